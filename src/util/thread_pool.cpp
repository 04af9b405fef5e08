#include "util/thread_pool.h"

#include <chrono>

namespace kvpack {

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
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

void ThreadPool::drain(int thread_index) {
  for (;;) {
    const int task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) break;
    (*fn_)(task, thread_index);
  }
}

void ThreadPool::run_impl(int n_tasks, TaskRef fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_tasks_ = n_tasks;
    next_task_.store(0, std::memory_order_relaxed);
    active_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  drain(0);
  // Wait for the workers to finish their last task (they may still be inside fn): spin briefly (the
  // common case on an idle machine is a few microseconds), then sleep so an oversubscribed machine
  // (CI, other processes) gives the core to the worker that still has work.
  for (int spin = 0; active_workers_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < 2000) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait_for(lock, std::chrono::microseconds(200),
                        [&] { return active_workers_.load(std::memory_order_acquire) == 0; });
    }
  }
  fn_ = nullptr;
}

void ThreadPool::worker_loop(int thread_index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little: decode issues many short parallel sections back to back.
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < 4000; ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    drain(thread_index);
    if (active_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace kvpack
