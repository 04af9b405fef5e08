#include "util/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace kvpack {

Progress::Style Progress::style_for(FILE* out) {
  if (const char* e = std::getenv("KVPACK_PROGRESS")) {
    if (std::strcmp(e, "0") == 0 || std::strcmp(e, "off") == 0) return Style::Off;
    if (std::strcmp(e, "lines") == 0) return Style::Lines;
    if (std::strcmp(e, "bar") == 0) return Style::Bar;
  }
  return isatty(fileno(out)) ? Style::Bar : Style::Lines;
}

Progress::Progress(std::string label, int64_t total, std::string unit, FILE* out)
    : label_(std::move(label)), unit_(std::move(unit)), total_(std::max<int64_t>(0, total)), out_(out), style_(style_for(out)) {
  if (const char* e = std::getenv("KVPACK_PROGRESS_EVERY")) {
    const double s = std::atof(e);
    if (s > 0) every_s_ = s;
  }
  t0_ = last_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { finish(); }

void Progress::advance(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ += n;
  draw(false);
}

void Progress::set(int64_t done) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = done;
  draw(false);
}

void Progress::set_total(int64_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  total_ = std::max<int64_t>(0, total);
}

void Progress::note(const std::string& s) {
  std::lock_guard<std::mutex> lock(mu_);
  note_ = s;
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  // A closing line only if something was shown (short work stays silent in both styles).
  if (drawn_) draw(true);
}

void Progress::draw(bool final) {
  if (style_ == Style::Off || (finished_ && !final)) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - t0_).count();
  if (!final) {
    const double since = std::chrono::duration<double>(now - last_).count();
    // The bar appears after a second and redraws at most 10 times a second; plain lines every every_s_.
    if (style_ == Style::Bar && !drawn_ && elapsed < 1.0) return;
    if (since < (style_ == Style::Bar ? 0.1 : every_s_)) return;
  }
  last_ = now;
  drawn_ = true;
  char counts[160];
  const std::string unit = unit_.empty() ? "" : " " + unit_;
  double frac = total_ > 0 ? std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_)) : 0.0;
  char eta[48] = "";
  if (total_ > 0 && done_ > 0 && !final && frac < 1.0) std::snprintf(eta, sizeof eta, ", ~%.0f s left", elapsed * (1.0 - frac) / frac);
  if (total_ > 0)
    std::snprintf(counts, sizeof counts, "%lld/%lld%s (%.0f%%), %.1f s%s", static_cast<long long>(done_),
                  static_cast<long long>(total_), unit.c_str(), 100.0 * frac, elapsed, eta);
  else if (!unit_.empty())
    std::snprintf(counts, sizeof counts, "%lld%s, %.1f s", static_cast<long long>(done_), unit.c_str(), elapsed);
  else
    std::snprintf(counts, sizeof counts, "%.1f s", elapsed);
  const std::string note = note_.empty() ? "" : " " + note_;
  if (style_ == Style::Bar) {
    constexpr int kWidth = 28;
    const int fill = total_ > 0 ? static_cast<int>(frac * kWidth) : 0;
    std::string bar(static_cast<size_t>(fill), '#');
    bar.append(static_cast<size_t>(kWidth - fill), total_ > 0 ? '.' : ' ');
    // \r + clear to end of line: the bar stays on one line; the final draw ends it.
    std::fprintf(out_, "\r\033[K[kvpack] %s [%s] %s%s%s", label_.c_str(), bar.c_str(), counts, note.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(out_, "[kvpack] %s: %s%s%s\n", label_.c_str(), final ? "done, " : "", counts, note.c_str());
  }
  std::fflush(out_);
}

ProgressProbe::ProgressProbe(Progress& progress, std::function<int64_t()> probe) : progress_(progress), probe_(std::move(probe)) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) progress_.set(probe_());
  });
}

ProgressProbe::~ProgressProbe() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  progress_.set(probe_());
}

}  // namespace kvpack
