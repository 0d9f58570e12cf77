// A CUDA stream held busy by a host function until the test releases it: work
// that does not finish, on demand (gpu_tests only).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tpreload/comm/device.h"

namespace tpreload::testing {

inline void CUDART_CB hold_until_released(void* flag) {
  while (!static_cast<std::atomic<bool>*>(flag)->load())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Holds `stream` until `*released` is true. `released` must outlive the held
// work (a static of the test, so that a test failing half-way leaves no dangling flag).
inline cudaError_t hold(DeviceStream& stream, std::atomic<bool>* released) {
  return cudaLaunchHostFunc(static_cast<cudaStream_t>(stream.native_handle()), hold_until_released,
                            released);
}

}  // namespace tpreload::testing
