// A llama.cpp user's first hour on the `kvpack` binary: llama-cli's flags (-c, -s, --version, -cnv,
// -sys), "did you mean" for typos, flags that do not apply, defaults in --help, f16 KV by default, the
// budget as the one knob (with calibration that happens by itself and is cached), and progress lines.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include "cli_util.h"

namespace {

using kvpack::test::Proc;
using kvpack::test::read_file;
using kvpack::test::stat_value;
namespace fs = std::filesystem;

const std::string kShared = KVPACK_SHARED_DIR;
const std::string kStories = kShared + "/models/stories260K.gguf";

// A shell command line around the binary ("{kvpack}" in `cmd` is replaced by its path).
Proc sh(std::string cmd) {
  for (size_t p; (p = cmd.find("{kvpack}")) != std::string::npos;) cmd.replace(p, 8, KVPACK_BINARY);
  const std::string err_path = ::testing::TempDir() + "/kvpack_sh_err_" + std::to_string(::getpid()) + ".txt";
  Proc r{};
  FILE* p = popen(("(" + cmd + ") 2>" + err_path).c_str(), "r");
  if (p == nullptr) return {-1, "", "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  r.status = pclose(p);
  r.err = read_file(err_path);
  std::remove(err_path.c_str());
  return r;
}

Proc run(const std::string& args) { return kvpack::test::run_kvpack(args); }

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

TEST(CliHabits, VersionPrintsTheCommit) {
  const Proc r = run("--version");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("kvpack, commit "), std::string::npos) << r.out;
}

TEST(CliHabits, TyposGetADidYouMean) {
  Proc r = run("generate -m " + kStories + " --tmep 0.5 -n 4");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("unknown flag --tmep"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean --temp?"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "") << "nothing may run on a mistyped command line";
  r = run("genrate -n 4");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("did you mean 'generate'?"), std::string::npos) << r.err;
  r = run("bench kvv");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("did you mean 'kvpack bench kv'?"), std::string::npos) << r.err;
  r = run("generate -temp 0.5");  // a long flag typed with one dash
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("did you mean --temp?"), std::string::npos) << r.err;
  r = run("serve --kv-budgte 64");
  EXPECT_NE(r.err.find("did you mean --kv-budget?"), std::string::npos) << r.err;
}

TEST(CliHabits, FlagsThatDoNotApplyAreNamedAndIgnoredOrRefused) {
  const std::string base = "generate -m " + kStories + " -p \"Once upon a time\" -n 16 --temp 0 -q";
  const Proc plain = run(base);
  ASSERT_EQ(plain.status, 0) << plain.err;
  // -ngl 99 used to be read as -n gl.
  const Proc ngl = run(base + " -ngl 99 -fa on --no-mmap");
  ASSERT_EQ(ngl.status, 0) << ngl.err;
  EXPECT_EQ(ngl.out, plain.out);
  EXPECT_NE(ngl.err.find("-ngl 99 ignored: kvpack runs on the CPU"), std::string::npos) << ngl.err;
  EXPECT_NE(ngl.err.find("-fa on ignored"), std::string::npos) << ngl.err;
  const Proc hf = run("generate -hf someone/model");
  EXPECT_NE(hf.status, 0);
  EXPECT_NE(hf.err.find("does not download models"), std::string::npos) << hf.err;
  // -ctk / -ctv become --kv-type (one type for K and V here).
  const Proc ctk = run(base + " -ctk q8_0 -ctv q8_0");
  EXPECT_NE(ctk.status, 0) << "stories260K has head_dim 8: q8_0 must be refused, so the flag reached --kv-type";
  EXPECT_NE(ctk.err.find("q8_0"), std::string::npos) << ctk.err;
  const Proc mixed = run(base + " -ctk f16 -ctv bf16");
  EXPECT_NE(mixed.status, 0);
  EXPECT_NE(mixed.err.find("one type"), std::string::npos) << mixed.err;
}

TEST(CliHabits, HelpShowsDefaultsAndTheRealDefaultModel) {
  const Proc r = run("generate --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("embedded kvpack testbed model"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("embedded random model"), std::string::npos);
  for (const char* d : {"=128", "=0.8", "=40", "=f16", "=random", "--ctx-size", "-cnv", "-sys", "--conversation", "--system-prompt"})
    EXPECT_NE(r.out.find(d), std::string::npos) << d << "\n" << r.out;
}

TEST(CliHabits, SeedIsRandomPrintedAndRepeatable) {
  const std::string base = "generate -m " + kStories + " -p \"Once upon a time\" -n 24 --temp 1.5";
  const Proc a = run(base);
  const Proc b = run(base);
  ASSERT_EQ(a.status, 0) << a.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(a.err, m, std::regex("seed ([0-9]+) \\(random; -s \\1 repeats this run\\)"))) << a.err;
  const std::string seed = m[1];
  ASSERT_TRUE(std::regex_search(b.err, m, std::regex("seed ([0-9]+)"))) << b.err;
  EXPECT_NE(seed, m[1].str()) << "two runs drew the same random seed";
  const Proc again = run(base + " -s " + seed);
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(again.out, a.out) << "-s with the printed seed must repeat the run";
  EXPECT_EQ(again.err.find("(random;"), std::string::npos) << "a given seed is not announced as random";
}

TEST(CliHabits, CtxSizeLimitsTheContext) {
  const Proc r = run("generate -m " + kStories + " -c 64 -n 500 --temp 0 --ignore-eos");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("ctx 64"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stop=context"), std::string::npos) << r.err;
  EXPECT_EQ(stat_value(r.err, "generated"), 63);  // BOS + 63 tokens fill the 64 positions
  const Proc big = run("generate -m " + kStories + " -c 1024 -n 4 --temp 0");
  ASSERT_EQ(big.status, 0) << big.err;
  EXPECT_NE(big.err.find("beyond the context this model was trained for (512)"), std::string::npos) << big.err;
}

TEST(CliHabits, LlamaCliStyleCommandLineWithoutASubcommand) {
  const Proc a = run("-m " + kStories + " -c 2048 -s 42 -p \"Once upon a time\" -n 16 -q");
  ASSERT_EQ(a.status, 0) << a.err;
  const Proc b = run("generate -m " + kStories + " --ctx-size 2048 --seed 42 -p \"Once upon a time\" -n 16 -q");
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out.rfind("Once upon a time", 0), 0u) << a.out;
}

TEST(CliHabits, ConversationModeChatsThroughTheChatTemplate) {
  // Two user turns from a pipe, then end of input; -sys sets the system prompt.
  const Proc r = sh("printf 'Hello there\\nWhat next?\\n' | {kvpack} -cnv -sys 'You are terse.' -m " + kStories + " -n 12 --temp 0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("> Hello there\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("> What next?\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("conversation (chat format plain)"), std::string::npos) << r.err;
  // A turn's reply depends only on the conversation so far: the first reply is the same when the
  // conversation ends after it.
  auto reply_after = [](const std::string& out, const std::string& turn) {
    const size_t a = out.find("> " + turn + "\n");
    if (a == std::string::npos) return std::string();
    const size_t b = a + turn.size() + 3;
    return out.substr(b, out.find("\n> ", b) - b);
  };
  const std::string first = reply_after(r.out, "Hello there");
  EXPECT_FALSE(first.empty()) << r.out;
  EXPECT_FALSE(reply_after(r.out, "What next?").empty()) << r.out;
  const Proc one = sh("printf 'Hello there\\n' | {kvpack} -cnv -sys 'You are terse.' -m " + kStories + " -n 12 --temp 0 -q");
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_EQ(reply_after(one.out, "Hello there"), first) << one.out;
  const Proc sys_alone = run("generate -m " + kStories + " -sys hi -n 2");
  EXPECT_NE(sys_alone.status, 0);
  EXPECT_NE(sys_alone.err.find("add -cnv"), std::string::npos) << sys_alone.err;
}

TEST(CliDefaults, KvTypeIsF16AndF32StillAvailable) {
  const Proc r = run("generate -m " + kStories + " -n 8 --temp 0 -q");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("kv_type=f16"), std::string::npos) << r.err;
  const Proc f = run("generate -m " + kStories + " -n 8 --temp 0 -q --kv-type f32");
  EXPECT_NE(f.err.find("kv_type=f32"), std::string::npos) << f.err;
  EXPECT_EQ(stat_value(f.err, "kv_page_bytes"), 2 * stat_value(r.err, "kv_page_bytes"));
}

TEST(CliDefaults, BudgetAloneOnTheTestbedModelAt2048) {
  // The command: `kvpack generate --kv-budget 205` at 2048 context, no other KV flag; a prompt of
  // about 1000 tokens of Austen so that compression runs.
  const std::string prompt = fresh_dir("budget") + "/prompt.txt";
  {
    const std::string austen = read_file(kShared + "/corpora/austen.txt");
    std::ofstream(prompt) << austen.substr(100000, 3500);
  }
  const Proc r = run("generate -c 2048 --kv-budget 205 -f " + prompt + " -n 32 --temp 0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("policy=trispan budget=205"), std::string::npos) << r.err;
  EXPECT_GT(stat_value(r.err, "compactions"), 0) << r.err;
  EXPECT_GT(stat_value(r.err, "freed_pages"), 0) << r.err;
}

TEST(CliDefaults, TriattentionCalibratesItselfOnceAndReusesTheCache) {
  const std::string cache = fresh_dir("calib_cache");
  ::setenv("KVPACK_CACHE_DIR", cache.c_str(), 1);
  const std::string cmd = "generate -m " + kStories + " -p \"Once upon a time\" -n 200 --temp 0 --kv-policy triattention --kv-budget 48";
  const Proc first = run(cmd);
  const Proc second = run(cmd);
  ::unsetenv("KVPACK_CACHE_DIR");
  ASSERT_EQ(first.status, 0) << first.err;
  ASSERT_EQ(second.status, 0) << second.err;
  EXPECT_NE(first.err.find("triattention calibration computed"), std::string::npos) << first.err;
  EXPECT_NE(first.err.find("cached at " + cache + "/calib/stories260K-"), std::string::npos) << first.err;
  EXPECT_NE(second.err.find("triattention calibration reused"), std::string::npos) << second.err;
  EXPECT_EQ(first.out, second.out) << "the cached statistics are the computed ones";
  EXPECT_GT(stat_value(first.err, "compactions"), 0);
  int files = 0;
  for (const auto& e : fs::directory_iterator(cache + "/calib")) files += e.path().extension() == ".calib" ? 1 : 0;
  EXPECT_EQ(files, 1);
  // A corrupt cache file is recomputed, not a crash.
  for (const auto& e : fs::directory_iterator(cache + "/calib")) std::ofstream(e.path()) << "garbage";
  ::setenv("KVPACK_CACHE_DIR", cache.c_str(), 1);
  const Proc third = run(cmd);
  ::unsetenv("KVPACK_CACHE_DIR");
  ASSERT_EQ(third.status, 0) << third.err;
  EXPECT_NE(third.err.find("unusable and was recomputed"), std::string::npos) << third.err;
  EXPECT_EQ(third.out, first.out);
}

TEST(CliProgress, CalibratePrintsPlainProgressLinesWhenNotATerminal) {
  const std::string out = fresh_dir("progress") + "/s.calib";
  const Proc r = sh("KVPACK_PROGRESS_EVERY=0.001 {kvpack} calibrate -m " + kStories + " --text " + kShared +
                    "/corpora/austen.txt --max-tokens 2048 -o " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("[kvpack] calibrate: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/2048 tokens ("), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[kvpack] calibrate: done, 2048/2048 tokens (100%)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "no carriage returns in a log";
  const Proc off = sh("KVPACK_PROGRESS=0 KVPACK_PROGRESS_EVERY=0.001 {kvpack} calibrate -m " + kStories + " --text " + kShared +
                      "/corpora/austen.txt --max-tokens 512 -o " + out);
  EXPECT_EQ(off.err.find("calibrate: "), std::string::npos) << off.err;
}

TEST(CliProgress, BenchKvWritesItsPlotNextToTheOutputFromAnyDirectory) {
  const std::string dir = fresh_dir("benchkv");
  const Proc r = sh("cd / && {kvpack} bench kv -m " + kStories + " -t 1 --tokens 256 --chunk 32 --budget 64 --interval 32 --depths 128 "
                    "--decode-tokens 4 --out " + dir + "/out");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir + "/out/kv_timeline.csv"));
  // Either the plot is there, or the line says exactly why not (no matplotlib on this machine).
  if (r.out.find("plot: " + dir + "/out/kv_timeline.png") != std::string::npos) {
    EXPECT_TRUE(fs::exists(dir + "/out/kv_timeline.png"));
  } else {
    EXPECT_NE(r.out.find("no plot: no python3 with matplotlib"), std::string::npos) << r.out;
  }
}

}  // namespace
