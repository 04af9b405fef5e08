// `kvpack generate -m BADFILE` on the crafted files of model_loader_hardening_test: it must exit with
// status 1 and the loader's message (never a signal), and metadata that only claims a huge context
// must not make it allocate for that context.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>

#include "cli_util.h"
#include "model_files.h"

namespace kvpack {
namespace {

using test::run_kvpack;

// Largest peak RSS (bytes) of any child process this test has waited for so far.
long children_peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  return ru.ru_maxrss * 1024L;  // ru_maxrss is in KiB on Linux
}

TEST(CliLoaderHardening, HugeContextLengthGeneratesWithBoundedMemory) {
  // Before: llama.context_length = 2^25 in the 1 MB stories model made `generate -n 8` take 2.7 GB
  // (the KV page pool's page table sized for the claimed context). Now the context is clipped.
  const std::string path =
      test::gguf_with("cli_ctx.gguf", [](gguf::Writer& w) { w.set_u32("llama.context_length", 1u << 25); });
  // The same run on the unedited model first: sanitizer builds start at ~200 MB RSS on their own, so
  // the bound is relative to what the binary needs for this model at its real context length.
  const auto base = run_kvpack("generate -m " + test::shared_path("models/stories260K.gguf") + " -n 8 -p Once --temp 0");
  ASSERT_TRUE(WIFEXITED(base.status) && WEXITSTATUS(base.status) == 0) << base.err;
  const long base_peak = children_peak_rss_bytes();  // the max over children so far: the baseline run
  const auto r = run_kvpack("generate -m " + path + " -n 8 -p Once --temp 0");
  ASSERT_TRUE(WIFEXITED(r.status)) << r.err;
  EXPECT_EQ(WEXITSTATUS(r.status), 0) << r.err;
  EXPECT_NE(r.err.find("context length 33554432 clipped to 1048576"), std::string::npos) << r.err;
  EXPECT_FALSE(r.out.empty());
  EXPECT_LT(children_peak_rss_bytes(), base_peak + (100L << 20));  // 2.7 GB before the clip
}

TEST(CliLoaderHardening, BadFilesExitWithTheLoaderMessageNotASignal) {
  std::string wrapping(16u << 20, '\0');
  const int32_t h[7] = {1 << 20, 10485758, 1 << 19, 1 << 20, 2, 2, 1048569};
  std::memcpy(wrapping.data(), h, sizeof h);
  const std::string wrap_path = test::temp_file("cli_wrapping.bin");
  test::write_bytes(wrap_path, wrapping);
  const std::string magic_path = test::temp_file("cli_magic.bin");
  test::write_bytes(magic_path, std::string("XYZW") + std::string(60, '\x07'));
  const std::string blocks =
      test::gguf_with("cli_blocks.gguf", [](gguf::Writer& w) { w.set_u32("llama.block_count", 1u << 22); });
  const struct {
    std::string args, message;
  } cases[] = {
      {"-m " + wrap_path + " --tokenizer " + test::shared_path("models/tok512.bin"), "n_layer = 524288 is out of range"},
      {"-m " + wrap_path, "not a llama2.c checkpoint"},
      {"-m " + magic_path, "not a GGUF file (magic 'XYZW')"},
      {"-m " + blocks, "n_layer = 4194304 is out of range"},
  };
  for (const auto& c : cases) {
    const auto r = run_kvpack("generate " + c.args + " -n 8 -p Once");
    ASSERT_TRUE(WIFEXITED(r.status)) << c.args << ": killed by a signal";
    EXPECT_EQ(WEXITSTATUS(r.status), 1) << c.args;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
  }
  std::filesystem::remove(wrap_path);  // 16 MiB
}

}  // namespace
}  // namespace kvpack
