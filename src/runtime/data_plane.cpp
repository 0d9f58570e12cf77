#include "tpreload/runtime/data_plane.h"

#include <functional>

#include "device_plane.h"
#include "tpreload/comm/agreement.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload {
namespace {

std::optional<std::string> check_choice(const DataPlaneOptions& o) {
  if (o.device != "cpu" && o.device != "cuda")
    return "unknown device '" + o.device + "' (cpu or cuda)";
  if (o.transport != "mpi" && o.transport != "nccl")
    return "unknown transport '" + o.transport + "' (mpi or nccl)";
  if (o.transport == "nccl" && o.device != "cuda")
    return std::string("--transport nccl needs --device cuda (NCCL moves device memory)");
  if (o.device == "cuda" && !built_with_cuda())
    return std::string(
        "--device cuda: this tpreload was built without CUDA (TPRELOAD_CUDA=OFF: no "
        "CUDA toolkit or NCCL was found when it was configured)");
  return std::nullopt;
}

}  // namespace

std::string DataPlane::describe() const {
  return (device ? device->describe() : std::string("host memory")) + " + " +
         (transport ? transport->backend() : std::string("?"));
}

DataPlane open_data_plane(MpiCommunicator& world, const DataPlaneOptions& options) {
  // Ranks given different choices would make different collectives below (the
  // error says which ranks were given what).
  agree_on_values<UsageError>(world,
                              {{"the data plane's device", options.device},
                               {"the data plane's transport", options.transport}},
                              " (--device, --transport: every rank must open the same data plane)");
  std::optional<std::string> problem = check_choice(options);
  agree_on_problem<UsageError>(world, problem, "opening the data plane");
  DataPlane plane;
  if (options.device == "cuda") {
    plane.device = detail::open_rank_device(world, options.cuda_ordinal, problem);
    agree_on_problem<UsageError>(world, problem, "opening the data plane");
  }
  plane.transport = options.transport == "nccl"
                        ? detail::open_nccl(world, plane.device, options.comm)
                        : world.make_data_transport();
  log().debug("data plane: {}", plane.describe());
  return plane;
}

}  // namespace tpreload
