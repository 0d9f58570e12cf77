// Shared by every mpi_tests binary: MPI set-up, a world communicator the tests use,
// per-rank failure output, and a job-wide verdict.
#pragma once

#include <gtest/gtest.h>

#include "tpreload/comm/communicator.h"
#include "tpreload/comm/mpi_communicator.h"

namespace tpreload::mpitest {

// The world communicator of the running test binary (valid inside tests).
Communicator& world();

// The same world as MPI's, for what only MPI offers (its data transport).
MpiCommunicator& mpi_world();

}  // namespace tpreload::mpitest

// Skip the test (on every rank alike) when the world has fewer than n ranks.
#define TPRELOAD_REQUIRE_RANKS(n)                                                    \
  do {                                                                               \
    if (::tpreload::mpitest::world().size() < (n))                                   \
      GTEST_SKIP() << "needs at least " << (n) << " ranks, world has "               \
                   << ::tpreload::mpitest::world().size();                           \
  } while (0)
