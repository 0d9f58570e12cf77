// The NCCL backend of the data plane (library tpreload_nccl, built when
// TPRELOAD_CUDA is on): bucket bytes between device buffers of a CUDA Device.
// Broadcast is ncclBroadcast; scatter is grouped ncclSend/ncclRecv (NCCL has no
// scatterv) inside a group that is always closed. NCCL has no bitwise
// reductions: validation stays on the control plane.
//
// NCCL is loaded at run time (dlopen), so that a program built with it starts
// on a machine without it and says what is missing. The communicator is
// non-blocking: its creation and every wait are polled against a deadline, and a
// timeout or an asynchronous error aborts it (ncclCommAbort) and throws; the
// transport is then broken and every later transfer throws.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "tpreload/comm/data_transport.h"

namespace tpreload {

class Communicator;
class Device;

struct NcclLibraryInfo {
  std::string path;  // what was loaded
  int version = 0;   // e.g. 22809 for 2.28.9
};

// The oldest NCCL this backend uses (non-blocking communicators with configs,
// ncclCommGetAsyncError, grouped send/recv).
inline constexpr int kMinNcclVersion = 21900;

// Load NCCL once per process: `path` if given, else $TPRELOAD_NCCL_LIBRARY, else
// "libnccl.so.2" from the loader's search path. Later calls return the library
// already loaded. Throws CommError naming the path and what is wrong: it cannot
// be loaded (the loader's message), it lacks a symbol this backend calls, or it
// is older than kMinNcclVersion.
NcclLibraryInfo load_nccl(const std::string& path = "");

// Check a library without keeping it (tests and diagnostics); throws as load_nccl.
NcclLibraryInfo check_nccl_library(const std::string& path);

struct NcclOptions {
  // The control plane's deadline (CommOptions::timeout). Creating the
  // communicator and each transfer get half of it: a rank whose transfer failed
  // on its side alone waits in the control plane's next collective (a node's
  // announcement, the world's agreement on the error), and its peers' transfers,
  // stuck on it, must give up before that collective does.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::string library;  // see load_nccl()
};

// A diagnostic of NCCL's point-to-point path on one device (the GPU check): the
// `bytes` at `src` into `dst` (device memory of `device`, a CUDA device) through
// an ncclSend and an ncclRecv of this process to itself, in one group, on a
// one-rank communicator made for it and aborted after. Throws UsageError for a
// device that is not CUDA, CommError naming the NCCL call that failed, and
// CommTimeoutError when it does not finish within `timeout`.
void nccl_self_send_recv(const std::shared_ptr<Device>& device, const void* src, void* dst,
                         std::uint64_t bytes, std::chrono::milliseconds timeout);

// COLLECTIVE over `control`: rank 0 creates the NCCL unique id and broadcasts it
// over the control plane; every rank joins with its control rank. `device` must
// be a CUDA device (UsageError otherwise); the transport keeps it.
std::unique_ptr<DataTransport> make_nccl_transport(Communicator& control,
                                                   std::shared_ptr<Device> device,
                                                   const NcclOptions& options = {});

}  // namespace tpreload
