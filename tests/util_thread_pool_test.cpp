// The fork-join pool: every task runs exactly once per run(), for many back-to-back runs of varied
// sizes (the decode pattern), with 1, 2 and 4 threads, and the caller sees all effects on return.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "util/thread_pool.h"

TEST(ThreadPool, EveryTaskRunsExactlyOncePerRun) {
  for (int threads : {1, 2, 4}) {
    kvpack::ThreadPool pool(threads);
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
