#include "kv/kv_manager.h"

#include <xxhash.h>

#include <chrono>
#include <stdexcept>
#include <vector>

namespace kvpack::kv {

KvManager::KvManager(const PoolConfig& pool, int32_t n_layers, int32_t n_kv_heads, uint64_t model_salt)
    : n_layers_(n_layers), n_kv_heads_(n_kv_heads), pool_(pool), cache_(pool_, n_layers * n_kv_heads, model_salt) {}

KvManager::~KvManager() = default;

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

uint64_t swap_key(uint64_t uid, int32_t stream, size_t page) {
  const uint64_t parts[4] = {0x7377617000000000ull /* "swap" */, uid, static_cast<uint64_t>(stream), page};
  return XXH3_64bits(parts, sizeof parts);
}
}  // namespace

int64_t SwappedKv::pages_total() const {
  int64_t n = 0;
  for (const auto& p : pages) n += static_cast<int64_t>(p.size());
  return n;
}

std::span<bool> KvManager::io_ok(size_t n) {
  if (n > io_ok_cap_) {
    io_ok_ = std::make_unique<bool[]>(n);
    io_ok_cap_ = n;
  }
  return std::span<bool>(io_ok_.get(), n);
}

void KvManager::set_cold_tier(std::unique_ptr<ColdTier> tier) {
  if (tier && tier->record_bytes() != pool_.record_bytes())
    throw std::invalid_argument("cold tier records are " + std::to_string(tier->record_bytes()) + " bytes, KV pages " +
                                std::to_string(pool_.record_bytes()));
  cache_.set_cold_tier(tier.get());
  cold_ = std::move(tier);
}

bool KvManager::swap_out(const SequenceKv& kv, uint64_t uid, SwappedKv& out) {
  if (!cold_) return false;
  const double t0 = now_s();
  SwappedKv sw;
  sw.uid = uid;
  sw.next_pos = kv.next_pos();
  sw.n_slots.resize(static_cast<size_t>(kv.n_streams()));
  sw.dropped_pages.resize(static_cast<size_t>(kv.n_streams()));
  sw.pages.resize(static_cast<size_t>(kv.n_streams()));
  io_src_.clear();
  for (int32_t s = 0; s < kv.n_streams(); ++s) {
    sw.n_slots[static_cast<size_t>(s)] = kv.n_slots(s);
    sw.dropped_pages[static_cast<size_t>(s)] = kv.dropped_pages(s);
    auto table = kv.page_table(s);
    auto& pages = sw.pages[static_cast<size_t>(s)];
    pages.assign(table.size(), kNoPage);
    for (size_t i = 0; i < table.size(); ++i) {
      if (pool_.refcount(table[i]) > 1) {
        pages[i] = table[i];  // shared with another holder: stays hot, referenced below on success
      } else {
        sw.keys.push_back(swap_key(uid, s, i));
        io_src_.push_back(pool_.data(table[i]));
      }
    }
  }
  std::span<bool> ok = io_ok(sw.keys.size());
  cold_->put_many(sw.keys, io_src_, ok);
  bool all = true;
  for (bool b : ok) all &= b;
  // A small tier may have made room for later records of this batch by evicting earlier ones (they are
  // pinned only now): all of them must be there.
  for (size_t i = 0; all && i < sw.keys.size(); ++i) all = cold_->contains(sw.keys[i]);
  if (!all) {
    for (uint64_t k : sw.keys) cold_->erase(k);
    ++cold_usage_.swap_out_failures;
    return false;
  }
  for (uint64_t k : sw.keys) cold_->pin(k, true);
  for (const auto& pages : sw.pages)
    for (PageId p : pages)
      if (p != kNoPage) pool_.retain(p);
  ++cold_usage_.swap_outs;
  cold_usage_.pages_swapped_out += static_cast<int64_t>(sw.keys.size());
  cold_usage_.swap_out_seconds += now_s() - t0;
  out = std::move(sw);
  return true;
}

int64_t KvManager::swap_in_pages(const SwappedKv& sw) const { return static_cast<int64_t>(sw.keys.size()); }

std::unique_ptr<SequenceKv> KvManager::swap_in(SwappedKv& sw, int32_t reserve_slots) {
  const double t0 = now_s();
  auto kv = new_sequence(reserve_slots);
  bool ok = cold_ != nullptr;
  for (size_t s = 0; s < sw.pages.size(); ++s)  // kept references move into the sequence, fresh pages join
    ok &= kv->restore_stream(static_cast<int32_t>(s), sw.pages[s], sw.n_slots[s], sw.dropped_pages[s]);
  if (ok) {
    io_dst_.clear();
    for (size_t s = 0; s < sw.pages.size(); ++s) {
      auto table = kv->page_table(static_cast<int32_t>(s));
      for (size_t i = 0; i < sw.pages[s].size(); ++i)
        if (sw.pages[s][i] == kNoPage) io_dst_.push_back(pool_.data(table[i]));
    }
    std::span<bool> got = io_ok(sw.keys.size());
    cold_->take_many(sw.keys, io_dst_, got);  // read and erase in one pass: the pages are hot again
    for (bool b : got) ok &= b;
  } else if (cold_) {
    for (uint64_t k : sw.keys) cold_->erase(k);
  }
  const int64_t n = static_cast<int64_t>(sw.keys.size());
  const int32_t next_pos = sw.next_pos;
  sw = SwappedKv{};
  if (!ok) {  // lost: the caller recomputes (never partial data)
    ++cold_usage_.swap_in_misses;
    return nullptr;
  }
  kv->set_next_pos(next_pos);
  ++cold_usage_.swap_ins;
  cold_usage_.pages_swapped_in += n;
  cold_usage_.swap_in_seconds += now_s() - t0;
  return kv;
}

void KvManager::drop_swapped(SwappedKv& sw) {
  if (cold_)
    for (uint64_t k : sw.keys) cold_->erase(k);
  for (const auto& pages : sw.pages)
    for (PageId p : pages)
      if (p != kNoPage) pool_.release(p);
  sw = SwappedKv{};
}

const ColdUsage& KvManager::cold_usage() {
  if (cold_) cold_usage_.tier = cold_->stats();
  return cold_usage_;
}

std::unique_ptr<SequenceKv> KvManager::new_sequence(int32_t reserve_slots) {
  auto kv = std::make_unique<SequenceKv>(pool_, n_layers_, n_kv_heads_);
  if (reserve_slots > 0) kv->reserve_slots(reserve_slots);
  return kv;
}

std::unique_ptr<SequenceKv> KvManager::fork_sequence(const SequenceKv& parent, int32_t reserve_slots, int64_t* shared_full_pages) {
  auto kv = new_sequence(reserve_slots);
  const int64_t full = kv->share_from(parent);
  if (shared_full_pages) *shared_full_pages = full;
  return kv;
}

int32_t KvManager::attach_cached_prefix(SequenceKv& kv, std::span<const int32_t> tokens, uint64_t salt, int32_t* from_cold,
                                        int32_t* from_shared) {
  return cache_.attach(kv, tokens, salt, from_cold, from_shared);
}

void KvManager::set_shared_tier(std::unique_ptr<SharedTier> tier, uint64_t model_id) {
  if (tier && (tier->record_bytes() != pool_.record_bytes() || tier->n_streams() != n_streams() || tier->page_size() != page_size()))
    throw std::invalid_argument("shared tier geometry (" + std::to_string(tier->record_bytes()) + " B records, " +
                                std::to_string(tier->n_streams()) + " streams, pages of " + std::to_string(tier->page_size()) +
                                ") does not match the KV pool's");
  cache_.set_shared_tier(tier.get(), model_id);
  shared_ = std::move(tier);
}

void KvManager::register_blocks(const SequenceKv& kv, std::span<const int32_t> tokens, int32_t n_blocks, uint64_t salt) {
  cache_.register_blocks(kv, tokens, n_blocks, salt);
}

int64_t KvManager::pages_for_slots(int64_t slots, bool compressed) const {
  const int32_t ps = page_size();
  return static_cast<int64_t>(n_streams()) * ((slots + ps - 1) / ps + (compressed ? 1 : 0));
}

KvUsage KvManager::usage() const {
  KvUsage u;
  u.pages_total = pool_.capacity();
  u.pages_used = pool_.used_pages();
  u.pages_cached_free = pool_.cached_free_pages();
  u.pages_free = pool_.free_pages();
  u.page_bytes = pool_.page_bytes();
  u.used_bytes = pool_.used_bytes();
  u.reserved_bytes = pool_.reserved_bytes();
  return u;
}

std::string KvManager::check(std::span<const SequenceKv* const> live, std::span<const SwappedKv* const> swapped) const {
  std::vector<std::span<const PageId>> tables;
  for (const SequenceKv* kv : live)
    for (int32_t i = 0; i < kv->n_streams(); ++i) tables.push_back(kv->page_table(i));
  std::vector<PageId> kept;
  for (const SwappedKv* sw : swapped) {
    for (const auto& pages : sw->pages)
      for (PageId p : pages)
        if (p != kNoPage) kept.push_back(p);
    for (uint64_t k : sw->keys)
      if (!cold_ || !cold_->contains(k)) return "swapped sequence " + std::to_string(sw->uid) + " lost a tier record";
  }
  tables.push_back(kept);
  std::string e = pool_.check(tables);
  if (e.empty()) e = cache_.check();
  return e;
}

}  // namespace kvpack::kv
