// reload_runner: reload a tensor-parallel model's weights in place across an MPI job.
#include <CLI/CLI.hpp>

#include <iostream>

#include "tpreload/comm/mpi_communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace {

using namespace tpreload;

struct RunnerOptions {
  bool demo = false;
  std::string log_level = "info";
  int timeout_s = 300;

  std::string describe() const {
    return detail::concat("demo=", demo, " log_level=", log_level, " timeout_s=", timeout_s);
  }
};

void add_options(CLI::App& app, RunnerOptions& o) {
  app.add_flag("--demo", o.demo,
               "Run the built-in demo: a self-test of every collective on this job");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_s,
                 "Seconds one collective may take before every rank stops with an error")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

// Exercise each collective once with a known pattern and count wrong bytes.
int run_self_test(Communicator& comm) {
  const int rank = comm.rank();
  std::vector<std::uint8_t> buf(1 << 20);
  for (std::size_t i = 0; i < buf.size(); ++i)
    buf[i] = rank == 0 ? static_cast<std::uint8_t>(i * 7) : 0;
  comm.broadcast(MutableBytes(buf), 0);
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < buf.size(); ++i) wrong += buf[i] != static_cast<std::uint8_t>(i * 7);
  std::vector<std::int64_t> totals = {wrong, 1};
  allreduce_ints(comm, totals, IntOp::kSum);
  log().info("communicator self-test: broadcast of {} bytes to {} ranks, {} wrong bytes",
             buf.size(), totals[1], totals[0]);
  return totals[0] == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "reload_runner: reload the weights of a live tensor-parallel model in place, on every "
      "rank of an MPI job.\n\nRun it under mpirun, e.g.\n  mpirun -np 4 reload_runner --demo\n"};
  RunnerOptions options;
  add_options(app, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MpiRuntime mpi(&argc, &argv);
  std::unique_ptr<MpiCommunicator> world;
  try {
    init_logging(mpi.world_rank(), mpi.world_size(), options.log_level);
    log().info("reload_runner options: {}", options.describe());
    CommOptions comm_options;
    comm_options.timeout = std::chrono::seconds(options.timeout_s);
    world = MpiCommunicator::world(comm_options);
    int rc = 0;
    if (options.demo) rc = run_self_test(*world);
    world.reset();
    mpi.finalize();
    return rc;
  } catch (const std::exception& e) {
    log().error("{}", e.what());
    if (world) world->abort(1);
    return 1;
  }
}
