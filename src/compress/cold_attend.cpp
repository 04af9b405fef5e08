#include "compress/cold_attend.h"

#include <chrono>

namespace kvpack::compress {

void ColdAttend::bind(kv::EvictedKv& cold, const kv::SequenceKv& kv) {
  cold_ = &cold;
  kv_ = &kv;
  complete_ = true;
  pages_read_ = 0;
  bytes_read_ = 0;
  read_seconds_ = 0;
  views_.clear();
  range_.assign(static_cast<size_t>(cold.n_streams()), {0, 0});
}

void ColdAttend::load_layer(int32_t layer) {
  const kv::PagePool& pool = kv_->pool();
  const size_t rec = pool.record_bytes();
  const int32_t ps = pool.config().page_size;
  for (auto& r : range_) r = {0, 0};  // the previous layer's views point into records_, about to be reused
  views_.clear();
  pages_.clear();
  refs_.clear();
  for (int32_t h = 0; h < kv_->n_kv_heads(); ++h) {
    const int32_t s = kv_->stream_index(layer, h);
    const auto list = cold_->pages(s);
    for (size_t p = 0; p < list.size(); ++p)
      if (!list[p].recalled) refs_.push_back({s, static_cast<int32_t>(p)});  // a lost one fails its read
  }
  if (refs_.empty()) return;
  if (records_.size() < refs_.size() * rec) records_.resize(refs_.size() * rec);
  outs_.resize(refs_.size());
  for (size_t i = 0; i < refs_.size(); ++i) outs_[i] = records_.data() + i * rec;
  const auto t0 = std::chrono::steady_clock::now();
  const std::span<const bool> ok = cold_->read_many(refs_, outs_);  // one batched tier call for the layer
  read_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Views: pages_ is filled first (its addresses are final once reserved), views refer into it.
  pages_.reserve(refs_.size());
  kernels::KvStreamView base = kv_->view(refs_[0].stream);
  base.v_offset = pool.v_offset();
  for (size_t i = 0; i < refs_.size();) {
    const int32_t s = refs_[i].stream;
    const auto first = static_cast<int32_t>(views_.size());
    while (i < refs_.size() && refs_[i].stream == s) {
      // A run of full records, or one partial record.
      kernels::KvStreamView v = base;
      v.pages = pages_.data() + pages_.size();
      v.n_slots = 0;
      while (i < refs_.size() && refs_[i].stream == s) {
        const int32_t n = cold_->pages(s)[static_cast<size_t>(refs_[i].page)].n_slots;
        if (!ok[i]) {
          complete_ = false;
          ++i;
          continue;
        }
        if (v.n_slots % ps != 0) break;  // the run ended with a partial record
        pages_.push_back(outs_[i]);
        v.n_slots += n;
        ++pages_read_;
        bytes_read_ += rec;
        ++i;
      }
      if (v.n_slots > 0) views_.push_back(v);
    }
    range_[static_cast<size_t>(s)] = {first, static_cast<int32_t>(views_.size())};
  }
}

std::span<const kernels::KvStreamView> ColdAttend::views(int32_t stream) const {
  const auto [b, e] = range_[static_cast<size_t>(stream)];
  return {views_.data() + b, static_cast<size_t>(e - b)};
}

}  // namespace kvpack::compress
