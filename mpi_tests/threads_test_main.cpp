// main() for mpi_tests sources built to run their ranks as threads of one
// process: each TPRELOAD_RANKS_TEST runs on
// TPRELOAD_THREAD_RANKS threads (default 2) over the threads communicator, its
// collectives carrying the data too; no launcher, no MPI. A rank stuck in a
// collective that a failed peer never entered times out
// (TPRELOAD_TEST_TIMEOUT_S, default 60 s) and the test fails.
#include <cstdlib>
#include <iostream>
#include <string>

#include "../tests/support/thread_ranks.h"
#include "mpi_test_main.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload::mpitest {
namespace {

thread_local Communicator* t_world = nullptr;
int g_ranks = 2;
std::chrono::milliseconds g_timeout = std::chrono::seconds(60);

int positive_env(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (!text) return fallback;
  const int value = std::atoi(text);
  if (value < 1) raise<UsageError>(name, " must be a positive number, got '", text, "'");
  return value;
}

}  // namespace

Communicator& world() {
  if (!t_world) raise<UsageError>("mpitest::world() outside a rank's thread");
  return *t_world;
}
MpiCommunicator& mpi_world() {
  raise<UsageError>("mpitest::mpi_world(): ranks as threads have no MPI");
}
int world_size() {
  return g_ranks;
}
bool ranks_are_threads() {
  return true;
}
void on_every_rank(void (*body)()) {
  testing::run_ranks(
      g_ranks,
      [&](Communicator& comm) {
        t_world = &comm;
        body();
        t_world = nullptr;
      },
      g_timeout);
}

}  // namespace tpreload::mpitest

int main(int argc, char** argv) {
  using namespace tpreload;
  ::testing::InitGoogleTest(&argc, argv);
  // (the UnderMpi suites need MPI's processes: mpi_test_main.h)
  std::string& filter = ::testing::GTEST_FLAG(filter);
  filter += filter.find('-') == std::string::npos ? "-UnderMpi.*" : ":UnderMpi.*";
  try {
    mpitest::g_ranks = mpitest::positive_env("TPRELOAD_THREAD_RANKS", 2);
    mpitest::g_timeout = std::chrono::seconds(mpitest::positive_env("TPRELOAD_TEST_TIMEOUT_S", 60));
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 2;
  }
  init_logging(0, mpitest::g_ranks, "warn");
  std::cout << "ranks as threads: " << mpitest::g_ranks << std::endl;
  return RUN_ALL_TESTS();
}
