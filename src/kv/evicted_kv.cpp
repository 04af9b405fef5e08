#include "kv/evicted_kv.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>

#include "util/half.h"

namespace kvpack::kv {

namespace {

uint64_t evicted_key(uint64_t uid, uint64_t record) {
  const uint64_t parts[3] = {0x6576696374000000ull /* "evict" */, uid, record};
  return XXH3_64bits(parts, sizeof parts);
}

}  // namespace

void EvictedStats::add(const EvictedStats& o) {
  pages_written += o.pages_written;
  slots_written += o.slots_written;
  pages_refused += o.pages_refused;
  pages_read += o.pages_read;
  pages_lost += o.pages_lost;
  bytes_written += o.bytes_written;
  digest_bytes += o.digest_bytes;
}

EvictedKv::EvictedKv(ColdTier& tier, const PagePool& pool, uint64_t uid, int32_t n_streams)
    : tier_(&tier),
      pool_(&pool),
      uid_(uid),
      head_dim_(pool.config().head_dim),
      page_size_(pool.config().page_size),
      kv_type_(pool.config().kv_type),
      streams_(static_cast<size_t>(n_streams)),
      scratch_(3 * static_cast<size_t>(pool.config().head_dim)) {
  if (tier.record_bytes() != pool.record_bytes())
    throw std::invalid_argument("EvictedKv: cold tier records are not KV page records");
}

EvictedKv::~EvictedKv() { clear(); }

void EvictedKv::add(const SequenceKv& kv, int32_t stream, std::span<const int32_t> keep) {
  const std::span<const int32_t> keeps[1] = {keep};
  add_many(kv, std::span(&stream, 1), keeps, nullptr);
}

void EvictedKv::add_many(const SequenceKv& kv, std::span<const int32_t> streams, std::span<const std::span<const int32_t>> keeps,
                         ThreadPool* pool) {
  if (keeps.size() != streams.size()) throw std::invalid_argument("EvictedKv::add_many: one keep per stream");
  const size_t record = pool_->record_bytes();
  // Plan, in stream order, every record the streams' evicted slots fill: its key, page entry, digest
  // place and stage place are assigned here, on the caller, exactly as a stream-by-stream loop would (the
  // same keys, the same staged order, the same commit points); the copies and digests, which touch only
  // their own record, page entry and digest, then run in parallel per planned batch.
  evicted_slots_.clear();
  jobs_.clear();
  for (size_t i = 0; i < streams.size(); ++i) {
    const int32_t stream = streams[i];
    const std::span<const int32_t> keep = keeps[i];
    const int32_t n = kv.n_slots(stream);
    if (static_cast<int32_t>(keep.size()) >= n) continue;
    const size_t first = evicted_slots_.size();
    size_t k = 0;  // next index into keep
    for (int32_t slot = 0; slot < n; ++slot) {
      if (k < keep.size() && keep[k] == slot) {
        ++k;
        continue;
      }
      evicted_slots_.push_back(slot);
    }
    Stream& st = streams_[static_cast<size_t>(stream)];
    for (size_t from = first; from < evicted_slots_.size(); from += static_cast<size_t>(page_size_)) {
      if (!staged_.empty() && stage_.size() + record > kStageBytes) {  // bounded staging
        fill_jobs(kv, pool);
        commit();
      }
      if (stage_.capacity() < stage_.size() + record) stage_.reserve(std::max(kStageBytes, record));  // once: no regrowth copies
      const size_t to = std::min(evicted_slots_.size(), from + static_cast<size_t>(page_size_));
      jobs_.push_back({stream, static_cast<int32_t>(st.pages.size()), from, to, stage_.size()});
      stage_.resize(stage_.size() + record);
      st.pages.push_back(EvictedPage{evicted_key(uid_, next_record_++), 0, 0, 0, false});
      st.digests.resize(st.digests.size() + 2 * static_cast<size_t>(head_dim_));
      staged_.push_back({stream, static_cast<int32_t>(st.pages.size()) - 1});
    }
  }
  fill_jobs(kv, pool);
}

void EvictedKv::fill_jobs(const SequenceKv& kv, ThreadPool* pool) {
  const size_t hd = static_cast<size_t>(head_dim_);
  const int threads = pool != nullptr ? pool->size() : 1;
  if (scratch_.size() < static_cast<size_t>(threads) * 3 * hd) scratch_.resize(static_cast<size_t>(threads) * 3 * hd);
  auto fill = [&](int task, int thread) { fill_record(kv, jobs_[static_cast<size_t>(task)], scratch_.data() + static_cast<size_t>(thread) * 3 * hd); };
  if (pool != nullptr && jobs_.size() > 1) {
    pool->run(static_cast<int>(jobs_.size()), fill);
  } else {
    for (size_t j = 0; j < jobs_.size(); ++j) fill(static_cast<int>(j), 0);
  }
  jobs_.clear();
}

void EvictedKv::fill_record(const SequenceKv& kv, const Job& job, float* scratch) {
  const size_t row = pool_->slot_bytes();
  const size_t voff = pool_->v_offset();
  const size_t pos_off = pool_->record_bytes() - sizeof(int32_t) * static_cast<size_t>(page_size_);
  const size_t hd = static_cast<size_t>(head_dim_);
  const auto table = kv.page_table(job.stream);
  uint8_t* rec = stage_.data() + job.stage_at;
  std::memset(rec, 0, pool_->record_bytes());
  auto* positions = reinterpret_cast<int32_t*>(rec + pos_off);
  std::fill_n(positions, page_size_, -1);
  // The page's box in f32, then its f16 digest: minima rounded down, maxima up.
  float* decoded = scratch;
  float* mn = scratch + hd;
  float* mx = mn + hd;
  std::fill_n(mn, hd, std::numeric_limits<float>::infinity());
  std::fill_n(mx, hd, -std::numeric_limits<float>::infinity());
  EvictedPage& page = streams_[static_cast<size_t>(job.stream)].pages[static_cast<size_t>(job.page)];
  for (size_t e = job.from; e < job.to; ++e) {
    const int32_t slot = evicted_slots_[e];
    const size_t in_record = e - job.from;
    const PageId p = table[static_cast<size_t>(slot / page_size_)];
    const uint8_t* src = pool_->data(p) + static_cast<size_t>(slot % page_size_) * row;
    std::memcpy(rec + in_record * row, src, row);
    std::memcpy(rec + voff + in_record * row, src + voff, row);
    const int32_t pos = pool_->positions(p)[slot % page_size_];
    positions[in_record] = pos;
    kernels::kv_decode_row(src, kv_type_, head_dim_, decoded);
    for (size_t i = 0; i < hd; ++i) {
      mn[i] = std::min(mn[i], decoded[i]);
      mx[i] = std::max(mx[i], decoded[i]);
    }
    if (in_record == 0) page.first_pos = pos;
    page.last_pos = pos;
  }
  page.n_slots = static_cast<int32_t>(job.to - job.from);
  uint16_t* d = streams_[static_cast<size_t>(job.stream)].digests.data() + static_cast<size_t>(job.page) * 2 * hd;
  for (size_t i = 0; i < hd; ++i) {
    d[i] = f32_to_fp16_floor(mn[i]);
    d[hd + i] = f32_to_fp16_ceil(mx[i]);
  }
}

std::unique_ptr<EvictedKv> EvictedKv::fork(uint64_t uid) const {
  if (!staged_.empty()) throw std::logic_error("EvictedKv::fork: records are staged");
  auto c = std::make_unique<EvictedKv>(*tier_, *pool_, uid, n_streams());
  c->streams_ = streams_;
  c->stats_ = stats_;
  std::vector<uint8_t> rec(pool_->record_bytes());
  for (Stream& st : c->streams_)
    for (EvictedPage& p : st.pages) {
      const uint64_t from = p.key;
      p.key = evicted_key(uid, c->next_record_++);
      if (p.lost) continue;
      if (!tier_->get(from, rec) || !tier_->put(p.key, rec)) {
        p.lost = true;
        ++c->stats_.pages_lost;
      }
    }
  return c;
}

void EvictedKv::commit() {
  if (staged_.empty()) return;
  const size_t record = pool_->record_bytes();
  stage_keys_.clear();
  stage_ptrs_.clear();
  for (size_t i = 0; i < staged_.size(); ++i) {
    const Staged& s = staged_[i];
    stage_keys_.push_back(streams_[static_cast<size_t>(s.stream)].pages[static_cast<size_t>(s.page)].key);
    stage_ptrs_.push_back(stage_.data() + i * record);
  }
  auto ok = std::make_unique<bool[]>(staged_.size());
  tier_->put_many(stage_keys_, stage_ptrs_, {ok.get(), staged_.size()});
  for (size_t i = 0; i < staged_.size(); ++i) {
    EvictedPage& page = streams_[static_cast<size_t>(staged_[i].stream)].pages[static_cast<size_t>(staged_[i].page)];
    if (ok[i]) {
      ++stats_.pages_written;
      stats_.slots_written += page.n_slots;
      stats_.bytes_written += record;
    } else {
      page.lost = true;
      ++stats_.pages_refused;
      ++stats_.pages_lost;
    }
  }
  staged_.clear();
  stage_.clear();
  uint64_t digest = 0;
  for (const Stream& s : streams_) digest += s.digests.size() * sizeof(uint16_t);
  stats_.digest_bytes = digest;
}

std::span<const uint16_t> EvictedKv::digest(int32_t stream, int32_t page) const {
  const size_t hd = static_cast<size_t>(head_dim_);
  return std::span<const uint16_t>(streams_[static_cast<size_t>(stream)].digests).subspan(static_cast<size_t>(page) * 2 * hd, 2 * hd);
}

float EvictedKv::upper_bound(int32_t stream, int32_t page, const float* q) const {
  const std::span<const uint16_t> d = digest(stream, page);
  float bound = 0.0f;
  for (int32_t i = 0; i < head_dim_; ++i)
    bound += std::max(q[i] * fp16_to_f32(d[static_cast<size_t>(i)]), q[i] * fp16_to_f32(d[static_cast<size_t>(head_dim_ + i)]));
  return bound;
}

bool EvictedKv::read(int32_t stream, int32_t page, std::span<uint8_t> out) {
  EvictedPage& p = streams_[static_cast<size_t>(stream)].pages[static_cast<size_t>(page)];
  if (p.lost) return false;
  if (!tier_->get(p.key, out)) {
    p.lost = true;
    ++stats_.pages_lost;
    return false;
  }
  ++stats_.pages_read;
  return true;
}

std::span<const bool> EvictedKv::read_many(std::span<const PageRef> refs, std::span<uint8_t* const> out) {
  if (out.size() != refs.size()) throw std::invalid_argument("EvictedKv::read_many: as many buffers as pages");
  if (read_cap_ < refs.size()) {
    read_cap_ = refs.size();
    read_got_ = std::make_unique<bool[]>(read_cap_);
    read_ok_ = std::make_unique<bool[]>(read_cap_);
  }
  const std::span<bool> ok(read_ok_.get(), refs.size());
  // Lost pages are not asked for; the rest go to the tier in the caller's order.
  read_keys_.clear();
  read_ptrs_.clear();
  read_index_.clear();
  for (size_t i = 0; i < refs.size(); ++i) {
    ok[i] = false;
    const EvictedPage& p = streams_[static_cast<size_t>(refs[i].stream)].pages[static_cast<size_t>(refs[i].page)];
    if (p.lost) continue;
    read_keys_.push_back(p.key);
    read_ptrs_.push_back(out[i]);
    read_index_.push_back(i);
  }
  if (read_keys_.empty()) return ok;
  tier_->get_many(read_keys_, read_ptrs_, {read_got_.get(), read_keys_.size()});
  for (size_t j = 0; j < read_keys_.size(); ++j) {
    const size_t i = read_index_[j];
    EvictedPage& p = streams_[static_cast<size_t>(refs[i].stream)].pages[static_cast<size_t>(refs[i].page)];
    if (read_got_[j]) {
      ok[i] = true;
      ++stats_.pages_read;
    } else if (!p.lost) {  // a page asked for twice is counted lost once
      p.lost = true;
      ++stats_.pages_lost;
    }
  }
  return ok;
}

void EvictedKv::forget(int32_t stream, int32_t page) {
  EvictedPage& p = streams_[static_cast<size_t>(stream)].pages[static_cast<size_t>(page)];
  if (!p.lost) tier_->erase(p.key);
  p.lost = true;
  p.recalled = true;
}

void EvictedKv::forget_from(int32_t pos) {
  for (size_t s = 0; s < streams_.size(); ++s)
    for (size_t p = 0; p < streams_[s].pages.size(); ++p) {
      const EvictedPage& page = streams_[s].pages[p];
      if (!page.recalled && page.n_slots > 0 && page.last_pos >= pos) forget(static_cast<int32_t>(s), static_cast<int32_t>(p));
    }
}

void EvictedKv::clear() {
  for (Stream& s : streams_) {
    for (const EvictedPage& p : s.pages)
      if (!p.lost) tier_->erase(p.key);
    s.pages.clear();
    s.digests.clear();
  }
  staged_.clear();
  stage_.clear();
  stats_.digest_bytes = 0;
}

}  // namespace kvpack::kv
