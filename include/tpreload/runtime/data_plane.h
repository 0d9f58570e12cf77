// Choosing where parameters live and what carries the bucket bytes, for the
// programs: `--device cpu|cuda --transport mpi|nccl`.
//   cpu  + mpi : host parameters, MPI on host buffers (no GPU needed);
//   cuda + mpi : device parameters, MPI on pinned host buffers, applied on the
//                device (clusters without NCCL);
//   cuda + nccl: device parameters, NCCL on device buffers.
// A build without CUDA (TPRELOAD_CUDA off) refuses cuda and nccl, saying so.
#pragma once

#include <memory>
#include <string>

#include "tpreload/comm/data_transport.h"
#include "tpreload/comm/device.h"
#include "tpreload/comm/mpi_communicator.h"

namespace tpreload {

struct DataPlaneOptions {
  std::string device = "cpu";     // "cpu" or "cuda"
  std::string transport = "mpi";  // "mpi" or "nccl"
  CommOptions comm;               // deadlines of the data transport
  // The CUDA device of this rank; -1: its node-local rank modulo the devices it
  // sees. Ranks may give different ordinals.
  int cuda_ordinal = -1;
};

struct DataPlane {
  std::shared_ptr<Device> device;  // null for cpu
  std::unique_ptr<DataTransport> transport;
  std::string describe() const;  // "cuda:0 (NVIDIA H200, ...) + nccl"
};

// Whether this build has the CUDA device and the NCCL transport.
bool built_with_cuda();

// COLLECTIVE over `world`. Every rank opens what the options ask for (the CUDA
// device `cuda_ordinal`, or that of its node-local rank modulo the devices it sees). If any rank
// cannot (ranks given different choices, a build without CUDA, no driver, no device, a bad
// combination), every rank throws the same UsageError naming the first such rank and what it lacks,
// in one line, before any transfer; NCCL that cannot be loaded or joined is the same CommError on
// every rank. All are AgreedErrors.
DataPlane open_data_plane(MpiCommunicator& world, const DataPlaneOptions& options);

}  // namespace tpreload
