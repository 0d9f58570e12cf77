// What the programs (reload_runner, the benchmark, the examples) share around the
// library: MPI start-up and teardown with logging and an abort policy. Its own
// library, tpreload_runtime, which links MPI; the reload engine does not.
#pragma once

#include <cstddef>
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

// For a process that reloads again and again: the C library keeps the memory the
// process frees (up to kRetainedFreeBytes at the top of its heap, blocks up to
// 32 MiB taken from the heap rather than mapped one by one) instead of handing
// it back to the kernel, so that the next reload does not fault it in again
// page by page. A reload of a 20,000-tensor checkpoint allocates its listing
// afresh when it opens the files; on machines where a page fault is dear that is
// a third of a small reload (docs/PERFORMANCE.md, change 24). Process-wide, so
// the library never does it on its own: reload_runner and the benchmark do, and
// a serving process may. glibc only; returns false where it changed nothing.
inline constexpr std::size_t kRetainedFreeBytes = std::size_t{256} << 20;
bool retain_freed_memory();

}  // namespace tpreload
