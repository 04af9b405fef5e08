#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <queue>
#include <stdexcept>
#include <unordered_map>

#include "gguf/gguf.h"
#include "tokenizer/pretokenize.h"

namespace kvpack {

using tokenizer_detail::PreInfo;
using tokenizer_detail::PreKind;

namespace {

constexpr const char* kEscapedSpace = "\xE2\x96\x81";  // U+2581

// Transparent hash so string_view lookups don't allocate.
struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

// Token texts that end generation (llama.cpp's list, matched on the vocab string).
constexpr const char* kEogTexts[] = {
    "<|eot_id|>",   "<|im_end|>",   "<|end|>",        "<|return|>",    "<|call|>",
    "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",    "<EOT>",         "_<EOT>",
    "<|end_of_text|>", "<end_of_utterance>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
};

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

// Length of the "UTF-8 character" starting with byte b, by its high nibble (llama.cpp's
// unicode_len_utf8: continuation / invalid lead bytes count as 1).
size_t utf8_len_by_lead(unsigned char b) {
  static constexpr size_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[b >> 4];
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

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

struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t off;  // byte offset into the word
  uint32_t n;    // bytes (0 once merged away)
  bool frozen;   // llama2.c mode: unknown character already turned into byte tokens
};

}  // namespace

struct Tokenizer::Impl {
  VocabData v;
  PreInfo pre{PreKind::DEFAULT, false, false};
  std::string pre_name;  // normalized ("" for SPM)
  TokenMap tok2id;
  std::vector<uint8_t> types;  // effective types (EOG texts forced to control)
  std::vector<uint8_t> eog;
  std::vector<std::string> pieces;
  std::array<int32_t, 256> byte_tok{};  // byte fallback token per byte (-1: none)
  // BPE
  TokenMap merge_rank;  // "left right" -> rank
  std::array<std::string, 256> byte_enc;
  // special tokens matched in raw text, longest first
  std::vector<int32_t> specials;

  int32_t n() const { return static_cast<int32_t>(v.tokens.size()); }
  int32_t lookup(std::string_view s) const {
    auto it = tok2id.find(s);
    return it == tok2id.end() ? -1 : it->second;
  }
  // SPM leading-space rule: a normal token whose text starts with the (escaped) space loses that
  // space at the start of a sequence / after BOS. Byte tokens (<0x20>) keep it, as in run.c.
  bool strips_space(int32_t t) const {
    return v.kind == VocabData::Kind::SPM && v.add_space_prefix && types[static_cast<size_t>(t)] == kTypeNormal &&
           !pieces[static_cast<size_t>(t)].empty() && pieces[static_cast<size_t>(t)][0] == ' ';
  }
  float score(int32_t id) const { return v.scores.empty() ? 0.0f : v.scores[static_cast<size_t>(id)]; }

  void encode_spm(std::string_view frag, bool prefix_space, std::vector<int32_t>& out) const;
  void encode_bpe(std::string_view frag, std::vector<int32_t>& out) const;
  void encode_bpe_word(const std::string& word, std::vector<int32_t>& out) const;
  void push_bytes(std::string_view s, std::vector<int32_t>& out) const;
};

// ---------------------------------------------------------------------------------------------------
// construction

Tokenizer::Tokenizer(VocabData v) {
  auto impl = std::make_shared<Impl>();
  Impl& m = *impl;
  const size_t n = v.tokens.size();
  if (n == 0) throw std::runtime_error("tokenizer: empty vocabulary");
  if (n > static_cast<size_t>(INT32_MAX)) throw std::runtime_error("tokenizer: vocabulary too large");
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
// loaders

Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
  const std::string where = f.name() + ": ";
  auto fail = [&](const std::string& msg) -> std::runtime_error { return std::runtime_error(where + msg); };
  VocabData v;
  std::optional<std::string> model;
  try {
    model = f.get_string("tokenizer.ggml.model");
  } catch (const std::exception& e) {
    throw fail(std::string("bad tokenizer.ggml.model: ") + e.what());
  }
  if (!model) throw fail("missing key tokenizer.ggml.model");
  if (*model == "llama") {
    v.kind = VocabData::Kind::SPM;
  } else if (*model == "gpt2") {
    v.kind = VocabData::Kind::BPE;
  } else {
    throw fail("unsupported tokenizer model '" + *model + "' (tokenizer.ggml.model; supported: llama, gpt2)");
  }

  try {
    if (auto pre = f.get_string("tokenizer.ggml.pre")) v.pre = *pre;
  } catch (const std::exception& e) {
    throw fail(std::string("bad tokenizer.ggml.pre: ") + e.what());
  }
  if (v.kind == VocabData::Kind::BPE) {
    if (v.pre.empty()) v.pre = "default";
    if (!tokenizer_detail::lookup_pre(v.pre, nullptr))
      throw fail("unsupported BPE pre-tokenizer '" + v.pre + "' (tokenizer.ggml.pre)");
  }

  auto array_of = [&](const char* key, gguf::ValueType want) -> const gguf::Value* {
    const gguf::Value* val = f.find(key);
    if (!val) return nullptr;
    if (val->type != gguf::ValueType::ARRAY) throw fail(std::string(key) + " is not an array");
    if (want == gguf::ValueType::STRING && val->elem_type != gguf::ValueType::STRING)
      throw fail(std::string(key) + " is not a string array");
    return val;
  };

  const gguf::Value* toks = array_of("tokenizer.ggml.tokens", gguf::ValueType::STRING);
  if (!toks) throw fail("missing key tokenizer.ggml.tokens");
  if (toks->strs.empty()) throw fail("tokenizer.ggml.tokens is empty");
  v.tokens = toks->strs;
  const size_t n = v.tokens.size();

  if (const gguf::Value* sc = array_of("tokenizer.ggml.scores", gguf::ValueType::FLOAT32)) {
    if (!sc->floats.empty()) {
      for (double d : sc->floats) v.scores.push_back(static_cast<float>(d));
    } else {
      for (int64_t d : sc->ints) v.scores.push_back(static_cast<float>(d));
    }
    if (v.scores.size() < n)
      throw fail("tokenizer.ggml.scores has " + std::to_string(v.scores.size()) + " entries for " +
                 std::to_string(n) + " tokens");
  }
  if (const gguf::Value* tt = array_of("tokenizer.ggml.token_type", gguf::ValueType::INT32)) {
    if (tt->ints.size() < n)
      throw fail("tokenizer.ggml.token_type has " + std::to_string(tt->ints.size()) + " entries for " +
                 std::to_string(n) + " tokens");
    v.token_types.reserve(n);
    for (size_t i = 0; i < n; ++i)
      v.token_types.push_back(static_cast<int32_t>(std::clamp<int64_t>(tt->ints[i], -1, 255)));
  }
  if (v.kind == VocabData::Kind::BPE) {
    const gguf::Value* mg = array_of("tokenizer.ggml.merges", gguf::ValueType::STRING);
    if (!mg) throw fail("missing key tokenizer.ggml.merges (required for gpt2 tokenizers)");
    v.merges = mg->strs;
  }

  auto get_id = [&](const char* key, int32_t def) -> int32_t {
    std::optional<int64_t> x;
    try {
      x = f.get_int(key);
    } catch (const std::exception& e) {
      throw fail(std::string("bad ") + key + ": " + e.what());
    }
    if (!x) return def;
    if (*x < 0 || *x >= static_cast<int64_t>(n)) return -1;  // e.g. 0xFFFFFFFF = "none"
    return static_cast<int32_t>(*x);
  };
  auto get_flag = [&](const char* key, bool def) -> bool {
    try {
      if (auto b = f.get_bool(key)) return *b;
    } catch (const std::exception& e) {
      throw fail(std::string("bad ") + key + ": " + e.what());
    }
    return def;
  };
  const bool spm = v.kind == VocabData::Kind::SPM;
  // llama.cpp defaults: SPM bos=1 eos=2 unk=0; BPE has no sensible defaults
  v.bos = get_id("tokenizer.ggml.bos_token_id", spm && n > 1 ? 1 : -1);
  v.eos = get_id("tokenizer.ggml.eos_token_id", spm && n > 2 ? 2 : -1);
  v.unk = get_id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  v.pad = get_id("tokenizer.ggml.padding_token_id", -1);
  PreInfo info{};
  if (!spm) tokenizer_detail::lookup_pre(v.pre, &info);
  v.add_bos = get_flag("tokenizer.ggml.add_bos_token", spm ? true : info.add_bos_default);
  v.add_space_prefix = get_flag("tokenizer.ggml.add_space_prefix", spm);
  return Tokenizer(std::move(v));
}

Tokenizer Tokenizer::from_llama2c_bytes(std::string_view data, int32_t vocab_size, const std::string& name) {
  auto fail = [&](const std::string& msg) -> std::runtime_error {
    return std::runtime_error(name + ": malformed llama2.c tokenizer: " + msg);
  };
  if (vocab_size <= 0) throw fail("vocab_size must be positive (got " + std::to_string(vocab_size) + ")");
  size_t pos = 0;
  auto read_i32 = [&](const char* what, size_t idx) -> int32_t {
    if (data.size() - pos < 4)
      throw fail(std::string("truncated while reading ") + what + " of token " + std::to_string(idx));
    int32_t x;
    std::memcpy(&x, data.data() + pos, 4);
    pos += 4;
    return x;
  };
  auto read_f32 = [&](size_t idx) -> float {
    if (data.size() - pos < 4) throw fail("truncated while reading score of token " + std::to_string(idx));
    float x;
    std::memcpy(&x, data.data() + pos, 4);
    pos += 4;
    return x;
  };
  if (data.size() < 4) throw fail("file too short for the header (" + std::to_string(data.size()) + " bytes)");
  const int32_t max_len = read_i32("max_token_length", 0);
  if (max_len < 0) throw fail("negative max_token_length " + std::to_string(max_len));

  VocabData v;
  v.kind = VocabData::Kind::SPM;
  v.llama2c = true;
  v.add_space_prefix = true;  // llama2.c's encode always adds the dummy prefix " "
  v.add_bos = true;
  const size_t n = static_cast<size_t>(vocab_size);
  v.tokens.reserve(n);
  v.scores.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const float score = read_f32(i);
    const int32_t len = read_i32("length", i);
    if (len < 0) throw fail("negative length " + std::to_string(len) + " for token " + std::to_string(i));
    if (data.size() - pos < static_cast<size_t>(len))
      throw fail("truncated in the text of token " + std::to_string(i) + " (length " + std::to_string(len) +
                 ", " + std::to_string(data.size() - pos) + " bytes left)");
    v.tokens.emplace_back(data.substr(pos, static_cast<size_t>(len)));
    v.scores.push_back(score);
    pos += static_cast<size_t>(len);
  }
  v.token_types.resize(n, kTypeNormal);
  for (size_t i = 0; i < n; ++i)
    if (parse_byte_token(v.tokens[i]) >= 0) v.token_types[i] = kTypeByte;
  // run.c hard-codes <unk>=0, BOS=1, EOS=2
  v.unk = 0;
  v.token_types[0] = kTypeUnknown;
  if (n > 1) { v.bos = 1; v.token_types[1] = kTypeControl; }
  if (n > 2) { v.eos = 2; v.token_types[2] = kTypeControl; }
  return Tokenizer(std::move(v));
}

Tokenizer Tokenizer::from_llama2c(const std::string& path, int32_t vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open llama2.c tokenizer file");
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error(path + ": read error");
  return from_llama2c_bytes(data, vocab_size, path);
}

// ---------------------------------------------------------------------------------------------------
// encode

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

  struct Bigram {
    int32_t left, right;
    float score;
    uint32_t size;
  };
  struct Cmp {
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };
  std::priority_queue<Bigram, std::vector<Bigram>, Cmp> q;
  const std::string_view tv = text;
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const Symbol& a = sym[static_cast<size_t>(l)];
    const Symbol& b = sym[static_cast<size_t>(r)];
    if (a.frozen || b.frozen) return;
    const int32_t id = lookup(tv.substr(a.off, a.n + b.n));
    if (id < 0) return;
    q.push(Bigram{l, r, score(id), a.n + b.n});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) try_add(i - 1, i);

  while (!q.empty()) {
    const Bigram bg = q.top();
    q.pop();
    Symbol& l = sym[static_cast<size_t>(bg.left)];
    Symbol& r = sym[static_cast<size_t>(bg.right)];
    if (l.n == 0 || r.n == 0 || l.next != bg.right || l.n + r.n != bg.size) continue;  // stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = bg.left;
    try_add(l.prev, bg.left);
    try_add(bg.left, l.next);
  }

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

  struct Bigram {
    int32_t left, right;
    int32_t rank;
    uint32_t size;
  };
  struct Cmp {
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };
  std::priority_queue<Bigram, std::vector<Bigram>, Cmp> q;
  const std::string_view wv = word;
  std::string key;
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const Symbol& a = sym[static_cast<size_t>(l)];
    const Symbol& b = sym[static_cast<size_t>(r)];
    key.assign(wv.substr(a.off, a.n));
    key.push_back(' ');
    key.append(wv.substr(b.off, b.n));
    auto it = merge_rank.find(key);
    if (it == merge_rank.end()) return;
    q.push(Bigram{l, r, it->second, a.n + b.n});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) try_add(i - 1, i);

  while (!q.empty()) {
    const Bigram bg = q.top();
    q.pop();
    Symbol& l = sym[static_cast<size_t>(bg.left)];
    Symbol& r = sym[static_cast<size_t>(bg.right)];
    if (l.n == 0 || r.n == 0 || l.next != bg.right || l.n + r.n != bg.size) continue;  // stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = bg.left;
    try_add(l.prev, bg.left);
    try_add(bg.left, l.next);
  }

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
  for (int32_t id : m.specials) {
    const uint8_t ty = m.types[static_cast<size_t>(id)];
    if (!parse_special && ty != kTypeUserDefined) continue;
    const std::string& st = m.v.tokens[static_cast<size_t>(id)];
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
