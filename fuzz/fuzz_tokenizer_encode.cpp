// Every real tokenizer (shared/vocab: SPM and each BPE pre-tokenizer) on arbitrary bytes: the first
// byte picks the tokenizer and the flags, the rest is the text. encode (with and without special-token
// parsing), decode of the result, decode of the raw bytes read as token ids (out-of-range ids
// included), and one pre-tokenizer's split, the kind picked by the last byte (it must cover the text
// exactly, in order). One kind per input, not all fourteen: the fuzzer combines kinds and texts itself,
// and all of them on every input of up to 4 KiB ran at ~150-600 executions a second under ASan.
#include <cstdint>
#include <cstring>
#include <iterator>

#include "fuzz_common.h"
#include "tokenizer/pretokenize.h"

using namespace kvpack;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto& all = fuzz::vocab_tokenizers();
  const Tokenizer& tok = all[(data[0] & 0x1f) % all.size()].tok;
  const bool add_bos = data[0] & 0x20, parse_special = data[0] & 0x40;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  const auto ids = tok.encode(text, add_bos, parse_special);
  fuzz::check_ids(tok, ids);
  (void)tok.decode(ids);

  std::vector<int32_t> raw(text.size() / 4);
  if (!raw.empty()) std::memcpy(raw.data(), text.data(), raw.size() * 4);
  (void)tok.decode(raw);

  using tokenizer_detail::PreKind;
  static constexpr PreKind kKinds[] = {PreKind::GPT2,      PreKind::LLAMA3,       PreKind::QWEN2,
                                       PreKind::QWEN35,    PreKind::DEFAULT,      PreKind::FALCON,
                                       PreKind::STARCODER, PreKind::DEEPSEEK_LLM, PreKind::DEEPSEEK_CODER,
                                       PreKind::DEEPSEEK3, PreKind::TEKKEN,       PreKind::GPT4O,
                                       PreKind::BLOOM,     PreKind::VIKING};
  const PreKind k = kKinds[data[size - 1] % std::size(kKinds)];
  size_t at = 0;
  for (const auto& [b, e] : tokenizer_detail::pretokenize_ranges(k, text)) {
    if (b != at || e <= b || e > text.size()) std::abort();
    at = e;
  }
  if (at != text.size()) std::abort();
  return 0;
}
