// The CUDA half of open_data_plane (internal): cuda_plane.cpp in a build with
// CUDA, no_cuda_plane.cpp without.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tpreload/runtime/data_plane.h"

namespace tpreload::detail {

// COLLECTIVE. This rank's CUDA device (`ordinal`, or -1 for that of its
// node-local rank), or null with the reason in `problem` (for the caller to agree on).
std::shared_ptr<Device> open_rank_device(MpiCommunicator& world, int ordinal,
                                         std::optional<std::string>& problem);

// COLLECTIVE. The NCCL transport over `device` (agrees on failures itself).
std::unique_ptr<DataTransport> open_nccl(MpiCommunicator& world, std::shared_ptr<Device> device,
                                         const CommOptions& options);

}  // namespace tpreload::detail
