// quantize_bench: the int8 kernel's rate on this CPU at each instruction-set
// level it runs (avx512, avx2, baseline: QuantizeLevel), for bfloat16, float16
// and float32 rows of 5632 columns (a TinyLlama MLP row) in a buffer written
// before the clock starts (a live model's memory is warm). Prints the best of
// five passes of each, in G elements/s, and in `wrong` how many of the three
// outputs differ from the baseline level's (exit status 1 if any). Why the
// kernels are built per level:
// docs/PERFORMANCE.md, "Why it is fast". Then the online FP8 kernels
// (quantize_fp8_host, quantize_fp8_blocks_host) on the same bfloat16 values,
// in ns per value, against the baseline level's bytes likewise.
//   build/bench/quantize_bench
// With --exhaustive, instead: every one of the 2^32 float32 bit patterns
// through the online FP8 encoder at each level this CPU runs (per tensor with
// amax 448, so each value is multiplied by 1), against the nearest code found
// by this file's own midpoint walk (NearestCode). The baseline level is
// tpreload/core/float8.h's scalar fp8::to_e4m3fn, which the CUDA kernels
// compile too. The count of patterns whose code differs, per level (exit
// status 1 if any); ~20 s a level.
//   build/bench/quantize_bench --exhaustive
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "tpreload/model/quantize.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t kRows = 2048, kCols = 5632;

// One kernel's output: the quantized rows and their scales.
struct Output {
  std::vector<std::int8_t> q;
  std::vector<float> scale;
  bool operator==(const Output& o) const {
    return q == o.q && std::memcmp(scale.data(), o.scale.data(), scale.size() * sizeof(float)) == 0;
  }
};

// The best rate of five passes (the first pass warms the output), leaving the
// output in `out`.
template <typename T, typename Kernel>
double best_rate(const std::vector<T>& w, Kernel kernel, Output& out) {
  out.q.assign(w.size(), 1);
  out.scale.assign(kRows, 1.0f);
  double best = 0;
  for (int pass = 0; pass < 6; ++pass) {
    const auto t0 = Clock::now();
    kernel(w.data(), kRows, kCols, kCols, out.q.data(), out.scale.data());
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (pass > 0) best = std::max(best, static_cast<double>(w.size()) / s / 1e9);
  }
  return best;
}

// --exhaustive's reference, computed apart from the engine's encoders: the
// e4m3fn magnitudes from their definition (subnormals m/8 * 2^-6, normals
// (1 + m/8) * 2^(e-7), 448 the largest) and, walking the float32 patterns of
// one sign in increasing order (their values increase with them), the code
// moving up past each midpoint between neighbours (exact in double), a value on
// a midpoint going to the even code; beyond 448 (infinity too) 448's code; a
// NaN of either sign 448's positive code (vLLM clamps with fminf/fmaxf).
class NearestCode {
 public:
  NearestCode() {
    for (int c = 0; c < 0x7F; ++c) {
      const int e = c >> 3, m = c & 7;
      magnitude_[c] = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1 + m / 8.0, e - 7);
    }
  }
  // The code of pattern u; patterns are given in increasing order within a sign.
  std::uint8_t next(std::uint32_t u) {
    if ((u & 0x7FFFFFFFu) == 0) code_ = 0;  // (a sign's first pattern: start again)
    float f;
    std::memcpy(&f, &u, sizeof f);
    if (std::isnan(f)) return 0x7E;
    const double v = std::fabs(static_cast<double>(f));
    while (code_ < 0x7E) {
      const double mid = (magnitude_[code_] + magnitude_[code_ + 1]) / 2;
      if (v < mid || (v == mid && code_ % 2 == 0)) break;
      ++code_;
    }
    return static_cast<std::uint8_t>(code_ | (u >> 31 ? 0x80 : 0));
  }

 private:
  double magnitude_[0x7F];
  int code_ = 0;
};

// --exhaustive: the encoder at each level on all 2^32 float32 patterns, a
// chunk at a time, against NearestCode.
int exhaustive() {
  using namespace tpreload;
  constexpr std::uint64_t kChunk = 1u << 22;
  std::vector<std::uint32_t> bits(kChunk);
  std::vector<std::uint8_t> want(kChunk), got(kChunk);
  std::printf(
      "# online FP8 encoder on every float32 pattern (amax 448: times 1), against the "
      "nearest code by midpoints\n%-10s %12s %10s\n",
      "level", "wrong", "seconds");
  int bad_levels = 0;
  for (QuantizeLevel l : {QuantizeLevel::kBaseline, QuantizeLevel::kAvx2, QuantizeLevel::kAvx512}) {
    if (!quantize_supports(l)) continue;
    detail::ScopedQuantizeLevel use(l);
    NearestCode nearest;
    std::uint64_t wrong = 0;
    const auto t0 = Clock::now();
    for (std::uint64_t base = 0; base < (std::uint64_t{1} << 32); base += kChunk) {
      for (std::uint64_t i = 0; i < kChunk; ++i) {
        bits[i] = static_cast<std::uint32_t>(base + i);
        want[i] = nearest.next(bits[i]);
      }
      float scale = 0;
      quantize_fp8_with_amax_host(bits.data(), DType::kFloat32, kChunk, 448.0f, got.data(), &scale);
      for (std::uint64_t i = 0; i < kChunk; ++i) wrong += got[i] != want[i] ? 1 : 0;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("%-10s %12llu %10.1f\n", quantize_level_name(l),
                static_cast<unsigned long long>(wrong), seconds);
    bad_levels += wrong ? 1 : 0;
  }
  return bad_levels ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tpreload;
  if (argc == 2 && std::strcmp(argv[1], "--exhaustive") == 0) return exhaustive();
  if (argc > 1) {
    std::fprintf(stderr, "usage: %s [--exhaustive]\n", argv[0]);
    return 2;
  }
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> f32(static_cast<std::size_t>(kRows * kCols));
  for (float& v : f32) v = normal(gen);
  std::vector<std::uint16_t> bf16(f32.size()), f16(f32.size());
  for (std::size_t i = 0; i < f32.size(); ++i) {
    std::uint32_t u;
    std::memcpy(&u, &f32[i], sizeof u);
    bf16[i] = static_cast<std::uint16_t>(u >> 16);
    // A float16 pattern of about the same magnitude (exponent 15 - 6, random mantissa).
    f16[i] = static_cast<std::uint16_t>((u >> 31) << 15 | 9u << 10 | (u & 0x3ffu));
  }
  std::printf(
      "# int8 kernel, %lld rows x %lld columns, best of 5, G elements/s; chosen level: %s\n",
      static_cast<long long>(kRows), static_cast<long long>(kCols),
      quantize_level_name(quantize_level()));
  std::printf("%-10s %10s %10s %10s %6s\n", "level", "bf16", "f16", "f32", "wrong");
  // Every level's bytes against the baseline's (run first), as the kernels promise.
  Output base[3];
  int wrong_levels = 0;
  for (QuantizeLevel l : {QuantizeLevel::kBaseline, QuantizeLevel::kAvx2, QuantizeLevel::kAvx512}) {
    if (!quantize_supports(l)) continue;
    detail::ScopedQuantizeLevel use(l);
    Output out[3];
    const double rates[3] = {best_rate(bf16, quantize_rows_bf16, out[0]),
                             best_rate(f16, quantize_rows_f16, out[1]),
                             best_rate(f32, quantize_rows_f32, out[2])};
    int wrong = 0;
    for (int k = 0; k < 3; ++k) {
      if (l == QuantizeLevel::kBaseline) base[k] = out[k];
      wrong += out[k] == base[k] ? 0 : 1;
    }
    wrong_levels += wrong ? 1 : 0;
    std::printf("%-10s %10.2f %10.2f %10.2f %6d\n", quantize_level_name(l), rates[0], rates[1],
                rates[2], wrong);
  }
  // Online FP8 of the bfloat16 values (a layer's staged weight), per tensor
  // (the amax pass, then the codes) and per 128 x 128 block.
  std::printf("# online FP8, %lld x %lld bfloat16 values, best of 5, ns per value\n",
              static_cast<long long>(kRows), static_cast<long long>(kCols));
  std::printf("%-10s %10s %10s %6s\n", "level", "tensor", "block", "wrong");
  const std::uint64_t n = bf16.size();
  std::vector<std::uint8_t> base_codes[2];
  std::vector<float> base_scales[2];
  for (QuantizeLevel l : {QuantizeLevel::kBaseline, QuantizeLevel::kAvx2, QuantizeLevel::kAvx512}) {
    if (!quantize_supports(l)) continue;
    detail::ScopedQuantizeLevel use(l);
    std::vector<std::uint8_t> codes[2] = {std::vector<std::uint8_t>(n, 1),
                                          std::vector<std::uint8_t>(n, 1)};
    std::vector<float> scales[2] = {
        std::vector<float>(1), std::vector<float>(((kRows + 127) / 128) * ((kCols + 127) / 128))};
    double ns[2] = {1e30, 1e30};
    for (int pass = 0; pass < 5; ++pass) {
      auto t = Clock::now();
      quantize_fp8_host(bf16.data(), DType::kBFloat16, n, codes[0].data(), scales[0].data());
      ns[0] = std::min(ns[0], std::chrono::duration<double, std::nano>(Clock::now() - t).count());
      t = Clock::now();
      quantize_fp8_blocks_host(bf16.data(), DType::kBFloat16, kRows, kCols, 128, codes[1].data(),
                               scales[1].data());
      ns[1] = std::min(ns[1], std::chrono::duration<double, std::nano>(Clock::now() - t).count());
    }
    int wrong = 0;
    for (int k = 0; k < 2; ++k) {
      if (l == QuantizeLevel::kBaseline) {
        base_codes[k] = codes[k];
        base_scales[k] = scales[k];
      }
      wrong += codes[k] == base_codes[k] && std::memcmp(scales[k].data(), base_scales[k].data(),
                                                        scales[k].size() * sizeof(float)) == 0
                   ? 0
                   : 1;
    }
    wrong_levels += wrong ? 1 : 0;
    std::printf("%-10s %10.3f %10.3f %6d\n", quantize_level_name(l), ns[0] / n, ns[1] / n, wrong);
  }
  return wrong_levels ? 1 : 0;
}
