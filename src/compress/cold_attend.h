// The evicted KV of one sequence as extra attention input (model/forward.h, ExtraKv): what the exact
// drift check attends besides the hot set, read from the cold tier one layer at a time into a scratch
// buffer and attended where it lies. The first version copied every cold page into a fork of the
// sequence instead — two copies of the whole evicted KV per check (tier → records → pool pages, the
// second one sorted into position order) and a context's worth of pool pages held for the step; at a
// 16K context about 0.7 s per check on the 2-vCPU VM, most of it copying (docs/quality.md §4f).
//
// Cold records have the page layout (kv/evicted_kv.h), so a record's base pointer is a page for
// kernels::KvStreamView. Per stream, runs of full records form one view; a record with fewer slots (the
// last of a compression event) is a view of its own. Order does not matter to attention (the forward
// merges the parts by their log-sum-exps), so nothing is sorted.
//
// Memory: one layer's cold records at a time (at 16K on the Qwen3-0.6B shape, 8 KV heads x ~900 pages
// x 8.25 KiB = ~58 MiB), kept between checks. A page the tier no longer has makes the check incomplete
// (complete() false): the caller reports it skipped, as when the copy could not be made.
// Thread-safety: one owner; views() is const and may be read from the forward's pool threads.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/attention.h"
#include "kv/evicted_kv.h"
#include "kv/sequence_kv.h"
#include "model/forward.h"

namespace kvpack::compress {

class ColdAttend final : public ExtraKv {
 public:
  // Points at the sequence whose evicted KV is attended (its pool sets the record layout); resets the
  // counts. The objects must outlive the forward call that uses this.
  void bind(kv::EvictedKv& cold, const kv::SequenceKv& kv);
  void load_layer(int32_t layer) override;
  std::span<const kernels::KvStreamView> views(int32_t stream) const override;

  bool complete() const { return complete_; }  // every cold page of every loaded layer was read
  int64_t pages_read() const { return pages_read_; }
  double read_seconds() const { return read_seconds_; }  // in load_layer's tier reads since bind()

 private:
  kv::EvictedKv* cold_ = nullptr;
  const kv::SequenceKv* kv_ = nullptr;
  bool complete_ = true;
  int64_t pages_read_ = 0;
  double read_seconds_ = 0;
  std::vector<uint8_t> records_;                    // this layer's records, back to back
  std::vector<kv::EvictedKv::PageRef> refs_;
  std::vector<uint8_t*> outs_;
  std::vector<const uint8_t*> pages_;              // page pointers of every view, view after view
  std::vector<kernels::KvStreamView> views_;
  std::vector<std::pair<int32_t, int32_t>> range_;  // per stream of the sequence: [first, end) in views_
};

}  // namespace kvpack::compress
