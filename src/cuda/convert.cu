// Floating conversions on the device, with the CPU's bit-level code
// (tpreload/core/float_bits.h), so the bytes are the same.
#include "launch.h"
#include "quantize_int8.h"
#include "tpreload/core/float_bits.h"
#include "tpreload/core/head_rows.h"

namespace tpreload::cuda {
namespace {

__device__ __forceinline__ float load(const void* p, Float from, std::int64_t i) {
  switch (from) {
    case Float::kFloat32:
      return static_cast<const float*>(p)[i];
    case Float::kFloat64:
      return fbits::narrow(static_cast<const double*>(p)[i]);
    case Float::kBFloat16:
      return fbits::from_bfloat16(static_cast<const std::uint16_t*>(p)[i]);
    default:
      return fbits::from_half(static_cast<const std::uint16_t*>(p)[i]);
  }
}

__global__ void convert_rows(const void* src, Float from, std::int64_t src_stride, void* dst,
                             Float to, std::int64_t rows, std::int64_t cols) {
  const int size = from == Float::kFloat64 ? 8 : from == Float::kFloat32 ? 4 : 2;
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols, c = i % cols;
    const void* row = static_cast<const char*>(src) + r * src_stride * size;
    switch (to) {
      case Float::kFloat64:
        static_cast<double*>(dst)[i] = from == Float::kFloat64 ? static_cast<const double*>(row)[c]
                                                               : fbits::widen(load(row, from, c));
        break;
      case Float::kFloat32:
        static_cast<float*>(dst)[i] = load(row, from, c);
        break;
      case Float::kBFloat16:
        static_cast<std::uint16_t*>(dst)[i] = fbits::to_bfloat16(load(row, from, c));
        break;
      default:
        static_cast<std::uint16_t*>(dst)[i] = fbits::to_half(load(row, from, c));
    }
  }
}

__global__ void head_rows_kernel(HeadRows a) {
  const std::int64_t n = a.elements();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    head_rows_element(a, i);
}

}  // namespace

cudaError_t launch_head_rows(const HeadRows& a, cudaStream_t stream) {
  const std::int64_t n = a.elements();
  if (n <= 0) return cudaSuccess;
  const std::int64_t blocks = (n + 255) / 256;
  return launch(head_rows_kernel, static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32),
                256, stream, a);
}

cudaError_t launch_convert(const void* src, Float from, std::int64_t src_stride, void* dst,
                           Float to, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (n <= 0) return cudaSuccess;
  const std::int64_t blocks = (n + 255) / 256;
  return launch(convert_rows, static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32), 256,
                stream, src, from, src_stride, dst, to, rows, cols);
}

cudaError_t load_convert() {
  const cudaError_t rc = preload(convert_rows);
  return rc == cudaSuccess ? preload(head_rows_kernel) : rc;
}

}  // namespace tpreload::cuda
