// The transformer forward pass over paged KV, for a batch of sequences in one call.
//
// Every token of every sequence in the batch goes through the weight matmuls together (one weight read
// per batch, which is what makes continuous batching and chunked prefill pay); attention then runs per
// sequence and KV stream over that sequence's pages. Per layer:
//   [embeddings * embd_scale] → rmsnorm → Q,K,V (+bias) → [q/k RMSNorm] → RoPE → write K,V into pages
//   → paged flash attention (windowed on sliding-window layers) → output projection [→ post-norm]
//   + residual → rmsnorm → SwiGLU / GeGLU MLP [→ post-norm] + residual; [logit soft-cap].
// Scratch buffers are sized once for `max_batch_tokens`, so a forward call does not allocate.
// Thread-safety: a Forward is used by one thread at a time (it owns scratch); it parallelises inside
// with the ThreadPool it was given.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kv/sequence_kv.h"
#include "model/model.h"
#include "util/thread_pool.h"

namespace kvpack {

// Optional taps into the forward pass (calibration, attention-score policies, tests).
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  // Pre-RoPE queries of one sequence's tokens in `layer` (after q-norm for qwen3): q(t, head) at
  // q + t * stride + head * head_dim, for t < n_tokens.
  virtual void on_query_pre_rope(int32_t batch_index, int32_t layer, const float* q, int32_t n_tokens, int64_t stride) {}
  // Post-RoPE queries of the same tokens (what attention used).
  virtual void on_query_post_rope(int32_t batch_index, int32_t layer, const float* q, int32_t n_tokens, int64_t stride) {}
};

// KV that a one-token batch item attends besides its own streams: pages held outside the pool. The exact
// drift check (engine/scheduler.cpp) reads a sequence's evicted pages from the cold tier one layer at a
// time and attends them where they lie, instead of copying every one into a fork of the sequence.
// Every extra slot must be older than the item's new token (decode: it sees them all). The two parts merge
// through their log-sum-exps, so the result is attention over the union (rounding aside: the sum runs
// in another order than over one stream holding every slot).
class ExtraKv {
 public:
  virtual ~ExtraKv() = default;
  // Called on the forward's calling thread right before layer `layer`'s attention, once per layer.
  virtual void load_layer(int32_t layer) = 0;
  // After load_layer: the extra KV of stream `stream` (of that layer) as views, each with its pages full
  // but the last; nothing = none. Called from the pool's threads (const, no changes in between).
  virtual std::span<const kernels::KvStreamView> views(int32_t stream) const = 0;
};

struct BatchItem {
  kv::SequenceKv* kv = nullptr;
  std::span<const int32_t> tokens;  // new tokens; positions are kv->next_pos() onwards
  float* logits = nullptr;          // nullptr: no logits; else [n_vocab] for the last token, or [n][n_vocab]
  bool all_logits = false;
  float* key_mass = nullptr;        // optional H2O statistic: [n_streams][max slots] (see paged_attention)
  int64_t key_mass_stride = 0;      // floats between streams in key_mass
  // Optional (one-token items only): [n_layer][n_head] log-sum-exp of each query head's scaled logits over
  // the slots it attended (kernels::AttentionArgs::lse), for recall's hot mass. Layers that took the
  // sliding-window path leave their entries unwritten.
  float* attn_lse = nullptr;
  // Optional (one-token items, models without sliding-window layers): extra KV attended beside the
  // item's own (ExtraKv). attn_lse then covers both.
  ExtraKv* extra = nullptr;
};

class Forward {
 public:
  Forward(const Model& model, ThreadPool& pool, int32_t max_batch_tokens);

  // Runs the batch. Returns false, changing nothing, when the KV pool cannot hold the new tokens of
  // some sequence (checked up front for the whole batch). Throws std::invalid_argument on bad input
  // (token id out of range, position past the context, batch larger than max_batch_tokens).
  bool run(std::span<BatchItem> batch, ForwardObserver* observer = nullptr);

  int32_t max_batch_tokens() const { return max_tokens_; }
  const Model& model() const { return *model_; }
  // Layers whose attention ran split-K (plan_split) since construction: tests and benchmarks.
  int64_t split_attention_layers() const { return split_layers_; }

 private:
  void attention(std::span<BatchItem> batch, int32_t layer);
  // Query tokens [t0, t1) of batch item `item`, KV head `head`, on a sliding-window layer whose window
  // cuts into the visible slots: the window's whole pages through the paged kernel (attn_scratch: the
  // thread's), the few slots before its first page boundary through an online-softmax loop, folded by their
  // log-sum-exps; with key_mass (H2O) the loop covers the whole window.
  void window_attention(BatchItem& b, int32_t item, int32_t layer, int32_t head, int32_t t0, int32_t t1, float scale,
                        float* scratch, float* attn_scratch);

  // Attends the extra views of stream `stream` for one query token and merges them into a.out / a.lse.
  void attend_extra(const ExtraKv& extra, int32_t stream, const kernels::AttentionArgs& a, float* part);
  // Query tokens [t0, t1) of item `item`, KV head `head` on `layer`: the stream's view and kernel arguments
  // (a.scratch: thread `thread`'s).
  kernels::AttentionArgs attention_args(BatchItem& b, int32_t item, int32_t layer, int32_t head, int32_t t0, int32_t t1,
                                        float scale, int thread, kernels::KvStreamView* view);
  // Split-K (kernels::attention_parts): with fewer (item, KV head) streams on a layer than twice the pool's
  // threads, one-token items' deep streams run one task per part, folded after (the same bits as unsplit).
  // Returns false (nothing planned) when the layer does not qualify; tasks then run as usual.
  bool plan_split(std::span<BatchItem> batch, int32_t layer, int32_t normal_tasks);

  const Model* model_;
  ThreadPool* pool_;
  int32_t max_tokens_;
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_, rope_cs_, rope_cs_swa_, logits_in_;
  std::vector<float> fused_;  // a fused Q|K|V or gate|up matmul's output rows (up to kFusedTokens tokens)
  std::vector<int32_t> pos_;
  std::vector<float> attn_scratch_;
  size_t attn_scratch_per_thread_ = 0;
  std::vector<float> extra_scratch_;  // per thread: group x (head_dim + 2) floats for attend_extra
  std::vector<float> window_scratch_;  // per thread: window_attention's accumulators
  size_t window_scratch_per_thread_ = 0;
  // Split-K plan of the current layer: one task per (item, head, part), part -1 = the whole stream (or the
  // item's token blocks) through the usual path; partial outputs / lses per split task. Capacity for
  // 2 x threads streams of kAttentionMaxParts parts, reserved at construction (no allocation per step).
  struct AttnTask {
    int32_t item, head, part, parts;
  };
  std::vector<AttnTask> split_tasks_;
  int64_t split_layers_ = 0;
  std::vector<float> split_out_, split_lse_;
  struct Span {
    int32_t begin, n, slots_before;
  };
  std::vector<Span> spans_;
};

}  // namespace kvpack
