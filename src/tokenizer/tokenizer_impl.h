// Tokenizer internals shared by the tokenizer's translation units (not part of the public API):
// tokenizer.cpp builds Tokenizer::Impl and decodes, tokenizer_encode.cpp encodes (SPM and BPE),
// tokenizer_load.cpp reads GGUF / llama2.c vocabularies. Kept in one header so the three files agree
// on the tables' layout and on the bigram-merge loop that SPM and BPE share.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace kvpack {
namespace tokenizer_detail {

inline constexpr const char* kEscapedSpace = "\xE2\x96\x81";  // U+2581

// Transparent hash so string_view lookups don't allocate.
struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

// Length of the "UTF-8 character" starting with byte b, by its high nibble (llama.cpp's
// unicode_len_utf8: continuation / invalid lead bytes count as 1).
inline size_t utf8_len_by_lead(unsigned char b) {
  static constexpr size_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[b >> 4];
}

// "<0xXX>" -> byte value, -1 otherwise.
int parse_byte_token(std::string_view s);

void replace_all(std::string& s, std::string_view from, std::string_view to);

struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t off;  // byte offset into the word
  uint32_t n;    // bytes (0 once merged away)
  bool frozen;   // llama2.c mode: unknown character already turned into byte tokens
};

// The bigram-merge loop SPM and BPE share: repeatedly merges the best pair of neighbouring symbols
// until no neighbouring pair is mergeable. `priority(left, right)` returns the pair's priority, or
// nullopt when the concatenation is not mergeable; the highest priority merges first, ties go to the
// leftmost pair. SPM ranks by token score, BPE by negated merge rank (lower rank = merged earlier).
// Merged-away symbols keep n == 0 and drop out of the prev/next chain that starts at symbol 0.
template <class Priority, class PriorityOf>
void merge_best_pairs(std::vector<Symbol>& sym, PriorityOf&& priority) {
  struct Bigram {
    int32_t left, right;
    Priority priority;
    uint32_t size;
  };
  struct Cmp {
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
    }
  };
  std::priority_queue<Bigram, std::vector<Bigram>, Cmp> q;
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const Symbol& a = sym[static_cast<size_t>(l)];
    const Symbol& b = sym[static_cast<size_t>(r)];
    const std::optional<Priority> p = priority(a, b);
    if (!p) return;
    q.push(Bigram{l, r, *p, a.n + b.n});
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
}

}  // namespace tokenizer_detail

struct Tokenizer::Impl {
  VocabData v;
  tokenizer_detail::PreInfo pre{tokenizer_detail::PreKind::DEFAULT, false, false};
  std::string pre_name;  // normalized ("" for SPM)
  tokenizer_detail::TokenMap tok2id;
  std::vector<uint8_t> types;  // effective types (EOG texts forced to control)
  std::vector<uint8_t> eog;
  std::vector<std::string> pieces;
  std::array<int32_t, 256> byte_tok{};  // byte fallback token per byte (-1: none)
  // BPE
  tokenizer_detail::TokenMap merge_rank;  // "left right" -> rank
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

}  // namespace kvpack
