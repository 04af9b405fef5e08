// llama2.c tokenizer.bin on arbitrary bytes: the first two bytes pick the vocab size the model would
// ask for, the rest is the file. A tokenizer that loads must encode and decode without going out of
// range.
#include <cstdint>
#include <cstring>

#include "fuzz_common.h"

using namespace kvpack;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  uint16_t v;
  std::memcpy(&v, data, 2);
  const int32_t vocab = v == 0xffff ? INT32_MAX : v;  // and 0: rejected
  const std::string_view file(reinterpret_cast<const char*>(data + 2), size - 2);
  try {
    const Tokenizer tok = Tokenizer::from_llama2c_bytes(file, vocab);
    const auto ids = tok.encode("Once upon a time, \xc3\xa9t\xc3\xa9 <0x41> \xff\xfe", true, true);
    fuzz::check_ids(tok, ids);
    (void)tok.decode(ids);
    for (int32_t t = -1; t <= tok.n_vocab() && t < 600; ++t) (void)tok.piece_after(1, t);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
