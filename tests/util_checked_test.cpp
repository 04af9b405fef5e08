#include "util/checked.h"

#include <gtest/gtest.h>

namespace kvpack {
namespace {

TEST(Checked, ProductsThatWrapThrowNamingTheQuantity) {
  EXPECT_EQ(checked_mul(uint64_t{1} << 31, uint64_t{1} << 32, "x"), uint64_t{1} << 63);
  try {
    checked_product("weight count", uint64_t{1} << 20, uint64_t{1} << 19, uint64_t{10485758}, uint64_t{1} << 20);
    FAIL() << "no overflow reported";
  } catch (const OverflowError& e) {
    EXPECT_STREQ(e.what(), "weight count overflows (5764606423522607104 * 1048576)");
  }
  EXPECT_THROW(checked_add(INT64_MAX, int64_t{1}, "offset"), OverflowError);
  EXPECT_THROW(checked_mul(INT64_MIN, int64_t{-1}, "offset"), OverflowError);
  EXPECT_EQ(checked_add(uint64_t{2}, uint64_t{3}, "n"), 5u);
}

TEST(Checked, NarrowingRejectsValuesThatDoNotFit) {
  EXPECT_EQ(checked_cast<int32_t>(int64_t{8}, "key_length"), 8);
  try {
    checked_cast<int32_t>((int64_t{1} << 32) + 8, "key_length");
    FAIL() << "truncated";
  } catch (const OverflowError& e) {
    EXPECT_STREQ(e.what(), "key_length = 4294967304 does not fit in a 32-bit signed integer");
  }
  EXPECT_THROW(checked_cast<uint32_t>(-1, "n"), OverflowError);
}

}  // namespace
}  // namespace kvpack
