// How tpreload_cuda launches its kernels (internal): cudaLaunchKernel, whose
// return value is the launch's own status. `kernel<<<...>>>` followed by
// cudaGetLastError() would also report an earlier error left on the thread by an
// unrelated call (an event query's "not ready", a failed allocation elsewhere),
// and so fail a launch that succeeded.
#pragma once

#include <cuda_runtime.h>

namespace tpreload::cuda {

template <typename T>
struct Exactly {
  using type = T;
};

// Enqueues `kernel` on `stream` with `args` converted to its parameter types.
template <typename... Params>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                   typename Exactly<Params>::type... args) {
  void* argv[] = {const_cast<void*>(static_cast<const void*>(&args))..., nullptr};
  return cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, argv, 0, stream);
}

// Whether `kernel`'s module is loaded now: CUDA loads modules lazily by default
// (CUDA_MODULE_LOADING=LAZY), and a first launch that loads one while an NCCL
// kernel spins on the device can deadlock with it. Querying the attributes loads it.
template <typename... Params>
cudaError_t preload(void (*kernel)(Params...)) {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel));
}

}  // namespace tpreload::cuda
