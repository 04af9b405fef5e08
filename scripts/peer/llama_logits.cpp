// llama.cpp side of `kvpack eval parity`: teacher-forced next-token logits of llama.cpp on token windows
// that kvpack chose, so both engines see exactly the same ids (tokenizer parity is tested separately).
// Built against the llama.cpp source bundled in node-llama-cpp by scripts/peer/build_llama_tools.sh; not
// part of the kvpack build (it links llama.cpp, which kvpack never does).
//
//   llama_logits MODEL.gguf WINDOWS.bin LOGITS.bin [THREADS]
// WINDOWS.bin: int32 n_windows, int32 ctx, then n_windows * ctx int32 token ids (BOS included where the
//              model has one: kvpack writes the windows exactly as it evaluates them).
// LOGITS.bin:  int32 n_windows, int32 ctx, int32 n_vocab, then n_windows * ctx * n_vocab float32 logits;
//              row t of a window is the distribution over token t + 1.
// Each window is one batch from an empty cache (all positions output), f16 KV as llama.cpp defaults,
// flash attention off. Exit status 1 with a message on stderr on any failure.
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "llama.h"

namespace {

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "llama_logits: %s\n", msg.c_str());
  std::exit(1);
}

bool read_i32(FILE* f, int32_t* v, size_t n) { return std::fread(v, sizeof(int32_t), n, f) == n; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) fail("usage: llama_logits MODEL.gguf WINDOWS.bin LOGITS.bin [THREADS]");
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;

  FILE* in = std::fopen(argv[2], "rb");
  if (!in) fail(std::string("cannot open ") + argv[2]);
  int32_t head[2];
  if (!read_i32(in, head, 2) || head[0] <= 0 || head[1] <= 1 || head[0] > (1 << 16) || head[1] > (1 << 20))
    fail(std::string(argv[2]) + ": bad header");
  const int32_t n_windows = head[0], ctx = head[1];
  std::vector<int32_t> ids(static_cast<size_t>(n_windows) * ctx);
  if (!read_i32(in, ids.data(), ids.size())) fail(std::string(argv[2]) + ": truncated");
  std::fclose(in);

  // llama.cpp's own progress lines would drown kvpack's output: warnings and errors only.
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  // LLAMA_LOGITS_NO_REPACK=1: llama.cpp's plain per-row dot products instead of its repacked (interleaved)
  // weight layouts, which it picks for Q4_0 / Q4_K / Q5_K / Q6_K / Q2_K / IQ4_NL / Q8_0 on AVX2 CPUs.
  if (const char* e = std::getenv("LLAMA_LOGITS_NO_REPACK"); e && *e == '1') mp.use_extra_bufts = false;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) fail(std::string("llama.cpp could not load ") + argv[1]);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);
  for (int32_t id : ids)
    if (id < 0 || id >= n_vocab) fail("token id " + std::to_string(id) + " outside the vocabulary");

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(ctx);
  cp.n_batch = static_cast<uint32_t>(ctx);
  cp.n_ubatch = static_cast<uint32_t>(ctx);
  // LLAMA_LOGITS_UBATCH=N: physical batches of N tokens (llama.cpp against itself at another batch size:
  // the noise floor of any comparison that quantises activations).
  if (const char* e = std::getenv("LLAMA_LOGITS_UBATCH"); e && std::atoi(e) > 0)
    cp.n_ubatch = static_cast<uint32_t>(std::min(ctx, std::atoi(e)));
  cp.n_seq_max = 1;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.no_perf = true;
  llama_context* lctx = llama_init_from_model(model, cp);
  if (!lctx) fail("llama.cpp could not create a context");

  FILE* out = std::fopen(argv[3], "wb");
  if (!out) fail(std::string("cannot create ") + argv[3]);
  const int32_t out_head[3] = {n_windows, ctx, n_vocab};
  std::fwrite(out_head, sizeof(int32_t), 3, out);

  llama_batch batch = llama_batch_init(ctx, 0, 1);
  for (int32_t w = 0; w < n_windows; ++w) {
    llama_memory_clear(llama_get_memory(lctx), true);
    batch.n_tokens = ctx;
    for (int32_t t = 0; t < ctx; ++t) {
      batch.token[t] = ids[static_cast<size_t>(w) * ctx + t];
      batch.pos[t] = t;
      batch.n_seq_id[t] = 1;
      batch.seq_id[t][0] = 0;
      batch.logits[t] = 1;
    }
    if (llama_decode(lctx, batch) != 0) fail("llama_decode failed on window " + std::to_string(w));
    for (int32_t t = 0; t < ctx; ++t) {
      const float* row = llama_get_logits_ith(lctx, t);
      if (!row) fail("no logits for position " + std::to_string(t));
      if (std::fwrite(row, sizeof(float), static_cast<size_t>(n_vocab), out) != static_cast<size_t>(n_vocab))
        fail(std::string("write failed: ") + argv[3]);
    }
  }
  llama_batch_free(batch);
  if (std::fclose(out) != 0) fail(std::string("write failed: ") + argv[3]);
  llama_free(lctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
