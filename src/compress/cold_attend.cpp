#include "compress/cold_attend.h"

#include <chrono>

namespace kvpack::compress {

void ColdAttend::bind(kv::EvictedKv& cold, const kv::SequenceKv& kv) {
  cold_ = &cold;
  kv_ = &kv;
  complete_ = true;
  pages_read_ = 0;
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
  // One view per run of full records of a stream; a partial record (the last of a compression event) ends
  // its run. pages_ never reallocates (reserved for every record), so the views may point into it.
  pages_.reserve(refs_.size());
  kernels::KvStreamView base = kv_->view(refs_[0].stream);
  base.v_offset = pool.v_offset();
  for (size_t i = 0; i < refs_.size(); ++i) {
    if (!ok[i]) {
      complete_ = false;  // the check is reported skipped: what the views hold no longer matters
      continue;
    }
    const int32_t s = refs_[i].stream;
    auto& range = range_[static_cast<size_t>(s)];
    if (range.first == range.second || views_.back().n_slots % ps != 0) {  // the stream's first view, or after a partial
      if (range.first == range.second) range.first = static_cast<int32_t>(views_.size());
      views_.push_back(base);
      views_.back().pages = pages_.data() + pages_.size();
      views_.back().n_slots = 0;
      range.second = static_cast<int32_t>(views_.size());
    }
    pages_.push_back(outs_[i]);
    views_.back().n_slots += cold_->pages(s)[static_cast<size_t>(refs_[i].page)].n_slots;
    ++pages_read_;
  }
}

std::span<const kernels::KvStreamView> ColdAttend::views(int32_t stream) const {
  const auto [b, e] = range_[static_cast<size_t>(stream)];
  return {views_.data() + b, static_cast<size_t>(e - b)};
}

}  // namespace kvpack::compress
