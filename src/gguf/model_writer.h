// Random-weight model files: GGUFs laid out exactly like llama.cpp's converted llama / qwen2 / qwen3 /
// phi3 / gemma3 models (same keys, tensor names, shapes and types), filled with deterministic pseudo-random
// weights. They exercise the loader, kernels and engine at real sizes (e.g. the Qwen3-0.6B shape)
// without shipping real weights, and llama.cpp itself can load them for speed comparisons.
//
// Determinism: the bytes depend only on the spec (seed included) — not on the library version,
// thread count or chunking — because every tensor row has its own splitmix64 stream keyed by
// (seed, tensor name, row).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "util/dtype.h"

namespace kvpack::gguf {

struct RandomModelSpec {
  // "llama", "qwen2" (q/k/v biases), "qwen3" (q/k norms), "phi3" (fused attn_qkv and gate+up ffn_up;
  // needs n_head_kv == n_head) or "gemma3" (q/k norms, post-attention / post-FFN norms, GeGLU)
  std::string arch = "llama";
  uint32_t n_vocab = 512;      // >= 266: 256 byte tokens, a few merges and the special tokens
  uint32_t n_embd = 64;
  uint32_t n_layer = 2;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;      // must divide n_head
  uint32_t head_dim = 16;      // llama/qwen2/phi3: must equal n_embd / n_head; qwen3/gemma3: free
  uint32_t n_ff = 128;
  uint32_t n_ctx = 256;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  uint32_t sliding_window = 0;   // phi3 / gemma3: <arch>.attention.sliding_window (0: key not written)
  float rope_theta_swa = 10000.0f;  // gemma3 with a window: rope.freq_base_swa (local layers)
  float final_logit_softcapping = 0.0f;  // gemma3: written when > 0
  // llama: > 0 writes rope_freqs.weight with Llama 3.1's "llama3" scaling of this factor (low / high
  // frequency factors 1 / 4, original context 8192), as convert_hf_to_gguf does for Llama 3.1+ models.
  float llama3_rope_factor = 0.0f;
  bool tied_embeddings = false;  // true: no output.weight, the output reuses token_embd.weight
  // 2-D weights: F32, F16, BF16, Q8_0, the K-quants Q2_K..Q6_K, Q5_0, Q5_1, IQ4_NL or IQ4_XS; norms and
  // biases stay F32. For the quantised types other than Q8_0, token_embd / output stay Q8_0 (so a file
  // tests its type's kernels on the layers, not on the vocabulary projection); the super-block types need
  // n_embd, n_head * head_dim, n_ff to be multiples of 256, the 32-block types of 32.
  DType weight_type = DType::F32;
  // "" (every 2-D weight in weight_type, as above) or one of llama.cpp's mixes, with its per-tensor rule
  // (llama_tensor_get_type; weight_type must be its base type):
  //   "q4_k_m" / "q5_k_m": Q4_K / Q5_K, except output.weight and, on the "more bits" layers (first and last
  //   eighth, every third between), attn_v and ffn_down: Q6_K. token_embd stays the base type.
  std::string mix;
  uint64_t seed = 0;

  // "qwen3-0.6b" (Qwen3-0.6B shape, F16), "llama-3.2-1b" (Llama-3.2-1B shape with its llama3 RoPE factors,
  // F16), "gemma3-1b" (Gemma 3 1B shape, window 512, F16), and tiny test models "tiny-llama", "tiny-llama3" (rope_freqs), "tiny-mistral" (Mistral-Nemo style:
  // head_dim != n_embd / n_head, GQA 4:1), "tiny-qwen2", "tiny-qwen3", "tiny-phi3", "tiny-gemma3". Throws
  // Error for unknown names.
  static RandomModelSpec preset(std::string_view name);

  // Throws Error describing the first inconsistency (unknown arch, head_dim mismatch, dims that are
  // not block multiples for Q8_0 / Q4_K, vocab too small, ...).
  void validate() const;
};

// Adds the model's metadata, vocabulary and (streamed) tensors to `w`. The tensors are generated
// when `w` is serialised, one chunk at a time.
void build_random_model(const RandomModelSpec& spec, Writer& w);
// rope_freqs.weight of the llama3 RoPE scaling: rot_dims / 2 divisors of theta^(-2i / rot_dims).
std::vector<float> llama3_rope_factors(float theta, uint32_t rot_dims, float factor);

// build_random_model + Writer::write: peak memory is the vocabulary plus one chunk of one tensor.
void write_random_model(const RandomModelSpec& spec, const std::string& path);

}  // namespace kvpack::gguf
