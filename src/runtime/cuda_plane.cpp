#include "device_plane.h"
#include "tpreload/comm/cuda_device.h"
#include "tpreload/comm/nccl_transport.h"

namespace tpreload {

bool built_with_cuda() {
  return true;
}

namespace detail {

std::shared_ptr<Device> open_rank_device(MpiCommunicator& world, int ordinal,
                                         std::optional<std::string>& problem) {
  const int node_rank = world.node_rank_and_size().first;
  const CudaProbe probe = probe_cuda();
  if (!probe.problem.empty()) {
    problem = "--device cuda: " + probe.problem;
    return nullptr;
  }
  try {
    // Without a given ordinal, the node-local rank picks the GPU.
    return open_cuda_device(ordinal >= 0 ? ordinal : node_rank % probe.devices);
  } catch (const std::exception& e) {
    problem = std::string("--device cuda: ") + e.what();
    return nullptr;
  }
}

std::unique_ptr<DataTransport> open_nccl(MpiCommunicator& world, std::shared_ptr<Device> device,
                                         const CommOptions& options) {
  NcclOptions nccl;
  nccl.timeout = options.timeout;
  return make_nccl_transport(world, std::move(device), nccl);
}

}  // namespace detail
}  // namespace tpreload
