// Calibration that happens by itself: when a request's policy needs TriAttention statistics
// (compress::policy_requires_calibration) and none were given, they are computed once on built-in
// English text, cached in the user's cache directory keyed by the model file's identity, and reused by
// every later run (CLI, server, Session API). The budget stays the one knob.
//
// Cache: $XDG_CACHE_HOME/kvpack/calib, else $HOME/.cache/kvpack/calib; KVPACK_CACHE_DIR overrides the
// directory (tests). The key hashes the model file's canonical path, size, modification time and first
// 64 KiB, plus the context length and the calibration recipe version, so a rewritten model file (same
// name, new weights) is calibrated again. Writes are atomic (temp file + rename), so concurrent first
// runs are safe; an unreadable or mismatching cache file is recomputed and replaced.
// Thread-safety: functions are reentrant; the engine passed in is used from the calling thread only.
#pragma once
#include <cstdint>
#include <string>

#include "compress/calibration.h"
#include "engine/engine.h"
#include "model/model.h"

namespace kvpack {

struct AutoCalibrationInfo {
  std::string path;        // the cache file ("" when nothing could be cached)
  bool computed = false;   // false: loaded from the cache
  int64_t tokens = 0;      // tokens the statistics were computed from
  double seconds = 0;      // computing (or loading) time
  std::string note;        // why the cache was not used, if it was not (e.g. no cache directory)
  std::string describe() const;  // one line for stderr / logs
};

// The cache directory ("" when neither $XDG_CACHE_HOME nor $HOME is set).
std::string calibration_cache_dir();
// The cache file for this model ("" without a cache directory).
std::string calibration_cache_path(const Model& model);
// About `tokens` tokens of built-in English prose (original text shipped in the binary, repeated in a
// fixed shuffled order), tokenized for `model`.
std::vector<int32_t> builtin_calibration_tokens(const Model& model, int64_t tokens);
// Tokens used by ensure_calibration: two contexts' worth, at most 4096.
int64_t auto_calibration_tokens(const ModelConfig& c);

// Loads the cached statistics for `model` or computes and caches them; shows progress on stderr while
// computing when `progress` is set. Throws std::runtime_error when computing fails.
compress::QueryStats auto_calibration(const Model& model, const EngineOptions& eo, AutoCalibrationInfo* info,
                                      bool progress = true);
// For an engine about to run `policy`: when the policy cannot run without statistics and the engine has
// none, gives it auto_calibration's and returns true (info filled); otherwise returns false.
bool ensure_calibration(Engine& engine, compress::PolicyKind policy, AutoCalibrationInfo* info, bool progress = true);

}  // namespace kvpack
