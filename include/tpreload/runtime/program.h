// What the programs (reload_runner, the benchmark, the examples) share around the
// library: MPI start-up and teardown with logging and an abort policy. Its own
// library, tpreload_runtime, which links MPI; the reload engine does not.
#pragma once

#include <functional>
#include <string>

#include "tpreload/comm/mpi_communicator.h"

namespace tpreload {

// The main() of an MPI program: initialise MPI, set up logging with the rank
// prefix (`log_level`), make the world communicator, and run `body`. An exception
// from `body` is logged; one that every rank raised alike (AgreedError) ends the
// program cleanly with status 1, any other ends the whole job (MPI_Abort with 1),
// so that no peer is left waiting. Otherwise MPI is finalized and body's return
// value returned.
int run_mpi_program(int* argc, char*** argv, const std::string& log_level,
                    const CommOptions& options,
                    const std::function<int(MpiCommunicator& world)>& body);

}  // namespace tpreload
