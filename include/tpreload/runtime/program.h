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

// For a process that reloads again and again: the C library keeps the memory
// the process frees instead of handing it back to the kernel, so that the next
// reload does not fault it in again page by page. glibc then trims the top of
// the main heap only when more than kRetainedFreeBytes are free there, takes
// blocks of up to 32 MiB from the heap rather than mapping each, and grows the
// heap 64 MiB at a time; a thread's own arena keeps what it grew to. Resident
// memory can stay higher after a peak (by what was freed), which is the point.
// A reload of a 20,000-tensor checkpoint allocates its listing afresh when it
// opens the files; where a page fault is dear that is a third of a small
// reload (docs/PERFORMANCE.md, "Why it is fast"). Process-wide, so the library never
// does it on its own: reload_runner does, the benchmark on request, and a
// serving process may. glibc only; false when a setting was refused (or the C
// library is not glibc).
inline constexpr std::size_t kRetainedFreeBytes = std::size_t{256} << 20;
bool retain_freed_memory();

}  // namespace tpreload
