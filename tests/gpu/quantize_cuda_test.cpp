// The device int8, conversion and head_rows kernels against the CPU code, byte for byte,
// and the CUDA device's copies. Needs a CUDA device: built in every CUDA build, run by
// scripts/gpu_check.sh (registered with ctest only with TPRELOAD_GPU_TESTS).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tpreload/comm/cuda_device.h"
#include "tpreload/core/head_rows.h"
#include "tpreload/model/convert.h"
#include "tpreload/model/quantize.h"

namespace tpreload {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<Device> device() {
  static std::shared_ptr<Device> d = open_cuda_device(0);
  return d;
}

std::uint16_t bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<std::uint16_t>(u >> 16);
}

// Rows with the values that break careless kernels: ties at .5 of the scale,
// NaN, +-infinity, -0, subnormals, an all-zero row, and random values.
std::vector<float> nasty_rows(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(rows * cols);
  for (auto& v : w) v = normal(gen);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            -0.0f,
                            1e-40f,
                            -3e-39f,
                            127.0f,
                            0.5f,
                            1.5f,
                            2.5f,
                            -2.5f,
                            63.5f};
  for (std::int64_t r = 0; r < rows; ++r) {
    if (r % 7 == 1) w[r * cols + (r % cols)] = specials[r % 12];
    if (r % 7 == 3)  // max 127 so that w / s = w: exact ties at .5
      for (std::int64_t c = 0; c < cols; ++c)
        w[r * cols + c] = c == 0 ? 127.0f : (c % 9) + 0.5f - 4.0f;
    if (r % 7 == 5)
      for (std::int64_t c = 0; c < cols; ++c) w[r * cols + c] = 0.0f;
    if (r % 7 == 6)  // subnormals only: the scale is subnormal too (no flush to zero)
      for (std::int64_t c = 0; c < cols; ++c)
        w[r * cols + c] = static_cast<float>((c % 13) - 6) * 1.1e-41f;
  }
  return w;
}

template <typename T>
void compare(DType dtype, const std::vector<T>& w, std::int64_t rows, std::int64_t cols,
             std::int64_t stride) {
  std::vector<std::int8_t> q_cpu(rows * cols);
  std::vector<float> s_cpu(rows);
  if constexpr (std::is_same_v<T, float>)
    quantize_rows_f32(w.data(), rows, cols, stride, q_cpu.data(), s_cpu.data());
  else if (dtype == DType::kBFloat16)
    quantize_rows_bf16(w.data(), rows, cols, stride, q_cpu.data(), s_cpu.data());
  else
    quantize_rows_f16(w.data(), rows, cols, stride, q_cpu.data(), s_cpu.data());

  Device& d = *device();
  const std::uint64_t in_bytes = w.size() * sizeof(T);
  Buffer din = d.memory().allocate(in_bytes), dq = d.memory().allocate(rows * cols),
         ds = d.memory().allocate(rows * sizeof(float));
  auto stream = d.make_stream();
  stream->copy(din.data(), w.data(), in_bytes, CopyKind::kHostToDevice);
  stream->quantize_int8(din.data(), dtype, rows, cols, stride,
                        reinterpret_cast<std::int8_t*>(dq.data()),
                        reinterpret_cast<float*>(ds.data()));
  std::vector<std::int8_t> q_gpu(rows * cols);
  std::vector<float> s_gpu(rows);
  stream->copy(q_gpu.data(), dq.data(), q_gpu.size(), CopyKind::kDeviceToHost);
  stream->copy(s_gpu.data(), ds.data(), s_gpu.size() * sizeof(float), CopyKind::kDeviceToHost);
  synchronize(*stream, 30s, "quantize test");
  EXPECT_EQ(0, std::memcmp(q_cpu.data(), q_gpu.data(), q_cpu.size()))
      << dtype_name(dtype) << " " << rows << "x" << cols;
  EXPECT_EQ(0, std::memcmp(s_cpu.data(), s_gpu.data(), s_cpu.size() * sizeof(float)))
      << dtype_name(dtype);
}

TEST(CudaQuantize, EqualsTheCpuKernelByteForByte) {
  for (auto [rows, cols, pad] : std::vector<std::array<std::int64_t, 3>>{{1, 1, 0},
                                                                         {7, 3, 0},
                                                                         {33, 255, 1},
                                                                         {64, 256, 0},
                                                                         {129, 1000, 24},
                                                                         {5, 4097, 3},
                                                                         {300, 2048, 0}}) {
    const std::int64_t stride = cols + pad;
    const auto f = nasty_rows(rows, stride, static_cast<std::uint32_t>(rows * 31 + cols));
    compare(DType::kFloat32, f, rows, cols, stride);
    std::vector<std::uint16_t> b(f.size()), h(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) {
      b[i] = bf16_bits(f[i]);
      h[i] =
          static_cast<std::uint16_t>(b[i] ^ 0x0101u);  // arbitrary half bit patterns, NaNs included
    }
    compare(DType::kBFloat16, b, rows, cols, stride);
    compare(DType::kFloat16, h, rows, cols, stride);
  }
}

TEST(CudaDevice, StridedCopiesAndFillsLandWhereTheySay) {
  Device& d = *device();
  const std::uint64_t rows = 37, src_pitch = 300, dst_pitch = 100, width = 100;
  std::vector<std::uint8_t> src(rows * src_pitch);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 7 + 3);
  Buffer ds = d.memory().allocate(src.size()), dd = d.memory().allocate(rows * dst_pitch + 64);
  auto stream = d.make_stream();
  stream->copy(ds.data(), src.data(), src.size(), CopyKind::kHostToDevice);
  stream->zero(dd.data(), dd.size());
  stream->copy_rows(dd.data(), dst_pitch, ds.data() + 40, src_pitch, width, rows,
                    CopyKind::kDeviceToDevice);
  std::vector<std::uint8_t> out(dd.size());
  stream->copy(out.data(), dd.data(), out.size(), CopyKind::kDeviceToHost);
  synchronize(*stream, 30s, "copy test");
  for (std::uint64_t r = 0; r < rows; ++r)
    for (std::uint64_t c = 0; c < width; ++c)
      ASSERT_EQ(out[r * dst_pitch + c], src[r * src_pitch + 40 + c]);
  for (std::uint64_t i = rows * dst_pitch; i < out.size(); ++i) ASSERT_EQ(out[i], 0);
}

// The device's head_rows (DeepSeek's W_UK_T and W_UV after a reload) against
// the CPU's, byte for byte: FP8 codes times a block grid into bfloat16,
// transposed; int8 times row scales into float16; bfloat16 copied as it is.
TEST(CudaHeadRows, EqualsTheCpuByteForByte) {
  const std::int64_t heads = 3, head_rows = 48, cols = 96, rows = 16, first = 32;
  std::mt19937 rng(7);
  std::vector<std::uint8_t> w(heads * head_rows * cols * 2);
  for (auto& b : w) b = static_cast<std::uint8_t>(rng() % 0x7E);  // (finite codes)
  std::vector<float> scale(heads * head_rows * 2);
  for (auto& f : scale) f = 0.01f + static_cast<float>(rng() % 1000) / 997.0f;
  Device& d = *device();
  auto stream = d.make_stream();
  Buffer dw = d.memory().allocate(w.size()), ds = d.memory().allocate(scale.size() * 4);
  stream->copy(dw.data(), w.data(), w.size(), CopyKind::kHostToDevice);
  stream->copy(ds.data(), scale.data(), scale.size() * 4, CopyKind::kHostToDevice);
  struct Case {
    DType w, out;
    HeadRows::Scale kind;
    bool transpose;
  };
  for (const Case& k : {Case{DType::kFloat8E4M3, DType::kBFloat16, HeadRows::Scale::kBlocks, true},
                        Case{DType::kInt8, DType::kFloat16, HeadRows::Scale::kRow, false},
                        Case{DType::kBFloat16, DType::kBFloat16, HeadRows::Scale::kNone, false}}) {
    HeadRows a;
    a.w_dtype = k.w;
    a.heads = heads;
    a.head_rows = head_rows;
    a.first = first;
    a.rows = rows;
    a.cols = cols;
    a.scale_kind = k.kind;
    a.block_n = 16;
    a.block_k = 32;
    a.grid_cols = cols / 32;
    a.transpose = k.transpose;
    a.out_dtype = k.out;
    std::vector<std::byte> cpu(a.elements() * dtype_size(k.out)), gpu(cpu.size());
    a.w = w.data();
    a.scale = scale.data();
    a.out = cpu.data();
    head_rows_host(a);
    Buffer dout = d.memory().allocate(gpu.size());
    a.w = dw.data();
    a.scale = reinterpret_cast<const float*>(ds.data());
    a.out = dout.data();
    stream->head_rows(a);
    stream->copy(gpu.data(), dout.data(), gpu.size(), CopyKind::kDeviceToHost);
    synchronize(*stream, 30s, "head_rows test");
    EXPECT_EQ(0, std::memcmp(cpu.data(), gpu.data(), cpu.size()))
        << dtype_name(k.w) << " -> " << dtype_name(k.out);
  }
}

}  // namespace
}  // namespace tpreload

namespace tpreload {
namespace {

// The device conversion kernel against the CPU conversion, every pair of
// floating dtypes, strided rows, with values at every scale and the specials.
TEST(CudaConvert, EqualsTheCpuConversionByteForByte) {
  const DType floats[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64};
  const std::int64_t rows = 37, cols = 1001, stride = 1013;
  const auto values = nasty_rows(rows, stride, 99);
  std::vector<double> wide(values.begin(), values.end());
  for (std::size_t i = 0; i < wide.size(); i += 17)
    wide[i] *= 1.0000001;  // float64 bits float32 lacks
  Device& d = *device();
  auto stream = d.make_stream();
  for (DType from : floats) {
    // The source in `from`, made by the CPU conversion from float64.
    std::vector<std::byte> src(rows * stride * dtype_size(from));
    convert_rows(wide.data(), DType::kFloat64, stride, src.data(), from, rows, stride);
    Buffer dsrc = d.memory().allocate(src.size());
    stream->copy(dsrc.data(), src.data(), src.size(), CopyKind::kHostToDevice);
    for (DType to : floats) {
      std::vector<std::byte> cpu(rows * cols * dtype_size(to)), gpu(cpu.size());
      convert_rows(src.data(), from, stride, cpu.data(), to, rows, cols);
      Buffer ddst = d.memory().allocate(gpu.size());
      stream->convert(dsrc.data(), from, stride, ddst.data(), to, rows, cols);
      stream->copy(gpu.data(), ddst.data(), gpu.size(), CopyKind::kDeviceToHost);
      synchronize(*stream, 30s, "convert test");
      EXPECT_EQ(0, std::memcmp(cpu.data(), gpu.data(), cpu.size()))
          << dtype_name(from) << " -> " << dtype_name(to);
    }
  }
}

}  // namespace
}  // namespace tpreload
