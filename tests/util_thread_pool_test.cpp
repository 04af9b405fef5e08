// The fork-join pool: every task runs exactly once per run(), for many back-to-back runs of varied
// sizes (the decode pattern), with 1, 2 and 4 threads and both task orders, and the caller sees all
// effects on return; the partitioned order walks each thread's range in order before helping others.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "util/thread_pool.h"

TEST(ThreadPool, EveryTaskRunsExactlyOncePerRun) {
  for (auto order : {kvpack::ThreadPool::Order::Partitioned, kvpack::ThreadPool::Order::Interleaved}) {
    for (int threads : {1, 2, 4}) {
      kvpack::ThreadPool pool(threads, order);
      std::vector<int> hits(257);
      for (int run = 0; run < 3000; ++run) {
        const int n = 1 + (run * 37) % 257;
        std::fill(hits.begin(), hits.begin() + n, 0);
        std::atomic<int> total{0};
        pool.run(n, [&](int task, int thread) {
          ASSERT_GE(thread, 0);
          ASSERT_LT(thread, threads);
          ++hits[static_cast<size_t>(task)];  // distinct tasks write distinct elements
          total.fetch_add(1, std::memory_order_relaxed);
        });
        ASSERT_EQ(total.load(), n) << "threads " << threads << " run " << run;
        for (int i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << "task " << i;
      }
    }
  }
}

// Partitioned order: thread t takes tasks of range t first (split_range(n, threads, t)), each range in
// ascending order, and only then the other ranges' remainders, visiting ranges t+1, t+2, ... (mod threads).
// So every thread's task sequence is ascending inside each range, and its ranges come in that rotation.
TEST(ThreadPool, PartitionedOrderWalksOwnRangeInOrderFirst) {
  for (int threads : {2, 3, 4}) {
    kvpack::ThreadPool pool(threads);
    for (int run = 0; run < 500; ++run) {
      const int n = 1 + (run * 53) % 300;
      std::vector<std::vector<int>> seq(static_cast<size_t>(threads));
      pool.run(n, [&](int task, int thread) { seq[static_cast<size_t>(thread)].push_back(task); });
      auto range_of = [&](int task) {
        for (int p = 0; p < threads; ++p)
          if (task < kvpack::split_range(n, threads, p).second) return p;
        return -1;
      };
      size_t total = 0;
      for (int t = 0; t < threads; ++t) {
        const std::vector<int>& s = seq[static_cast<size_t>(t)];
        total += s.size();
        int prev_step = -1, prev_task = -1;
        for (int task : s) {
          const int step = (range_of(task) - t + threads) % threads;  // 0: own range, 1: the next, ...
          ASSERT_GE(step, prev_step) << "thread " << t << " went back to an earlier range, n " << n;
          if (step == prev_step) {
            ASSERT_GT(task, prev_task) << "thread " << t << " out of order in a range, n " << n;
          }
          prev_step = step;
          prev_task = task;
        }
      }
      ASSERT_EQ(total, static_cast<size_t>(n));
    }
  }
}

TEST(ThreadPool, SplitRangeCoversEverythingOnce) {
  for (int64_t n : {0, 1, 7, 64, 1000})
    for (int parts : {1, 2, 3, 8}) {
      int64_t covered = 0, prev_hi = 0;
      for (int i = 0; i < parts; ++i) {
        const auto [lo, hi] = kvpack::split_range(n, parts, i, 4);
        EXPECT_EQ(lo, prev_hi);
        EXPECT_GE(hi, lo);
        covered += hi - lo;
        prev_hi = hi;
      }
      EXPECT_EQ(covered, n);
    }
}
