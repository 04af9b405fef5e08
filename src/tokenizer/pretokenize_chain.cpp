// Pre-tokenizers that llama.cpp runs through std::regex (llm_tokenizer_bpe's regex_exprs; a list of patterns
// is a chain: every pattern splits each piece the previous one produced, keeping both its matches and the
// text between them). The GPT-2 pattern is llama.cpp's own fast path (split_gpt2). llama.cpp runs the
// others in one of two ways, and the matchers here follow the one that applies:
//  - patterns naming \p{..}: on a "collapsed" string where ASCII stays itself and every other code point
//    becomes one byte for its category (White_Space first), so a class like \p{L} means A-Za-z plus the
//    non-ASCII letters, and the flags kL / kN / kP / kM / kS carry exactly that;
//  - the other patterns: on the code points, with non-ASCII whitespace replaced by U+000B, so a literal
//    class that spans e.g. U+3000 never matches it (`wide` below).
// Both run ECMAScript alternation: at the leftmost position where any alternative matches, the first one
// that matches wins; characters where nothing matches join into one piece.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include "tokenizer/pretokenize_impl.h"

namespace kvpack::tokenizer_detail {
namespace {

struct Range {
  uint32_t lo, hi;
};

// DeepSeek LLM's letter class (its tokenizer.json: Latin, Greek, Coptic, Cyrillic, Armenian, Georgian,
// Cherokee, Glagolitic, letter-like symbols, fullwidth Latin, Deseret, Osage, Old Hungarian, Warang Citi,
// Adlam, ...): a hand-picked subset of \p{L}, so it cannot come from the category flags.
constexpr Range kDeepseekLetters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},       {0xD8, 0xF6},
    {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},     {0x295, 0x2AF},     {0x370, 0x373},
    {0x376, 0x377},     {0x37B, 0x37D},     {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},
    {0x38C, 0x38C},     {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},
    {0xA771, 0xA787},   {0xA78B, 0xA78E},   {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

// DeepSeek LLM's punctuation class: ASCII without digits (letters included: they are split off before),
// fullwidth forms, curly quotes, U+3000..U+3002 (U+3000 is whitespace, so it never matches).
constexpr Range kDeepseekPunct[] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};

// [一-龥ࠀ-一가-퟿]: U+0800..U+9FA5 (one range in all but name) and Hangul syllables through U+D7FF.
constexpr Range kDeepseekCjk[] = {{0x800, 0x9FA5}, {0xAC00, 0xD7FF}};

// [一-龥぀-ゟ゠-ヿ]: CJK ideographs, hiragana, katakana.
constexpr Range kDeepseek3Cjk[] = {{0x3040, 0x30FF}, {0x4E00, 0x9FA5}};

// What [^(\s|.,!?…。，、।۔،)] leaves out besides whitespace (bloom's pattern lists '(', '|', ')' too).
constexpr Range kBloomStops[] = {
    {0x21, 0x21}, {0x28, 0x29}, {0x2C, 0x2C}, {0x2E, 0x2E},     {0x3F, 0x3F},     {0x7C, 0x7C},
    {0x60C, 0x60C}, {0x6D4, 0x6D4}, {0x964, 0x964}, {0x2026, 0x2026}, {0x3001, 0x3002}, {0xFF0C, 0xFF0C},
};

// The code point a non-\p pattern sees (see the header comment).
uint32_t wide(const Cp& c) { return (c.c > 0x7F && c.c != kInvalid && (c.flags & kW)) ? 0x0Bu : c.c; }

template <size_t N>
bool in_ranges(const Range (&r)[N], uint32_t c) {
  // the first range that ends at or after c (the tables are sorted and disjoint)
  const Range* it = std::lower_bound(std::begin(r), std::end(r), c, [](const Range& x, uint32_t v) { return x.hi < v; });
  return it != std::end(r) && it->lo <= c;
}

bool is_nl(uint32_t c) { return c == '\r' || c == '\n'; }
bool is_ascii_digit(uint32_t c) { return c >= '0' && c <= '9'; }
bool is_ascii_alpha(uint32_t c) { return (c | 0x20u) >= 'a' && (c | 0x20u) <= 'z'; }
// ASCII punctuation and symbols: !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~
bool is_ascii_punct(uint32_t c) { return c > 0x20 && c < 0x7F && !is_ascii_alpha(c) && !is_ascii_digit(c); }

// One pattern over [b, e): `match(pos)` returns the end of the match that starts at pos, or pos if none does.
// Matches are pieces, and so is each run of characters between them.
template <class Match>
void regex_split(size_t b, size_t e, Match match, std::vector<size_t>& ends) {
  size_t gap = b;
  for (size_t pos = b; pos < e;) {
    const size_t end = match(pos);
    if (end == pos) {
      ++pos;
      continue;
    }
    if (pos > gap) ends.push_back(pos);
    ends.push_back(end);
    pos = gap = end;
  }
  if (e > gap) ends.push_back(e);
}

// Runs one pattern over every piece of `pieces` (piece end indices); `stage(b, e, out)` splits one.
template <class Stage>
std::vector<size_t> each_piece(const std::vector<size_t>& pieces, Stage stage) {
  std::vector<size_t> out;
  out.reserve(pieces.size() * 2);
  size_t b = 0;
  for (size_t e : pieces) {
    stage(b, e, out);
    b = e;
  }
  return out;
}

class Chain {
 public:
  explicit Chain(const Cps& cp) : cp_(cp) {
    if (!cp.empty()) pieces_.push_back(cp.size());
  }

  // X  (each matching character alone)
  template <class Pred>
  Chain& single(Pred pred) {
    return pass([pred](size_t b, size_t e, std::vector<size_t>& out) {
      regex_split(b, e, [&](size_t p) { return pred(p) ? p + 1 : p; }, out);
    });
  }

  // X{1,max}  (max = 0: X+)
  template <class Pred>
  Chain& runs(Pred pred, size_t max = 0) {
    return pass([pred, max](size_t b, size_t e, std::vector<size_t>& out) {
      regex_split(b, e, [&](size_t p) {
        size_t q = p;
        while (q < e && pred(q) && (max == 0 || q - p < max)) ++q;
        return q;
      }, out);
    });
  }

  // O?X+  (an O character is taken only when X follows it)
  template <class Opt, class Pred>
  Chain& opt_runs(Opt opt, Pred pred) {
    return pass([opt, pred](size_t b, size_t e, std::vector<size_t>& out) {
      regex_split(b, e, [&](size_t p) {
        size_t q = p;
        if (!pred(q) && opt(q) && q + 1 < e && pred(q + 1)) ++q;
        if (!pred(q)) return p;
        while (q < e && pred(q)) ++q;
        return q;
      }, out);
    });
  }

  // \s?X+
  template <class Pred>
  Chain& ws_runs(Pred pred) {
    const Cps& cp = cp_;
    return opt_runs([&cp](size_t k) { return (cp[k].flags & kW) != 0; }, pred);
  }

  // \s+$  (the whitespace that ends the piece)
  Chain& trailing_ws() {
    const Cps& cp = cp_;
    return pass([&cp](size_t b, size_t e, std::vector<size_t>& out) {
      size_t t = e;
      while (t > b && (cp[t - 1].flags & kW)) --t;
      regex_split(b, e, [&](size_t p) { return p == t ? e : p; }, out);
    });
  }

  // [0-9][0-9][0-9]
  Chain& ascii_digit_triples() {
    const Cps& cp = cp_;
    return pass([&cp](size_t b, size_t e, std::vector<size_t>& out) {
      regex_split(b, e, [&](size_t p) {
        const bool m = p + 3 <= e && is_ascii_digit(cp[p].c) && is_ascii_digit(cp[p + 1].c) &&
                       is_ascii_digit(cp[p + 2].c);
        return m ? p + 3 : p;
      }, out);
    });
  }

  Chain& gpt2() {
    const Cps& cp = cp_;
    return pass([&cp](size_t b, size_t e, std::vector<size_t>& out) { split_gpt2(cp, b, e, out); });
  }

  template <class Stage>
  Chain& pass(Stage stage) {
    pieces_ = each_piece(pieces_, stage);
    return *this;
  }

  void append_to(std::vector<size_t>& ends) const { ends.insert(ends.end(), pieces_.begin(), pieces_.end()); }

 private:
  const Cps& cp_;
  std::vector<size_t> pieces_;
};

// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
size_t match_deepseek3(const Cps& cp, size_t pos, size_t e) {
  auto fl = [&](size_t k) -> uint8_t { return k < e ? cp[k].flags : 0; };
  const uint32_t c = cp[pos].c;
  const uint8_t f = cp[pos].flags;
  if (is_ascii_punct(c) && pos + 1 < e && is_ascii_alpha(cp[pos + 1].c)) {
    size_t q = pos + 1;
    while (q < e && is_ascii_alpha(cp[q].c)) ++q;
    return q;
  }
  // a mark is both an allowed prefix and part of the run, so either way the run starts right after c
  const bool prefix_ok = !is_nl(c) && !(f & (kL | kP | kS));
  if ((f & (kL | kM)) || (prefix_ok && (fl(pos + 1) & (kL | kM)))) {
    size_t q = pos + 1;
    while (fl(q) & (kL | kM)) ++q;
    return q;
  }
  const size_t q0 = pos + (c == ' ' ? 1 : 0);
  if (fl(q0) & (kP | kS)) {
    size_t q = q0;
    while (fl(q) & (kP | kS)) ++q;
    while (q < e && is_nl(cp[q].c)) ++q;
    return q;
  }
  if (f & kW) return match_whitespace(cp, pos, e, true);
  return pos;
}

// [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*
// at the letter `s`: llama.cpp's rewrite of tekken's / gpt-4o's [\p{Lu}..]*[\p{Ll}..]+|[\p{Lu}..]+[\p{Ll}..]*. On
// its collapsed text only ASCII letters have a case: A-Z count as upper, a-z as lower, every other letter as
// both. Returns the end (> s, since a letter always matches one of the two).
size_t match_cased_word(const Cps& cp, size_t s, size_t e) {
  auto letter = [&](size_t k) { return k < e && (cp[k].flags & kL); };
  auto upper = [&](size_t k) { return letter(k) && !(cp[k].c >= 'a' && cp[k].c <= 'z'); };
  auto lower = [&](size_t k) { return letter(k) && !(cp[k].c >= 'A' && cp[k].c <= 'Z'); };
  size_t u = s;
  while (upper(u)) ++u;
  // upper* lower+: backtracking gives the upper run back one character at a time until a lower one follows
  for (size_t k = u + 1; k-- > s;) {
    if (!lower(k)) continue;
    size_t q = k;
    while (lower(q)) ++q;
    return q;
  }
  return u;  // upper+ (no lower character after or inside the run, so lower* is empty)
}

// tekken (max_digits 1) / gpt-4o (max_digits 3, with contractions):
// <cased word>('s|'t|'re|'ve|'m|'ll|'d, any case)?|\p{N}{1,max}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_tekken(const Cps& cp, size_t pos, size_t e, size_t max_digits, bool contractions) {
  const uint32_t c = cp[pos].c;
  const uint8_t f = cp[pos].flags;
  // the optional prefix is no letter, so with or without it only one start can begin a word
  const size_t s = (!(f & (kL | kN)) && !is_nl(c)) ? pos + 1 : pos;
  if (s < e && (cp[s].flags & kL)) {
    size_t end = match_cased_word(cp, s, e);
    if (contractions && end < e) end += match_contraction(cp, end, e, true);
    return end;
  }
  if (f & kN) {
    size_t q = pos;
    while (q < e && q - pos < max_digits && (cp[q].flags & kN)) ++q;
    return q;
  }
  const size_t q0 = pos + (c == ' ' ? 1 : 0);
  if (q0 < e && !(cp[q0].flags & (kW | kL | kN))) {
    size_t q = q0;
    while (q < e && !(cp[q].flags & (kW | kL | kN))) ++q;
    while (q < e && (is_nl(cp[q].c) || cp[q].c == '/')) ++q;
    return q;
  }
  if (f & kW) return match_whitespace(cp, pos, e, true);
  return pos;
}

}  // namespace

void split_chain(PreKind kind, const Cps& cp, std::vector<size_t>& ends) {
  auto flag = [&cp](uint8_t m) { return [&cp, m](size_t k) { return (cp[k].flags & m) != 0; }; };
  auto nl = [&cp](size_t k) { return is_nl(cp[k].c); };
  auto table = [&cp](const auto& r) { return [&cp, &r](size_t k) { return in_ranges(r, wide(cp[k])); }; };
  // [\p{P}\$\+<=>\^~\|] (+ '`' for falcon): \p{P} plus the ASCII symbols named (not \p{S} as a whole)
  auto punct_and = [&cp](bool backtick) {
    return [&cp, backtick](size_t k) {
      const uint32_t c = cp[k].c;
      return (cp[k].flags & kP) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
             c == '~' || c == '|' || (backtick && c == '`');
    };
  };

  Chain ch(cp);
  switch (kind) {
    case PreKind::FALCON:
      ch.runs(punct_and(true)).gpt2().ascii_digit_triples();
      break;
    case PreKind::STARCODER:
      ch.single(flag(kN)).gpt2();
      break;
    case PreKind::DEEPSEEK_LLM:
      ch.single(nl)
          .ws_runs(table(kDeepseekLetters))
          .ws_runs(table(kDeepseekPunct))
          .trailing_ws()
          .runs(table(kDeepseekCjk))
          .runs(flag(kN));
      break;
    case PreKind::DEEPSEEK_CODER:
      ch.single(nl).ws_runs(flag(kL)).ws_runs(flag(kP)).runs(table(kDeepseekCjk)).single(flag(kN));
      break;
    case PreKind::DEEPSEEK3:
      ch.runs(flag(kN), 3).runs(table(kDeepseek3Cjk)).pass([&cp](size_t b, size_t e, std::vector<size_t>& out) {
        regex_split(b, e, [&](size_t p) { return match_deepseek3(cp, p, e); }, out);
      });
      break;
    case PreKind::TEKKEN:
    case PreKind::GPT4O: {
      const bool gpt4o = kind == PreKind::GPT4O;
      ch.pass([&cp, gpt4o](size_t b, size_t e, std::vector<size_t>& out) {
        regex_split(b, e, [&](size_t p) { return match_tekken(cp, p, e, gpt4o ? 3 : 1, gpt4o); }, out);
      });
      break;
    }
    case PreKind::BLOOM:
    case PreKind::VIKING:
      // " ?[^(\s|.,!?…。，、।۔،)]+" (, \p{N})
      ch.opt_runs([&cp](size_t k) { return cp[k].c == ' '; },
                  [&cp](size_t k) { return !(cp[k].flags & kW) && !in_ranges(kBloomStops, wide(cp[k])); });
      if (kind == PreKind::VIKING) ch.single(flag(kN));
      break;
    default:  // DEFAULT
      ch.runs(punct_and(false)).gpt2().runs(flag(kN)).ascii_digit_triples();
      break;
  }
  ch.append_to(ends);
}

}  // namespace kvpack::tokenizer_detail
