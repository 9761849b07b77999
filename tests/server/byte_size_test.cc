#include "server/operations/byte_size.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

TEST(ByteSizeTest, ParsesUnits) {
  EXPECT_EQ(4096u, *ParseByteSize("4096"));
  EXPECT_EQ(512u << 20, *ParseByteSize("512MiB"));
  EXPECT_EQ(64ull << 30, *ParseByteSize("64GiB"));
  EXPECT_EQ(10ull << 30, *ParseByteSize("10G"));
  EXPECT_EQ(2000000000u, *ParseByteSize("2GB"));
  EXPECT_EQ(1ull << 40, *ParseByteSize("1tib"));
  EXPECT_EQ(0u, *ParseByteSize("0"));
}

TEST(ByteSizeTest, RefusesGarbage) {
  EXPECT_ERROR(InvalidArgument, ParseByteSize(""));
  EXPECT_ERROR(InvalidArgument, ParseByteSize("GiB"));
  EXPECT_ERROR(InvalidArgument, ParseByteSize("-1"));
  EXPECT_ERROR(InvalidArgument, ParseByteSize("12 GiB"));
  EXPECT_ERROR(InvalidArgument, ParseByteSize("12XB"));
  EXPECT_ERROR(InvalidArgument, ParseByteSize("99999999999999999999"));
  EXPECT_ERROR(InvalidArgument, ParseByteSize("20000000000TiB"));
}

}  // namespace
}  // namespace hostkv
