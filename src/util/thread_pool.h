// A small fork-join pool for the kernels: run(n, fn) calls fn(task, thread) for task in [0, n) on the
// caller plus the workers and returns when all tasks are done. Built for ~hundreds of calls per decoded
// token, so workers spin briefly before sleeping and no call allocates.
//
// Which thread runs which task never changes a result (the kernels give every task its own outputs); it
// changes speed. By default the tasks are cut into one contiguous range per thread: thread i takes the
// tasks of range i in order, then helps with what is left of the others. The kernels number their tasks
// along memory (a GEMV's row blocks), so each thread reads one sequential stream per call and the
// hardware prefetchers keep running from one task into the next, where a single shared counter handed
// out every other block to each thread and restarted the stream at every task.
// Thread-safety: one run() at a time per pool (the engine owns one pool and calls it from one thread).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvpack {

// Non-owning reference to a callable void(int task, int thread); avoids std::function's allocation.
class TaskRef {
 public:
  template <class F>
  TaskRef(F& f) : obj_(&f), call_([](void* o, int task, int thread) { (*static_cast<F*>(o))(task, thread); }) {}
  void operator()(int task, int thread) const { call_(obj_, task, thread); }

 private:
  void* obj_;
  void (*call_)(void*, int, int);
};

class ThreadPool {
 public:
  // How run() hands out tasks: Partitioned (above, the default) or Interleaved (one shared counter, the
  // next task to whoever asks: the baseline bench_matmul measures against).
  enum class Order { Partitioned, Interleaved };

  explicit ThreadPool(int n_threads, Order order = Order::Partitioned);  // total threads including the caller; >= 1
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  template <class F>
  void run(int n_tasks, F&& fn) {
    auto& f = fn;
    run_impl(n_tasks, TaskRef(f));
  }

 private:
  void run_impl(int n_tasks, TaskRef fn);
  void worker_loop(int thread_index);
  void drain(uint64_t gen, int n_tasks, TaskRef* fn, int thread_index);
  int ranges() const { return order_ == Order::Partitioned ? n_threads_ : 1; }  // cursors_ entries

  // Claims of range p: (generation << 32) | next task; on its own cache line so the threads do not
  // contend on one counter while each walks its own range.
  struct alignas(64) Cursor {
    std::atomic<uint64_t> claim{0};
  };

  int n_threads_;
  Order order_;
  std::unique_ptr<Cursor[]> cursors_;  // one per range (ranges())
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;  // the last worker finishing a run() wakes the caller
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> completed_{0};
  int n_tasks_ = 0;
  TaskRef* fn_ = nullptr;
  bool stop_ = false;
};

// Splits [0, n) into `parts` contiguous ranges; returns the range of part `i`, aligned to `align`.
inline std::pair<int64_t, int64_t> split_range(int64_t n, int parts, int i, int64_t align = 1) {
  const int64_t blocks = (n + align - 1) / align;
  const int64_t per = blocks / parts, extra = blocks % parts;
  const int64_t b0 = i * per + (i < extra ? i : extra);
  const int64_t b1 = b0 + per + (i < extra ? 1 : 0);
  int64_t lo = b0 * align, hi = b1 * align;
  if (hi > n) hi = n;
  if (lo > n) lo = n;
  return {lo, hi};
}

}  // namespace kvpack
