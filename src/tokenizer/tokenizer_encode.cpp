// Tokenizer::encode: special-token partitioning, then SPM (score-ordered merges over UTF-8
// characters, byte fallback) or BPE (pre-tokenizer, GPT-2 byte mapping, rank-ordered merges) on each
// text fragment. Both merge with tokenizer_detail::merge_best_pairs (tokenizer_impl.h).
#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

#include "tokenizer/tokenizer_impl.h"

namespace kvpack {

using tokenizer_detail::kEscapedSpace;
using tokenizer_detail::replace_all;
using tokenizer_detail::Symbol;
using tokenizer_detail::utf8_len_by_lead;

void Tokenizer::Impl::push_bytes(std::string_view s, std::vector<int32_t>& out) const {
  for (char ch : s) {
    const int32_t id = byte_tok[static_cast<unsigned char>(ch)];
    if (id >= 0) out.push_back(id);
    else if (v.unk >= 0) out.push_back(v.unk);
  }
}

void Tokenizer::Impl::encode_spm(std::string_view frag, bool prefix_space, std::vector<int32_t>& out) const {
  std::string text;
  text.reserve(frag.size() + 4);
  if (prefix_space) text.push_back(' ');
  text.append(frag);
  if (!v.llama2c) replace_all(text, " ", kEscapedSpace);
  if (text.empty()) return;

  // split into characters
  std::vector<Symbol> sym;
  sym.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t off = 0;
  while (off < text.size()) {
    size_t len;
    if (v.llama2c) {
      // run.c: a byte plus the continuation bytes that follow it, at most 4 in all
      len = 1;
      while (off + len < text.size() && len < 4 && (p[off + len] & 0xC0) == 0x80) ++len;
    } else {
      // llama.cpp takes the sequence length from the lead byte alone; we additionally require the
      // continuation bytes to be present (identical on valid UTF-8), so an invalid lead byte cannot
      // swallow part of the next character (e.g. an escaped space) and every byte string round-trips.
      len = utf8_len_by_lead(p[off]);
      for (size_t k = 1; k < len; ++k) {
        if (off + k >= text.size() || (p[off + k] & 0xC0) != 0x80) {
          len = 1;
          break;
        }
      }
    }
    const int32_t idx = static_cast<int32_t>(sym.size());
    Symbol s{idx - 1, -1, static_cast<uint32_t>(off), static_cast<uint32_t>(len), false};
    if (v.llama2c) s.frozen = lookup(std::string_view(text).substr(off, len)) < 0;
    off += len;
    if (off < text.size()) s.next = idx + 1;
    sym.push_back(s);
  }

  const std::string_view tv = text;
  tokenizer_detail::merge_best_pairs<float>(sym, [&](const Symbol& a, const Symbol& b) -> std::optional<float> {
    if (a.frozen || b.frozen) return std::nullopt;
    const int32_t id = lookup(tv.substr(a.off, a.n + b.n));
    if (id < 0) return std::nullopt;
    return score(id);
  });

  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& s = sym[static_cast<size_t>(i)];
    const std::string_view piece = tv.substr(s.off, s.n);
    const int32_t id = s.frozen ? -1 : lookup(piece);
    if (id >= 0) out.push_back(id);
    else push_bytes(piece, out);
  }
}

void Tokenizer::Impl::encode_bpe_word(const std::string& word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (pre.ignore_merges) {
    if (int32_t id = lookup(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  size_t off = 0;
  while (off < word.size()) {
    const size_t len = std::min(utf8_len_by_lead(static_cast<unsigned char>(word[off])), word.size() - off);
    const int32_t idx = static_cast<int32_t>(sym.size());
    Symbol s{idx - 1, -1, static_cast<uint32_t>(off), static_cast<uint32_t>(len), false};
    off += len;
    if (off < word.size()) s.next = idx + 1;
    sym.push_back(s);
  }

  const std::string_view wv = word;
  std::string key;
  // Priority = -rank: the lowest-ranked merge applies first (ranks are >= 0, so negation is exact).
  tokenizer_detail::merge_best_pairs<int32_t>(sym, [&](const Symbol& a, const Symbol& b) -> std::optional<int32_t> {
    key.assign(wv.substr(a.off, a.n));
    key.push_back(' ');
    key.append(wv.substr(b.off, b.n));
    auto it = merge_rank.find(key);
    if (it == merge_rank.end()) return std::nullopt;
    return -it->second;
  });

  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& s = sym[static_cast<size_t>(i)];
    const std::string_view piece = wv.substr(s.off, s.n);
    if (int32_t id = lookup(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // not a token (only with inconsistent merges): fall back to the single mapped characters
    size_t k = 0;
    while (k < piece.size()) {
      const size_t len = std::min(utf8_len_by_lead(static_cast<unsigned char>(piece[k])), piece.size() - k);
      const int32_t id = lookup(piece.substr(k, len));
      if (id >= 0) out.push_back(id);
      else if (v.unk >= 0) out.push_back(v.unk);
      k += len;
    }
  }
}

void Tokenizer::Impl::encode_bpe(std::string_view frag, std::vector<int32_t>& out) const {
  std::string word;
  for (auto [b, e] : tokenizer_detail::pretokenize_ranges(pre.kind, frag)) {
    word.clear();
    for (size_t k = b; k < e; ++k) word += byte_enc[static_cast<unsigned char>(frag[k])];
    encode_bpe_word(word, out);
  }
}

namespace {

// A set of the text's 4-byte substrings, hashed into 2^16 bits: a special token of 4 bytes or more can
// occur only if its last 4 bytes do. Vocabularies carry hundreds of special tokens (Qwen2: ~300
// user-defined [PAD...] tokens, matched even without special parsing; Gemma: thousands of <unused...>),
// so without it every encode searched the whole text once per token. A false positive costs one search,
// so the result is exactly the unfiltered one.
class GramFilter {
 public:
  explicit GramFilter(std::string_view t) {
    for (size_t i = 0; i + 4 <= t.size(); ++i) {
      const uint32_t h = hash(t.data() + i);
      bits_[h >> 6] |= uint64_t{1} << (h & 63);
    }
  }
  bool may_occur(std::string_view s) const {
    if (s.size() < 4) return true;
    const uint32_t h = hash(s.data() + s.size() - 4);
    return (bits_[h >> 6] >> (h & 63)) & 1;
  }

 private:
  static uint32_t hash(const char* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return (v * 2654435761u) >> 16;
  }
  std::array<uint64_t, 1024> bits_{};
};

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  if (add_bos && m.v.bos >= 0) out.push_back(m.v.bos);
  if (text.empty()) return out;

  // Partition the text on special-token occurrences (longest token first, like llama.cpp).
  struct Frag {
    int32_t token;  // -1: raw text
    size_t off, len;
  };
  std::vector<Frag> frags{{-1, 0, text.size()}};
  std::optional<GramFilter> grams;  // for long texts and many special tokens only (it is 8 KB to clear)
  if (text.size() >= 64 && m.specials.size() >= 16) grams.emplace(text);
  for (int32_t id : m.specials) {
    const uint8_t ty = m.types[static_cast<size_t>(id)];
    if (!parse_special && ty != kTypeUserDefined) continue;
    const std::string& st = m.v.tokens[static_cast<size_t>(id)];
    if (st.size() > text.size() || (grams && !grams->may_occur(st))) continue;
    // Most special tokens occur nowhere in a text (a Llama-3 vocabulary has 256, nearly all reserved):
    // look before building a new fragment list, so a text without them costs one search per token and
    // no allocation.
    const bool occurs = std::any_of(frags.begin(), frags.end(), [&](const Frag& f) {
      return f.token < 0 && f.len >= st.size() && text.substr(f.off, f.len).find(st) != std::string_view::npos;
    });
    if (!occurs) continue;
    std::vector<Frag> next;
    bool changed = false;
    for (const Frag& f : frags) {
      if (f.token >= 0 || f.len < st.size()) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.off, f.len);
      size_t pos = 0;
      while (true) {
        const size_t k = raw.find(st, pos);
        if (k == std::string_view::npos) break;
        changed = true;
        if (k > pos) next.push_back({-1, f.off + pos, k - pos});
        next.push_back({id, 0, 0});
        pos = k + st.size();
      }
      if (pos < raw.size()) next.push_back({-1, f.off + pos, raw.size() - pos});
    }
    if (changed) frags.swap(next);
  }

  bool prev_special = true;  // SPM: prefix a space to the first text fragment and after specials
  for (const Frag& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.off, f.len);
    if (m.v.kind == VocabData::Kind::SPM) {
      m.encode_spm(raw, m.v.add_space_prefix && prev_special, out);
    } else {
      m.encode_bpe(raw, out);
    }
    prev_special = false;
  }
  return out;
}

}  // namespace kvpack
