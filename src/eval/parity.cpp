#include "eval/parity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>

namespace kvpack::eval {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

void write_windows_file(const std::string& path, const std::vector<std::vector<int32_t>>& windows) {
  if (windows.empty()) throw std::invalid_argument("no windows");
  const int32_t ctx = static_cast<int32_t>(windows[0].size());
  for (const auto& w : windows)
    if (static_cast<int32_t>(w.size()) != ctx) throw std::invalid_argument("windows of different lengths");
  File f(std::fopen(path.c_str(), "wb"));
  if (!f) throw std::runtime_error("cannot write " + path);
  const int32_t head[2] = {static_cast<int32_t>(windows.size()), ctx};
  bool ok = std::fwrite(head, sizeof(int32_t), 2, f.get()) == 2;
  for (const auto& w : windows) ok = ok && std::fwrite(w.data(), sizeof(int32_t), w.size(), f.get()) == w.size();
  ok = std::fflush(f.get()) == 0 && ok;
  if (!ok) throw std::runtime_error("write failed: " + path);
}

PeerLogits read_logits_file(const std::string& path, int32_t windows, int32_t ctx, int32_t n_vocab) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw std::runtime_error("cannot read " + path);
  int32_t head[3];
  if (std::fread(head, sizeof(int32_t), 3, f.get()) != 3) throw std::runtime_error(path + ": no header");
  if (head[0] != windows || head[1] != ctx || head[2] != n_vocab)
    throw std::runtime_error(path + ": shape " + std::to_string(head[0]) + " x " + std::to_string(head[1]) + " x " +
                             std::to_string(head[2]) + ", expected " + std::to_string(windows) + " windows x " +
                             std::to_string(ctx) + " positions x " + std::to_string(n_vocab) + " vocabulary");
  PeerLogits p;
  p.windows = windows;
  p.ctx = ctx;
  p.n_vocab = n_vocab;
  p.logits.resize(static_cast<size_t>(windows) * static_cast<size_t>(ctx) * static_cast<size_t>(n_vocab));
  if (std::fread(p.logits.data(), sizeof(float), p.logits.size(), f.get()) != p.logits.size())
    throw std::runtime_error(path + ": truncated (fewer logits than its header says)");
  for (const float v : p.logits)
    if (!std::isfinite(v)) throw std::runtime_error(path + ": non-finite logit");
  return p;
}

ParityResult compare_logits(const FullReference& ours, const PeerLogits& peer) {
  if (static_cast<int32_t>(ours.logits.size()) != peer.windows) throw std::invalid_argument("window counts differ");
  const int32_t V = peer.n_vocab;
  const size_t row = static_cast<size_t>(V);
  std::vector<double> lp_peer(row), lp_ours(row), kls;
  int64_t agree = 0;
  ParityResult r;
  for (int32_t w = 0; w < peer.windows; ++w) {
    if (ours.logits[static_cast<size_t>(w)].size() != static_cast<size_t>(peer.ctx) * row)
      throw std::invalid_argument("window " + std::to_string(w) + ": kvpack's logits have another shape");
    for (int32_t t = 0; t + 1 < peer.ctx; ++t) {  // row ctx-1 predicts the token after the window: not compared
      const float* a = peer.row(w, t);
      const float* b = ours.logits[static_cast<size_t>(w)].data() + static_cast<size_t>(t) * row;
      const int32_t am_peer = log_softmax(a, V, lp_peer);
      const int32_t am_ours = log_softmax(b, V, lp_ours);
      agree += am_peer == am_ours;
      double kl = 0;
      for (size_t i = 0; i < row; ++i) {
        kl += std::exp(lp_peer[i]) * (lp_peer[i] - lp_ours[i]);
        r.max_abs_logit_diff = std::max(r.max_abs_logit_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      }
      kls.push_back(std::max(0.0, kl));
    }
  }
  r.positions = static_cast<int64_t>(kls.size());
  if (kls.empty()) return r;
  r.top1 = static_cast<double>(agree) / static_cast<double>(kls.size());
  double sum = 0;
  for (const double k : kls) sum += k;
  r.mean_kl = sum / static_cast<double>(kls.size());
  std::sort(kls.begin(), kls.end());
  r.max_kl = kls.back();
  r.p99_kl = kls[std::min(kls.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(kls.size())))];
  return r;
}

}  // namespace kvpack::eval
