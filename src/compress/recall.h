// Recall of evicted pages, and the drift estimate (what evicted keys could still weigh).
//
// After prefill and every `every` decode steps, for every stream (layer x KV head) and the latest query
// rows of its GQA group (post-RoPE, from the compressor's QueryWindow):
//   1. hot: the exact logits s_j = q.k_j / sqrt(d) of the hot slots, their log-sum-exp L(q) per query
//      row and head, and each slot's score max over rows and heads (the victim order);
//   2. cold: each cold page's bound B_p(q) = sum_i max(q_i min_i, q_i max_i) / sqrt(d) from its digest
//      (kv/evicted_kv.h; Quest's bound), so exp(B_p - L) * n_p bounds the page's attention mass relative
//      to the hot set's;
//   3. recall: pages in decreasing bound whose bounded share exceeds `min_share` are read (at most
//      `max_pages` per stream); their exact share is measured, and a page whose exact share reaches
//      `min_share` and whose best slot beats the worst unprotected hot slot comes back, that many
//      lowest-scoring unprotected hot slots going down to the cold tier in its place (the hot length is
//      unchanged; token order is kept: kv::SequenceKv::splice_stream merges by position). Slots the policy
//      pinned (Protection::pinned) go down only with a check every token, for a page whose exact share
//      reaches pin_override_share, after the unpinned ones;
//   4. drift: for each query row and head, D = E / (H + E), with H = 1 (hot mass relative to itself) and
//      E the evicted mass relative to it — exact for the pages read, the digest bound for the others; a
//      stream's drift is the largest D over its rows and heads, a check's the mean over streams. The
//      bound makes it conservative: unread pages count as if their keys sat at the digest corner.
// No attention probabilities are needed from the kernels. With one query row and `attn_lse` (the attention
// kernel's own log-sum-exp of that row over the same hot slots, kernels::AttentionArgs::lse) step 1 takes
// L(q) from it and computes the hot logits only for the streams that exchange (their victim order);
// otherwise the hot logits are recomputed for the latest query rows (rows x group x hot slots x head_dim
// multiply-adds per stream and check).
//
// Thread-safety: one per sequence (used by its compressor). The hot scoring and the digest bounds run
// in parallel over streams on the given pool (read-only); reads from the tier and the exchanges run on
// the caller.
#pragma once
#include <cstdint>
#include <vector>

#include "compress/config.h"
#include "compress/query_window.h"
#include "compress/selection.h"
#include "kv/evicted_kv.h"
#include "kv/sequence_kv.h"
#include "model/model.h"
#include "util/thread_pool.h"

namespace kvpack::compress {


struct RecallStats {
  int64_t checks = 0;
  int64_t pages_bounded = 0;   // cold pages whose digest was scored
  int64_t pages_read = 0;      // read from the tier to measure them exactly
  int64_t pages_recalled = 0;  // brought back into the hot set
  int64_t slots_recalled = 0;  // slots they held (= hot slots sent down in exchange)
  int64_t read_misses = 0;     // pages the tier no longer had
  uint64_t bytes_read = 0;
  double seconds = 0;
  // Where `seconds` went: digest bounds (+ hot logits where recomputed), tier reads, exact measurement
  // of the pages read, exchanges (and the tier's commit).
  double score_seconds = 0, read_seconds = 0, measure_seconds = 0, settle_seconds = 0;
  double drift_last = 0;       // the latest check's drift (mean over streams)
  double drift_max = 0;        // the largest over checks
  double drift_first = -1;     // the first check's (end of prefill: before the answer); -1 = no check
  int64_t guard_escalations = 0;  // checks repeated over every cold page (drift above the guard)
  int64_t guard_fallbacks = 0;    // requests that went back to full KV
  // ... of which could not bring every evicted token back (the pool had no room for the whole KV, or the
  // tier had dropped pages): the request goes on with what it holds, so its output is not full KV's.
  int64_t guard_fallbacks_incomplete = 0;
  // Requests a guard flagged but could not send back: the pool cannot hold their whole KV, so they stay
  // compressed (a fallback would have failed them once they outgrew the pool).
  int64_t guard_fallbacks_refused = 0;
  int64_t fallback_pages_lost = 0;  // cold pages a fallback could not bring back (dropped by the tier)
  // The exact drift check (RecallConfig::exact): at a check, the newest token computed once more over
  // every KV of the request (hot and cold) in a scratch copy; its next-token distribution against the
  // compressed one's, as total variation distance (0: the same, 1: disjoint).
  int64_t exact_checks = 0;
  int64_t exact_skipped = 0;     // checks it could not run (pool out of pages, cold pages lost)
  int64_t exact_flips = 0;       // checks whose most likely next token differed
  double exact_tv_last = -1;     // -1: none yet
  double exact_tv_max = -1;
  double exact_tv_first = -1;    // end of prefill: before the answer
  void add(const RecallStats& o);
  // Takes away `base`'s counts and times (what a forked choice inherited from its parent, so a request's
  // choices count what happened before the fork once); the latest / first / largest values stay.
  void subtract_counts(const RecallStats& base);
  // One exact check's result from the two logit rows (n_vocab each); returns whether it flipped (the most
  // likely token differs).
  bool add_exact_check(const float* compressed, const float* full, int32_t n_vocab);
};

class Recall {
 public:
  Recall() = default;
  // `frozen`: streams the compressor leaves alone (sliding-window layers; empty = none): never scored,
  // no drift (their pages may be gone, and nothing of theirs is evicted).
  Recall(const RecallConfig& cfg, const ModelConfig& model, std::vector<uint8_t> frozen = {});

  const RecallConfig& config() const { return cfg_; }
  // One check over every stream; returns the slots recalled (0: the hot set is unchanged). `prot[s]` is
  // stream s's protection. Evicted slots of the exchange are staged and committed in `cold`.
  // `rows`: the latest query rows to score (at most the window's). Slots of the last `rows` positions
  // are never sent down (the caller may recompute them, see SequenceCompressor::before_sample).
  // `attn_lse`: nullptr, or [n_layer][n_head] log-sum-exp of the newest query row over the current hot set
  // (from that row's forward, no compaction or exchange since); used when `rows` is 1 (NaN entries: that
  // stream recomputes).
  int64_t run(kv::SequenceKv& kv, kv::EvictedKv& cold, const QueryWindow& queries, const std::vector<Protection>& prot,
              int32_t rows, ThreadPool* pool, const float* attn_lse = nullptr);
  const RecallStats& stats() const { return stats_; }
  RecallStats& mutable_stats() { return stats_; }
  // Reads every cold page back into the hot set (the guard's fallback to full KV), merged in position
  // order. Returns the slots restored; false in `complete` when the pool lacked pages or a page was lost.
  int64_t restore_all(kv::SequenceKv& kv, kv::EvictedKv& cold, bool& complete);
  // Every cold page copied into `dst` (a fork of the sequence: kv::KvManager::fork_sequence), merged in
  // position order; `cold` keeps them (the exact drift check's scratch copy). False when the pool lacked
  // pages or a page was lost: `dst` is then incomplete and must not be used.
  bool copy_all_into(kv::SequenceKv& dst, kv::EvictedKv& cold);
  // The next run() reads every cold page whose bound passes (the guard's escalation).
  void set_read_all(bool on) { read_all_ = on; }

 private:
  // A cold page read this check whose exact share passes: `record` indexes StreamWork::records.
  struct Candidate {
    int32_t page;
    float best;  // the page's best slot logit (max over query vectors)
    int32_t record;
    double share;  // its exact share of the hot mass, max over query vectors
  };
  // Per stream: the scaled query rows of its group, hot results and cold candidates.
  struct StreamWork {
    std::vector<float> q;         // [rows * group][head_dim], pre-scaled by 1/sqrt(d)
    std::vector<float> lse;       // per query row x head: log-sum-exp of the hot logits
    std::vector<float> slot_max;  // per hot slot: its logit, max over rows and heads (empty: not computed yet)
    std::vector<float> bound;     // per cold page: max over rows and heads of B_p - L (log share bound)
    std::vector<int32_t> order;   // cold pages to read this check, by decreasing bound
    std::vector<double> share_sum;  // per query vector: sum over cold pages of the bounded shares
    std::vector<float> page_bound;  // [page][query vector]: the digest bound of q.k (kernels::digest_bounds)
    std::vector<int32_t> positions;  // the hot slots' positions (settle_stream, streams that exchange)
    std::vector<float> log_n;       // [page]: log of its slot count, -inf for a lost or empty page (kernels::page_shares)
    struct Read {
      int32_t page;
      int32_t record;  // where its record sits in `records` (the page's index in `order`)
    };
    std::vector<Read> reads;          // pages read this check (hits), in order
    std::vector<uint8_t> records;     // one record per page of `order`
    std::vector<Candidate> candidates;
    std::vector<int32_t> eligible, pinned;  // settle_stream: the hot slots it may send down, unpinned / pinned
    double drift = 0;
  };
  // `attn_lse`: run()'s (nullptr: recompute the hot logits).
  void score_stream(const kv::SequenceKv& kv, const kv::EvictedKv& cold, int32_t s, const float* attn_lse, StreamWork& w) const;
  // Hot logits of the stream for w.q: each slot's max into w.slot_max and, if `lse`, the log-sum-exp per
  // query vector into w.lse.
  void hot_scores(const kv::SequenceKv& kv, int32_t s, StreamWork& w, bool lse) const;
  // Reads every stream's w.order pages into its w.records with one batched tier call; adds to stats_.
  void read_pages(kv::EvictedKv& cold, size_t record_bytes);
  // Exact shares of the pages read, the stream's drift, the pages worth recalling (w.candidates) and, for a
  // stream that will exchange, its hot slot scores. Read-only on kv and cold: runs in parallel over streams.
  double measure_stream(const kv::SequenceKv& kv, const kv::EvictedKv& cold, int32_t s, StreamWork& w) const;
  // restore_all / copy_all_into: `forget` erases the records brought back (restore) or leaves them (copy).
  int64_t bring_all(kv::SequenceKv& kv, kv::EvictedKv& cold, bool forget, bool& complete);
  // The exchange for one stream (serial); returns its drift (w.drift).
  double settle_stream(kv::SequenceKv& kv, kv::EvictedKv& cold, int32_t s, const Protection& prot, StreamWork& w);

  RecallConfig cfg_;
  ModelConfig mc_;
  RecallStats stats_;
  std::vector<std::vector<float>> layer_queries_;  // [layer] recent rows, oldest first
  std::vector<StreamWork> work_;
  std::vector<kv::EvictedKv::PageRef> read_refs_;  // read_pages' batch
  std::vector<uint8_t*> read_out_;
  std::vector<uint8_t> frozen_;
  int32_t keep_tail_ = 1;
  bool read_all_ = false;                          // this check: positions >= next_pos - keep_tail_ stay hot
};

}  // namespace kvpack::compress
