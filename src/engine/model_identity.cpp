#include "engine/model_identity.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu_features.h"

namespace kvpack {

namespace {
// Bumped whenever the page record layout (kv/page_pool.h) or the KV row formats change.
constexpr uint64_t kKvLayoutVersion = 1;
}  // namespace

uint64_t model_kv_identity(const Model& model, const kv::PoolConfig& pool) {
  std::ifstream in(model.path(), std::ios::binary);
  if (!in) throw std::runtime_error("cannot read the model file '" + model.path() + "' to identify its KV for the shared tier");
  XXH3_state_t st;
  XXH3_INITSTATE(&st);  // reset_withSeed reads the old seed: stack garbage equal to it skips the secret
  XXH3_64bits_reset(&st);
  std::vector<char> buf(4 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    XXH3_64bits_update(&st, buf.data(), static_cast<size_t>(in.gcount()));
  }
  const int64_t layout[] = {static_cast<int64_t>(kKvLayoutVersion), static_cast<int64_t>(pool.kv_type), pool.page_size, pool.head_dim};
  XXH3_64bits_update(&st, layout, sizeof layout);
  const std::string isa = std::string(kernels::isa_name(kernels::selected_isa(kernels::kMatmulIsa))) + "/" +
                          kernels::isa_name(kernels::selected_isa(kernels::kAttentionIsa));
  XXH3_64bits_update(&st, isa.data(), isa.size());
  return XXH3_64bits_digest(&st);
}

std::string identity_hex(uint64_t id) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(id));
  return b;
}

}  // namespace kvpack
