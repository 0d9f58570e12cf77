#include <cuda_fp16.h>

#include "tpreload/core/float8.h"

#include "launch.h"
#include "quantize_int8.h"

namespace tpreload::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load(const std::uint16_t* row, std::int64_t c,
                                      QuantizeSource dtype) {
  const std::uint16_t bits = row[c];
  if (dtype == QuantizeSource::kBFloat16) return __uint_as_float(static_cast<unsigned>(bits) << 16);
  return __half2float(__ushort_as_half(bits));  // exact
}

__device__ __forceinline__ float load(const float* row, std::int64_t c, QuantizeSource) {
  return row[c];
}

// The largest of the block's kThreads values `m` (fmaxf: a NaN operand is
// ignored), returned to every thread; `partial` is free again on return.
__device__ __forceinline__ float block_max(float m, float* partial) {
  partial[threadIdx.x] = m;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + half]);
    __syncthreads();
  }
  const float result = partial[0];
  __syncthreads();
  return result;
}

// One block per row (grid-stride over rows). The CPU kernel's formula:
//   amax = max |w| ignoring NaN (fmaxf ignores a NaN operand, as the CPU max does);
//   s = amax == 0 ? 1 : amax / 127 (IEEE division, round to nearest);
//   q = clamp(rint(w / s), -127, 127), ties to even; NaN -> -127 (fmaxf(-127, NaN)).
template <typename T>
__global__ void quantize_rows(const T* w, QuantizeSource dtype, std::int64_t rows,
                              std::int64_t cols, std::int64_t row_stride, std::int8_t* q,
                              float* scale) {
  __shared__ float partial[kThreads];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = w + r * row_stride;
    float m = 0.0f;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      m = fmaxf(m, fabsf(load(row, c, dtype)));
    const float amax = block_max(m, partial);
    const float s = amax == 0.0f ? 1.0f : __fdiv_rn(amax, 127.0f);
    if (threadIdx.x == 0) scale[r] = s;
    std::int8_t* out = q + r * cols;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = fminf(127.0f, fmaxf(-127.0f, rintf(__fdiv_rn(load(row, c, dtype), s))));
      out[c] = static_cast<std::int8_t>(static_cast<int>(v));
    }
  }
}

// Grid-stride over the codes; every thread computes the largest scale itself
// (count is a few), thread 0 of block 0 stores it.
__global__ void requantize_fp8_codes(std::uint8_t* w, std::uint64_t n, const float* staged,
                                     std::uint32_t from, std::uint32_t first, std::uint32_t count,
                                     float* out) {
  const float m = fp8::largest(staged + first, count);
  if (out && blockIdx.x == 0 && threadIdx.x == 0) *out = m;
  const float scale_half = fbits::from_half(fbits::to_half(staged[from])), inverse = 1.0f / m;
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step)
    w[i] = fp8::requantize_e4m3fn(w[i], scale_half, inverse);
}

// Each block's amax over a grid-stride share, reduced in shared memory, then
// divided by 448 and merged into *scale with an integer atomicMax (the bit
// patterns of non-negative floats order as the floats do). T: the staged
// values' type (float, fp8::Bf16Bits, fp8::HalfBits).
template <typename T>
__global__ void fp8_amax(const T* x, std::uint64_t n, float* scale) {
  __shared__ float partial[kThreads];
  float m = 0.0f;
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step)
    m = fmaxf(m, fabsf(fp8::as_float(x[i])));
  const float amax = block_max(m, partial);
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<int*>(scale), __float_as_int(fp8::amax_scale(amax)));
}

template <typename T>
__global__ void fp8_quantize(const T* x, std::uint64_t n, std::uint8_t* codes, const float* scale) {
  const float inverse = 1.0f / *scale;
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step)
    codes[i] = fp8::to_e4m3fn(fp8::as_float(x[i]) * inverse);
}

// One block of threads per tile (blockIdx.x its column, blockIdx.y its row):
// the tile's amax (fp8::nan_max: a NaN is the amax, as torch.amax makes it),
// its scale (fp8::block_scale), then its codes.
template <typename T>
__global__ void fp8_quantize_tiles(const T* x, std::int64_t rows, std::int64_t cols,
                                   std::int64_t block, std::uint8_t* codes, float* grid) {
  __shared__ float partial[kThreads];
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * block;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * block;
  const std::int64_t h = rows - r0 < block ? rows - r0 : block;
  const std::int64_t w = cols - c0 < block ? cols - c0 : block;
  float m = 0.0f;
  for (std::int64_t i = threadIdx.x; i < h * w; i += blockDim.x)
    m = fp8::nan_max(fp8::magnitude(fp8::as_float(x[(r0 + i / w) * cols + c0 + i % w])), m);
  partial[threadIdx.x] = m;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      partial[threadIdx.x] = fp8::nan_max(partial[threadIdx.x], partial[threadIdx.x + half]);
    __syncthreads();
  }
  const float s = fp8::block_scale(partial[0]), inverse = 1.0f / s;
  if (threadIdx.x == 0) grid[static_cast<std::int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = s;
  for (std::int64_t i = threadIdx.x; i < h * w; i += blockDim.x) {
    const std::int64_t at = (r0 + i / w) * cols + c0 + i % w;
    codes[at] = fp8::cast_e4m3fn(fp8::as_float(x[at]) * inverse);
  }
}

template <typename T>
cudaError_t quantize_fp8_of(const T* x, std::uint64_t n, std::uint8_t* codes, float* scale,
                            cudaStream_t stream) {
  cudaError_t rc = cudaMemsetAsync(scale, 0, sizeof(float), stream);
  if (rc != cudaSuccess) return rc;
  const std::uint64_t want = (n + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(want == 0 ? 1 : want < 65535 ? want : 65535);
  rc = launch(fp8_amax<T>, blocks, kThreads, stream, x, n, scale);
  if (rc != cudaSuccess) return rc;
  return launch(fp8_quantize<T>, blocks, kThreads, stream, x, n, codes,
                static_cast<const float*>(scale));
}

template <typename T>
cudaError_t quantize_fp8_block_of(const T* x, std::int64_t rows, std::int64_t cols,
                                  std::int64_t block, std::uint8_t* codes, float* grid,
                                  cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const dim3 tiles(static_cast<unsigned>((cols + block - 1) / block),
                   static_cast<unsigned>((rows + block - 1) / block));
  return launch(fp8_quantize_tiles<T>, tiles, kThreads, stream, x, rows, cols, block, codes, grid);
}

template <typename T>
cudaError_t preload_fp8() {
  cudaError_t rc = preload(fp8_amax<T>);
  if (rc == cudaSuccess) rc = preload(fp8_quantize<T>);
  if (rc == cudaSuccess) rc = preload(fp8_quantize_tiles<T>);
  return rc;
}

// `f` called with x as the staged type of `dtype`.
template <typename F>
cudaError_t with_staged(const void* x, Float dtype, F f) {
  switch (dtype) {
    case Float::kFloat32:
      return f(static_cast<const float*>(x));
    case Float::kBFloat16:
      return f(static_cast<const fp8::Bf16Bits*>(x));
    case Float::kFloat16:
      return f(static_cast<const fp8::HalfBits*>(x));
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_quantize_fp8_block(const void* x, Float dtype, std::int64_t rows,
                                      std::int64_t cols, std::int64_t block, std::uint8_t* codes,
                                      float* grid, cudaStream_t stream) {
  return with_staged(x, dtype, [&](const auto* v) {
    return quantize_fp8_block_of(v, rows, cols, block, codes, grid, stream);
  });
}

cudaError_t launch_quantize_fp8(const void* x, Float dtype, std::uint64_t n, std::uint8_t* codes,
                                float* scale, cudaStream_t stream) {
  return with_staged(x, dtype,
                     [&](const auto* v) { return quantize_fp8_of(v, n, codes, scale, stream); });
}

cudaError_t launch_requantize_fp8(std::uint8_t* w, std::uint64_t n, const float* staged,
                                  std::uint32_t from, std::uint32_t first, std::uint32_t count,
                                  float* out, cudaStream_t stream) {
  const std::uint64_t want = (n + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(want == 0 ? 1 : want < 65535 ? want : 65535);
  return launch(requantize_fp8_codes, blocks, kThreads, stream, w, n, staged, from, first, count,
                out);
}

cudaError_t launch_quantize_int8(const void* src, QuantizeSource dtype, std::int64_t rows,
                                 std::int64_t cols, std::int64_t row_stride, std::int8_t* q,
                                 float* scale, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(rows < 65535 * 32 ? rows : 65535 * 32);
  if (dtype == QuantizeSource::kFloat32)
    return launch(quantize_rows<float>, blocks, kThreads, stream, static_cast<const float*>(src),
                  dtype, rows, cols, row_stride, q, scale);
  return launch(quantize_rows<std::uint16_t>, blocks, kThreads, stream,
                static_cast<const std::uint16_t*>(src), dtype, rows, cols, row_stride, q, scale);
}

cudaError_t load_quantize_int8() {
  cudaError_t rc = preload(quantize_rows<float>);
  if (rc == cudaSuccess) rc = preload(quantize_rows<std::uint16_t>);
  if (rc == cudaSuccess) rc = preload(requantize_fp8_codes);
  if (rc == cudaSuccess) rc = preload_fp8<float>();
  if (rc == cudaSuccess) rc = preload_fp8<fp8::Bf16Bits>();
  return rc != cudaSuccess ? rc : preload_fp8<fp8::HalfBits>();
}

}  // namespace tpreload::cuda
