// GGUF reader on arbitrary bytes: parse, every typed getter on every key, every tensor's data range
// (ASan checks it lies inside the buffer), and the vocab loader (tokenizer.ggml.*) on what parsed.
// Only the documented errors (gguf::Error / std::runtime_error) may come out; anything else is a bug.
#include <cstdint>
#include <cstring>

#include "fuzz_common.h"

using namespace kvpack;

namespace {

void exercise_getters(const gguf::File& f) {
  for (const auto& kv : f.metadata()) {
    const std::string& k = kv.key;
    try { (void)f.get_string(k); } catch (const gguf::Error&) {}
    try { (void)f.get_int(k); } catch (const gguf::Error&) {}
    try { (void)f.get_float(k); } catch (const gguf::Error&) {}
    try { (void)f.get_bool(k); } catch (const gguf::Error&) {}
    try { (void)f.get_string_array(k); } catch (const gguf::Error&) {}
    try { (void)f.get_float_array(k); } catch (const gguf::Error&) {}
    try { (void)f.get_int_array(k); } catch (const gguf::Error&) {}
    if (f.find(k) != &kv.value) std::abort();
  }
}

void touch_tensors(const gguf::File& f) {
  volatile uint8_t sink = 0;
  for (const auto& t : f.tensors()) {
    if (f.tensor(t.name) != &t) std::abort();
    if (t.n_bytes == 0) continue;
    const auto* p = static_cast<const uint8_t*>(t.data);
    sink = static_cast<uint8_t>(sink + p[0] + p[t.n_bytes - 1]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<gguf::File> f;
  try {
    f = gguf::File::parse(data, size, "fuzz");
  } catch (const gguf::Error&) {
    return 0;
  }
  exercise_getters(*f);
  touch_tensors(*f);
  try {
    const Tokenizer tok = Tokenizer::from_gguf(*f);
    const auto ids = tok.encode("Hello world! <s> 123 \xe2\x96\x81 caf\xc3\xa9", true, true);
    fuzz::check_ids(tok, ids);
    (void)tok.decode(ids);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
