#include "device_plane.h"
#include "tpreload/core/error.h"

namespace tpreload {

bool built_with_cuda() {
  return false;
}

namespace detail {

std::shared_ptr<Device> open_rank_device(MpiCommunicator&, int,
                                         std::optional<std::string>& problem) {
  problem = "--device cuda: this tpreload was built without CUDA (TPRELOAD_CUDA=OFF)";
  return nullptr;
}

std::unique_ptr<DataTransport> open_nccl(MpiCommunicator&, std::shared_ptr<Device>,
                                         const CommOptions&) {
  raise<UsageError>("--transport nccl: this tpreload was built without NCCL (TPRELOAD_CUDA=OFF)");
}

}  // namespace detail
}  // namespace tpreload
