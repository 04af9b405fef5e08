// The simulated prefix cache of `kvpack analyze-prefix` against the engine's own (kv::KvManager): the
// same cached-token count for every request of real rendered traffic (stories260K's tokenizer), plus
// the rules on their own: whole blocks only, one token always left to compute, salts apart, LRU.
#include <gtest/gtest.h>

#include <memory>

#include "analyze/prefix_sim.h"
#include "analyze/prompt_render.h"
#include "analyze/traffic_gen.h"
#include "gguf/gguf.h"
#include "kv/kv_manager.h"
#include "server/api.h"
#include "shared_files.h"

using namespace kvpack;
using namespace kvpack::analyze;

namespace {

std::vector<int32_t> iota(int32_t n, int32_t base) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = base + i;
  return t;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST(PrefixSim, MatchesTheEnginesPrefixCacheOnRealTraffic) {
  const auto file = gguf::File::open(test::shared_path("models/stories260K.gguf"));
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  PromptRenderer renderer(tok, server::ChatFormat::Plain);
  TrafficSpec spec;
  spec.requests = 120;
  spec.planted = {Cause::Volatile, Cause::Tools, Cause::Truncation};  // some reuse, some not
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> salts;
  for (const auto& r : generate_traffic(spec)) {
    prompts.push_back(renderer.tokens(r));
    salts.push_back(prompts.size() % 7 == 0 ? "tenant-b" : "");  // a few requests under another salt
  }
  constexpr int32_t kPage = 16;
  const SimResult sim = simulate_prefix_cache(prompts, salts, {kPage, 0});

  // The engine: a pool big enough to hold every block (unbounded, as the simulation), one stream.
  kv::PoolConfig pc;
  pc.page_size = kPage;
  pc.head_dim = 4;
  pc.kv_type = DType::F32;
  pc.max_pages = 1 << 16;
  kv::KvManager m(pc, 1, 1);
  int64_t engine_cached = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    const uint64_t salt = salts[i].empty() ? 0 : server::salt_hash(salts[i]);
    auto kv = m.new_sequence();
    const int32_t hit = m.attach_cached_prefix(*kv, p, salt);
    ASSERT_TRUE(kv->append(static_cast<int32_t>(p.size()) - hit, hit));
    m.register_blocks(*kv, p, static_cast<int32_t>(p.size()) / kPage, salt);
    EXPECT_EQ(sim.cached[i], hit) << "request " << i;
    engine_cached += hit;
  }
  EXPECT_EQ(sim.cached_tokens, engine_cached);
  EXPECT_GT(sim.cached_tokens, 0);
  EXPECT_LT(sim.cached_tokens, sim.prompt_tokens);
}

TEST(PrefixSim, WholeBlocksOnlyAndOneTokenLeftToCompute) {
  const std::vector<std::vector<int32_t>> prompts = {iota(32, 0), iota(32, 0), iota(40, 0), iota(33, 0), iota(20, 0)};
  const SimResult r = simulate_prefix_cache(prompts, {}, {16, 0});
  // Exactly two blocks again: the second is recomputed so the last token gets logits.
  EXPECT_EQ(r.cached, (std::vector<int32_t>{0, 16, 32, 32, 16}));
  EXPECT_EQ(r.prompt_tokens, 32 + 32 + 40 + 33 + 20);
  EXPECT_EQ(r.computed_tokens(), r.prompt_tokens - 96);
}

TEST(PrefixSim, ADifferenceEndsReuseAtItsBlockAndSaltsAreApart) {
  const auto shared = iota(48, 0);
  std::vector<std::vector<int32_t>> prompts = {cat(shared, iota(16, 100)), cat(shared, iota(16, 200))};
  prompts[1][20] = 999;  // inside the second block
  prompts.push_back(cat(shared, iota(16, 300)));
  const std::vector<std::string> salts = {"", "", "other"};
  const SimResult r = simulate_prefix_cache(prompts, salts, {16, 0});
  EXPECT_EQ(r.cached, (std::vector<int32_t>{0, 16, 0}));
}

TEST(PrefixSim, ABoundedCacheDropsTheLeastRecentlyUsedBlocks) {
  const auto a = iota(33, 0), b = iota(33, 1000), c = iota(33, 2000);
  // Room for four blocks: a (2 blocks) and b (2) fit; c pushes out b, used less recently than a.
  const std::vector<std::vector<int32_t>> order = {a, b, a, c, a, b};
  EXPECT_EQ(simulate_prefix_cache(order, {}, {16, 64}).cached, (std::vector<int32_t>{0, 0, 32, 0, 32, 0}));
  EXPECT_EQ(simulate_prefix_cache(order, {}, {16, 0}).cached, (std::vector<int32_t>{0, 0, 32, 0, 32, 32}));
}
