#include "tokenizer/pretokenize.h"

#include <unicode/uchar.h>

#include <array>
#include <stdexcept>

#include "tokenizer/pretokenize_impl.h"
#include "tokenizer/tokenizer.h"

namespace kvpack::tokenizer_detail {
namespace {

uint8_t flags_of(uint32_t c) {
  if (c > 0x10FFFF) return 0;
  uint8_t f = 0;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      f |= kL;
      break;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      f |= kN;
      break;
    case U_CONNECTOR_PUNCTUATION:
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
      f |= kP;
      break;
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
      f |= kM;
      break;
    case U_MATH_SYMBOL:
    case U_CURRENCY_SYMBOL:
    case U_MODIFIER_SYMBOL:
    case U_OTHER_SYMBOL:
      f |= kS;
      break;
    default:
      break;
  }
  if (u_isUWhiteSpace(static_cast<UChar32>(c))) f |= kW;
  return f;
}

const std::array<uint8_t, 128>& ascii_flags() {
  static const std::array<uint8_t, 128> t = [] {
    std::array<uint8_t, 128> a{};
    for (uint32_t c = 0; c < 128; ++c) a[c] = flags_of(c);
    return a;
  }();
  return t;
}

// Decodes like llama.cpp's unicode_cpt_from_utf8 (lead byte + continuation checks, no overlong /
// range checks); a byte that does not start a valid sequence becomes one invalid character. llama.cpp
// turns such a byte into U+FFFD, a symbol: kS keeps that for the patterns that name \p{S}.
Cps decode(std::string_view s) {
  const auto& af = ascii_flags();
  Cps out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  auto cont = [&](size_t k) { return k < n && (p[k] & 0xC0) == 0x80; };
  while (i < n) {
    const unsigned char b = p[i];
    uint32_t c = kInvalid;
    uint8_t len = 1;
    if (b < 0x80) {
      c = b;
    } else if ((b & 0xE0) == 0xC0) {
      if (cont(i + 1)) { c = ((b & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu); len = 2; }
    } else if ((b & 0xF0) == 0xE0) {
      if (cont(i + 1) && cont(i + 2)) {
        c = ((b & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu);
        len = 3;
      }
    } else if ((b & 0xF8) == 0xF0) {
      if (cont(i + 1) && cont(i + 2) && cont(i + 3)) {
        c = ((b & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) | (p[i + 3] & 0x3Fu);
        len = 4;
      }
    }
    uint8_t f = kS;
    if (c != kInvalid) f = c < 128 ? af[c] : flags_of(c);
    out.push_back(Cp{c, static_cast<uint32_t>(i), len, f});
    i += len;
  }
  return out;
}

uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

}  // namespace

size_t match_contraction(const Cps& cp, size_t pos, size_t e, bool case_insensitive) {
  if (cp[pos].c != '\'' || pos + 1 >= e) return 0;
  auto low = [&](size_t k) { return case_insensitive ? ascii_lower(cp[k].c) : cp[k].c; };
  const uint32_t c1 = low(pos + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 < e) {
    const uint32_t c2 = low(pos + 2);
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  }
  return 0;
}

size_t match_whitespace(const Cps& cp, size_t pos, size_t e, bool newline_rule) {
  size_t k = pos;
  size_t last_nl = 0;
  while (k < e && (cp[k].flags & kW)) {
    if (cp[k].c == '\r' || cp[k].c == '\n') last_nl = k + 1;
    ++k;
  }
  if (newline_rule && last_nl > 0) return last_nl;  // \s*[\r\n]+
  const size_t nws = k - pos;
  if (nws > 1 && k < e) return k - 1;  // \s+(?!\S): leave the last space for the next word
  if (nws > 0) return k;               // \s+
  return pos + 1;                      // no alternative matched: single character
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(const Cps& cp, size_t b, size_t e, std::vector<size_t>& ends) {
  size_t pos = b;
  auto fl = [&](size_t k) -> uint8_t { return k < e ? cp[k].flags : 0; };
  while (pos < e) {
    size_t end = 0;
    if (size_t m = match_contraction(cp, pos, e, false)) {
      end = pos + m;
    } else {
      const bool sp = cp[pos].c == ' ';
      const size_t q0 = pos + (sp ? 1 : 0);  // start after the optional space
      const bool in = q0 < e;
      const uint8_t f2 = in ? cp[q0].flags : 0;
      if (in && (f2 & kL)) {
        end = q0;
        while (end < e && (fl(end) & kL)) ++end;
      } else if (in && (f2 & kN)) {
        end = q0;
        while (end < e && (fl(end) & kN)) ++end;
      } else if (in && !(f2 & (kW | kL | kN))) {
        end = q0;
        while (end < e && !(fl(end) & (kW | kL | kN))) ++end;
      } else {
        end = match_whitespace(cp, pos, e, false);
      }
    }
    ends.push_back(end);
    pos = end;
  }
}

// LLAMA3 / QWEN2 / QWEN35 (QWEN35 with [\p{L}\p{M}] wherever the others have \p{L}, except in the prefix class):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void split_llama3(const Cps& cp, size_t b, size_t e, size_t max_digits, uint8_t letters, std::vector<size_t>& ends) {
  size_t pos = b;
  auto fl = [&](size_t k) -> uint8_t { return k < e ? cp[k].flags : 0; };
  while (pos < e) {
    size_t end = 0;
    const uint32_t c = cp[pos].c;
    const uint8_t f = cp[pos].flags;
    if (size_t m = match_contraction(cp, pos, e, true)) {
      end = pos + m;
    } else if (!(c == '\r' || c == '\n' || (f & kN)) && ((f & letters) || (fl(pos + 1) & letters))) {
      // [^\r\n\p{L}\p{N}]?\p{L}+ : either c is a letter, or c is an allowed prefix followed by letters (a
      // QWEN35 mark is both, which comes to the same match)
      end = pos + 1;
      while (end < e && (fl(end) & letters)) ++end;
    } else if (f & kN) {
      end = pos;
      while (end < e && end - pos < max_digits && (fl(end) & kN)) ++end;
    } else {
      const bool sp = c == ' ';
      const size_t q0 = pos + (sp ? 1 : 0);
      const uint8_t stop = kW | letters | kN;
      if (q0 < e && !(cp[q0].flags & stop)) {
        end = q0;
        while (end < e && !(fl(end) & stop)) ++end;
        while (end < e && (cp[end].c == '\r' || cp[end].c == '\n')) ++end;
      } else {
        end = match_whitespace(cp, pos, e, true);
      }
    }
    ends.push_back(end);
    pos = end;
  }
}

bool lookup_pre(std::string_view name, PreInfo* out) {
  static const struct {
    const char* name;
    PreInfo info;
  } table[] = {
      // Names and flags as llama.cpp's llama_vocab::load maps them (ignore_merges / add_bos only where it sets
      // them). Left out: names whose models need more than a pre-tokenizer (jina-v1-en, jina-v2-code,
      // roberta-bpe add a SEP token; chatglm-bpe / glm4 drop BOS; gemma4, sarvam-moe escape whitespace) and
      // the patterns not implemented here (jais-2, kimi-k2, chameleon, youtu, spark2_5, granite-embed-multi-*,
      // tiny_aya, superbpe, bailingmoe, seed-coder, afmoe, laguna, exaone-moe, minicpm5, grok-2, ufakzeka,
      // whitespace, ...).
      {"", {PreKind::DEFAULT, false, false}},
      {"default", {PreKind::DEFAULT, false, false}},
      {"gpt-2", {PreKind::GPT2, false, false}},
      {"gpt2", {PreKind::GPT2, false, false}},
      {"phi-2", {PreKind::GPT2, false, false}},
      {"mpt", {PreKind::GPT2, false, false}},
      {"olmo", {PreKind::GPT2, false, false}},
      {"jais", {PreKind::GPT2, false, false}},
      {"jina-es", {PreKind::GPT2, false, false}},
      {"jina-de", {PreKind::GPT2, false, false}},
      {"jina-v2-es", {PreKind::GPT2, false, false}},
      {"jina-v2-de", {PreKind::GPT2, false, false}},
      {"gigachat", {PreKind::GPT2, false, false}},
      {"a.x-4.0", {PreKind::GPT2, false, false}},
      {"mellum", {PreKind::GPT2, false, false}},
      {"modern-bert", {PreKind::GPT2, false, false}},
      {"exaone4", {PreKind::GPT2, false, false}},
      {"trillion", {PreKind::GPT2, false, false}},
      {"granite-docling", {PreKind::GPT2, false, false}},
      {"llama3", {PreKind::LLAMA3, true, true}},
      {"llama-v3", {PreKind::LLAMA3, true, true}},
      {"llama-bpe", {PreKind::LLAMA3, true, true}},
      {"falcon3", {PreKind::LLAMA3, true, true}},
      {"falcon-h1", {PreKind::LLAMA3, true, true}},
      {"pixtral", {PreKind::LLAMA3, true, true}},
      {"midm-2.0", {PreKind::LLAMA3, true, true}},
      {"lfm2", {PreKind::LLAMA3, true, true}},
      {"jina-v5-nano", {PreKind::LLAMA3, true, true}},
      {"dbrx", {PreKind::LLAMA3, false, false}},
      {"smaug-bpe", {PreKind::LLAMA3, false, false}},
      {"qwen2", {PreKind::QWEN2, false, false}},
      {"deepseek-r1-qwen", {PreKind::QWEN2, false, false}},
      {"kormo", {PreKind::QWEN2, false, false}},
      {"f2llmv2", {PreKind::QWEN2, false, false}},
      {"stablelm2", {PreKind::QWEN2, false, false}},
      {"megrez", {PreKind::QWEN2, false, false}},
      {"hunyuan", {PreKind::QWEN2, false, false}},
      {"solar-open", {PreKind::QWEN2, false, false}},
      {"qwen35", {PreKind::QWEN35, false, false}},
      {"falcon", {PreKind::FALCON, false, false}},
      {"starcoder", {PreKind::STARCODER, false, false}},
      {"refact", {PreKind::STARCODER, false, false}},
      {"command-r", {PreKind::STARCODER, false, false}},
      {"smollm", {PreKind::STARCODER, false, false}},
      {"codeshell", {PreKind::STARCODER, false, false}},
      {"exaone", {PreKind::STARCODER, false, false}},
      {"minerva-7b", {PreKind::STARCODER, false, false}},
      {"mellum2", {PreKind::STARCODER, false, false}},
      {"tekken", {PreKind::TEKKEN, true, true}},
      {"gpt-4o", {PreKind::GPT4O, false, false}},
      {"llama4", {PreKind::GPT4O, false, false}},
      {"kanana2", {PreKind::GPT4O, false, false}},
      {"talkie", {PreKind::GPT4O, false, false}},
      {"minimax-m2", {PreKind::GPT4O, false, false}},
      {"bloom", {PreKind::BLOOM, false, false}},
      {"poro-chat", {PreKind::BLOOM, false, false}},
      {"gpt3-finnish", {PreKind::BLOOM, false, false}},
      {"viking", {PreKind::VIKING, false, false}},
      {"deepseek-llm", {PreKind::DEEPSEEK_LLM, false, false}},
      {"deepseek-coder", {PreKind::DEEPSEEK_CODER, false, false}},
      {"deepseek-v3", {PreKind::DEEPSEEK3, false, false}},
      {"hunyuan-dense", {PreKind::DEEPSEEK3, false, false}},
      {"joyai-llm", {PreKind::DEEPSEEK3, false, false}},
      {"hy_v4", {PreKind::DEEPSEEK3, false, false}},
  };
  for (const auto& t : table) {
    if (name == t.name) {
      if (out) *out = t.info;
      return true;
    }
  }
  return false;
}

std::vector<std::pair<size_t, size_t>> pretokenize_ranges(PreKind kind, std::string_view text) {
  const Cps cp = decode(text);
  const size_t n = cp.size();
  std::vector<size_t> ends;  // code-point end indices of consecutive pieces
  ends.reserve(n / 3 + 4);

  switch (kind) {
    case PreKind::GPT2:
      split_gpt2(cp, 0, n, ends);
      break;
    case PreKind::LLAMA3:
      split_llama3(cp, 0, n, 3, kL, ends);
      break;
    case PreKind::QWEN2:
      split_llama3(cp, 0, n, 1, kL, ends);
      break;
    case PreKind::QWEN35:
      split_llama3(cp, 0, n, 1, kL | kM, ends);
      break;
    default:
      split_chain(kind, cp, ends);
      break;
  }

  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(ends.size());
  size_t prev = 0;
  for (size_t e : ends) {
    if (e <= prev) continue;
    const size_t bb = cp[prev].off;
    const size_t be = e < n ? cp[e].off : text.size();
    out.emplace_back(bb, be);
    prev = e;
  }
  return out;
}

std::vector<std::string> pretokenize(std::string_view pre, std::string_view text) {
  PreInfo info{};
  if (!lookup_pre(pre, &info)) throw std::runtime_error("unsupported BPE pre-tokenizer '" + std::string(pre) + "'");
  std::vector<std::string> out;
  for (auto [b, e] : pretokenize_ranges(info.kind, text)) out.emplace_back(text.substr(b, e - b));
  return out;
}

}  // namespace kvpack::tokenizer_detail
