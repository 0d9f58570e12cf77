// The device int8 kernel (internal to tpreload_cuda): the formula of
// tpreload/model/quantize.h, byte for byte, one block of threads per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tpreload::cuda {

enum class QuantizeSource : int { kBFloat16 = 0, kFloat16 = 1, kFloat32 = 2 };

// Enqueues on `stream`; returns the launch status.
cudaError_t launch_quantize_int8(const void* src, QuantizeSource dtype, std::int64_t rows,
                                 std::int64_t cols, std::int64_t row_stride, std::int8_t* q,
                                 float* scale, cudaStream_t stream);

}  // namespace tpreload::cuda
