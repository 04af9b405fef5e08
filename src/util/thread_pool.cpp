#include "util/thread_pool.h"

#include <chrono>

namespace kvpack {

// Protocol. run() publishes (generation, fn, n_tasks) under the mutex and resets each range's cursor to
// (generation << 32 | first task of the range). Anyone — the caller or a worker holding a snapshot of
// that generation — takes a task by compare-and-swap on a cursor, which only succeeds while the
// generation bits still match, so a late worker can never take a task of a newer run with an older
// snapshot; a range's end is split_range(n_tasks, ranges, p), computed from the snapshot, not shared.
// When run() returns every cursor of its generation stands at its range's end, so a stale worker finds
// nothing to claim. Each thread adds the tasks it ran to `completed_` once, when it finds no task left
// (one contended atomic per thread per run, not per task); the caller returns once `completed_` reaches
// n_tasks: it never waits for workers that took no task (a worker preempted by another process costs
// nothing unless it is actually running one of our tasks, and then only the rest of that one task:
// its range's remaining tasks are taken by the others).

ThreadPool::ThreadPool(int n_threads, Order order)
    : n_threads_(n_threads < 1 ? 1 : n_threads),
      order_(order),
      cursors_(std::make_unique<Cursor[]>(static_cast<size_t>(ranges()))) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain(uint64_t gen, int n_tasks, TaskRef* fn, int thread_index) {
  const int ranges = this->ranges();
  const uint64_t tag = gen & 0xffffffffu;
  int ran = 0;
  // Own range first, then the others' remainders in turn.
  for (int k = 0; k < ranges; ++k) {
    const int p = (thread_index + k) % ranges;
    const auto end = static_cast<uint64_t>(split_range(n_tasks, ranges, p).second);
    std::atomic<uint64_t>& cursor = cursors_[static_cast<size_t>(p)].claim;
    for (;;) {
      uint64_t c = cursor.load(std::memory_order_acquire);
      if ((c >> 32) != tag) {  // a newer run started: our snapshot is stale (so `ran` is 0: the run we
        k = ranges;            // took tasks of cannot have finished before we counted them)
        break;
      }
      const uint64_t task = c & 0xffffffffu;
      if (task >= end) break;
      if (!cursor.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
      (*fn)(static_cast<int>(task), thread_index);
      ++ran;
    }
  }
  if (ran > 0 && completed_.fetch_add(ran, std::memory_order_acq_rel) + ran == n_tasks) {
    std::lock_guard<std::mutex> lock(mu_);
    done_cv_.notify_one();
  }
}

void ThreadPool::run_impl(int n_tasks, TaskRef fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_tasks_ = n_tasks;
    completed_.store(0, std::memory_order_relaxed);
    gen = generation_.fetch_add(1, std::memory_order_acq_rel) + 1;
    const int ranges = this->ranges();
    for (int p = 0; p < ranges; ++p)
      cursors_[static_cast<size_t>(p)].claim.store(
          ((gen & 0xffffffffu) << 32) | static_cast<uint64_t>(split_range(n_tasks, ranges, p).first),
          std::memory_order_release);
  }
  cv_.notify_all();
  drain(gen, n_tasks, &fn, 0);
  // Tasks other threads took may still be running: spin briefly, then sleep.
  for (int spin = 0; completed_.load(std::memory_order_acquire) < n_tasks; ++spin) {
    if (spin < 2000) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait_for(lock, std::chrono::microseconds(200),
                        [&] { return completed_.load(std::memory_order_acquire) >= n_tasks; });
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  fn_ = nullptr;
}

void ThreadPool::worker_loop(int thread_index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little: decode issues many short parallel sections back to back.
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < 4000; ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      g = generation_.load(std::memory_order_acquire);
    }
    uint64_t gen;
    TaskRef* fn;
    int n_tasks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
      gen = generation_.load(std::memory_order_acquire);
      fn = fn_;
      n_tasks = n_tasks_;
    }
    seen = gen;
    if (fn != nullptr) drain(gen, n_tasks, fn, thread_index);
  }
}

}  // namespace kvpack
