#include "engine/auto_calibration.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "engine/calibrate.h"
#include "util/progress.h"

namespace kvpack {
namespace detail {
const std::vector<std::string>& calibration_paragraphs();  // calibration_text.cpp
}

namespace fs = std::filesystem;

namespace {

// Bump when the recipe (text, token count, engine settings) changes: old cache files are then ignored.
constexpr int kRecipeVersion = 1;

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex16(uint64_t x) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string AutoCalibrationInfo::describe() const {
  char buf[96];
  std::snprintf(buf, sizeof buf, " (%lld tokens of built-in text, %.1f s)", static_cast<long long>(tokens), seconds);
  std::string s = computed ? std::string("triattention calibration computed") + buf : std::string("triattention calibration reused");
  if (!path.empty()) s += computed ? ", cached at " + path : " from the cache " + path;
  if (!note.empty()) s += " (" + note + ")";
  return s;
}

std::string calibration_cache_dir() {
  if (const char* d = std::getenv("KVPACK_CACHE_DIR"); d && *d) return (fs::path(d) / "calib").string();
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "kvpack" / "calib").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "kvpack" / "calib").string();
  return "";
}

std::string calibration_cache_path(const Model& model) {
  const std::string dir = calibration_cache_dir();
  if (dir.empty() || model.path().empty()) return "";
  std::error_code ec;
  const fs::path canon = fs::weakly_canonical(model.path(), ec);
  const std::string where = ec ? model.path() : canon.string();
  uint64_t h = 1469598103934665603ull;
  h = fnv1a(h, where.data(), where.size());
  struct stat st {};
  if (::stat(model.path().c_str(), &st) == 0) {
    const int64_t fields[] = {static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                              static_cast<int64_t>(st.st_mtim.tv_nsec)};
    h = fnv1a(h, fields, sizeof fields);
  }
  std::ifstream in(model.path(), std::ios::binary);
  std::vector<char> head(64 * 1024);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  h = fnv1a(h, head.data(), static_cast<size_t>(in.gcount()));
  const int32_t extra[] = {model.config().n_ctx, kRecipeVersion};
  h = fnv1a(h, extra, sizeof extra);
  std::string stem = fs::path(model.path()).stem().string();
  for (char& c : stem)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return (fs::path(dir) / (stem + "-" + hex16(h) + ".calib")).string();
}

int64_t auto_calibration_tokens(const ModelConfig& c) { return std::min<int64_t>(4096, 2 * static_cast<int64_t>(c.n_ctx)); }

std::vector<int32_t> builtin_calibration_tokens(const Model& model, int64_t tokens) {
  const auto& paras = detail::calibration_paragraphs();
  std::string text;
  std::vector<int32_t> out;
  // A fixed permutation per round (a stride coprime with the paragraph count), so the text does not
  // repeat with the period of one round; tokenized paragraph by paragraph until there are enough.
  const size_t n = paras.size();
  for (size_t round = 0; static_cast<int64_t>(out.size()) < tokens; ++round) {
    const size_t stride = 1 + 4 * (round % 3);  // 1, 5, 9: coprime with 12
    for (size_t i = 0; i < n && static_cast<int64_t>(out.size()) < tokens; ++i) {
      const std::string& p = paras[(i * stride + round) % n];
      const std::vector<int32_t> t = model.tokenizer().encode(p + "\n\n", false);
      if (t.empty()) throw std::runtime_error("the built-in calibration text gives no tokens for this model's vocabulary");
      out.insert(out.end(), t.begin(), t.end());
    }
    if (round > 100000) break;  // cannot happen with a non-empty encoding; belt and braces
  }
  if (static_cast<int64_t>(out.size()) > tokens) out.resize(static_cast<size_t>(tokens));
  return out;
}

compress::QueryStats auto_calibration(const Model& model, const EngineOptions& eo, AutoCalibrationInfo* info, bool progress) {
  AutoCalibrationInfo local;
  AutoCalibrationInfo& inf = info ? *info : local;
  inf = {};
  const auto t0 = std::chrono::steady_clock::now();
  inf.path = calibration_cache_path(model);
  if (inf.path.empty()) inf.note = "not cached: no cache directory ($XDG_CACHE_HOME and $HOME unset)";
  if (!inf.path.empty() && fs::exists(inf.path)) {
    try {
      compress::QueryStats st = compress::QueryStats::load(inf.path, model.config());
      inf.tokens = st.tokens;
      inf.seconds = seconds_since(t0);
      return st;
    } catch (const std::exception& e) {
      inf.note = std::string("the cached file was unusable and was recomputed: ") + e.what();
    }
  }
  const std::vector<int32_t> toks = builtin_calibration_tokens(model, auto_calibration_tokens(model.config()));
  EngineOptions ceo = eo;
  ceo.kv_type = DType::F32;  // the statistics do not depend on the run's KV type (one cache file per model)
  ceo.kv_cold.clear();
  ceo.kv_pages = 0;
  std::unique_ptr<Progress> bar;
  if (progress) bar = std::make_unique<Progress>("calibrating triattention (once per model)", static_cast<int64_t>(toks.size()), "tokens");
  compress::QueryStats st = calibrate(model, toks, ceo, [&](int64_t done) {
    if (bar) bar->set(done);
  });
  if (bar) bar->finish();
  inf.computed = true;
  inf.tokens = static_cast<int64_t>(toks.size());  // text tokens (st.tokens also counts each window's BOS)
  if (!inf.path.empty()) {
    std::error_code ec;
    fs::create_directories(fs::path(inf.path).parent_path(), ec);
    const std::string tmp = inf.path + ".tmp." + std::to_string(::getpid());
    try {
      st.save(tmp);
      fs::rename(tmp, inf.path);
    } catch (const std::exception& e) {
      fs::remove(tmp, ec);
      inf.note = std::string("could not be cached: ") + e.what();
      inf.path.clear();
    }
  }
  inf.seconds = seconds_since(t0);
  return st;
}

bool ensure_calibration(Engine& engine, compress::PolicyKind policy, AutoCalibrationInfo* info, bool progress) {
  if (!compress::policy_requires_calibration(policy) || engine.calibration() != nullptr) return false;
  engine.set_calibration(auto_calibration(engine.model(), engine.options(), info, progress));
  return true;
}

}  // namespace kvpack
