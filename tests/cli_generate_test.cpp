// End-to-end tests of the `kvpack` binary: the reference greedy output in both model formats, and
// clear one-line errors with a non-zero exit for bad input.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_util.h"
#include "gguf/gguf.h"

namespace {

const std::string kShared = KVPACK_SHARED_DIR;

using kvpack::test::Proc;
using kvpack::test::read_file;
Proc run(const std::string& args) { return kvpack::test::run_kvpack(args); }

}  // namespace

TEST(CliGenerate, GreedyStories260kGgufMatchesReference) {
  const Proc r = run("generate -m " + kShared + "/models/stories260K.gguf --temp 0 -n 256");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, read_file(kShared + "/models/stories260K.greedy.txt"));
  EXPECT_NE(r.err.find("decode_tok_s="), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resident_kv_bytes="), std::string::npos) << r.err;
}

TEST(CliGenerate, GreedyStories260kLlama2cMatchesReference) {
  const Proc r = run("generate -m " + kShared + "/models/stories260K.bin --tokenizer " + kShared +
                    "/models/tok512.bin --temp 0 -n 256");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, read_file(kShared + "/models/stories260K.greedy.txt"));
}

TEST(CliGenerate, OtherLlama2cModelsWithTheirOwnTokenizersRun) {
  for (const auto& [model, tok] : {std::pair{"xs_model.bin", "tok512.bin"}, std::pair{"aidreams260K.bin", "tok512_dreamer.bin"}}) {
    const std::string tok_path = std::string(tok) == "tok512.bin" ? kShared + "/models/tok512.bin" : kShared + "/models/extra/" + tok;
    const Proc r = run("generate -m " + kShared + "/models/extra/" + model + " --tokenizer " + tok_path + " --temp 0 -n 40 -p \"Once\"");
    ASSERT_EQ(r.status, 0) << model << ": " << r.err;
    EXPECT_GT(r.out.size(), 20u) << model;
    EXPECT_EQ(r.out.rfind("Once", 0), 0u) << model << " output: " << r.out;
  }
}

TEST(CliGenerate, StatsLineReportsKvUse) {
  const Proc r = run("generate -m " + kShared + "/models/stories260K.gguf --temp 0 -n 30 -q");
  ASSERT_EQ(r.status, 0) << r.err;
  // 1 BOS + 29 decoded tokens = 30 slots per stream, 2 pages of 16 each, 5 layers x 4 KV heads.
  EXPECT_NE(r.err.find("kv_pages_in_use=40 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generated=30 "), std::string::npos) << r.err;
}

// The README's main job: no -m, the default model (the embedded trained testbed model, or the random
// fallback in a build without it). Twice: the second run reuses the file the first wrote. Greedy output
// is deterministic.
TEST(CliGenerate, DefaultModelRunsWithoutArguments) {
  const Proc a = run("generate -p \"It is a truth\" -n 12 --temp 0");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_NE(a.err.find("using the embedded default model"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("generated=12 "), std::string::npos) << a.err;
  EXPECT_EQ(a.out.rfind("It is a truth", 0), 0u) << a.out;
  const Proc b = run("generate -p \"It is a truth\" -n 12 --temp 0");
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
}

TEST(CliErrors, OneClearLineAndNonZeroExit) {
  struct Case {
    std::string args, needle;
  };
  const std::string tmp = ::testing::TempDir();
  {
    kvpack::gguf::Writer w;
    w.set_string("general.architecture", "gptj");
    w.write(tmp + "/unknown_arch.gguf");
  }
  std::string long_prompt;
  for (int i = 0; i < 700; ++i) long_prompt += "the cat ";
  std::ofstream(tmp + "/long_prompt.txt") << long_prompt;
  const Case cases[] = {
      {"generate -m /nonexistent/model.gguf", "/nonexistent/model.gguf"},
      {"generate -m " + tmp + "/unknown_arch.gguf", "unknown architecture 'gptj'"},
      {"generate -m " + kShared + "/models/stories260K.gguf -f " + tmp + "/long_prompt.txt", "context"},
      {"generate -m " + kShared + "/models/stories260K.bin", "tokenizer"},
      {"generate --no-such-flag", "no-such-flag"},
      {"generate -m " + kShared + "/models/stories260K.gguf --temp -1", "temp"},
  };
  for (const Case& c : cases) {
    const Proc r = run(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << " -> " << r.err;
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 2) << c.args << " -> " << r.err;
  }
}

TEST(CliTokenize, PrintsIdsForVocabOnlyFiles) {
  const Proc r = run("tokenize -m " + kShared + "/vocab/ggml-vocab-llama-spm.gguf -p \"Hello world\" --ids");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[15043, 3186]\n");
}
