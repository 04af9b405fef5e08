#include "tokenizer/pretokenize.h"

#include <unicode/uchar.h>

#include <array>
#include <stdexcept>

#include "tokenizer/tokenizer.h"

namespace kvpack::tokenizer_detail {
namespace {

enum : uint8_t {
  kL = 1,   // \p{L}
  kN = 2,   // \p{N}
  kW = 4,   // \s (Unicode White_Space)
  kP = 8,   // \p{P}
};

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

struct Cp {
  uint32_t c;      // code point; 0xFFFFFFFF for an invalid byte
  uint32_t off;    // byte offset in the text
  uint8_t len;     // bytes
  uint8_t flags;
};

constexpr uint32_t kInvalid = 0xFFFFFFFFu;

// Decodes like llama.cpp's unicode_cpt_from_utf8 (lead byte + continuation checks, no overlong /
// range checks); a byte that does not start a valid sequence becomes one invalid "other" character.
std::vector<Cp> decode(std::string_view s) {
  const auto& af = ascii_flags();
  std::vector<Cp> out;
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
    uint8_t f = 0;
    if (c != kInvalid) f = c < 128 ? af[c] : flags_of(c);
    out.push_back(Cp{c, static_cast<uint32_t>(i), len, f});
    i += len;
  }
  return out;
}

uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// Matches the contraction alternatives at `pos`; returns the match length (0 if none).
size_t match_contraction(const std::vector<Cp>& cp, size_t pos, size_t e, bool case_insensitive) {
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

// Whitespace tail shared by all patterns: [\s*[\r\n]+ |] \s+(?!\S) | \s+ ; returns the end.
size_t match_whitespace(const std::vector<Cp>& cp, size_t pos, size_t e, bool newline_rule) {
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
void split_gpt2(const std::vector<Cp>& cp, size_t b, size_t e, std::vector<size_t>& ends) {
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

// LLAMA3 / QWEN2:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void split_llama3(const std::vector<Cp>& cp, size_t b, size_t e, size_t max_digits, std::vector<size_t>& ends) {
  size_t pos = b;
  auto fl = [&](size_t k) -> uint8_t { return k < e ? cp[k].flags : 0; };
  while (pos < e) {
    size_t end = 0;
    const uint32_t c = cp[pos].c;
    const uint8_t f = cp[pos].flags;
    if (size_t m = match_contraction(cp, pos, e, true)) {
      end = pos + m;
    } else if (!(c == '\r' || c == '\n' || (f & kN)) && ((f & kL) || (fl(pos + 1) & kL))) {
      // [^\r\n\p{L}\p{N}]?\p{L}+ : either c is a letter, or c is an allowed prefix followed by letters
      end = pos + 1;
      while (end < e && (fl(end) & kL)) ++end;
    } else if (f & kN) {
      end = pos;
      while (end < e && end - pos < max_digits && (fl(end) & kN)) ++end;
    } else {
      const bool sp = c == ' ';
      const size_t q0 = pos + (sp ? 1 : 0);
      if (q0 < e && !(cp[q0].flags & (kW | kL | kN))) {
        end = q0;
        while (end < e && !(fl(end) & (kW | kL | kN))) ++end;
        while (end < e && (cp[end].c == '\r' || cp[end].c == '\n')) ++end;
      } else {
        end = match_whitespace(cp, pos, e, true);
      }
    }
    ends.push_back(end);
    pos = end;
  }
}

// Splits [b, e) into matches of "runs of characters satisfying pred" and the gaps between them.
template <class Pred>
void split_runs(size_t b, size_t e, Pred pred, std::vector<size_t>& ends) {
  size_t pos = b;
  while (pos < e) {
    const bool m = pred(pos);
    size_t end = pos + 1;
    while (end < e && pred(end) == m) ++end;
    ends.push_back(end);
    pos = end;
  }
}

bool is_ascii_digit(uint32_t c) { return c >= '0' && c <= '9'; }

}  // namespace

bool lookup_pre(std::string_view name, PreInfo* out) {
  static const struct {
    const char* name;
    PreInfo info;
  } table[] = {
      {"", {PreKind::DEFAULT, false, false}},
      {"default", {PreKind::DEFAULT, false, false}},
      {"gpt-2", {PreKind::GPT2, false, false}},
      {"gpt2", {PreKind::GPT2, false, false}},
      {"phi-2", {PreKind::GPT2, false, false}},
      {"mpt", {PreKind::GPT2, false, false}},
      {"olmo", {PreKind::GPT2, false, false}},
      {"jais", {PreKind::GPT2, false, false}},
      {"llama3", {PreKind::LLAMA3, true, true}},
      {"llama-v3", {PreKind::LLAMA3, true, true}},
      {"llama-bpe", {PreKind::LLAMA3, true, true}},
      {"falcon3", {PreKind::LLAMA3, true, true}},
      {"dbrx", {PreKind::LLAMA3, false, false}},
      {"smaug-bpe", {PreKind::LLAMA3, false, false}},
      {"qwen2", {PreKind::QWEN2, false, false}},
      {"deepseek-r1-qwen", {PreKind::QWEN2, false, false}},
      {"stablelm2", {PreKind::QWEN2, false, false}},
      {"megrez", {PreKind::QWEN2, false, false}},
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
  const std::vector<Cp> cp = decode(text);
  const size_t n = cp.size();
  std::vector<size_t> ends;  // code-point end indices of consecutive pieces
  ends.reserve(n / 3 + 4);

  switch (kind) {
    case PreKind::GPT2:
      split_gpt2(cp, 0, n, ends);
      break;
    case PreKind::LLAMA3:
      split_llama3(cp, 0, n, 3, ends);
      break;
    case PreKind::QWEN2:
      split_llama3(cp, 0, n, 1, ends);
      break;
    case PreKind::DEFAULT: {
      // Each stage splits every piece of the previous stage further (matches and gaps both kept).
      auto is_p = [&](size_t k) {
        const uint32_t c = cp[k].c;
        return (cp[k].flags & kP) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
               c == '~' || c == '|';
      };
      std::vector<size_t> s1, s2, s3;
      split_runs(0, n, is_p, s1);
      size_t b = 0;
      for (size_t e : s1) { split_gpt2(cp, b, e, s2); b = e; }
      b = 0;
      for (size_t e : s2) { split_runs(b, e, [&](size_t k) { return (cp[k].flags & kN) != 0; }, s3); b = e; }
      b = 0;
      for (size_t e : s3) {
        // [0-9][0-9][0-9]: leftmost non-overlapping matches, gaps kept
        size_t pos = b;
        size_t gap = b;
        while (pos + 3 <= e) {
          if (is_ascii_digit(cp[pos].c) && is_ascii_digit(cp[pos + 1].c) && is_ascii_digit(cp[pos + 2].c)) {
            if (pos > gap) ends.push_back(pos);
            ends.push_back(pos + 3);
            pos += 3;
            gap = pos;
          } else {
            ++pos;
          }
        }
        if (e > gap) ends.push_back(e);
        b = e;
      }
      break;
    }
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
