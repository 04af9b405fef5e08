// The public embedding API (include/kvpack/kvpack.h) end to end on the reference model.
#include <gtest/gtest.h>

#include <kvpack/kvpack.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace {
const std::string kShared = KVPACK_SHARED_DIR;
}

TEST(PublicApi, GreedyGenerationMatchesTheReferenceText) {
  auto s = kvpack::Session::open({.model_path = kShared + "/models/stories260K.gguf"});
  kvpack::GenerateOptions g;
  g.temperature = 0;
  g.max_tokens = 256;
  kvpack::GenerateStats st;
  std::string streamed;
  const std::string text = s->generate("", g, [&](std::string_view t) { streamed += t; return true; }, &st);
  std::stringstream want;
  want << std::ifstream(kShared + "/models/stories260K.greedy.txt").rdbuf();
  EXPECT_EQ(text + "\n", want.str());
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(st.generated_tokens, 256);
  EXPECT_EQ(st.prompt_tokens, 1);
  EXPECT_GT(st.resident_kv_bytes, 0u);
}

TEST(PublicApi, CompressionStatsAndErrors) {
  auto s = kvpack::Session::open({.model_path = kShared + "/models/stories260K.gguf", .kv_policy = "knorm", .kv_budget = 64});
  kvpack::GenerateOptions g;
  g.temperature = 0;
  g.max_tokens = 300;
  kvpack::GenerateStats st;
  s->generate("Once upon a time", g, {}, &st);
  EXPECT_GT(st.compactions, 0);
  EXPECT_GT(st.freed_pages, 0);
  EXPECT_GT(st.reclaim_efficiency, 0.95);
  EXPECT_THROW(kvpack::Session::open({.model_path = "/nonexistent.gguf"}), std::runtime_error);
  EXPECT_THROW(kvpack::Session::open({.model_path = kShared + "/models/stories260K.gguf", .kv_policy = "bogus", .kv_budget = 64}),
               std::invalid_argument);
  EXPECT_THROW(kvpack::Session::open({.model_path = kShared + "/models/stories260K.gguf", .kv_policy = "knorm", .kv_budget = 3}),
               std::invalid_argument);
  EXPECT_EQ(s->detokenize(s->tokenize("Hello world", false)), "Hello world");
}

// The budget is the one knob: no policy named picks the recommended one (trispan), and triattention
// without kv_calib calibrates itself once (cached in KVPACK_CACHE_DIR here) and says so.
TEST(PublicApi, BudgetAloneAndSelfCalibratingTriattention) {
  const std::string model = kShared + "/models/stories260K.gguf";
  kvpack::GenerateOptions g;
  g.temperature = 0;
  g.max_tokens = 200;
  kvpack::GenerateStats alone, named;
  const std::string a = kvpack::Session::open({.model_path = model, .kv_budget = 48})->generate("Once upon a time", g, {}, &alone);
  const std::string b =
      kvpack::Session::open({.model_path = model, .kv_policy = "trispan", .kv_budget = 48})->generate("Once upon a time", g, {}, &named);
  EXPECT_EQ(a, b);
  EXPECT_GT(alone.compactions, 0);
  EXPECT_EQ(alone.evicted_slots, named.evicted_slots);
  EXPECT_EQ(kvpack::Session::open({.model_path = model})->calibration_report(), "");

  const std::string cache = ::testing::TempDir() + "/kvpack_api_calib_cache";
  std::filesystem::remove_all(cache);
  ::setenv("KVPACK_CACHE_DIR", cache.c_str(), 1);
  auto first = kvpack::Session::open({.model_path = model, .kv_policy = "triattention", .kv_budget = 48});
  auto second = kvpack::Session::open({.model_path = model, .kv_policy = "triattention", .kv_budget = 48});
  ::unsetenv("KVPACK_CACHE_DIR");
  EXPECT_NE(first->calibration_report().find("computed"), std::string::npos) << first->calibration_report();
  EXPECT_NE(second->calibration_report().find("reused"), std::string::npos) << second->calibration_report();
  kvpack::GenerateStats s1, s2;
  EXPECT_EQ(first->generate("Once upon a time", g, {}, &s1), second->generate("Once upon a time", g, {}, &s2));
  EXPECT_GT(s1.compactions, 0);
}
