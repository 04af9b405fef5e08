#include "kv/kv_manager.h"

#include <vector>

namespace kvpack::kv {

KvManager::KvManager(const PoolConfig& pool, int32_t n_layers, int32_t n_kv_heads, uint64_t model_salt)
    : n_layers_(n_layers), n_kv_heads_(n_kv_heads), pool_(pool), cache_(pool_, n_layers * n_kv_heads, model_salt) {}

KvManager::~KvManager() = default;

std::unique_ptr<SequenceKv> KvManager::new_sequence(int32_t reserve_slots) {
  auto kv = std::make_unique<SequenceKv>(pool_, n_layers_, n_kv_heads_);
  if (reserve_slots > 0) kv->reserve_slots(reserve_slots);
  return kv;
}

int32_t KvManager::attach_cached_prefix(SequenceKv& kv, std::span<const int32_t> tokens, uint64_t salt) {
  return cache_.attach(kv, tokens, salt);
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

std::string KvManager::check(std::span<const SequenceKv* const> live) const {
  std::vector<std::span<const PageId>> tables;
  for (const SequenceKv* kv : live)
    for (int32_t i = 0; i < kv->n_streams(); ++i) tables.push_back(kv->page_table(i));
  std::string e = pool_.check(tables);
  if (e.empty()) e = cache_.check();
  return e;
}

}  // namespace kvpack::kv
