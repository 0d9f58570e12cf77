// The CUDA backend of Device (library tpreload_cuda, built when TPRELOAD_CUDA is
// on): device and pinned memory through the CUDA runtime (linked statically, so
// a program built with it starts on a machine without a driver and says so),
// non-blocking streams, events, strided copies, and the int8 kernel. No torch.
#pragma once

#include <memory>
#include <string>

#include "tpreload/comm/device.h"

namespace tpreload {

// What this machine offers. Never throws.
struct CudaProbe {
  bool driver = false;     // the NVIDIA driver library (libcuda.so.1) loads
  int driver_version = 0;  // e.g. 13000; 0 when unknown
  int devices = 0;         // CUDA devices visible to this process
  std::string problem;     // empty when a device is usable; else what is missing, one line
};
CudaProbe probe_cuda();

// Device `ordinal` of this process. Throws CommError saying what is missing (no
// driver, no device, an ordinal past the devices there are).
std::shared_ptr<Device> open_cuda_device(int ordinal);

}  // namespace tpreload
