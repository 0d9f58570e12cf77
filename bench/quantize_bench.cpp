// quantize_bench: the int8 kernel's rate on this CPU at each instruction-set
// level it runs (avx512, avx2, baseline: QuantizeLevel), for bfloat16, float16
// and float32 rows of 5632 columns (a TinyLlama MLP row) in a buffer written
// before the clock starts (a live model's memory is warm). Prints the best of
// five passes of each, in G elements/s. Why the kernels are built per level:
// docs/PERFORMANCE.md, change 7.
//   build/bench/quantize_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "tpreload/model/quantize.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t kRows = 2048, kCols = 5632;

template <typename T, typename Kernel>
double best_rate(const std::vector<T>& w, Kernel kernel) {
  std::vector<std::int8_t> q(w.size(), 1);
  std::vector<float> scale(kRows, 1.0f);
  double best = 0;
  for (int pass = 0; pass < 6; ++pass) {  // the first warms the output
    const auto t0 = Clock::now();
    kernel(w.data(), kRows, kCols, kCols, q.data(), scale.data());
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (pass > 0) best = std::max(best, static_cast<double>(w.size()) / s / 1e9);
  }
  return best;
}

}  // namespace

int main() {
  using namespace tpreload;
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
  std::printf("%-10s %10s %10s %10s\n", "level", "bf16", "f16", "f32");
  for (QuantizeLevel l : {QuantizeLevel::kAvx512, QuantizeLevel::kAvx2, QuantizeLevel::kBaseline}) {
    if (!quantize_supports(l)) continue;
    detail::ScopedQuantizeLevel use(l);
    std::printf("%-10s %10.2f %10.2f %10.2f\n", quantize_level_name(l),
                best_rate(bf16, quantize_rows_bf16), best_rate(f16, quantize_rows_f16),
                best_rate(f32, quantize_rows_f32));
  }
  return 0;
}
