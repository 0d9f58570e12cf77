// Tests that fail on purpose, run by ctest with the outcome it must see: a
// failure on one rank fails the whole job, and a rank that leaves a collective
// early makes its peers time out instead of hanging. Not part of the suite proper
// (DISABLED_ unless selected with --gtest_also_run_disabled_tests).
#include <gtest/gtest.h>

#include "mpi_test_main.h"

namespace tpreload {
namespace {

using mpitest::world;

TEST(FailureProbe, DISABLED_FailsOnRankOneOnly) {
  TPRELOAD_REQUIRE_RANKS(2);
  EXPECT_NE(world().rank(), 1) << "planted failure";
}

TEST(FailureProbe, DISABLED_RankOneLeavesBeforeBroadcast) {
  TPRELOAD_REQUIRE_RANKS(2);
  ASSERT_NE(world().rank(), 1) << "planted failure before a collective";
  std::vector<std::uint8_t> buf(16);
  world().broadcast(MutableBytes(buf), 1);
}

}  // namespace
}  // namespace tpreload
