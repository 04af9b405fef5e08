// Tokenizer construction (vocabulary tables, byte fallback, GPT-2 byte mapping, decode pieces),
// decoding and accessors. Encoding lives in tokenizer_encode.cpp, the GGUF / llama2.c loaders in
// tokenizer_load.cpp; the shared internals in tokenizer_impl.h.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <unordered_map>

#include "tokenizer/tokenizer_impl.h"

namespace kvpack {

using tokenizer_detail::cpt_to_utf8;
using tokenizer_detail::kEscapedSpace;
using tokenizer_detail::parse_byte_token;
using tokenizer_detail::replace_all;
using tokenizer_detail::utf8_len_by_lead;

namespace {

// Token texts that end generation (llama.cpp's list, matched on the vocab string).
constexpr const char* kEogTexts[] = {
    "<|eot_id|>",   "<|im_end|>",   "<|end|>",        "<|return|>",    "<|call|>",
    "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",    "<EOT>",         "_<EOT>",
    "<|end_of_text|>", "<end_of_utterance>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
};

// GPT-2 bytes_to_unicode(): printable bytes map to themselves, the rest to U+0100.. in byte order.
std::array<uint32_t, 256> byte_to_cpt_table() {
  std::array<uint32_t, 256> t{};
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    t[b] = printable ? b : 256 + n++;
  }
  return t;
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

namespace tokenizer_detail {

// "<0xXX>" -> byte value, -1 otherwise.
int parse_byte_token(std::string_view s) {
  if (s.size() != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
  const int hi = hexval(s[3]), lo = hexval(s[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t k = s.find(from, pos);
    if (k == std::string::npos) break;
    out.append(s, pos, k - pos);
    out.append(to);
    pos = k + from.size();
  }
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

std::string cpt_to_utf8(uint32_t c) {
  std::string r;
  if (c < 0x80) {
    r.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    r.push_back(static_cast<char>(0xC0 | (c >> 6)));
    r.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    r.push_back(static_cast<char>(0xE0 | (c >> 12)));
    r.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    r.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    r.push_back(static_cast<char>(0xF0 | (c >> 18)));
    r.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    r.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    r.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
  return r;
}

}  // namespace tokenizer_detail

// ---------------------------------------------------------------------------------------------------
// construction

Tokenizer::Tokenizer(VocabData v) {
  auto impl = std::make_shared<Impl>();
  Impl& m = *impl;
  const size_t n = v.tokens.size();
  if (n == 0) throw std::runtime_error("tokenizer: empty vocabulary");
  if (n > static_cast<size_t>(kMaxVocab))
    throw std::runtime_error("tokenizer: vocabulary of " + std::to_string(n) + " tokens is too large (at most " +
                             std::to_string(kMaxVocab) + ")");
  if (!v.scores.empty()) {
    if (v.scores.size() < n)
      throw std::runtime_error("tokenizer: " + std::to_string(v.scores.size()) + " scores for " + std::to_string(n) +
                               " tokens");
    v.scores.resize(n);
  }
  if (!v.token_types.empty()) {
    if (v.token_types.size() < n)
      throw std::runtime_error("tokenizer: " + std::to_string(v.token_types.size()) + " token types for " +
                               std::to_string(n) + " tokens");
    v.token_types.resize(n);
  }
  const int32_t nv = static_cast<int32_t>(n);
  for (int32_t* id : {&v.bos, &v.eos, &v.unk, &v.pad})
    if (*id < 0 || *id >= nv) *id = -1;  // out-of-range special ids are disabled (as llama.cpp does)
  if (v.bos < 0) v.add_bos = false;

  if (v.kind == VocabData::Kind::BPE) {
    if (!tokenizer_detail::lookup_pre(v.pre, &m.pre))
      throw std::runtime_error("tokenizer: unsupported BPE pre-tokenizer '" + v.pre + "'");
    m.pre_name = v.pre.empty() ? "default" : v.pre;
    v.add_space_prefix = false;
    v.llama2c = false;
  }

  m.types.resize(n);
  m.eog.assign(n, 0);
  m.tok2id.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    m.types[i] = v.token_types.empty() ? kTypeNormal : static_cast<uint8_t>(std::clamp(v.token_types[i], 0, 255));
    m.tok2id.emplace(v.tokens[i], static_cast<int32_t>(i));  // duplicates: first id wins
  }
  for (const char* t : kEogTexts) {
    if (int32_t id = m.lookup(t); id >= 0) {
      m.eog[static_cast<size_t>(id)] = 1;
      m.types[static_cast<size_t>(id)] = kTypeControl;
    }
  }
  if (v.eos >= 0) m.eog[static_cast<size_t>(v.eos)] = 1;

  // byte fallback tokens
  for (int b = 0; b < 256; ++b) {
    static const char* hex = "0123456789ABCDEF";
    const char buf[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
    int32_t id = m.lookup(buf);
    if (id < 0) id = m.lookup(std::string(1, static_cast<char>(b)));
    m.byte_tok[static_cast<size_t>(b)] = id;
  }

  // BPE tables
  const auto b2c = byte_to_cpt_table();
  std::unordered_map<uint32_t, uint8_t> c2b;
  for (int b = 0; b < 256; ++b) {
    m.byte_enc[static_cast<size_t>(b)] = cpt_to_utf8(b2c[static_cast<size_t>(b)]);
    c2b[b2c[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
  }
  if (v.kind == VocabData::Kind::BPE) {
    m.merge_rank.reserve(v.merges.size() * 2);
    for (size_t i = 0; i < v.merges.size(); ++i) {
      const std::string& s = v.merges[i];
      const size_t sp = s.size() > 1 ? s.find(' ', 1) : std::string::npos;
      if (sp == std::string::npos || sp + 1 >= s.size()) continue;  // malformed: never matches anyway
      m.merge_rank.emplace(s, static_cast<int32_t>(std::min<size_t>(i, INT32_MAX)));
    }
  }

  // pieces
  m.pieces.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = v.tokens[i];
    std::string p;
    switch (m.types[i]) {
      case kTypeNormal:
        if (v.kind == VocabData::Kind::SPM) {
          p = t;
          if (!v.llama2c) replace_all(p, kEscapedSpace, " ");
        } else {
          // inverse GPT-2 byte mapping; characters outside the mapping are kept as they are
          const std::string_view sv = t;
          size_t k = 0;
          while (k < sv.size()) {
            const auto b0 = static_cast<unsigned char>(sv[k]);
            size_t len = std::min(utf8_len_by_lead(b0), sv.size() - k);
            uint32_t c = b0;
            if (len == 2) c = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(sv[k + 1]) & 0x3Fu);
            auto it = (len == 2 || b0 < 0x80) ? c2b.find(c) : c2b.end();
            if (it != c2b.end()) p.push_back(static_cast<char>(it->second));
            else p.append(sv.substr(k, len));
            k += len;
          }
        }
        break;
      case kTypeUserDefined:
        p = t;
        break;
      case kTypeByte: {
        const int b = parse_byte_token(t);
        p = b >= 0 ? std::string(1, static_cast<char>(b)) : t;
        break;
      }
      default:  // control, unknown, unused, undefined
        break;
    }
    m.pieces[i] = std::move(p);
  }

  // special tokens matched in the input text (user-defined always; control/unknown with parse_special)
  for (size_t i = 0; i < n; ++i) {
    const uint8_t ty = m.types[i];
    if ((ty == kTypeControl || ty == kTypeUserDefined || ty == kTypeUnknown) && !v.tokens[i].empty())
      m.specials.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(m.specials.begin(), m.specials.end(), [&](int32_t a, int32_t b) {
    return v.tokens[static_cast<size_t>(a)].size() > v.tokens[static_cast<size_t>(b)].size();
  });

  m.v = std::move(v);
  impl_ = std::move(impl);
}

// ---------------------------------------------------------------------------------------------------
// decode

std::string Tokenizer::piece(int32_t token) const {
  if (token < 0 || token >= impl_->n()) return {};
  return impl_->pieces[static_cast<size_t>(token)];
}

std::string Tokenizer::piece_after(int32_t prev, int32_t token) const {
  const Impl& m = *impl_;
  if (token < 0 || token >= m.n()) return {};
  std::string p = m.pieces[static_cast<size_t>(token)];
  if (m.strips_space(token) && prev >= 0 && prev == m.v.bos) p.erase(0, 1);
  return p;
}

std::string Tokenizer::decode(std::span<const int32_t> tokens) const {
  const Impl& m = *impl_;
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t >= m.n()) continue;
    const std::string& p = m.pieces[static_cast<size_t>(t)];
    if (m.strips_space(t) && (i == 0 || (m.v.bos >= 0 && tokens[i - 1] == m.v.bos)))
      out.append(p, 1, std::string::npos);
    else
      out += p;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// accessors

int32_t Tokenizer::bos() const { return impl_->v.bos; }
int32_t Tokenizer::eos() const { return impl_->v.eos; }
int32_t Tokenizer::unk() const { return impl_->v.unk; }
int32_t Tokenizer::pad() const { return impl_->v.pad; }
int32_t Tokenizer::n_vocab() const { return impl_->n(); }
bool Tokenizer::add_bos_default() const { return impl_->v.add_bos; }
VocabData::Kind Tokenizer::kind() const { return impl_->v.kind; }
const std::string& Tokenizer::pre() const { return impl_->pre_name; }

const std::string& Tokenizer::token_text(int32_t t) const {
  if (t < 0 || t >= impl_->n()) throw std::out_of_range("token id " + std::to_string(t) + " out of range");
  return impl_->v.tokens[static_cast<size_t>(t)];
}

int32_t Tokenizer::token_type(int32_t t) const {
  if (t < 0 || t >= impl_->n()) return 0;
  return impl_->types[static_cast<size_t>(t)];
}

int32_t Tokenizer::find_token(std::string_view text) const { return impl_->lookup(text); }

bool Tokenizer::is_control(int32_t t) const { return token_type(t) == kTypeControl; }

bool Tokenizer::is_eog(int32_t t) const {
  if (t < 0 || t >= impl_->n()) return false;
  return impl_->eog[static_cast<size_t>(t)] != 0;
}

}  // namespace kvpack
