// Logit parity plumbing (eval/parity.h): the exchange files written and read exactly, every malformed
// logits file refused with a message that says what is wrong, the comparison's figures against direct
// computations, and `kvpack eval parity` end to end on a logits file that kvpack's own full-KV run wrote
// (the real llama.cpp comparison is the ctest llama_cpp_quantized_files, registered when llama.cpp's tools
// are built: scripts/peer/build_llama_tools.sh).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "eval/parity.h"
#include "model/model.h"

namespace {

namespace eval = kvpack::eval;
namespace fs = std::filesystem;
const std::string kShared = KVPACK_SHARED_DIR;

struct TmpDir {
  fs::path p = fs::temp_directory_path() / ("kvpack-parity-test-" + std::to_string(::getpid()));
  TmpDir() { fs::create_directories(p); }
  ~TmpDir() { fs::remove_all(p); }
};

void write_logits(const std::string& path, int32_t w, int32_t c, int32_t v, const std::vector<float>& x, size_t keep = SIZE_MAX) {
  std::ofstream o(path, std::ios::binary);
  const int32_t h[3] = {w, c, v};
  o.write(reinterpret_cast<const char*>(h), sizeof h);
  o.write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(std::min(keep, x.size()) * sizeof(float)));
}

TEST(EvalParity, WindowsFileHoldsTheHeaderAndEveryId) {
  TmpDir d;
  const std::string f = (d.p / "w.bin").string();
  eval::write_windows_file(f, {{1, 2, 3}, {4, 5, 6}});
  std::ifstream in(f, std::ios::binary);
  std::vector<int32_t> got(8);
  in.read(reinterpret_cast<char*>(got.data()), 8 * sizeof(int32_t));
  ASSERT_EQ(in.gcount(), static_cast<std::streamsize>(8 * sizeof(int32_t)));
  EXPECT_EQ(got, (std::vector<int32_t>{2, 3, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(fs::file_size(f), 8 * sizeof(int32_t));
  EXPECT_THROW(eval::write_windows_file(f, {{1, 2}, {3}}), std::invalid_argument);
  EXPECT_THROW(eval::write_windows_file((d.p / "no" / "w.bin").string(), {{1}}), std::runtime_error);
}

TEST(EvalParity, MalformedLogitsFilesAreRefusedWithTheReason) {
  TmpDir d;
  const std::string f = (d.p / "l.bin").string();
  std::vector<float> x(2 * 3 * 5, 0.5f);
  auto message = [&](int32_t w, int32_t c, int32_t v) {
    try {
      eval::read_logits_file(f, w, c, v);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  write_logits(f, 2, 3, 5, x);
  EXPECT_EQ(eval::read_logits_file(f, 2, 3, 5).logits, x);
  EXPECT_NE(message(2, 3, 6).find("shape 2 x 3 x 5, expected 2 windows x 3 positions x 6 vocabulary"), std::string::npos);
  write_logits(f, 2, 3, 5, x, x.size() - 1);
  EXPECT_NE(message(2, 3, 5).find("truncated"), std::string::npos);
  x[7] = std::numeric_limits<float>::quiet_NaN();
  write_logits(f, 2, 3, 5, x);
  EXPECT_NE(message(2, 3, 5).find("non-finite"), std::string::npos);
  std::ofstream(f, std::ios::binary | std::ios::trunc) << "ab";
  EXPECT_NE(message(2, 3, 5).find("no header"), std::string::npos);
  EXPECT_NE(message(2, 3, 5).find(f), std::string::npos);
  fs::remove(f);
  EXPECT_NE(message(2, 3, 5).find("cannot read"), std::string::npos);
}

TEST(EvalParity, FiguresMatchADirectComputation) {
  const int32_t W = 2, C = 4, V = 6;
  eval::PeerLogits peer;
  peer.windows = W;
  peer.ctx = C;
  peer.n_vocab = V;
  eval::FullReference ours;
  for (int32_t w = 0; w < W; ++w) {
    std::vector<float> lg;
    for (int32_t t = 0; t < C; ++t)
      for (int32_t i = 0; i < V; ++i) {
        const float a = std::sin(0.7f * static_cast<float>(i + 3 * t + 11 * w));
        peer.logits.push_back(a);
        lg.push_back(a + 2.5f + 0.1f * std::cos(static_cast<float>(i * t + w)));  // a shift plus a small change
      }
    ours.logits.push_back(lg);
  }
  // The same logits plus a constant: the same distributions.
  eval::FullReference shifted = ours;
  for (int32_t w = 0; w < W; ++w)
    for (size_t k = 0; k < shifted.logits[w].size(); ++k) shifted.logits[w][k] = peer.logits[w * C * V + k] + 3.0f;
  const eval::ParityResult same = eval::compare_logits(shifted, peer);
  EXPECT_EQ(same.positions, W * (C - 1));
  EXPECT_EQ(same.top1, 1.0);
  EXPECT_NEAR(same.mean_kl, 0.0, 1e-12);
  EXPECT_NEAR(same.max_abs_logit_diff, 3.0, 1e-6);

  const eval::ParityResult r = eval::compare_logits(ours, peer);
  double sum = 0, mx = 0;
  int agree = 0;
  for (int32_t w = 0; w < W; ++w)
    for (int32_t t = 0; t + 1 < C; ++t) {
      const float* p = peer.row(w, t);
      const float* q = ours.logits[w].data() + t * V;
      double zp = 0, zq = 0;
      for (int32_t i = 0; i < V; ++i) zp += std::exp(double(p[i])), zq += std::exp(double(q[i]));
      double kl = 0;
      int ap = 0, aq = 0;
      for (int32_t i = 0; i < V; ++i) {
        const double pp = std::exp(double(p[i])) / zp, qq = std::exp(double(q[i])) / zq;
        kl += pp * std::log(pp / qq);
        if (p[i] > p[ap]) ap = i;
        if (q[i] > q[aq]) aq = i;
      }
      sum += kl;
      mx = std::max(mx, kl);
      agree += ap == aq;
    }
  EXPECT_GT(r.mean_kl, 0.0);
  EXPECT_NEAR(r.mean_kl, sum / (W * (C - 1)), 1e-12);
  EXPECT_NEAR(r.max_kl, mx, 1e-12);
  EXPECT_DOUBLE_EQ(r.top1, double(agree) / (W * (C - 1)));

  ours.logits.pop_back();
  EXPECT_THROW(eval::compare_logits(ours, peer), std::invalid_argument);
}

// The CLI on a logits file written from kvpack's own full-KV run of the same windows: agreement 100 %, KL 0.
TEST(EvalParity, TheCommandAgreesWithItsOwnLogits) {
  TmpDir d;
  const std::string model_path = kShared + "/models/stories260K.gguf", text = kShared + "/corpora/austen.txt";
  auto model = kvpack::Model::load(model_path);
  const int32_t ctx = 64, chunks = 2;
  const auto toks = eval::tokenize_head(model->tokenizer(), eval::read_text_file(text), (ctx - 1) * chunks);
  const auto windows = eval::make_windows(*model, toks, ctx, chunks);
  kvpack::EngineOptions eo;
  eo.threads = 1;
  eo.kv_type = kvpack::DType::F32;  // the command below is given --kv-type f32 (its default is f16)
  const eval::FullReference ref = eval::full_reference(*model, windows, eo);
  std::vector<float> all;
  for (const auto& w : ref.logits) all.insert(all.end(), w.begin(), w.end());
  const std::string lf = (d.p / "peer.bin").string(), out = (d.p / "out.json").string();
  write_logits(lf, chunks, ctx, model->config().n_vocab, all);
  const std::string cmd = std::string(KVPACK_BINARY) + " eval parity -q -t 1 --kv-type f32 -m " + model_path +
                          " --text " + text + " --ctx 64 --chunks 2 --peer-logits " + lf + " --json > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  const std::string j((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(j.find("\"positions\": 126"), std::string::npos) << j;
  EXPECT_NE(j.find("\"top1\": 1.0"), std::string::npos) << j;
  EXPECT_NE(j.find("\"mean_kl\": 0.0"), std::string::npos) << j;

  // A file of another shape: a clear error, exit status non-zero.
  write_logits(lf, chunks, ctx - 1, model->config().n_vocab, all);
  const std::string bad = std::string(KVPACK_BINARY) + " eval parity -q -t 1 -m " + model_path + " --text " + text +
                          " --ctx 64 --chunks 2 --peer-logits " + lf + " > /dev/null 2> " + out;
  EXPECT_NE(std::system(bad.c_str()), 0);
  std::ifstream err(out);
  const std::string e((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_NE(e.find("expected 2 windows x 64 positions"), std::string::npos) << e;
}

}  // namespace
