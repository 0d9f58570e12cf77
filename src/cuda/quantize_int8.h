// The device quantization kernels (internal to tpreload_cuda): int8, the formula
// of tpreload/model/quantize.h, byte for byte, one block of threads per row; and
// the per-tensor FP8 requantization of tpreload/core/float8.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tpreload/core/head_rows.h"

namespace tpreload::cuda {

enum class QuantizeSource : int { kBFloat16 = 0, kFloat16 = 1, kFloat32 = 2 };

// Floating dtypes the device kernels read and write (tpreload::DType's subset).
enum class Float : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

// tpreload/model/convert.h on the device: `rows` x `cols`, source rows
// `src_stride` elements apart, into contiguous rows. Enqueues on `stream`.
cudaError_t launch_convert(const void* src, Float from, std::int64_t src_stride, void* dst,
                           Float to, std::int64_t rows, std::int64_t cols, cudaStream_t stream);

// head_rows_element (tpreload/core/head_rows.h) for every element of `a`, on
// device memory. Enqueues on `stream`.
cudaError_t launch_head_rows(const HeadRows& a, cudaStream_t stream);

// Raw CRC-32C of every kCrc32cBlock-byte block of [src, src + bytes) into `raw`
// (pinned host memory, written by the device). Enqueues on `stream`.
cudaError_t launch_crc32c_blocks(const void* src, std::uint64_t bytes, std::uint32_t* raw,
                                 cudaStream_t stream);

// Enqueues on `stream`; returns the launch status.
cudaError_t launch_quantize_int8(const void* src, QuantizeSource dtype, std::int64_t rows,
                                 std::int64_t cols, std::int64_t row_stride, std::int8_t* q,
                                 float* scale, cudaStream_t stream);

// fp8::requantize_step (tpreload/core/float8.h) on device memory: the largest
// of staged[first, first + count) into *out (null: none), the n codes at w
// requantized from staged[from] to it. Enqueues on `stream`.
cudaError_t launch_requantize_fp8(std::uint8_t* w, std::uint64_t n, const float* staged,
                                  std::uint32_t from, std::uint32_t first, std::uint32_t count,
                                  float* out, cudaStream_t stream);

// fp8::quantize_step on device memory, of n values of `dtype` (float32,
// bfloat16 or float16): the amax (a reduction into *scale, zeroed first, as
// amax / 448 per block: division by 448 keeps the order), then the codes with
// 1.0f / *scale. Enqueues on `stream`.
cudaError_t launch_quantize_fp8(const void* x, Float dtype, std::uint64_t n, std::uint8_t* codes,
                                float* scale, cudaStream_t stream);

// fp8::quantize_block_step on device memory: one block of threads per tile.
cudaError_t launch_quantize_fp8_block(const void* x, Float dtype, std::int64_t rows,
                                      std::int64_t cols, std::int64_t block, std::uint8_t* codes,
                                      float* grid, cudaStream_t stream);

// Load each kernel's module now (launch.h: preload), one call per file.
cudaError_t load_convert();
cudaError_t load_crc32c();
cudaError_t load_quantize_int8();

}  // namespace tpreload::cuda
