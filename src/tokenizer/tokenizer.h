// Tokenizers: SentencePiece-style (SPM, "llama") and GPT-2-style byte-level BPE ("gpt2").
//
// Reproduces llama.cpp's tokenization (which produced the vectors in shared/vocab/*.inp/.out):
//  - SPM: spaces escaped as U+2581, optional space prefix, greedy highest-score pair merging over
//    UTF-8 characters, byte fallback to <0xXX> tokens.
//  - BPE: regex pre-tokenizer chosen by `pre` (gpt-2, llama-bpe/llama3, qwen2, default, ...), GPT-2
//    byte-to-unicode mapping, merges by rank.
//  - User-defined tokens are always matched as whole tokens in the input text (as llama.cpp does);
//    control tokens only when encode(..., parse_special = true).
// A Tokenizer is immutable after construction; all const methods are thread-safe. Copies are cheap
// (shared immutable state).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvpack {
namespace gguf {
class File;
}

// Everything a tokenizer needs, independent of the file format it came from.
struct VocabData {
  enum class Kind { SPM, BPE } kind = Kind::SPM;
  std::string pre;  // BPE pre-tokenizer: "gpt-2", "llama-bpe", "qwen2", "default", ... (ignored for SPM)
  std::vector<std::string> tokens;
  std::vector<float> scores;         // SPM merge priorities; may be empty (all 0)
  std::vector<int32_t> token_types;  // ggml token types: 1 normal, 2 unknown, 3 control, 4 user-defined,
                                     // 5 unused, 6 byte; may be empty (all normal)
  std::vector<std::string> merges;   // BPE merges "a b", rank = index
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = false;
  bool add_space_prefix = true;  // SPM only
  // SPM variant of llama2.c's run.c: pieces contain plain ' ' (no U+2581 escaping), the input is split
  // into UTF-8 characters the way llama2.c does it, and a character that is not in the vocab is
  // replaced by its byte tokens *before* merging (so it never takes part in a merge).
  bool llama2c = false;
};

class Tokenizer {
 public:
  // ggml token types
  static constexpr int32_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4,
                           kTypeUnused = 5, kTypeByte = 6;
  // Largest vocabulary a file may declare (real ones are <= 2^18): bounds what a forged token count
  // can make the loaders reserve.
  static constexpr int64_t kMaxVocab = int64_t{1} << 24;

  // Throws std::runtime_error on inconsistent data (size mismatches, unsupported `pre`, ...).
  explicit Tokenizer(VocabData v);

  // Reads the tokenizer.ggml.* keys. Throws std::runtime_error naming the key / model / pre-tokenizer
  // when something is missing or unsupported.
  static Tokenizer from_gguf(const gguf::File& f);
  // llama2.c tokenizer.bin (e.g. tok512.bin): int32 max_token_length, then per token float32 score,
  // int32 len, len bytes. BOS = 1, EOS = 2, tokens "<0xXX>" are byte tokens. Throws std::runtime_error
  // on a truncated / malformed file.
  static Tokenizer from_llama2c(const std::string& tokenizer_path, int32_t vocab_size);
  static Tokenizer from_llama2c_bytes(std::string_view file_bytes, int32_t vocab_size,
                                      const std::string& name = "<memory>");

  // add_bos prepends BOS if the vocab has one. parse_special: also match control-token texts
  // (e.g. "<|im_start|>") in `text` and emit them as single tokens.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = false) const;

  // Raw bytes of the token as it appears in text (may be a partial UTF-8 sequence). Control,
  // unknown and unused tokens -> "". Out-of-range ids -> "".
  std::string piece(int32_t token) const;
  // Streaming helper: the piece of `token` when it follows `prev` (llama2.c's decode(prev, token)):
  // for SPM vocabs with a space prefix, a leading ' ' is dropped when prev is BOS.
  std::string piece_after(int32_t prev, int32_t token) const;
  // Concatenated pieces. SPM with add_space_prefix: the single leading space of the piece at the very
  // start of the sequence, or right after a BOS token, is dropped (so decode(encode(x)) == x).
  std::string decode(std::span<const int32_t> tokens) const;

  int32_t bos() const;
  int32_t eos() const;
  int32_t unk() const;
  int32_t pad() const;
  int32_t n_vocab() const;
  bool add_bos_default() const;
  VocabData::Kind kind() const;
  const std::string& pre() const;             // normalized pre-tokenizer name ("" for SPM)
  const std::string& token_text(int32_t t) const;  // vocab string as stored (throws if out of range)
  int32_t token_type(int32_t t) const;        // ggml type, 0 if out of range
  int32_t find_token(std::string_view text) const;  // exact vocab string -> id, -1 if absent

  bool is_control(int32_t t) const;  // control type (includes EOG tokens detected by text)
  bool is_eog(int32_t t) const;      // end of generation: eos, and <|im_end|>/<|endoftext|>/<|eot_id|>/...

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

namespace tokenizer_detail {
// Exposed for tests: split `text` into pre-tokens (raw UTF-8 byte ranges, before byte encoding) with
// the regex of BPE pre-tokenizer `pre` ("gpt-2", "llama-bpe", "qwen2", "default", ...).
std::vector<std::string> pretokenize(std::string_view pre, std::string_view text);
// UTF-8 bytes of code point `c` (1 to 4 bytes by its magnitude, no validity check). Used for the GPT-2
// byte-to-unicode table; exposed for tests that build random UTF-8 text.
std::string cpt_to_utf8(uint32_t c);
}  // namespace tokenizer_detail

}  // namespace kvpack
