// crc32c_bench: the checksum's rate on this CPU, per method it has (fold,
// instruction, table), over a buffer that stays in the core's cache (256 KiB),
// one in the shared cache (8 MiB, a bucket) and one in memory (64 MiB), with a
// memcpy of the same bytes beside it. Buffers are written before the clock
// starts, as a live model's memory is warm. Prints the best of five passes of
// each; a pass checksums 1 GiB (the table an eighth of it). Why the fold is the default where the
// CPU has it: docs/PERFORMANCE.md, change 31.
//   build/bench/crc32c_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "file_bench_util.h"
#include "tpreload/core/crc32c.h"

int main() {
  using tpreload::Crc32cMethod;
  std::printf("# crc32c_bench: GB/s, best of 5 passes of 1 GiB; this CPU's method: %s\n",
              tpreload::crc32c_method_name(tpreload::crc32c_method()));
  std::printf("%10s %12s %12s %12s %12s\n", "buffer", "fold", "instruction", "table", "memcpy");
  const std::size_t pass_bytes = std::size_t{1} << 30;
  std::uint32_t sink = 0;
  for (std::size_t size : {std::size_t{256} << 10, std::size_t{8} << 20, std::size_t{64} << 20}) {
    std::vector<unsigned char> src(size), dst(size);
    for (std::size_t i = 0; i < size; ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
    std::memset(dst.data(), 0, size);
    // One pass: `bytes` (at least the buffer) in calls over the whole buffer.
    auto best_rate = [&](std::size_t bytes, auto&& one) {
      const std::size_t reps = std::max<std::size_t>(bytes / size, 1);
      double best = 1e30;
      for (int pass = 0; pass < 5; ++pass) {
        const auto start = std::chrono::steady_clock::now();
        for (std::size_t r = 0; r < reps; ++r) one();
        best = std::min(best, bench::seconds_since(start));
      }
      return static_cast<double>(reps * size) / best / 1e9;
    };
    std::printf("%7zu KiB", size >> 10);
    for (Crc32cMethod m : {Crc32cMethod::kFold, Crc32cMethod::kInstruction, Crc32cMethod::kTable}) {
      if (!tpreload::crc32c_supports(m)) {
        std::printf(" %12s", "-");
        continue;
      }
      // (the table, ten times slower, sums an eighth as many bytes a pass)
      const std::size_t bytes = m == Crc32cMethod::kTable ? pass_bytes / 8 : pass_bytes;
      std::printf(" %12.1f", best_rate(bytes, [&] {
                    sink ^= tpreload::detail::crc32c_raw_with(m, sink, src.data(), size);
                  }));
    }
    std::printf(" %12.1f\n", best_rate(pass_bytes, [&] {
                  std::memcpy(dst.data(), src.data(), size);
                  sink ^= dst[sink % size];
                }));
  }
  return sink == 0x12345678u ? 3 : 0;  // keeps the sums from being optimised away
}
