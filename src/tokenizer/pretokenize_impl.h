// Shared pieces of the pre-tokenizer implementation (pretokenize*.cpp only).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tokenizer/pretokenize.h"

namespace kvpack::tokenizer_detail {

enum : uint8_t {
  kL = 1,   // \p{L}
  kN = 2,   // \p{N}
  kW = 4,   // \s (Unicode White_Space)
  kP = 8,   // \p{P}
  kM = 16,  // \p{M}
  kS = 32,  // \p{S}
};

struct Cp {
  uint32_t c;      // code point; kInvalid for an invalid byte
  uint32_t off;    // byte offset in the text
  uint8_t len;     // bytes
  uint8_t flags;
};

constexpr uint32_t kInvalid = 0xFFFFFFFFu;

using Cps = std::vector<Cp>;

// 's|'t|'re|'ve|'m|'ll|'d at `pos` (< e); returns the match length (0 if none).
size_t match_contraction(const Cps& cp, size_t pos, size_t e, bool case_insensitive);

// The whitespace alternatives at `pos`: [\s*[\r\n]+ |] \s+(?!\S) | \s+ ; returns the end.
size_t match_whitespace(const Cps& cp, size_t pos, size_t e, bool newline_rule);

// The patterns llama.cpp runs through its own hand-written fast paths (unicode.cpp). Each splits [b, e) and
// appends the code-point end index of every piece to `ends`.
void split_gpt2(const Cps& cp, size_t b, size_t e, std::vector<size_t>& ends);
// `letters` is kL (llama3 / qwen2) or kL | kM (qwen35: letter runs take combining marks too).
void split_llama3(const Cps& cp, size_t b, size_t e, size_t max_digits, uint8_t letters, std::vector<size_t>& ends);

// The pre-tokenizers that llama.cpp runs through std::regex (DEFAULT, FALCON, STARCODER, the DeepSeek ones,
// TEKKEN, GPT4O, BLOOM, VIKING). Appends the piece ends of the whole text [0, cp.size()).
void split_chain(PreKind kind, const Cps& cp, std::vector<size_t>& ends);

}  // namespace kvpack::tokenizer_detail
