#include "tpreload/runtime/program.h"

#include <iostream>
#include <memory>
#include <optional>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "tpreload/comm/agreement.h"
#include "tpreload/core/log.h"

namespace tpreload {

bool retain_freed_memory() {
#if defined(__GLIBC__)
  // Fixed thresholds also turn off glibc's own adjustment of them.
  return mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 &&
         mallopt(M_TRIM_THRESHOLD, static_cast<int>(kRetainedFreeBytes)) == 1 &&
         mallopt(M_TOP_PAD, 64 << 20) == 1;
#else
  return false;
#endif
}

int run_mpi_program(int* argc, char*** argv, const std::string& log_level,
                    const CommOptions& options,
                    const std::function<int(MpiCommunicator& world)>& body) {
  std::optional<MpiRuntime> started;
  try {
    started.emplace(argc, argv);
  } catch (const std::exception& e) {  // (no logger yet: it names the rank)
    std::cerr << "error: starting MPI failed: " << e.what() << "\n";
    return 1;
  }
  MpiRuntime& mpi = *started;
  std::unique_ptr<MpiCommunicator> world;
  try {
    init_logging(mpi.world_rank(), mpi.world_size(), log_level);
    world = MpiCommunicator::world(options);
    const int rc = body(*world);
    world.reset();
    mpi.finalize();
    return rc;
  } catch (const std::exception& e) {
    log().error("{}", e.what());
    const bool agreed = dynamic_cast<const AgreedError*>(&e) != nullptr;
    // (--log-level off silences the log, not the error that ends the run: once
    // where every rank has it, else from each rank that does)
    if (log_level == "off" && (!agreed || mpi.world_rank() == 0))
      std::cerr << "error: " << e.what() << "\n";
    if (agreed) {  // every rank is here with no transfer in flight
      world.reset();
      mpi.finalize();
      return 1;
    }
    if (world) world->abort(1);
    log().flush();
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

}  // namespace tpreload
