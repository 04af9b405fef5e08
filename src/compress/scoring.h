// Importance scores of cached keys, one float per slot of a stream (higher = more worth keeping).
// Each function scores the live slots [0, n) of the streams it is given; protection (sinks, window,
// prompt) and the budget are applied afterwards by selection.h, so scores never encode them.
//
//   knorm        -||k||                                   (KNorm press: low-norm keys draw attention)
//   triattention  mean over 17 future offsets of the trigonometric series from calibrated pre-RoPE query
//                 centres, plus the norm term; computed on post-RoPE keys and the scalar position t
//                 (research/triattention.md §2.3), z-normalised per query head, max over the GQA group
//   snapkv        mean over the last w queries of softmax(max-over-group q·k/√d) over non-window keys,
//                 max-pooled with kernel 7                (triattention repo §7, decode-time variant)
//   rkv           λ·snapkv − (1−λ)·redundancy, λ = 0.1, cosine threshold 0.5 keeping the newest copy
//   tova          last query's attention averaged over all heads of the layer (shared by its KV heads)
//   h2o           accumulated attention probability mass (from the attention kernel)
// Thread-safety: pure functions over the given data.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "compress/calibration.h"
#include "kv/sequence_kv.h"

namespace kvpack::compress {

// Copies slot `slot` of a stream's K (or V) row into f32.
void load_key(const kv::SequenceKv& kv, int32_t stream, int32_t slot, float* out);
void load_value(const kv::SequenceKv& kv, int32_t stream, int32_t slot, float* out);

void score_knorm(const kv::SequenceKv& kv, int32_t stream, std::span<float> out);

// Per-band future-offset averages for position t: C_f = mean_δ cos(ω_f (t+δ)), S_f = mean_δ sin(...),
// δ ∈ {1, 2, 4, ..., 65536}. ω_f from the model's RoPE (theta, linear scaling).
void tri_offset_table(const ModelConfig& c, int64_t t, std::vector<float>& C, std::vector<float>& S);

// TriAttention raw scores of every slot of stream (layer, kv_head) for each of the G query heads of its
// GQA group, using the offset tables: out[g * n_slots + j]. Each key is read and its band magnitudes
// computed once for the whole group.
void score_triattention_group(const kv::SequenceKv& kv, const ModelConfig& c, const QueryStats& qs, int32_t layer,
                              int32_t kv_head, std::span<const float> C, std::span<const float> S, std::span<float> out);

// Window attention: A[w][n] = max over the GQA group of (q_i · k_j) * scale for the last-w queries of
// this layer (queries: [w][n_head * head_dim], post-RoPE). Result in `logits` (w * n floats).
void window_logits(const kv::SequenceKv& kv, const ModelConfig& c, int32_t layer, int32_t kv_head,
                   std::span<const float> queries, int32_t w, std::vector<float>& logits);

// SnapKV importance from window logits: softmax over keys [0, n - w_keys), mean over the w queries,
// max-pool (kernel 7). Slots in the last w_keys get 0 (they are the protected window).
void snapkv_from_logits(std::span<const float> logits, int32_t w, int32_t n, int32_t w_keys, std::span<float> out);

// R-KV redundancy of keys [0, n - w_keys): softmax_j(mean_i C[i,j]) with C the cosine similarity
// matrix (zero diagonal, the newest near-duplicate (>0.5) of each row exempted).
void rkv_redundancy(const kv::SequenceKv& kv, int32_t stream, int32_t n, int32_t w_keys, std::span<float> out);

}  // namespace kvpack::compress
