// Progress of long work on stderr: a bar redrawn in place when stderr is a terminal, otherwise a plain
// line every few seconds (logs and CI see the work moving without a flood of carriage returns).
//
//   Progress p("calibrate", total_tokens, "tokens");
//   for (...) p.advance(n);   // or p.set(done)
//   p.finish();               // the last line (also written by the destructor if forgotten)
//
// KVPACK_PROGRESS=0 silences it, KVPACK_PROGRESS=lines forces plain lines on a terminal,
// KVPACK_PROGRESS=bar forces the bar; KVPACK_PROGRESS_EVERY=SECONDS sets the plain-line period
// (default 5 s). Nothing is shown for work shorter than that (the bar: a second). A total of 0 means
// unknown (counts only; with no unit either, the elapsed time only).
// Thread-safety: advance / set may be called from any thread (a mutex guards the output); one Progress
// per task.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

namespace kvpack {

class Progress {
 public:
  enum class Style { Off, Bar, Lines };
  Progress(std::string label, int64_t total, std::string unit = "", FILE* out = stderr);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(int64_t n = 1);
  void set(int64_t done);
  void set_total(int64_t total);
  // A short note shown after the counts (e.g. the row being measured).
  void note(const std::string& s);
  void finish();
  Style style() const { return style_; }
  // The style the environment asks for: KVPACK_PROGRESS, else Bar on a terminal, else Lines.
  static Style style_for(FILE* out);

 private:
  void draw(bool final);  // mu_ held
  std::string label_, unit_, note_;
  int64_t total_ = 0, done_ = 0;
  FILE* out_;
  Style style_;
  double every_s_ = 5.0;
  std::chrono::steady_clock::time_point t0_, last_;
  bool finished_ = false, drawn_ = false;
  std::mutex mu_;
};

// For work that cannot report its own progress (a library call that writes or maps a file): a thread
// that samples `probe()` (e.g. the size of the file being written) into `progress` every 100 ms until
// destroyed. Nothing is shown for work that ends within the first plain-line period.
class ProgressProbe {
 public:
  ProgressProbe(Progress& progress, std::function<int64_t()> probe);
  ~ProgressProbe();  // stops and joins the thread (the last sample is taken first)
  ProgressProbe(const ProgressProbe&) = delete;
  ProgressProbe& operator=(const ProgressProbe&) = delete;

 private:
  Progress& progress_;
  std::function<int64_t()> probe_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kvpack
