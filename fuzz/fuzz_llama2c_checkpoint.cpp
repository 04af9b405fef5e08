// Model::load on arbitrary bytes as a file (llama2.c checkpoints, and whatever else a path may hold:
// the loader picks the format by content), with the real 512-token llama2.c tokenizer. Must end in a
// ModelError / std::runtime_error or a model whose weights lie inside what was read.
#include <cstdint>
#include <cstdio>

#include "fuzz_common.h"
#include "model/model.h"

using namespace kvpack;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_path("ckpt");
  static const std::string tok = fuzz::shared_dir() + "/models/tok512.bin";
  FILE* out = std::fopen(path.c_str(), "wb");
  if (!out) std::abort();
  if (size) std::fwrite(data, 1, size, out);
  std::fclose(out);
  try {
    const auto m = Model::load(path, tok);
    const ModelWeights& w = m->weights();
    volatile float sink = 0;
    // First and last element of every matrix the model points to: ASan checks they are inside the buffer.
    auto touch = [&](const Weight& x) {
      if (!x) return;
      sink = sink + x.f32()[0] + x.f32()[x.n_in * x.n_out - 1];
    };
    touch(w.tok_embd);
    touch(w.output);
    touch(w.out_norm);
    for (const auto& l : w.layers)
      for (const Weight* x : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) touch(*x);
    fuzz::check_ids(m->tokenizer(), m->tokenizer().encode("Once upon a time", true));
  } catch (const std::runtime_error&) {
  }
  return 0;
}
