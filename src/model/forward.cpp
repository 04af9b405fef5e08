#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/matmul_packed.h"
#include "kernels/ops.h"
#include "util/half.h"

namespace kvpack {
namespace {

void matmul(const Weight& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool) {
  if (w.packed != nullptr)
    kernels::matmul_packed(*w.packed, x, n_tokens, y, pool);
  else if (w.packed_k != nullptr)
    kernels::matmul_packed(*w.packed_k, x, n_tokens, y, pool);
  else
    kernels::matmul(w.data, w.type, w.n_out, w.n_in, x, n_tokens, y, pool);
}

void add_bias(float* y, const Weight& b, int64_t n_tokens) {
  if (!b) return;
  for (int64_t t = 0; t < n_tokens; ++t) kernels::add_inplace(y + t * b.n_in, b.f32(), b.n_in);
}

// a[i] = gelu(a[i]) * b[i] with GELU's tanh approximation (GeGLU; ggml_gelu).
void gelu_mul(float* a, const float* b, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f, kCoef = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = a[i];
    a[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoef * x * x))) * b[i];
  }
}

// Prefill query tokens are split into blocks so both threads get attention work even with few KV heads.
constexpr int32_t kAttnTokenBlock = 64;
// Up to this many tokens in a forward call, Q|K|V and gate|up run as one matmul each where the model fused
// them (LayerWeights::wqkv / w_gate_up): at decode the two threads' sync and the activation quantisation per
// matmul cost more than the split; bench_matmul, Q8_0, 2 threads: q + k + v 153 us vs 110 fused, gate + up
// 206 vs 159 (1024 x 2048 / 1024 / 1024, 1024 x 3072 x 2). Larger calls (prefill) keep the separate matmuls.
constexpr int64_t kFusedTokens = 16;
// Attention scratch is sized for pages up to this many slots.
constexpr int32_t kMaxPageSize = 256;

}  // namespace

Forward::Forward(const Model& model, ThreadPool& pool, int32_t max_batch_tokens)
    : model_(&model), pool_(&pool), max_tokens_(max_batch_tokens) {
  const ModelConfig& c = model.config();
  const size_t T = static_cast<size_t>(max_batch_tokens);
  x_.resize(T * c.n_embd);
  xb_.resize(T * std::max(c.n_embd, c.q_dim()));
  q_.resize(T * c.q_dim());
  k_.resize(T * c.kv_dim());
  v_.resize(T * c.kv_dim());
  att_.resize(T * c.q_dim());
  hb_.resize(T * c.n_ff);
  hb2_.resize(T * c.n_ff);
  rope_cs_.resize(T * static_cast<size_t>(c.rope_dims));
  logits_in_.resize(T * c.n_embd);
  fused_.resize(static_cast<size_t>(std::min<int64_t>(T, kFusedTokens)) *
                static_cast<size_t>(std::max<int64_t>(int64_t{c.q_dim()} + 2 * int64_t{c.kv_dim()}, 2 * int64_t{c.n_ff})));
  pos_.resize(T);
  attn_scratch_per_thread_ = kernels::attention_scratch_floats(std::min(kAttnTokenBlock, max_batch_tokens), c.group(),
                                                               c.head_dim, kMaxPageSize);
  attn_scratch_.resize(attn_scratch_per_thread_ * static_cast<size_t>(pool.size()));
  extra_scratch_.resize(static_cast<size_t>(c.group()) * (c.head_dim + 2) * static_cast<size_t>(pool.size()));
  const size_t split_cap = 2 * static_cast<size_t>(pool.size()) * kernels::kAttentionMaxParts;
  split_tasks_.reserve(split_cap);
  split_out_.resize(split_cap * static_cast<size_t>(c.group()) * c.head_dim);
  split_lse_.resize(split_cap * static_cast<size_t>(c.group()));
  if (c.swa_window > 0) {
    rope_cs_swa_.resize(T * static_cast<size_t>(c.rope_dims));
    // acc, m, l, a K and a V row; then the page-aligned body's output rows and log-sum-exps.
    window_scratch_per_thread_ = static_cast<size_t>(c.group()) * (c.head_dim + 2) + 2 * static_cast<size_t>(c.head_dim) +
                                 static_cast<size_t>(c.group()) * (c.head_dim + 1);
    window_scratch_.resize(window_scratch_per_thread_ * static_cast<size_t>(pool.size()));
  }
}

bool Forward::run(std::span<BatchItem> batch, ForwardObserver* observer) {
  const ModelConfig& c = model_->config();
  const ModelWeights& W = model_->weights();
  // Validate everything before touching any KV.
  int32_t total = 0;
  int64_t pages_needed = 0;
  spans_.clear();
  for (const BatchItem& b : batch) {
    const auto n = static_cast<int32_t>(b.tokens.size());
    if (b.kv == nullptr || n == 0) throw std::invalid_argument("forward: empty batch item");
    for (int32_t tok : b.tokens)
      if (tok < 0 || tok >= c.n_vocab) throw std::invalid_argument("forward: token id " + std::to_string(tok) + " out of range");
    if (static_cast<int64_t>(b.kv->next_pos()) + n > c.n_ctx)
      throw std::invalid_argument("forward: position " + std::to_string(b.kv->next_pos() + n) + " exceeds the context length " +
                                  std::to_string(c.n_ctx));
    if (b.kv->pool().config().page_size > kMaxPageSize)
      throw std::invalid_argument("forward: page size above " + std::to_string(kMaxPageSize));
    if (b.kv->pool().config().head_dim != c.head_dim || b.kv->n_layers() != c.n_layer || b.kv->n_kv_heads() != c.n_head_kv)
      throw std::invalid_argument("forward: KV cache shape does not match the model");
    if (b.extra != nullptr && (n != 1 || c.swa_window > 0))
      throw std::invalid_argument("forward: extra KV needs a one-token item and a model without sliding-window layers");
    pages_needed += b.kv->pages_needed(n);
    spans_.push_back({total, n, 0});
    total += n;
  }
  if (total > max_tokens_) throw std::invalid_argument("forward: batch of " + std::to_string(total) + " tokens exceeds " +
                                                       std::to_string(max_tokens_));
  if (!batch.empty() && pages_needed > batch[0].kv->pool().free_pages()) return false;
  for (size_t i = 0; i < batch.size(); ++i) {
    BatchItem& b = batch[i];
    const int32_t pos0 = b.kv->next_pos();
    for (int32_t t = 0; t < spans_[i].n; ++t) pos_[static_cast<size_t>(spans_[i].begin + t)] = pos0 + t;
    spans_[i].slots_before = 0;
    if (!b.kv->append(spans_[i].n, pos0)) {
      for (size_t j = 0; j < i; ++j) batch[j].kv->truncate_tail(spans_[j].n);  // roll back
      return false;
    }
  }

  const int64_t E = c.n_embd, QD = c.q_dim(), KVD = c.kv_dim(), HD = c.head_dim;
  // Embeddings.
  for (size_t i = 0; i < batch.size(); ++i)
    for (int32_t t = 0; t < spans_[i].n; ++t) {
      const int64_t row = spans_[i].begin + t;
      const int32_t tok = batch[i].tokens[static_cast<size_t>(t)];
      const auto* base = static_cast<const uint8_t*>(W.tok_embd.data) + row_bytes(W.tok_embd.type, E) * static_cast<uint64_t>(tok);
      kernels::dequantize_row(base, W.tok_embd.type, E, x_.data() + row * E);
      if (c.embd_scale != 1.0f)
        for (int64_t e = 0; e < E; ++e) x_[static_cast<size_t>(row * E + e)] *= c.embd_scale;
    }
  kernels::rope_table(pos_.data(), total, c.rope_dims, c.rope_theta, 1.0f / c.rope_freq_scale, rope_cs_.data(), c.rope_factors());
  if (c.swa_window > 0)
    kernels::rope_table(pos_.data(), total, c.rope_dims, c.rope_theta_swa, 1.0f / c.rope_freq_scale_swa,
                        rope_cs_swa_.data());

  for (int32_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = W.layers[static_cast<size_t>(l)];
    for (int64_t t = 0; t < total; ++t) kernels::rmsnorm(x_.data() + t * E, L.attn_norm.f32(), E, c.rms_eps, xb_.data() + t * E);
    if (L.wqkv && total <= kFusedTokens) {
      // One matmul over Q|K|V, its rows split after (the same bits per output as the three matmuls).
      matmul(L.wqkv, xb_.data(), total, fused_.data(), pool_);
      for (int64_t t = 0; t < total; ++t) {
        const float* r = fused_.data() + t * (QD + 2 * KVD);
        std::copy(r, r + QD, q_.data() + t * QD);
        std::copy(r + QD, r + QD + KVD, k_.data() + t * KVD);
        std::copy(r + QD + KVD, r + QD + 2 * KVD, v_.data() + t * KVD);
      }
    } else {
      matmul(L.wq, xb_.data(), total, q_.data(), pool_);
      matmul(L.wk, xb_.data(), total, k_.data(), pool_);
      matmul(L.wv, xb_.data(), total, v_.data(), pool_);
    }
    add_bias(q_.data(), L.bq, total);
    add_bias(k_.data(), L.bk, total);
    add_bias(v_.data(), L.bv, total);
    for (int64_t t = 0; t < total; ++t) {
      float* qt = q_.data() + t * QD;
      float* kt = k_.data() + t * KVD;
      if (c.qk_norm) {
        for (int32_t h = 0; h < c.n_head; ++h) kernels::rmsnorm(qt + h * HD, L.q_norm.f32(), HD, c.rms_eps, qt + h * HD);
        for (int32_t h = 0; h < c.n_head_kv; ++h) kernels::rmsnorm(kt + h * HD, L.k_norm.f32(), HD, c.rms_eps, kt + h * HD);
      }
    }
    if (observer)
      for (size_t i = 0; i < batch.size(); ++i)
        observer->on_query_pre_rope(static_cast<int32_t>(i), l, q_.data() + spans_[i].begin * QD, spans_[i].n, QD);
    for (int64_t t = 0; t < total; ++t) {
      const float* cs = (c.is_swa(l) ? rope_cs_swa_.data() : rope_cs_.data()) + t * c.rope_dims;
      for (int32_t h = 0; h < c.n_head; ++h) kernels::rope_apply(q_.data() + t * QD + h * HD, cs, c.rope_dims, c.rope_neox);
      for (int32_t h = 0; h < c.n_head_kv; ++h) kernels::rope_apply(k_.data() + t * KVD + h * HD, cs, c.rope_dims, c.rope_neox);
    }
    if (observer)
      for (size_t i = 0; i < batch.size(); ++i)
        observer->on_query_post_rope(static_cast<int32_t>(i), l, q_.data() + spans_[i].begin * QD, spans_[i].n, QD);
    // Write K/V of the new tokens into their slots (the last n slots of each stream).
    for (size_t i = 0; i < batch.size(); ++i) {
      kv::SequenceKv& kv = *batch[i].kv;
      const DType kt = kv.pool().config().kv_type;
      for (int32_t h = 0; h < c.n_head_kv; ++h) {
        const int32_t s = kv.stream_index(l, h);
        const int32_t first = kv.n_slots(s) - spans_[i].n;
        for (int32_t t = 0; t < spans_[i].n; ++t) {
          const int64_t row = spans_[i].begin + t;
          // f32 -> KV row: copy, round to nearest even (F16/BF16) or ggml's Q8_0 reference quantiser.
          kernels::kv_encode_row(k_.data() + row * KVD + h * HD, kt, HD, kv.k_slot(s, first + t));
          kernels::kv_encode_row(v_.data() + row * KVD + h * HD, kt, HD, kv.v_slot(s, first + t));
        }
      }
    }
    attention(batch, l);
    matmul(L.wo, att_.data(), total, xb_.data(), pool_);
    if (L.attn_post_norm)
      for (int64_t t = 0; t < total; ++t)
        kernels::rmsnorm(xb_.data() + t * E, L.attn_post_norm.f32(), E, c.rms_eps, xb_.data() + t * E);
    kernels::add_inplace(x_.data(), xb_.data(), total * E);
    for (int64_t t = 0; t < total; ++t) kernels::rmsnorm(x_.data() + t * E, L.ffn_norm.f32(), E, c.rms_eps, xb_.data() + t * E);
    if (L.w_gate_up && total <= kFusedTokens) {
      const int64_t F = c.n_ff;
      matmul(L.w_gate_up, xb_.data(), total, fused_.data(), pool_);
      for (int64_t t = 0; t < total; ++t) {
        const float* r = fused_.data() + t * 2 * F;
        std::copy(r, r + F, hb_.data() + t * F);
        std::copy(r + F, r + 2 * F, hb2_.data() + t * F);
      }
    } else {
      matmul(L.w_gate, xb_.data(), total, hb_.data(), pool_);
      matmul(L.w_up, xb_.data(), total, hb2_.data(), pool_);
    }
    if (c.gelu_ffn)
      gelu_mul(hb_.data(), hb2_.data(), total * c.n_ff);
    else
      kernels::silu_mul(hb_.data(), hb2_.data(), total * c.n_ff);
    matmul(L.w_down, hb_.data(), total, xb_.data(), pool_);
    if (L.ffn_post_norm)
      for (int64_t t = 0; t < total; ++t)
        kernels::rmsnorm(xb_.data() + t * E, L.ffn_post_norm.f32(), E, c.rms_eps, xb_.data() + t * E);
    kernels::add_inplace(x_.data(), xb_.data(), total * E);
  }

  // Final norm and logits only for the rows that need them. Items whose logits buffers follow one another
  // (the scheduler's rows, a batched decode) share one matmul over the output head: one pass over its
  // weights (the largest matrix, 155 MB in Q8_0 for a 152K vocabulary) instead of a GEMV per sequence.
  // The matmul's per-output arithmetic does not depend on the batch (kernels/matmul.h), so the logits are
  // bitwise the same as item by item.
  const int64_t V = c.n_vocab;
  for (size_t i = 0; i < batch.size();) {
    if (batch[i].logits == nullptr) {
      ++i;
      continue;
    }
    float* out = batch[i].logits;
    int32_t rows = 0;
    size_t j = i;
    for (; j < batch.size(); ++j) {
      const BatchItem& b = batch[j];
      if (b.logits != out + static_cast<int64_t>(rows) * V) break;  // not contiguous (or no logits): next run
      const int32_t first = b.all_logits ? 0 : spans_[j].n - 1;
      for (int32_t t = first; t < spans_[j].n; ++t, ++rows)
        kernels::rmsnorm(x_.data() + (spans_[j].begin + t) * E, W.out_norm.f32(), E, c.rms_eps, logits_in_.data() + rows * E);
    }
    matmul(W.output, logits_in_.data(), rows, out, pool_);
    if (c.logit_softcap > 0) {
      const float cap = c.logit_softcap, inv = 1.0f / c.logit_softcap;
      for (int64_t k = 0; k < static_cast<int64_t>(rows) * V; ++k) out[k] = cap * std::tanh(out[k] * inv);
    }
    i = j;
  }
  return true;
}

void Forward::attention(std::span<BatchItem> batch, int32_t layer) {
  const ModelConfig& c = model_->config();
  const int32_t G = c.group();
  const int64_t HD = c.head_dim;
  const float scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(HD));
  const bool swa = c.is_swa(layer);
  // Tasks: (sequence, kv head, token block). With key_mass (H2O) all blocks of a stream add into the
  // same mass row, so that item's blocks run inside one task, one after another (no data race).
  auto blocks_of = [&](size_t i) {
    return batch[i].key_mass ? 1 : (spans_[i].n + kAttnTokenBlock - 1) / kAttnTokenBlock;
  };
  int32_t n_tasks = 0;
  for (size_t i = 0; i < spans_.size(); ++i) {
    n_tasks += c.n_head_kv * blocks_of(i);
    if (batch[i].extra != nullptr) batch[i].extra->load_layer(layer);
  }
  // (item, head, token blocks [t0, t_end)) through the usual path: the paged kernel (which folds a deep
  // decode stream's parts itself) or, where the window cuts in, window_attention.
  auto attend = [&](size_t item, int32_t head, int32_t t0, int32_t t_end, int thread) {
    BatchItem& b = batch[item];
    const int32_t n = spans_[item].n;
    const int32_t s = b.kv->stream_index(layer, head);
    for (; t0 < t_end; t0 += kAttnTokenBlock) {
      const int32_t t1 = std::min(t_end, t0 + kAttnTokenBlock);
      if (swa) {
        // Does the window cut into the slots the block's last token sees? (Positions increase with the
        // slot index, so the first slot holds the oldest position.)
        // A stream whose front pages were released as they left the window (Scheduler::
        // release_out_of_window) takes the path it would take holding them: the same kernel, hence
        // bitwise the same logits whether or not pages were freed.
        const kv::SequenceKv& kv = *b.kv;
        const int32_t last_slot = kv.n_slots(s) - n + t1 - 1;
        const int32_t oldest = kv.dropped_pages(s) > 0 ? 0 : kv.position(s, 0);
        if (kv.position(s, last_slot) - oldest >= c.swa_window) {
          window_attention(b, static_cast<int32_t>(item), layer, head, t0, t1, scale,
                           window_scratch_.data() + static_cast<size_t>(thread) * window_scratch_per_thread_,
                           attn_scratch_.data() + static_cast<size_t>(thread) * attn_scratch_per_thread_);
          continue;
        }
      }
      kernels::KvStreamView view;
      kernels::AttentionArgs a = attention_args(b, static_cast<int32_t>(item), layer, head, t0, t1, scale, thread, &view);
      float* part = extra_scratch_.data() + static_cast<size_t>(thread) * static_cast<size_t>(G) * (HD + 2);
      if (b.extra != nullptr && a.lse == nullptr) a.lse = part + static_cast<size_t>(G) * (HD + 1);  // the hot part's lse
      kernels::paged_attention(view, a);
      if (b.extra != nullptr) attend_extra(*b.extra, s, a, part);
    }
  };
  if (!swa && plan_split(batch, layer, n_tasks)) {
    ++split_layers_;
    pool_->run(static_cast<int>(split_tasks_.size()), [&](int task, int thread) {
      const AttnTask& t = split_tasks_[static_cast<size_t>(task)];
      if (t.part < 0) {
        attend(static_cast<size_t>(t.item), t.head, 0, spans_[static_cast<size_t>(t.item)].n, thread);
        return;
      }
      kernels::KvStreamView view;
      const kernels::AttentionArgs a =
          attention_args(batch[static_cast<size_t>(t.item)], t.item, layer, t.head, 0, 1, scale, thread, &view);
      kernels::paged_attention_part(view, a, t.part, split_out_.data() + static_cast<size_t>(task) * G * HD,
                                    split_lse_.data() + static_cast<size_t>(task) * G);
    });
    // Fold each split stream's parts in order, as paged_attention would have (the same bits), into the
    // outputs (and log-sum-exps) the unsplit call would have written.
    for (size_t i = 0; i < split_tasks_.size();) {
      const AttnTask& t = split_tasks_[i];
      if (t.part < 0) {
        ++i;
        continue;
      }
      kernels::KvStreamView view;
      const kernels::AttentionArgs a =
          attention_args(batch[static_cast<size_t>(t.item)], t.item, layer, t.head, 0, 1, scale, 0, &view);
      float* lse = a.lse != nullptr ? a.lse : extra_scratch_.data();  // the caller's thread: no task runs now
      for (int32_t p = 0; p < t.parts; ++p)
        kernels::attention_fold(p, a.out, lse, split_out_.data() + (i + p) * G * HD, split_lse_.data() + (i + p) * G, G,
                                static_cast<int32_t>(HD));
      i += static_cast<size_t>(t.parts);
    }
    return;
  }
  pool_->run(n_tasks, [&](int task, int thread) {
    size_t item = 0;
    int32_t idx = task;
    while (idx >= c.n_head_kv * blocks_of(item)) idx -= c.n_head_kv * blocks_of(item++);
    const int32_t blocks = blocks_of(item);
    const int32_t head = idx / blocks;
    const int32_t n = spans_[item].n;
    const int32_t t0 = (idx % blocks) * kAttnTokenBlock;
    attend(item, head, t0, blocks == 1 ? n : std::min(n, t0 + kAttnTokenBlock), thread);
  });
}

kernels::AttentionArgs Forward::attention_args(BatchItem& b, int32_t item, int32_t layer, int32_t head, int32_t t0,
                                               int32_t t1, float scale, int thread, kernels::KvStreamView* view) {
  const ModelConfig& c = model_->config();
  const int32_t G = c.group();
  const int64_t QD = c.q_dim(), HD = c.head_dim;
  const int32_t n = spans_[static_cast<size_t>(item)].n;
  const int32_t s = b.kv->stream_index(layer, head);
  *view = b.kv->view(s);
  view->n_slots = view->n_slots - n + t1;  // causal: this block's last token sees up to its own slot
  const int64_t row0 = spans_[static_cast<size_t>(item)].begin + t0;
  kernels::AttentionArgs a;
  a.q = q_.data() + row0 * QD + static_cast<int64_t>(head) * G * HD;
  a.q_stride = QD;
  a.out = att_.data() + row0 * QD + static_cast<int64_t>(head) * G * HD;
  a.out_stride = QD;
  a.n_new = t1 - t0;
  a.group = G;
  a.scale = scale;
  a.key_mass = b.key_mass ? b.key_mass + s * b.key_mass_stride : nullptr;
  if (b.attn_lse != nullptr && n == 1) a.lse = b.attn_lse + static_cast<int64_t>(layer) * c.n_head + static_cast<int64_t>(head) * G;
  a.scratch = attn_scratch_.data() + static_cast<size_t>(thread) * attn_scratch_per_thread_;
  return a;
}

bool Forward::plan_split(std::span<BatchItem> batch, int32_t layer, int32_t normal_tasks) {
  const ModelConfig& c = model_->config();
  const int T = pool_->size();
  if (T < 2 || normal_tasks >= 2 * T || static_cast<size_t>(normal_tasks) > split_tasks_.capacity()) return false;
  split_tasks_.clear();
  bool any = false;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchItem& b = batch[i];
    const bool one_token = spans_[i].n == 1 && b.key_mass == nullptr && b.extra == nullptr;
    for (int32_t h = 0; h < c.n_head_kv; ++h) {
      int32_t parts = 1;
      if (one_token) {
        kernels::AttentionArgs probe;  // n_new 1, no key_mass: what attention_args passes for this stream
        parts = kernels::attention_parts(b.kv->view(b.kv->stream_index(layer, h)), probe);
      }
      if (split_tasks_.size() + static_cast<size_t>(parts) > split_tasks_.capacity()) return false;  // never grows
      if (parts == 1) {
        split_tasks_.push_back({static_cast<int32_t>(i), h, -1, 1});
        continue;
      }
      for (int32_t p = 0; p < parts; ++p) split_tasks_.push_back({static_cast<int32_t>(i), h, p, parts});
      any = true;
    }
  }
  return any;
}

void Forward::attend_extra(const ExtraKv& extra, int32_t stream, const kernels::AttentionArgs& a, float* part) {
  const int32_t G = a.group, HD = model_->config().head_dim;
  float* part_lse = part + static_cast<size_t>(G) * HD;
  kernels::AttentionArgs e = a;
  e.out = part;
  e.out_stride = 0;
  e.key_mass = nullptr;
  e.lse = part_lse;
  for (const kernels::KvStreamView& v : extra.views(stream)) {
    if (v.n_slots <= 0) continue;
    kernels::paged_attention(v, e);
    kernels::attention_merge(a.out, a.lse, part, part_lse, G, HD);
  }
}

void Forward::window_attention(BatchItem& b, int32_t item, int32_t layer, int32_t head, int32_t t0, int32_t t1,
                               float scale, float* scratch, float* attn_scratch) {
  const ModelConfig& c = model_->config();
  const int32_t G = c.group(), HD = c.head_dim;
  const int64_t QD = c.q_dim();
  const kv::SequenceKv& kv = *b.kv;
  const int32_t s = kv.stream_index(layer, head);
  const kernels::KvStreamView view = kv.view(s);
  const DType kt = view.kv_type;
  const size_t row_b = kernels::kv_row_bytes(kt, HD);
  auto k_row = [&](int32_t slot) {
    return view.pages[slot / view.page_size] + static_cast<size_t>(slot % view.page_size) * row_b;
  };
  float* acc = scratch;                              // [G][HD]
  float* m = acc + static_cast<size_t>(G) * HD;      // [G] running max
  float* l = m + G;                                  // [G] running sum
  float* krow = l + G;                               // [HD]
  float* vrow = krow + HD;                           // [HD]
  float* body_out = vrow + HD;                       // [G][HD] the page-aligned body's output
  float* body_lse = body_out + static_cast<size_t>(G) * HD;  // [G]
  const int32_t ps = view.page_size;
  const int32_t n = spans_[static_cast<size_t>(item)].n;
  float* mass = b.key_mass ? b.key_mass + s * b.key_mass_stride : nullptr;
  for (int32_t t = t0; t < t1; ++t) {
    const int32_t hi = kv.n_slots(s) - n + t + 1;  // causal: up to its own slot
    const int32_t p = kv.position(s, hi - 1);
    // First slot inside the window: position > p - window (llama.cpp LLAMA_SWA_TYPE_STANDARD).
    int32_t lo = 0, up = hi - 1;
    while (lo < up) {
      const int32_t mid = lo + (up - lo) / 2;
      if (p - kv.position(s, mid) >= c.swa_window) lo = mid + 1; else up = mid;
    }
    const int64_t row = spans_[static_cast<size_t>(item)].begin + t;
    const float* q = q_.data() + row * QD + static_cast<int64_t>(head) * G * HD;
    std::fill(acc, acc + static_cast<size_t>(G) * HD, 0.0f);
    std::fill(m, m + G, -INFINITY);
    std::fill(l, l + G, 0.0f);
    // Without key_mass, the window's whole pages [body, hi) go through the paged kernel (as a stream that
    // starts at page `body / ps`), and only the slots before the first page boundary, at most ps - 1, through
    // the loop below; the two parts are folded by their log-sum-exps. The loop alone cost one exp per slot
    // and head and scalar row conversions for every window layer.
    const int32_t body = mass ? hi : std::min(hi, (lo + ps - 1) / ps * ps);
    for (int32_t j = lo; j < body; ++j) {
      kernels::kv_decode_row(k_row(j), kt, HD, krow);
      kernels::kv_decode_row(k_row(j) + view.v_offset, kt, HD, vrow);
      for (int32_t g = 0; g < G; ++g) {
        const float* qg = q + static_cast<int64_t>(g) * HD;
        float d = 0;
        for (int32_t e = 0; e < HD; ++e) d += qg[e] * krow[e];
        d *= scale;
        float* o = acc + static_cast<size_t>(g) * HD;
        if (d > m[g]) {
          const float a = m[g] == -INFINITY ? 0.0f : std::exp(m[g] - d);
          for (int32_t e = 0; e < HD; ++e) o[e] *= a;
          l[g] *= a;
          m[g] = d;
        }
        const float w = std::exp(d - m[g]);
        l[g] += w;
        for (int32_t e = 0; e < HD; ++e) o[e] += w * vrow[e];
      }
    }
    float* out = att_.data() + row * QD + static_cast<int64_t>(head) * G * HD;
    for (int32_t g = 0; g < G; ++g) {
      const float inv = l[g] > 0 ? 1.0f / l[g] : 0.0f;
      for (int32_t e = 0; e < HD; ++e) out[static_cast<int64_t>(g) * HD + e] = acc[static_cast<size_t>(g) * HD + e] * inv;
    }
    if (body < hi) {
      kernels::KvStreamView bv = view;
      bv.pages = view.pages + body / ps;
      bv.n_slots = hi - body;
      kernels::AttentionArgs a;
      a.q = q;
      a.q_stride = QD;
      a.out = body_out;
      a.out_stride = static_cast<int64_t>(G) * HD;
      a.n_new = 1;
      a.group = G;
      a.scale = scale;
      a.lse = body_lse;
      a.scratch = attn_scratch;
      kernels::paged_attention(bv, a);
      if (lo == body) {
        std::copy_n(body_out, static_cast<size_t>(G) * HD, out);
      } else {
        for (int32_t g = 0; g < G; ++g) m[g] = l[g] > 0 ? m[g] + std::log(l[g]) : -INFINITY;  // the head's lse
        kernels::attention_merge(out, m, body_out, body_lse, G, HD);
      }
    }
    if (mass)  // H2O: each head's probability of each slot (second pass over the window)
      for (int32_t j = lo; j < hi; ++j) {
        kernels::kv_decode_row(k_row(j), kt, HD, krow);
        for (int32_t g = 0; g < G; ++g) {
          const float* qg = q + static_cast<int64_t>(g) * HD;
          float d = 0;
          for (int32_t e = 0; e < HD; ++e) d += qg[e] * krow[e];
          if (l[g] > 0) mass[j] += std::exp(d * scale - m[g]) / l[g];
        }
      }
  }
}

}  // namespace kvpack
