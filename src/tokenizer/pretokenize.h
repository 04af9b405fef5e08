// BPE pre-tokenizers (internal). Hand-written matchers equivalent to the regexes llama.cpp uses for
// each `tokenizer.ggml.pre` type; Unicode categories come from ICU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvpack::tokenizer_detail {

enum class PreKind {
  GPT2,     // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  LLAMA3,   // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  QWEN2,    // same as LLAMA3 but \p{N} (single digits)
  QWEN35,   // same as QWEN2 but letter runs are [\p{L}\p{M}]+ and the symbol run excludes \p{M}
  // The rest are chains: each pattern splits every piece the previous one left (matches and gaps both kept).
  DEFAULT,         // [\p{P}\$\+<=>\^~\|]+ , GPT2 , \p{N}+ , [0-9][0-9][0-9]
  FALCON,          // [\p{P}\$\+<=>\^~\|`]+ , GPT2 , [0-9][0-9][0-9]
  STARCODER,       // \p{N} , GPT2
  DEEPSEEK_LLM,    // [\r\n] , \s?[latin/greek/cyrillic/... letters]+ , \s?[ASCII/fullwidth punctuation]+ , \s+$ ,
                   // [CJK/Hangul]+ , \p{N}+
  DEEPSEEK_CODER,  // [\r\n] , \s?\p{L}+ , \s?\p{P}+ , [CJK/Hangul]+ , \p{N}
  DEEPSEEK3,       // \p{N}{1,3} , [CJK/kana]+ , [ASCII punct][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
                   // ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  // llama.cpp's rewrite of [\p{Lu}..]*[\p{Ll}..]+|[\p{Lu}..]+[\p{Ll}..]* with lookaheads (case = ASCII case only):
  TEKKEN,  // <cased word>|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
  GPT4O,   // <cased word><contraction>?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
  BLOOM,   //  ?[^(\s|.,!?…。，、।۔،)]+
  VIKING,  // BLOOM , \p{N}
};

struct PreInfo {
  PreKind kind;
  bool ignore_merges;    // a whole pre-token that is itself a vocab token is emitted without merging
  bool add_bos_default;  // llama.cpp's default for tokenizer.ggml.add_bos_token
};

// Maps a tokenizer.ggml.pre name to its pre-tokenizer; false if unsupported. "" maps to DEFAULT.
bool lookup_pre(std::string_view name, PreInfo* out);

// Splits `text` into pre-tokens; returns [begin, end) byte ranges covering the whole text in order.
// Invalid UTF-8 bytes are kept (each one is treated as a single "other" character).
std::vector<std::pair<size_t, size_t>> pretokenize_ranges(PreKind kind, std::string_view text);

}  // namespace kvpack::tokenizer_detail
