#include <gtest/gtest.h>

#include <climits>

#include "tpreload/comm/chunking.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

TEST(SplitRange, CoversEveryByteOnce) {
  EXPECT_TRUE(split_range(0, 10).empty());
  const auto pieces = split_range(25, 10);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0], (ByteRange{0, 10}));
  EXPECT_EQ(pieces[2], (ByteRange{20, 5}));
  const auto big = split_range(std::uint64_t{5} << 30, INT_MAX);
  std::uint64_t next = 0;
  for (const auto& p : big) {
    EXPECT_EQ(p.offset, next);
    EXPECT_LE(p.length, std::uint64_t{INT_MAX});
    next = p.end();
  }
  EXPECT_EQ(next, std::uint64_t{5} << 30);
  EXPECT_THROW(split_range(5, 0), UsageError);
}

// Replays a plan and checks that each rank receives exactly its range, in order,
// within the limits.
void check_plan(const std::vector<ByteRange>& ranges, std::uint64_t max_bytes,
                std::uint64_t max_span) {
  const auto rounds = plan_scatter_rounds(ranges, max_bytes, max_span);
  std::vector<std::uint64_t> received(ranges.size(), 0);
  for (const auto& round : rounds) {
    ASSERT_EQ(round.send.size(), ranges.size());
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      const ByteRange& piece = round.send[r];
      if (piece.length == 0) continue;
      EXPECT_LE(piece.length, max_bytes);
      EXPECT_GE(piece.offset, round.base);
      EXPECT_LE(piece.offset - round.base, max_span);
      EXPECT_EQ(round.recv_offset[r], received[r]) << "rank " << r << " out of order";
      EXPECT_EQ(piece.offset, ranges[r].offset + received[r]);
      received[r] += piece.length;
    }
  }
  for (std::size_t r = 0; r < ranges.size(); ++r) EXPECT_EQ(received[r], ranges[r].length);
}

TEST(ScatterPlan, UnevenEmptyAndReversedRanges) {
  check_plan({{100, 30}, {0, 0}, {0, 95}, {130, 1}}, 10, 1000);
  check_plan({{0, 0}, {0, 0}}, 10, 1000);
  EXPECT_TRUE(plan_scatter_rounds({{0, 0}, {5, 0}}, 10, 10).empty());
}

TEST(ScatterPlan, FarApartRangesGetSeparateRounds) {
  // Pieces more than max_span apart cannot share one call's displacement base.
  const std::vector<ByteRange> ranges = {{0, 8}, {1000, 8}, {20, 8}};
  check_plan(ranges, 8, 100);
  EXPECT_EQ(plan_scatter_rounds(ranges, 8, 100).size(), 2u);
  EXPECT_EQ(plan_scatter_rounds(ranges, 8, 1000).size(), 1u);
}

TEST(ScatterPlan, RangesBeyondFourGiB) {
  const std::uint64_t gib = std::uint64_t{1} << 30;
  check_plan({{0, 3 * gib}, {3 * gib, gib + 1}, {7 * gib, 5}}, INT_MAX, INT_MAX);
}

}  // namespace
}  // namespace tpreload
