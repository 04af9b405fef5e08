// `kvpack analyze-prefix` as a user runs it: generate traffic with planted causes and its ground truth,
// analyze the written log (text and --json), and bad input that ends in one clear error line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include "cli_util.h"

using namespace kvpack::test;

namespace {

const std::string kModel = std::string(" -m ") + KVPACK_SHARED_DIR + "/models/stories260K.gguf";

std::string temp(const std::string& name) { return ::testing::TempDir() + "/kvpack_" + std::to_string(::getpid()) + "_" + name; }

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

}  // namespace

TEST(CliAnalyzePrefix, GeneratesTrafficAndComparesTheReportWithTheGroundTruth) {
  const std::string log = temp("traffic.jsonl");
  const Proc g = run_kvpack("analyze-prefix --generate 120 --plant all --seed 2 -o " + log + " --ground-truth" + kModel);
  ASSERT_EQ(g.status, 0) << g.err;
  for (const char* c : {"volatile", "tools", "whitespace", "truncation", "documents"})
    EXPECT_NE(g.out.find(std::string("| ") + c), std::string::npos) << c << "\n" << g.out;
  EXPECT_EQ(g.out.find("| no "), std::string::npos) << g.out;  // all planted

  const Proc a = run_kvpack("analyze-prefix " + log + kModel);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_NE(a.out.find("Simulated prefix-cache hit rate"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("example: req-"), std::string::npos) << a.out;

  const Proc j = run_kvpack("analyze-prefix --json --page-size 32 --cache-tokens 100000 " + log + kModel);
  ASSERT_EQ(j.status, 0) << j.err;
  const auto report = nlohmann::json::parse(j.out);
  EXPECT_EQ(report["requests"], 120);
  EXPECT_EQ(report["page_size"], 32);
  EXPECT_EQ(report["causes"].size(), 5u);
  std::remove(log.c_str());
}

TEST(CliAnalyzePrefix, BadInputIsOneErrorLineWithTheLineNumber) {
  const std::string bad = temp("bad.jsonl");
  write(bad, "{\"prompt\":\"fine\"}\n{\"messages\":[{\"role\":\"user\",\"content\":7}]}\n");
  const Proc p = run_kvpack("analyze-prefix " + bad + kModel);
  ASSERT_TRUE(WIFEXITED(p.status)) << "killed by a signal";
  EXPECT_EQ(WEXITSTATUS(p.status), 1);
  EXPECT_NE(p.err.find("kvpack: error: line 2: messages[0].content must be a string"), std::string::npos) << p.err;

  write(bad, "{\"id\":\"r1\",\"prompt_tokens\":40,\"cached_tokens\":16}\n");
  const Proc q = run_kvpack("analyze-prefix " + bad + kModel);
  EXPECT_EQ(WEXITSTATUS(q.status), 1);
  EXPECT_NE(q.err.find("line 1: no request body"), std::string::npos) << q.err;

  write(bad, std::string(3000, '{') + "\n");
  const Proc r = run_kvpack("analyze-prefix --max-line-bytes 1000 " + bad + kModel);
  ASSERT_TRUE(WIFEXITED(r.status));
  EXPECT_EQ(WEXITSTATUS(r.status), 1);
  EXPECT_NE(r.err.find("line 1: the line is longer than 1000 bytes"), std::string::npos) << r.err;

  const Proc s = run_kvpack("analyze-prefix --generate 10 --plant volatile,dates -o " + bad + kModel);
  EXPECT_EQ(WEXITSTATUS(s.status), 1);
  EXPECT_NE(s.err.find("unknown cause 'dates'"), std::string::npos) << s.err;
  std::remove(bad.c_str());
}
