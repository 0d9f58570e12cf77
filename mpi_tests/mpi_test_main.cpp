// main() for the mpi_tests binaries. Rank 0 prints GoogleTest's usual output;
// other ranks print only their failures, prefixed with their rank. At the end the
// failure counts are summed over the world, so a test that fails on any one rank
// fails the whole run (every rank exits non-zero) and ctest sees it. A rank stuck
// in a collective that a failed peer never entered times out (TPRELOAD_TEST_TIMEOUT_S,
// default 60 s) instead of hanging.
#include "mpi_test_main.h"

#include <cstdlib>
#include <iostream>
#include <memory>

#include "tpreload/comm/mpi_communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload::mpitest {
namespace {

std::unique_ptr<MpiCommunicator> g_world;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::cerr << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
              << result.line_number() << ": Failure\n"
              << result.summary() << std::endl;
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::cerr << "[rank " << rank_ << "] FAILED " << info.test_suite_name() << "." << info.name()
                << std::endl;
  }

 private:
  int rank_;
};

}  // namespace

Communicator& world() {
  return *g_world;
}
MpiCommunicator& mpi_world() {
  return *g_world;
}
int world_size() {
  return g_world->size();
}
bool ranks_are_threads() {
  return false;
}
void on_every_rank(void (*body)()) {
  body();
}

}  // namespace tpreload::mpitest

int main(int argc, char** argv) {
  using namespace tpreload;
  MpiRuntime mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  init_logging(mpi.world_rank(), mpi.world_size(), "warn");
  CommOptions options;
  if (const char* t = std::getenv("TPRELOAD_TEST_TIMEOUT_S"))
    options.timeout = std::chrono::seconds(std::atoi(t));
  else
    options.timeout = std::chrono::seconds(60);
  mpitest::g_world = MpiCommunicator::world(options);

  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (mpi.world_rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new mpitest::RankFailurePrinter(mpi.world_rank()));
  }
  int local = 0;
  try {
    local = RUN_ALL_TESTS() == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "[rank " << mpi.world_rank() << "] uncaught: " << e.what() << std::endl;
    mpitest::g_world->abort(3);
  }
  std::int64_t failed_ranks = local;
  try {
    mpitest::g_world->allreduce_ints(&failed_ranks, 1, IntOp::kSum);
  } catch (const std::exception& e) {
    std::cerr << "[rank " << mpi.world_rank() << "] final verdict: " << e.what() << std::endl;
    mpitest::g_world->abort(4);
  }
  if (mpi.world_rank() == 0)
    std::cout << "mpi verdict: " << failed_ranks << " of " << mpi.world_size()
              << " ranks had failures" << std::endl;
  mpitest::g_world.reset();
  mpi.finalize();
  return failed_ranks == 0 ? 0 : 1;
}
