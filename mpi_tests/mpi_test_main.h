// Shared by every mpi_tests binary: MPI set-up, a world communicator the tests use,
// per-rank failure output, and a job-wide verdict.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tpreload/comm/communicator.h"
#include "tpreload/comm/mpi_communicator.h"

namespace tpreload::mpitest {

// The world communicator of the running test binary (valid inside tests).
Communicator& world();

// The same world as MPI's, for what only MPI offers (its data transport).
MpiCommunicator& mpi_world();

// The world's size, also outside a test (where the threads binary has no
// world() on the calling thread).
int world_size();

// Whether the ranks are threads of this process (threads_test_main.cpp) rather
// than MPI processes. One object of a test source serves both binaries; tests of
// what only MPI shows go in a suite named UnderMpi, which the threads binary
// leaves out.
bool ranks_are_threads();

// Runs a test's body on every rank: under mpirun this process's rank runs it;
// in the threads binary (threads_test_main.cpp) every rank does, each on its
// own thread of the one process, world() being that rank's communicator.
void on_every_rank(void (*body)());

// Whether every rank holds the same `text` (its length and hash, min against max
// over the world). COLLECTIVE.
inline bool same_on_every_rank(const std::string& text) {
  std::vector<std::int64_t> mine = {static_cast<std::int64_t>(text.size()),
                                    static_cast<std::int64_t>(std::hash<std::string>{}(text))};
  std::vector<std::int64_t> lo = mine, hi = mine;
  allreduce_ints(world(), lo, IntOp::kMin);
  allreduce_ints(world(), hi, IntOp::kMax);
  return lo == hi;
}

// A directory every rank sees (created by rank 0, removed at exit).
class SharedDir {
 public:
  SharedDir() {
    std::string name(256, '\0');
    if (world().rank() == 0) {
      char tmpl[] = "/tmp/tpreload-mpitest-XXXXXX";
      if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
      name = tmpl;
      name.resize(256, '\0');
    }
    world().broadcast(MutableBytes(name.data(), name.size()), 0);
    path_ = name.c_str();
  }
  ~SharedDir() {
    world().barrier();
    if (world().rank() == 0) std::filesystem::remove_all(path_);
  }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The world sizes a binary's tests can run at: those that divide `divides`
// (the tiny models' 8 attention heads, split tp = world size ways). Any other
// size fails the run once, before any test, saying which sizes work; instead
// of every test failing with "cannot split the model". Register with
// TPRELOAD_TINY_MODEL_WORLD_SIZES.
class WorldSizeDivides : public ::testing::Environment {
 public:
  WorldSizeDivides(int divides, std::string why) : divides_(divides), why_(std::move(why)) {}
  void SetUp() override {
    const int n = world_size();
    if (divides_ % n == 0) return;
    std::string sizes;
    for (int k = 1; k <= divides_; ++k)
      if (divides_ % k == 0) sizes += (sizes.empty() ? "" : ", ") + std::to_string(k);
    GTEST_FAIL() << "these tests run at world sizes that divide " << divides_ << " (" << why_
                 << "): " << sizes << "; this job has " << n << " ranks";
  }

 private:
  int divides_;
  std::string why_;
};

}  // namespace tpreload::mpitest

// In the source of a test binary whose tests split the tiny models
// (tests/support) tp = world size ways, at namespace scope: every tiny model
// has 8 attention heads, so the binary runs at world sizes that divide 8.
#define TPRELOAD_TINY_MODEL_WORLD_SIZES()                                                 \
  [[maybe_unused]] static ::testing::Environment* const tpreload_world_size_environment = \
      ::testing::AddGlobalTestEnvironment(new ::tpreload::mpitest::WorldSizeDivides(      \
          8, "the tiny models' 8 attention heads are split tp = world size ways"))

// A test that every rank of the world runs (on_every_rank()): as processes
// under mpirun, or as threads of one process. Its body follows, as TEST's does.
#define TPRELOAD_RANKS_TEST(suite, name)                             \
  static void suite##_##name##_on_a_rank();                          \
  TEST(suite, name) {                                                \
    ::tpreload::mpitest::on_every_rank(&suite##_##name##_on_a_rank); \
  }                                                                  \
  static void suite##_##name##_on_a_rank()

// Skip the test (on every rank alike) when the world has fewer than n ranks.
#define TPRELOAD_REQUIRE_RANKS(n)                                      \
  do {                                                                 \
    if (::tpreload::mpitest::world().size() < (n))                     \
      GTEST_SKIP() << "needs at least " << (n) << " ranks, world has " \
                   << ::tpreload::mpitest::world().size();             \
  } while (0)
