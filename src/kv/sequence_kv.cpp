#include "kv/sequence_kv.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace kvpack::kv {

SequenceKv::SequenceKv(PagePool& pool, int32_t n_layers, int32_t n_kv_heads)
    : pool_(&pool), n_layers_(n_layers), n_kv_heads_(n_kv_heads), streams_(static_cast<size_t>(n_layers) * n_kv_heads) {}

SequenceKv::~SequenceKv() { clear(); }

void SequenceKv::clear() {
  for (auto& s : streams_) {
    if (!s.pages.empty()) pool_->release_reservation(s.pages.back());
    for (PageId p : s.pages) pool_->release(p);
    s.pages.clear();
    s.page_ptrs.clear();
    s.n_slots = 0;
    s.dropped_pages = 0;
  }
  next_pos_ = 0;
}

int64_t SequenceKv::pages_needed(int32_t n) const {
  const int32_t ps = pool_->config().page_size;
  int64_t need = 0;
  for (const auto& s : streams_) {
    const int64_t have = static_cast<int64_t>(s.pages.size());
    const int64_t want = (static_cast<int64_t>(s.n_slots) + n + ps - 1) / ps;
    need += std::max<int64_t>(0, want - have);
    if (n > 0 && s.n_slots % ps != 0 && pool_->is_shared(s.pages.back())) ++need;  // copy-on-write (append)
  }
  return need;
}

bool SequenceKv::append(int32_t n, int32_t pos0) {
  if (n <= 0) return true;
  const int32_t ps = pool_->config().page_size;
  if (pages_needed(n) > pool_->free_pages()) return false;
  // A shared (prefix-cached) page is read-only: if the last page is shared and partially filled,
  // writing into it would corrupt the other owner, so copy it first.
  for (auto& s : streams_)
    if (s.n_slots % ps != 0 && pool_->is_shared(s.pages.back()) && !make_private(s, s.pages.size() - 1))
      return false;
  for (auto& s : streams_) {
    const size_t want = (static_cast<size_t>(s.n_slots) + n + ps - 1) / ps;
    while (s.pages.size() < want) {
      const PageId p = pool_->allocate_after(s.pages.empty() ? kNoPage : s.pages.back());
      if (p == kNoPage) {  // cannot happen after the check above unless memory ran out: undo
        for (auto& u : streams_) shrink_to(u, u.n_slots);
        return false;
      }
      s.pages.push_back(p);
      s.page_ptrs.push_back(pool_->data(p));
    }
  }
  for (auto& s : streams_) {
    for (int32_t i = 0; i < n; ++i) {
      const int32_t slot = s.n_slots + i;
      pool_->positions(s.pages[static_cast<size_t>(slot / ps)])[slot % ps] = pos0 + i;
    }
    s.n_slots += n;
  }
  next_pos_ = std::max(next_pos_, pos0 + n);
  return true;
}

void SequenceKv::reserve_slots(int32_t slots) {
  const int32_t ps = pool_->config().page_size;
  const size_t pages = static_cast<size_t>(std::max(slots, 0) + ps - 1) / static_cast<size_t>(ps) + 1;
  for (auto& s : streams_) {
    s.pages.reserve(pages);
    s.page_ptrs.reserve(pages);
  }
}

int32_t SequenceKv::max_slots() const {
  int32_t m = 0;
  for (const auto& s : streams_) m = std::max(m, s.n_slots);
  return m;
}

int64_t SequenceKv::total_slots() const {
  int64_t t = 0;
  for (const auto& s : streams_) t += s.n_slots;
  return t;
}

int64_t SequenceKv::pages_held() const {
  int64_t t = 0;
  for (const auto& s : streams_) t += static_cast<int64_t>(s.pages.size());
  return t;
}

uint8_t* SequenceKv::k_slot(int32_t stream, int32_t slot) {
  const int32_t ps = pool_->config().page_size;
  auto& s = streams_[static_cast<size_t>(stream)];
  return pool_->data(s.pages[static_cast<size_t>(slot / ps)]) + static_cast<size_t>(slot % ps) * pool_->slot_bytes();
}

uint8_t* SequenceKv::v_slot(int32_t stream, int32_t slot) { return k_slot(stream, slot) + pool_->v_offset(); }

int32_t& SequenceKv::position(int32_t stream, int32_t slot) {
  const int32_t ps = pool_->config().page_size;
  return pool_->positions(streams_[static_cast<size_t>(stream)].pages[static_cast<size_t>(slot / ps)])[slot % ps];
}

int32_t SequenceKv::position(int32_t stream, int32_t slot) const {
  return const_cast<SequenceKv*>(this)->position(stream, slot);
}

void SequenceKv::copy_positions(int32_t stream, std::vector<int32_t>& out) const {
  const auto& st = streams_[static_cast<size_t>(stream)];
  const int32_t ps = pool_->config().page_size;
  out.resize(static_cast<size_t>(st.n_slots));
  for (int32_t j = 0; j < st.n_slots; j += ps) {
    const int32_t* src = pool_->positions(st.pages[static_cast<size_t>(j / ps)]);
    std::copy(src, src + std::min(ps, st.n_slots - j), out.begin() + j);
  }
}

kernels::KvStreamView SequenceKv::view(int32_t stream) const {
  const auto& s = streams_[static_cast<size_t>(stream)];
  kernels::KvStreamView v;
  v.pages = s.page_ptrs.data();
  v.n_slots = s.n_slots;
  v.page_size = pool_->config().page_size;
  v.head_dim = pool_->config().head_dim;
  v.kv_type = pool_->config().kv_type;
  v.v_offset = pool_->v_offset();
  return v;
}

void SequenceKv::shrink_to(Stream& s, int32_t n_slots) {
  const int32_t ps = pool_->config().page_size;
  const size_t keep_pages = (static_cast<size_t>(n_slots) + ps - 1) / ps;
  if (s.pages.size() > keep_pages) pool_->release_reservation(s.pages.back());
  while (s.pages.size() > keep_pages) {
    pool_->release(s.pages.back());
    s.pages.pop_back();
    s.page_ptrs.pop_back();
  }
  s.n_slots = n_slots;
}

bool SequenceKv::make_private(Stream& s, size_t page_index) {
  const PageId old = s.pages[page_index];
  if (!pool_->is_shared(old)) return true;
  const PageId fresh = pool_->allocate_after(page_index > 0 ? s.pages[page_index - 1] : kNoPage, page_index + 1 == s.pages.size());
  if (fresh == kNoPage) return false;
  std::memcpy(pool_->data(fresh), pool_->data(old), pool_->page_bytes());
  const int32_t ps = pool_->config().page_size;
  std::memcpy(pool_->positions(fresh), pool_->positions(old), sizeof(int32_t) * static_cast<size_t>(ps));
  pool_->release(old);
  s.pages[page_index] = fresh;
  s.page_ptrs[page_index] = pool_->data(fresh);
  return true;
}

int64_t SequenceKv::shared_pages_in(const Stream& s, int32_t from, int32_t to) const {
  if (from >= to) return 0;
  const int32_t ps = pool_->config().page_size;
  const size_t last = std::min(s.pages.size(), static_cast<size_t>((to - 1) / ps) + 1);
  int64_t n = 0;
  for (size_t p = static_cast<size_t>(from / ps); p < last; ++p) n += pool_->is_shared(s.pages[p]) ? 1 : 0;
  return n;
}

namespace {
// Survivors slide forward into the lowest slots in their original order; slots before the first
// dropped one stay where they are. The first slot compaction writes.
int32_t first_moved(std::span<const int32_t> keep) {
  int32_t dst = 0;
  while (dst < static_cast<int32_t>(keep.size()) && keep[static_cast<size_t>(dst)] == dst) ++dst;
  return dst;
}
}  // namespace

int64_t SequenceKv::compaction_copies(int32_t stream, std::span<const int32_t> keep) const {
  return shared_pages_in(streams_[static_cast<size_t>(stream)], first_moved(keep), static_cast<int32_t>(keep.size()));
}

int64_t SequenceKv::compact_stream(int32_t stream, std::span<const int32_t> keep) {
  auto& s = streams_[static_cast<size_t>(stream)];
  const int64_t pages_before = static_cast<int64_t>(s.pages.size());
  // Unmodified (possibly shared) pages before the first moved slot are never touched; every shared page
  // after it is copied before its first write, so the copies must all be possible before anything moves.
  if (shared_pages_in(s, first_moved(keep), static_cast<int32_t>(keep.size())) > pool_->free_pages()) return -1;
  slide_kept(s, keep);
  shrink_to(s, static_cast<int32_t>(keep.size()));
  return pages_before - static_cast<int64_t>(s.pages.size());
}

void SequenceKv::slide_kept(Stream& s, std::span<const int32_t> keep) {
  const int32_t ps = pool_->config().page_size;
  const size_t row = pool_->slot_bytes();
  const size_t voff = pool_->v_offset();
  size_t private_page = SIZE_MAX;
  for (int32_t dst = first_moved(keep); dst < static_cast<int32_t>(keep.size()); ++dst) {
    const int32_t src = keep[static_cast<size_t>(dst)];
    const size_t dpage = static_cast<size_t>(dst / ps);
    if (dpage != private_page) {
      // first write into this destination page: copy-on-write if shared (the callers checked: cannot fail)
      if (!make_private(s, dpage)) throw std::logic_error("compact_stream: pool exhausted after the check");
      private_page = dpage;
    }
    const PageId sp = s.pages[static_cast<size_t>(src / ps)], dp = s.pages[dpage];
    const uint8_t* from = pool_->data(sp) + static_cast<size_t>(src % ps) * row;
    uint8_t* to = pool_->data(dp) + static_cast<size_t>(dst % ps) * row;
    std::memcpy(to, from, row);
    std::memcpy(to + voff, from + voff, row);
    pool_->positions(dp)[dst % ps] = pool_->positions(sp)[src % ps];
  }
}

void SequenceKv::compact_streams(std::span<const int32_t> streams, std::span<const std::span<const int32_t>> keeps,
                                 ThreadPool* pool, std::span<int64_t> freed) {
  if (keeps.size() != streams.size() || freed.size() != streams.size())
    throw std::invalid_argument("compact_streams: one keep set and one result per stream");
  for (size_t i = 0; i < streams.size(); ++i)
    if (compaction_copies(streams[i], keeps[i]) != 0) throw std::logic_error("compact_streams: a stream needs copy-on-write");
  // No shared page is written (checked), so make_private allocates nothing and a slide reads and writes
  // only its own stream's pages.
  const auto slide = [&](size_t i) { slide_kept(streams_[static_cast<size_t>(streams[i])], keeps[i]); };
  if (pool != nullptr) {
    pool->run(static_cast<int32_t>(streams.size()), [&](int i, int) { slide(static_cast<size_t>(i)); });
  } else {
    for (size_t i = 0; i < streams.size(); ++i) slide(i);
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    auto& s = streams_[static_cast<size_t>(streams[i])];
    const int64_t before = static_cast<int64_t>(s.pages.size());
    shrink_to(s, static_cast<int32_t>(keeps[i].size()));
    freed[i] = before - static_cast<int64_t>(s.pages.size());
  }
}

bool SequenceKv::splice_stream(int32_t stream, std::span<const int32_t> keep, std::span<const InsertedSlot> insert) {
  auto& s = streams_[static_cast<size_t>(stream)];
  const int32_t ps = pool_->config().page_size;
  const size_t row = pool_->slot_bytes();
  const size_t voff = pool_->v_offset();
  const int32_t n_new = static_cast<int32_t>(keep.size() + insert.size());
  const size_t pages_new = (static_cast<size_t>(n_new) + ps - 1) / ps;
  if (pages_new > s.pages.size() && static_cast<int64_t>(pages_new - s.pages.size()) > pool_->free_pages()) return false;
  // The merged order: kept slots stay in order, inserted ones go before the first kept slot with a
  // larger position.
  std::vector<SpliceSource>& order = splice_.order;
  order.clear();
  order.reserve(static_cast<size_t>(n_new));
  size_t i = 0, j = 0;
  while (i < keep.size() || j < insert.size()) {
    const bool take_insert = j < insert.size() && (i == keep.size() || insert[j].pos < position(stream, keep[i]));
    if (take_insert) order.push_back({-1, static_cast<int32_t>(j++)});
    else order.push_back({keep[i++], -1});
  }
  // Only slots [first, last) change: before `first` and from `last` on, each slot is the kept slot of
  // the same index (a recall exchanges as many slots as it brings back, so the offset returns to zero
  // after the last victim or insert, usually well before the stream's recent end).
  int32_t first = 0;
  while (first < n_new && order[static_cast<size_t>(first)].kept == first) ++first;
  int32_t last = n_new;
  while (last > first && order[static_cast<size_t>(last) - 1].kept == last - 1) --last;
  // New pages and copies of the shared pages written in [first, last), all before anything changes.
  const int64_t grow = pages_new > s.pages.size() ? static_cast<int64_t>(pages_new - s.pages.size()) : 0;
  if (grow + shared_pages_in(s, first, last) > pool_->free_pages()) return false;
  // Copy the changed range out first: sources and destinations overlap in both directions. The
  // buffers are kept between calls: a fresh one per splice cost page faults on every exchange.
  const size_t span = static_cast<size_t>(last - first);
  if (splice_.k.size() < span * row) {
    splice_.k.resize(span * row);
    splice_.v.resize(span * row);
  }
  splice_.pos.resize(span);
  uint8_t* const k = splice_.k.data();
  uint8_t* const v = splice_.v.data();
  for (size_t t = 0; t < span; ++t) {
    const SpliceSource& src = order[static_cast<size_t>(first) + t];
    if (src.kept >= 0) {
      std::memcpy(k + t * row, k_slot(stream, src.kept), row);
      std::memcpy(v + t * row, v_slot(stream, src.kept), row);
      splice_.pos[t] = position(stream, src.kept);
    } else {
      const InsertedSlot& in = insert[static_cast<size_t>(src.ins)];
      std::memcpy(k + t * row, in.k, row);
      std::memcpy(v + t * row, in.v, row);
      splice_.pos[t] = in.pos;
    }
  }
  while (s.pages.size() < pages_new) {
    const PageId p = pool_->allocate_after(s.pages.empty() ? kNoPage : s.pages.back());
    if (p == kNoPage) {
      shrink_to(s, s.n_slots);  // memory refused after the check: give the new pages back, unchanged
      return false;
    }
    s.pages.push_back(p);
    s.page_ptrs.push_back(pool_->data(p));
  }
  size_t private_page = SIZE_MAX;
  for (size_t t = 0; t < span; ++t) {
    const int32_t dst = first + static_cast<int32_t>(t);
    const size_t dpage = static_cast<size_t>(dst / ps);
    if (dpage != private_page) {
      if (!make_private(s, dpage)) throw std::logic_error("splice_stream: pool exhausted after the check");
      private_page = dpage;
    }
    uint8_t* dp = pool_->data(s.pages[dpage]) + static_cast<size_t>(dst % ps) * row;
    std::memcpy(dp, k + t * row, row);
    std::memcpy(dp + voff, v + t * row, row);
    pool_->positions(s.pages[dpage])[dst % ps] = splice_.pos[t];
  }
  shrink_to(s, n_new);
  return true;
}

void SequenceKv::attach_shared_block(std::span<const PageId> pages_per_stream, int32_t pos0) {
  const int32_t ps = pool_->config().page_size;
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = streams_[i];
    if (s.n_slots % ps != 0 || static_cast<size_t>(s.n_slots / ps) != s.pages.size())
      throw std::logic_error("attach_shared_block: stream not at a page boundary");
    pool_->retain(pages_per_stream[i]);
    s.pages.push_back(pages_per_stream[i]);
    s.page_ptrs.push_back(pool_->data(pages_per_stream[i]));
    s.n_slots += ps;
  }
  next_pos_ = std::max(next_pos_, pos0 + ps);
}

int64_t SequenceKv::share_from(const SequenceKv& parent) {
  if (parent.pool_ != pool_ || parent.streams_.size() != streams_.size()) throw std::logic_error("share_from: other pool or shape");
  if (pages_held() != 0) throw std::logic_error("share_from: sequence is not empty");
  const int32_t ps = pool_->config().page_size;
  int64_t full = 0;
  for (size_t i = 0; i < streams_.size(); ++i) {
    const Stream& from = parent.streams_[i];
    Stream& s = streams_[i];
    for (PageId p : from.pages) {
      pool_->retain(p);
      s.pages.push_back(p);
      s.page_ptrs.push_back(pool_->data(p));
    }
    s.n_slots = from.n_slots;
    s.dropped_pages = from.dropped_pages;
    full += from.n_slots / ps;
  }
  next_pos_ = parent.next_pos_;
  return full;
}

bool SequenceKv::restore_stream(int32_t stream, std::span<const PageId> pages, int32_t n_slots, int32_t dropped_pages) {
  Stream& s = streams_[static_cast<size_t>(stream)];
  if (!s.pages.empty()) throw std::logic_error("restore_stream: stream is not empty");
  bool ok = true;
  for (PageId p : pages) {
    if (p == kNoPage && ok) {
      p = pool_->allocate_after(s.pages.empty() ? kNoPage : s.pages.back());
      ok = p != kNoPage;
    }
    if (p == kNoPage) continue;  // after a failed allocation: the remaining handed-over pages still join
    s.pages.push_back(p);
    s.page_ptrs.push_back(pool_->data(p));
  }
  s.n_slots = ok ? n_slots : 0;
  s.dropped_pages = ok ? dropped_pages : 0;
  return ok;
}

int64_t SequenceKv::drop_pages_before(int32_t stream, int32_t min_pos) {
  const int32_t ps = pool_->config().page_size;
  Stream& s = streams_[static_cast<size_t>(stream)];
  size_t n = 0;
  // Positions increase along a stream, so a full page is out when its last slot is.
  while (static_cast<int64_t>(n + 1) * ps <= s.n_slots && pool_->positions(s.pages[n])[ps - 1] < min_pos) ++n;
  if (n == 0) return 0;
  for (size_t i = 0; i < n; ++i) pool_->release(s.pages[i]);
  // Shifting the tables keeps their capacity: no allocation on the decode path.
  s.pages.erase(s.pages.begin(), s.pages.begin() + static_cast<std::ptrdiff_t>(n));
  s.page_ptrs.erase(s.page_ptrs.begin(), s.page_ptrs.begin() + static_cast<std::ptrdiff_t>(n));
  s.n_slots -= static_cast<int32_t>(n) * ps;
  s.dropped_pages += static_cast<int32_t>(n);
  return static_cast<int64_t>(n);
}

void SequenceKv::truncate_tail(int32_t n) {
  for (auto& s : streams_) shrink_to(s, std::max(0, s.n_slots - n));
  next_pos_ = std::max(0, next_pos_ - n);
}

}  // namespace kvpack::kv
