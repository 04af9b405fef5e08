// Quality harness, end to end: `kvpack eval sweep --quick` through the binary writes one CSV row per
// (policy, budget); failing budgets are rows with their reason; `eval gen-tasks` writes JSON lines;
// `eval kld` prints its labelled figures.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "eval/sweep.h"
#include "model/model.h"

namespace {

namespace fs = std::filesystem;
const std::string kShared = KVPACK_SHARED_DIR;
const std::string kBin = KVPACK_BINARY;
const std::string kModel = kShared + "/models/stories260K.gguf";
const std::string kText = kShared + "/corpora/austen.txt";

struct CmdResult {
  int status;
  std::string out, err;
};

CmdResult run(const std::string& args) {
  // One file per test process: ctest runs these tests in parallel, and a shared name let one test read
  // another's stderr.
  const std::string err_path = ::testing::TempDir() + "/kvpack_eval_stderr." + std::to_string(getpid()) + ".txt";
  const std::string cmd = kBin + " " + args + " 2>" + err_path;
  CmdResult r{};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "", "popen failed"};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  r.status = pclose(p);
  std::stringstream ss;
  ss << std::ifstream(err_path).rdbuf();
  r.err = ss.str();
  std::remove(err_path.c_str());
  return r;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<std::string> split_csv_simple(const std::string& l) {  // fields without quotes only
  std::vector<std::string> f;
  std::stringstream ss(l);
  for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
  return f;
}

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::path(::testing::TempDir()) / name;
  fs::remove_all(d);
  return d;
}

TEST(EvalSweep, QuickSweepWritesOneRowPerPolicyAndBudget) {
  const fs::path dir = temp_dir("kvpack_eval_sweep_quick");
  const CmdResult r = run("eval sweep -m " + kModel + " --text " + kText + " --quick -t 1 --no-plot --out " + dir.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto lines = read_lines((dir / "results.csv").string());
  ASSERT_EQ(lines.size(), 1u + 8 * 2) << "header + 8 policies x budgets 32, 64";
  const auto header = split_csv_simple(lines[0]);
  ASSERT_GE(header.size(), 6u);
  EXPECT_EQ(header[0], "policy");
  EXPECT_EQ(header[5], "mean_kl");
  std::set<std::pair<std::string, std::string>> seen;
  for (size_t i = 1; i < lines.size(); ++i) {
    const auto f = split_csv_simple(lines[i]);
    ASSERT_GE(f.size(), 9u) << lines[i];
    EXPECT_TRUE(seen.emplace(f[0], f[1]).second);
    EXPECT_EQ(f[4], "ok") << lines[i];
    EXPECT_EQ(f[3], "256");
    const double kl = std::stod(f[5]), top1 = std::stod(f[8]);
    if (f[0] == "full") {
      EXPECT_EQ(kl, 0.0);
      EXPECT_EQ(top1, 1.0);
    } else {
      EXPECT_GT(kl, 0.0) << lines[i];
      EXPECT_LT(top1, 1.0) << lines[i];
    }
  }
  for (const char* p : {"full", "streaming", "knorm", "triattention", "snapkv", "rkv", "tova", "h2o"})
    for (const char* b : {"32", "64"}) EXPECT_TRUE(seen.count({p, b})) << p << " " << b;
  const auto md = read_lines((dir / "results.md").string());
  ASSERT_GT(md.size(), 10u);
  EXPECT_NE(r.out.find("| triattention | 32 |"), std::string::npos) << r.out;
  // triattention had no --kv-calib: the sweep calibrated and said so.
  EXPECT_TRUE(fs::exists(dir / "triattention_calib.gguf"));
  EXPECT_NE(r.err.find("computed by the sweep"), std::string::npos) << r.err;
}

TEST(EvalSweep, FailingBudgetsAreReportedNotDropped) {
  auto model = kvpack::Model::load(kModel);
  kvpack::eval::SweepOptions o;
  o.policies = {"streaming", "snapkv"};
  o.budgets = {4, 16};  // 4 is below sinks + window + 1 for both (streaming needs 5, snapkv 13); 16 is fine
  o.ctx = 128;
  o.windows = 1;
  o.text_path = kText;
  o.engine.threads = 1;
  const kvpack::eval::SweepResult res = kvpack::eval::run_sweep(*model, o);
  ASSERT_EQ(res.rows.size(), 4u);
  for (const auto& r : res.rows) {
    if (r.budget == 4) {
      EXPECT_FALSE(r.ok);
      EXPECT_NE(r.error.find("is smaller than kv_sinks + kv_window + 1"), std::string::npos) << r.error;
    } else {
      EXPECT_TRUE(r.ok) << r.error;
    }
  }
  const fs::path dir = temp_dir("kvpack_eval_sweep_fail");
  fs::create_directories(dir);
  kvpack::eval::write_csv((dir / "results.csv").string(), res, o);
  const auto lines = read_lines((dir / "results.csv").string());
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_NE(lines[1].find("failed: kv_budget: 4 is smaller"), std::string::npos) << lines[1];
  const std::string md = kvpack::eval::markdown_table(res, o);
  EXPECT_NE(md.find("failed [1]"), std::string::npos) << md;
  EXPECT_NE(md.find("[2] snapkv at budget 4"), std::string::npos) << md;
  EXPECT_THROW(
      {
        kvpack::eval::SweepOptions bad = o;
        bad.policies = {"nope"};
        kvpack::eval::run_sweep(*model, bad);
      },
      std::invalid_argument);
}

TEST(EvalCli, GenTasksWritesJsonLines) {
  const fs::path out = temp_dir("kvpack_gen_tasks.jsonl");
  const CmdResult r = run("eval gen-tasks -m " + kModel + " -q --task all --n 3 --ctx 512 --seed 5 --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto lines = read_lines(out.string());
  ASSERT_EQ(lines.size(), 9u);
  std::set<std::string> tasks;
  for (const auto& l : lines) {
    const auto j = nlohmann::json::parse(l);
    tasks.insert(j.at("task").get<std::string>());
    EXPECT_LE(j.at("prompt_len").get<int>() + j.at("max_tokens").get<int>(), 512);
    EXPECT_FALSE(j.at("answer").get<std::string>().empty());
    EXPECT_EQ(j.at("unit"), "tokens");
  }
  EXPECT_EQ(tasks.size(), 3u);
  // Same seed, same file; character-sized with --chars needs no model.
  const fs::path out2 = temp_dir("kvpack_gen_tasks2.jsonl");
  ASSERT_EQ(run("eval gen-tasks -m " + kModel + " -q --n 3 --ctx 512 --seed 5 --out " + out2.string()).status, 0);
  EXPECT_EQ(read_lines(out2.string()), lines);
  const CmdResult c = run("eval gen-tasks --chars --task pointer --n 2 --ctx 2000 --out " + out2.string());
  ASSERT_EQ(c.status, 0) << c.err;
  for (const auto& l : read_lines(out2.string())) {
    const auto j = nlohmann::json::parse(l);
    EXPECT_EQ(j.at("unit"), "bytes");
    EXPECT_EQ(static_cast<size_t>(j.at("prompt_len").get<int>()), j.at("prompt").get<std::string>().size());
  }
}

TEST(EvalCli, KldPrintsLabelledFigures) {
  const CmdResult r = run("eval kld -m " + kModel + " -q -t 1 --text " + kText + " --ctx 256 --chunks 1 --kv-policy streaming --kv-budget 32");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* label : {"top-1 agreement: ", "mean KL: ", "p99 KL: ", "ppl full: ", "ppl compressed: ", "peak resident KV: ",
                            "reclaim efficiency 1.000"})
    EXPECT_NE(r.out.find(label), std::string::npos) << label << "\n" << r.out;
  const CmdResult j = run("eval kld -m " + kModel + " -q -t 1 --text " + kText + " --ctx 128 --chunks 1 --json");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto js = nlohmann::json::parse(j.out);
  EXPECT_EQ(js.at("mean_kl").get<double>(), 0.0);
  EXPECT_EQ(js.at("top1").get<double>(), 1.0);
  // triattention without --kv-calib: calibrated by itself on built-in text (cached), and said so.
  const std::string cache = ::testing::TempDir() + "/kvpack_eval_calib_cache";
  std::filesystem::remove_all(cache);
  ::setenv("KVPACK_CACHE_DIR", cache.c_str(), 1);
  const CmdResult e = run("eval kld -m " + kModel + " -q --text " + kText + " --ctx 128 --kv-policy triattention --kv-budget 32");
  ::unsetenv("KVPACK_CACHE_DIR");
  EXPECT_EQ(e.status, 0) << e.err;
  EXPECT_NE(e.err.find("triattention calibration computed"), std::string::npos) << e.err;
}

TEST(EvalCli, TasksReportsAccuracyPerTask) {
  const CmdResult r = run("eval tasks -m " + kModel + " -q -t 1 --ctx 512 --n 2 --kv-policy streaming --kv-budget 64");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* t : {"needle: accuracy ", "vartrack: accuracy ", "pointer: accuracy "}) EXPECT_NE(r.out.find(t), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mean prompt tokens"), std::string::npos);
  EXPECT_NE(r.out.find("peak resident KV"), std::string::npos);
}

// The exact drift check and guard through the command line: --answer-only generates the expected
// answer's token count; --kv-drift-exact reports one exact check per recall check (every token here) and
// never falls back; --kv-guard-exact with the smallest threshold falls back on the first check that moves.
TEST(EvalCli, TasksReportsTheExactDriftCheckPerSample) {
  const std::string base = "eval tasks -m " + kModel + " -q -t 1 --ctx 512 --n 2 --task pointer --json --answer-only --kv-policy knorm "
                           "--kv-budget 32 --kv-cold host:64M --kv-recall-every 1 ";
  const CmdResult drift = run(base + "--kv-drift-exact");
  ASSERT_EQ(drift.status, 0) << drift.err;
  const auto jd = nlohmann::json::parse(drift.out);
  int64_t checks = 0, skipped = 0;
  for (const auto& smp : jd["tasks"][0]["samples"]) {
    checks += smp["exact_checks"].get<int64_t>();
    skipped += smp["exact_skipped"].get<int64_t>();
    EXPECT_EQ(smp["guard_fallbacks"].get<int64_t>(), 0);
    EXPECT_GE(smp["exact_tv_max"].get<double>(), 0.0);
    EXPECT_LE(smp["exact_tv_max"].get<double>(), 1.0);
  }
  EXPECT_GT(checks, 2);
  EXPECT_EQ(skipped, 0);  // the default pool holds the scratch copy
  const CmdResult guard = run(base + "--kv-guard-exact --kv-guard-exact-tv 0.000001");
  ASSERT_EQ(guard.status, 0) << guard.err;
  const auto jg = nlohmann::json::parse(guard.out);
  int64_t fallbacks = 0;
  for (const auto& smp : jg["tasks"][0]["samples"]) fallbacks += smp["guard_fallbacks"].get<int64_t>();
  EXPECT_EQ(fallbacks, 2);
  const CmdResult off = run(base);
  ASSERT_EQ(off.status, 0) << off.err;
  // Named: a range-for over a subobject of a temporary json iterates freed memory (ASan caught it).
  const auto jo = nlohmann::json::parse(off.out);
  for (const auto& smp : jo["tasks"][0]["samples"]) EXPECT_EQ(smp["exact_checks"].get<int64_t>(), 0);
}

}  // namespace
