// The public embedding API (include/kvpack/kvpack.h) end to end on the reference model.
#include <gtest/gtest.h>

#include <kvpack/kvpack.h>

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
  EXPECT_THROW(kvpack::Session::open({.model_path = kShared + "/models/stories260K.gguf", .kv_policy = "triattention", .kv_budget = 64}),
               std::invalid_argument);
  EXPECT_EQ(s->detokenize(s->tokenize("Hello world", false)), "Hello world");
}
