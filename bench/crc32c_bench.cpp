// crc32c_bench: the checksum's rate on this CPU, per method it has (fold,
// instruction, table), over a buffer that stays in the core's cache (256 KiB),
// one in the shared cache (8 MiB, a bucket) and one in memory (64 MiB), with a
// memcpy of the same bytes beside it. Buffers are written before the clock
// starts, as a live model's memory is warm. Prints the best of five passes of
// each; a pass checksums 1 GiB (the table an eighth of it). Why the fold is the default where the
// CPU has it: docs/PERFORMANCE.md, "Why it is fast".
// Then, where the CPU has the fold's instructions, the multiplier's ceiling on
// a 256 KiB buffer: the fold's loop (two carry-less multiplies and an xor per
// 16-byte lane) with 2, 4 and 8 accumulators of 512 bits and 4 and 8 of 256
// bits, with a constant that folds nothing in particular (the rate, not a
// CRC). The fold uses four of 512 bits.
// Last, the CPU's method on pieces of an 8 MiB bucket, as a broadcast receiver
// sums its own column windows of each row (docs/PERFORMANCE.md, "Why it is fast"):
// whole 64 KiB blocks against half, a quarter and an eighth of 4 KiB rows and
// half of 11 KiB rows, the rate counted over the bytes summed.
//   build/bench/crc32c_bench
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "file_bench_util.h"
#include "tpreload/core/crc32c.h"

namespace {

#define FOLD_TARGET __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul")))

// The fold's round on `n` bytes with A accumulators of 512 bits.
template <int A>
FOLD_TARGET std::uint32_t fold_rate_512(const unsigned char* p, std::size_t n) {
  const __m512i k = _mm512_set1_epi64(0x1234567);
  __m512i acc[A];
  for (int i = 0; i < A; ++i) acc[i] = _mm512_loadu_si512(p + 64 * i);
  for (std::size_t at = 64 * A; at + 64 * A <= n; at += 64 * A)
    for (int i = 0; i < A; ++i)
      acc[i] = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc[i], k, 0x00),
                                         _mm512_clmulepi64_epi128(acc[i], k, 0x11),
                                         _mm512_loadu_si512(p + at + 64 * i), 0x96);
  for (int i = 1; i < A; ++i) acc[0] = _mm512_xor_si512(acc[0], acc[i]);
  alignas(64) std::uint32_t out[16];
  _mm512_store_si512(out, acc[0]);
  return out[0];
}

// The same with A accumulators of 256 bits.
template <int A>
FOLD_TARGET std::uint32_t fold_rate_256(const unsigned char* p, std::size_t n) {
  const __m256i k = _mm256_set1_epi64x(0x1234567);
  __m256i acc[A];
  for (int i = 0; i < A; ++i) acc[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p) + i);
  for (std::size_t at = 32 * A; at + 32 * A <= n; at += 32 * A)
    for (int i = 0; i < A; ++i)
      acc[i] = _mm256_ternarylogic_epi64(
          _mm256_clmulepi64_epi128(acc[i], k, 0x00), _mm256_clmulepi64_epi128(acc[i], k, 0x11),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + at) + i), 0x96);
  for (int i = 1; i < A; ++i) acc[0] = _mm256_xor_si256(acc[0], acc[i]);
  return static_cast<std::uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(acc[0])));
}

}  // namespace

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
  if (tpreload::crc32c_supports(Crc32cMethod::kFold)) {
    const std::size_t size = std::size_t{256} << 10;
    std::vector<unsigned char> buf(size);
    for (std::size_t i = 0; i < size; ++i) buf[i] = static_cast<unsigned char>(i * 131 + 7);
    std::printf("# the multiplier's ceiling, GB/s on %zu KiB (not a CRC: the fold's loop)\n",
                size >> 10);
    using Loop = std::uint32_t (*)(const unsigned char*, std::size_t);
    const std::pair<const char*, Loop> loops[] = {{"512-bit x2", fold_rate_512<2>},
                                                  {"512-bit x4", fold_rate_512<4>},
                                                  {"512-bit x8", fold_rate_512<8>},
                                                  {"256-bit x4", fold_rate_256<4>},
                                                  {"256-bit x8", fold_rate_256<8>}};
    for (const auto& [name, loop] : loops) {
      double best = 1e30;
      const std::size_t reps = pass_bytes / size;
      for (int pass = 0; pass < 5; ++pass) {
        const auto start = std::chrono::steady_clock::now();
        for (std::size_t r = 0; r < reps; ++r) sink ^= loop(buf.data(), size);
        best = std::min(best, bench::seconds_since(start));
      }
      std::printf("%10s %12.1f\n", name, static_cast<double>(reps * size) / best / 1e9);
    }
  }
  {
    const std::size_t size = std::size_t{8} << 20;
    std::vector<unsigned char> buf(size);
    for (std::size_t i = 0; i < size; ++i) buf[i] = static_cast<unsigned char>(i * 131 + 7);
    std::printf("# pieces of an 8 MiB bucket, GB/s of the bytes summed, best of 30 passes\n");
    std::printf("%12s %12s %12s\n", "piece", "every", "GB/s");
    const std::pair<std::size_t, std::size_t> pieces[] = {
        {65536, 65536}, {2048, 4096}, {1024, 4096}, {512, 4096}, {5632, 11264}};
    for (const auto& [piece, every] : pieces) {
      double best = 1e30;
      for (int pass = 0; pass < 30; ++pass) {
        const auto start = std::chrono::steady_clock::now();
        std::uint32_t crc = 0;
        for (std::size_t at = 0; at + piece <= size; at += every)
          crc = tpreload::crc32c_extend(crc, buf.data() + at, piece);
        sink ^= crc;
        best = std::min(best, bench::seconds_since(start));
      }
      std::printf("%12zu %12zu %12.1f\n", piece, every,
                  static_cast<double>(size / every * piece) / best / 1e9);
    }
  }
  return sink == 0x12345678u ? 3 : 0;  // keeps the sums from being optimised away
}
