// CompressionSchedule: when events fire, how far the next one is, and what the scheduler may assume
// about a sequence's size and its prefix-cache registration. Pure arithmetic; no KV cache.
#include <gtest/gtest.h>

#include <limits>

#include "compress/schedule.h"

using namespace kvpack::compress;

namespace {

CompressConfig cfg(int32_t budget, int32_t interval, bool protect_prompt = false) {
  CompressConfig c;
  c.policy = PolicyKind::KNorm;
  c.budget = budget;
  c.interval = interval;
  c.protect_prompt = protect_prompt;
  return c;
}

}  // namespace

TEST(CompressSchedule, FiresAtBudgetPlusIntervalSummedOverStreams) {
  const CompressionSchedule s(cfg(32, 16), 4);
  EXPECT_FALSE(s.fires(4 * 48 - 1, false));
  EXPECT_TRUE(s.fires(4 * 48, false));
  EXPECT_EQ(s.tokens_until_event(0), 48);
  EXPECT_EQ(s.tokens_until_event(4 * 47), 1);
  EXPECT_EQ(s.tokens_until_event(4 * 47 + 1), 1);  // rounds up: a partial token still fires the event
  EXPECT_EQ(s.tokens_until_event(4 * 100), 1);     // never below 1
}

TEST(CompressSchedule, EndOfPrefillFiresOnlyAboveBudgetAndOnlyOnce) {
  CompressionSchedule s(cfg(32, 16), 2);
  EXPECT_FALSE(s.fires(2 * 32, true));      // at the budget: nothing to cut
  EXPECT_TRUE(s.fires(2 * 32 + 1, true));   // above it at the end of the prompt
  EXPECT_FALSE(s.fires(2 * 32 + 1, false)); // not at other steps
  s.on_event(2 * 40);                        // protected slots left 40 per stream
  EXPECT_FALSE(s.fires(2 * 40, true));      // nothing added since: does not fire again
  EXPECT_TRUE(s.fires(2 * 40 + 1, true));
}

TEST(CompressSchedule, AfterAnEventAboveBudgetTheNextWaitsAFullInterval) {
  CompressionSchedule s(cfg(32, 16), 2);
  s.on_event(2 * 60);  // e.g. a protected prompt of 60
  EXPECT_EQ(s.events(), 1);
  EXPECT_FALSE(s.fires(2 * 75, false));
  EXPECT_TRUE(s.fires(2 * 76, false));
  EXPECT_EQ(s.tokens_until_event(2 * 60), 16);
  s.on_event(2 * 32);  // back at the budget: the budget + interval threshold applies again
  EXPECT_EQ(s.tokens_until_event(2 * 32), 16);
  EXPECT_EQ(s.events(), 2);
}

TEST(CompressSchedule, ProjectedSlots) {
  const CompressionSchedule plain(cfg(32, 16), 2);
  EXPECT_EQ(plain.projected_slots(1000, 100, 0), 48);  // budget + interval
  EXPECT_EQ(plain.projected_slots(40, 100, 0), 40);    // never more than the final length
  EXPECT_EQ(plain.projected_slots(1000, 10, 64), 80);  // a cached prefix is protected: 64 + interval
  const CompressionSchedule prot(cfg(32, 16, true), 2);
  EXPECT_EQ(prot.projected_slots(1000, 100, 0), 116);  // protected prompt + interval
  EXPECT_EQ(prot.projected_slots(1000, 100, 120), 136);
  EXPECT_EQ(prot.projected_slots(1000, 8, 0), 48);
  const CompressionSchedule off(CompressConfig{}, 2);
  EXPECT_EQ(off.projected_slots(1000, 100, 64), 1000);
}

TEST(CompressSchedule, MayRegisterOnlyNeverEvictedPromptsBeforeTheFirstEvent) {
  CompressionSchedule s(cfg(32, 16), 2);
  EXPECT_TRUE(s.may_register(32));
  EXPECT_FALSE(s.may_register(33));  // a prompt over the budget will be compressed
  EXPECT_EQ(s.registrable_tokens(50, 30), 30);  // generated tokens are evictable
  EXPECT_EQ(s.registrable_tokens(20, 30), 20);
  s.on_event(64);
  EXPECT_FALSE(s.may_register(8));
  CompressionSchedule prot(cfg(32, 16, true), 2);
  EXPECT_TRUE(prot.may_register(500));
  const CompressionSchedule off(CompressConfig{}, 2);
  EXPECT_TRUE(off.may_register(500));
  EXPECT_EQ(off.registrable_tokens(50, 30), 50);
  EXPECT_FALSE(off.fires(1 << 30, true));
  EXPECT_EQ(off.tokens_until_event(0), std::numeric_limits<int32_t>::max());
}
