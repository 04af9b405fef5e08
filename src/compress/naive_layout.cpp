#include "compress/naive_layout.h"

#include <algorithm>

namespace kvpack::compress {

NaiveLayout::NaiveLayout(int32_t n_streams, int32_t page_size)
    : page_size_(page_size), streams_(static_cast<size_t>(n_streams)) {}

void NaiveLayout::sync(int32_t s, int32_t live_slots) {
  Stream& st = streams_[static_cast<size_t>(s)];
  for (; st.live < live_slots; ++st.live, ++st.slots) {  // appended: the next virtual slot
    if (st.slots % page_size_ == 0) st.page_live.push_back(0);
    ++st.page_live.back();
  }
  for (; st.live > live_slots; --st.live) {  // rolled back: the newest slots, at the tail
    // Only slots appended since the last event are rolled back, and those are live and last.
    --st.slots;
    if (--st.page_live.back() == 0 && st.slots % page_size_ == 0) st.page_live.pop_back();
  }
}

int64_t NaiveLayout::evict(int32_t s, std::span<const int32_t> keep) {
  Stream& st = streams_[static_cast<size_t>(s)];
  // Count the survivors of each virtual page: live slot i belongs to the page where the running sum of
  // page_live first exceeds i.
  std::vector<int32_t> survivors(st.page_live.size(), 0);
  size_t pg = 0;
  int32_t page_end = st.page_live.empty() ? 0 : st.page_live[0];
  for (int32_t i : keep) {
    while (i >= page_end) page_end += st.page_live[++pg];
    ++survivors[pg];
  }
  // Remove the pages without survivors. Every page but the last is full, so the new slot count is
  // full pages for all kept pages but the last, plus the last kept page's own slot count.
  const int32_t n_pages = static_cast<int32_t>(st.page_live.size());
  const int32_t last_page_slots = st.slots - (n_pages - 1) * page_size_;
  std::vector<int32_t> kept;
  int32_t slots = 0;
  for (int32_t p = 0; p < n_pages; ++p) {
    if (survivors[static_cast<size_t>(p)] == 0) continue;
    kept.push_back(survivors[static_cast<size_t>(p)]);
    slots += p == n_pages - 1 ? last_page_slots : page_size_;
  }
  const int64_t freed = n_pages - static_cast<int64_t>(kept.size());
  st.page_live.swap(kept);
  st.slots = slots;
  st.live = static_cast<int32_t>(keep.size());
  return freed;
}

int64_t NaiveLayout::pages(int32_t s, int32_t live_slots) const {
  const Stream& st = streams_[static_cast<size_t>(s)];
  const int64_t slots = static_cast<int64_t>(st.slots) + live_slots - st.live;
  return (slots + page_size_ - 1) / page_size_;
}

}  // namespace kvpack::compress
