// KV compression through the kvpack binary on the reference model: with a budget at least the sequence
// length every policy reproduces full KV token for token; with --kv-budget 128 over 500 generated tokens
// resident KV stays bounded by budget + interval (+ one page per stream) and the stats line shows it;
// naive eviction frees (almost) nothing while compaction frees what it evicts.
#include <gtest/gtest.h>

#include <string>
#include <unistd.h>

#include "cli_util.h"

namespace {

const std::string kShared = KVPACK_SHARED_DIR;
const std::string kModel = kShared + "/models/stories260K.gguf";

using kvpack::test::Proc;
long long stat(const std::string& err, const std::string& key) { return static_cast<long long>(kvpack::test::stat_value(err, key)); }
double statf(const std::string& err, const std::string& key) { return kvpack::test::stat_value(err, key); }
Proc run(const std::string& args) { return kvpack::test::run_kvpack(args); }

std::string calib_path() {
  static std::string path;
  if (path.empty()) {
    path = ::testing::TempDir() + "/stories260K_" + std::to_string(::getpid()) + ".calib";
    const Proc r = run("calibrate -m " + kModel + " --text " + kShared + "/corpora/austen.txt --max-tokens 4096 -o " + path);
    EXPECT_EQ(r.status, 0) << r.err;
  }
  return path;
}

}  // namespace

TEST(CliCompress, BudgetAtLeastSequenceLengthReproducesFullForEveryPolicy) {
  const std::string base = "generate -m " + kModel + " --temp 0 -n 200 -p \"Once upon a time\" -q";
  const Proc full = run(base);
  ASSERT_EQ(full.status, 0) << full.err;
  for (const std::string policy : {"streaming", "knorm", "triattention", "snapkv", "rkv", "tova", "h2o"}) {
    for (const std::string split : {"uniform", "pyramid", "ada"}) {
      std::string args = base + " --kv-policy " + policy + " --kv-budget 512 --kv-split " + split;
      if (policy == "triattention") args += " --kv-calib " + calib_path();
      const Proc r = run(args);
      ASSERT_EQ(r.status, 0) << policy << ": " << r.err;
      EXPECT_EQ(r.out, full.out) << policy << " " << split;
      EXPECT_EQ(stat(r.err, "compactions"), 0) << policy;
    }
  }
}

TEST(CliCompress, Budget128Over500TokensStaysBounded) {
  // stories260K: 5 layers x 4 KV heads = 20 streams, 16-slot pages of 8 dims x 4 bytes x (K+V) = 1 KiB.
  const long long streams = 20, page_bytes = 1024;
  const long long bound = streams * ((128 + 128) / 16 + 1) * page_bytes;  // budget + interval + 1 page/stream
  for (const std::string policy : {"streaming", "knorm", "triattention", "snapkv", "rkv", "tova", "h2o"}) {
    std::string args = "generate -m " + kModel + " --temp 0 -n 500 -q --kv-policy " + policy + " --kv-budget 128";
    if (policy == "triattention") args += " --kv-calib " + calib_path();
    const Proc r = run(args);
    ASSERT_EQ(r.status, 0) << policy << ": " << r.err;
    EXPECT_EQ(stat(r.err, "generated"), 500) << r.err;
    EXPECT_GT(stat(r.err, "compactions"), 0) << r.err;
    EXPECT_LE(stat(r.err, "peak_resident_kv_bytes"), bound) << policy << ": " << r.err;
    EXPECT_LE(stat(r.err, "final_resident_kv_bytes"), bound) << policy << ": " << r.err;
    EXPECT_GE(statf(r.err, "reclaim_efficiency"), 0.95) << policy << ": " << r.err;
  }
}

// The drift figures reach a `generate` user: with the exact guard at its smallest threshold the request falls
// back to full KV (guard_fallbacks=1) and its text is full KV's; with a pool that can never hold the whole KV
// the guard is refused instead (guard_fallbacks_refused=1) and the request still finishes.
TEST(CliCompress, GenerateReportsDriftChecksAndTheGuard) {
  const std::string prompt = "\"Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
                             "friends. One day, she saw a big red ball under a tree and\"";
  const std::string base = "generate -m " + kModel + " --temp 0 -n 40 -q -p " + prompt;
  const std::string guarded = base + " --kv-policy knorm --kv-budget 16 --kv-interval 16 --kv-cold host:16M --kv-recall-every 1 "
                                     "--kv-guard-exact --kv-guard-exact-tv 0.000001";
  const Proc full = run(base);
  const Proc g = run(guarded);
  ASSERT_EQ(full.status, 0) << full.err;
  ASSERT_EQ(g.status, 0) << g.err;
  EXPECT_GT(stat(g.err, "exact_checks"), 0) << g.err;
  EXPECT_EQ(stat(g.err, "guard_fallbacks"), 1) << g.err;
  EXPECT_EQ(stat(g.err, "guard_fallbacks_refused"), 0) << g.err;
  EXPECT_EQ(g.out, full.out) << "after the fallback the request continues as full KV";
  // 20 streams x 4 pages: the compressed request (16 + 16 slots = 2 pages per stream, plus the check's fork
  // page) fits, its whole KV (~80 tokens: 5 pages per stream) never does.
  const Proc small = run(guarded + " --kv-pages 80");
  ASSERT_EQ(small.status, 0) << small.err;
  EXPECT_EQ(stat(small.err, "generated"), 40) << small.err;
  EXPECT_EQ(stat(small.err, "guard_fallbacks"), 0) << small.err;
  EXPECT_EQ(stat(small.err, "guard_fallbacks_refused"), 1) << small.err;
}

TEST(CliCompress, NaiveEvictionFreesAlmostNothing) {
  const std::string base = "generate -m " + kModel + " --temp 0 -n 500 -q --kv-policy knorm --kv-budget 128";
  const Proc naive = run(base + " --kv-naive");
  const Proc compact = run(base);
  ASSERT_EQ(naive.status, 0) << naive.err;
  ASSERT_EQ(compact.status, 0) << compact.err;
  EXPECT_LT(statf(naive.err, "reclaim_efficiency"), 0.1) << naive.err;
  EXPECT_GT(statf(compact.err, "reclaim_efficiency"), 0.95) << compact.err;
  EXPECT_EQ(stat(naive.err, "evicted_slots"), stat(compact.err, "evicted_slots"));
  EXPECT_GT(stat(naive.err, "peak_resident_kv_bytes"), stat(compact.err, "peak_resident_kv_bytes") * 3 / 2);
  // Naive mode is bookkeeping over a compacted cache: same keep sets, same attention, same text.
  EXPECT_EQ(naive.out, compact.out);
}

TEST(CliCompress, ClearErrors) {
  // (triattention without --kv-calib calibrates by itself: cli_first_hour_test.cpp.)
  Proc r = run("generate -m " + kModel + " --kv-policy bogus --kv-budget 64");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("unknown KV policy 'bogus'"), std::string::npos) << r.err;
  r = run("generate -m " + kModel + " --kv-policy knorm");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--kv-budget"), std::string::npos) << r.err;
  r = run("generate -m " + kModel + " --kv-policy knorm --kv-budget 3");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("kv_budget: 3 is smaller than kv_sinks + kv_window"), std::string::npos) << r.err;
}
