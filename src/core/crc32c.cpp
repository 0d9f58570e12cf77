#include "tpreload/core/crc32c.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "tpreload/core/log.h"

namespace tpreload {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zero bytes.
struct Tables {
  std::array<std::array<std::uint32_t, 256>, 8> slice{};
  // shift[k][b]: the raw CRC register value b << (8k), advanced over one block
  // of zero bytes (x^(8 * kCrc32cBlock) mod P, by linearity byte by byte).
  std::array<std::array<std::uint32_t, 256>, 4> shift{};
};

std::uint32_t advance_zeros_slow(const Tables& t, std::uint32_t crc, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) crc = t.slice[0][crc & 0xFF] ^ (crc >> 8);
  return crc;
}

Tables make_tables() {
  Tables t;
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
    t.slice[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (std::uint32_t b = 0; b < 256; ++b)
      t.slice[k][b] = t.slice[0][t.slice[k - 1][b] & 0xFF] ^ (t.slice[k - 1][b] >> 8);
  for (int k = 0; k < 4; ++k)
    for (std::uint32_t b = 0; b < 256; ++b)
      t.shift[k][b] = advance_zeros_slow(t, b << (8 * k), kCrc32cBlock);
  return t;
}

const Tables& tables() {
  static const Tables t = make_tables();
  return t;
}

// The register advanced over one block of zeros.
std::uint32_t shift_block(const Tables& t, std::uint32_t crc) {
  return t.shift[0][crc & 0xFF] ^ t.shift[1][(crc >> 8) & 0xFF] ^ t.shift[2][(crc >> 16) & 0xFF] ^
         t.shift[3][crc >> 24];
}

std::uint32_t raw_table(const Tables& t, std::uint32_t crc, const unsigned char* p,
                        std::uint64_t n) {
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= crc;
    crc = t.slice[7][w & 0xFF] ^ t.slice[6][(w >> 8) & 0xFF] ^ t.slice[5][(w >> 16) & 0xFF] ^
          t.slice[4][(w >> 24) & 0xFF] ^ t.slice[3][(w >> 32) & 0xFF] ^
          t.slice[2][(w >> 40) & 0xFF] ^ t.slice[1][(w >> 48) & 0xFF] ^ t.slice[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = t.slice[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t raw_hw(std::uint32_t crc, const unsigned char* p,
                                                       std::uint64_t n) {
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8;
    n -= 8;
  }
  while (n--) c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
  return static_cast<std::uint32_t>(c);
}

// Three whole blocks at once (the instruction's latency is three cycles, its
// throughput one), each a raw CRC.
__attribute__((target("sse4.2"))) void raw_hw_3blocks(const unsigned char* p,
                                                      std::uint32_t out[3]) {
  std::uint64_t a = 0, b = 0, c = 0;
  const unsigned char* q = p + kCrc32cBlock;
  const unsigned char* r = p + 2 * kCrc32cBlock;
  for (std::uint64_t i = 0; i < kCrc32cBlock; i += 8) {
    std::uint64_t x, y, z;
    std::memcpy(&x, p + i, 8);
    std::memcpy(&y, q + i, 8);
    std::memcpy(&z, r + i, 8);
    a = _mm_crc32_u64(a, x);
    b = _mm_crc32_u64(b, y);
    c = _mm_crc32_u64(c, z);
  }
  out[0] = static_cast<std::uint32_t>(a);
  out[1] = static_cast<std::uint32_t>(b);
  out[2] = static_cast<std::uint32_t>(c);
}

// The instruction on three blocks at a time while whole blocks remain, each
// block's raw CRC appended to the register.
std::uint32_t raw_instruction(std::uint32_t crc, const unsigned char* p, std::uint64_t n) {
  const Tables& t = tables();
  while (n >= 3 * kCrc32cBlock) {
    std::uint32_t blocks[3];
    raw_hw_3blocks(p, blocks);
    for (std::uint32_t b : blocks) crc = shift_block(t, crc) ^ b;
    p += 3 * kCrc32cBlock;
    n -= 3 * kCrc32cBlock;
  }
  return raw_hw(crc, p, n);
}

// Folding with carry-less multiplies (VPCLMULQDQ on AVX-512 registers), twice
// the crc32 instruction's rate on the CPUs that have it (measured in
// docs/PERFORMANCE.md, "Component figures"). A 128-bit lane holds a polynomial of degree
// < 128, reflected as the bytes are (the lane's first byte holds its
// highest-degree bits, in its low qword); the message so far is congruent,
// modulo P, to that lane placed where it stands. Folding a lane forward by d bits
// multiplies its two halves by x^(d+64) and x^d modulo P (32-bit constants) and
// adds the bytes d bits on. A carry-less multiply of two reflected 64-bit values
// yields the reflected product times x, so the constants are x^(d+63) and
// x^(d-1) modulo P. The last lane is reduced by the crc32 instruction: its 16
// bytes, from a register of 0, give the CRC of everything folded into it.
struct FoldBy {
  std::uint64_t low_half, high_half;  // the constants for the lane's low and high qwords
};

// x^n modulo P (P = x^32 + 0x1EDC6F41, normal bit order).
std::uint64_t x_pow_mod(unsigned n) {
  std::uint64_t r = 1;
  for (unsigned i = 0; i < n; ++i) {
    r <<= 1;
    if (r >> 32) r ^= 0x11EDC6F41ull;
  }
  return r;
}

std::uint64_t reflect64(std::uint64_t v) {
  std::uint64_t r = 0;
  for (int i = 0; i < 64; ++i) r |= ((v >> i) & 1u) << (63 - i);
  return r;
}

FoldBy fold_by(unsigned bits) {
  return {reflect64(x_pow_mod(bits + 63)), reflect64(x_pow_mod(bits - 1))};
}

struct FoldConstants {
  FoldBy by256bytes = fold_by(2048), by64bytes = fold_by(512), by48bytes = fold_by(384),
         by32bytes = fold_by(256), by16bytes = fold_by(128);
};

const FoldConstants& fold_constants() {
  static const FoldConstants k;
  return k;
}

#define TPRELOAD_FOLD_TARGET __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))

TPRELOAD_FOLD_TARGET __m512i every_lane(FoldBy k) {
  return _mm512_set4_epi64(static_cast<long long>(k.high_half), static_cast<long long>(k.low_half),
                           static_cast<long long>(k.high_half), static_cast<long long>(k.low_half));
}

// a's lanes folded by k's constants, plus `next`.
TPRELOAD_FOLD_TARGET __m512i fold(__m512i a, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
                                   _mm512_clmulepi64_epi128(a, k, 0x11), next, 0x96);
}

// Four 64-byte accumulators, 256 bytes a round; then one lane, 16 bytes at a
// time; then the crc32 instruction for the last 15 bytes or fewer.
TPRELOAD_FOLD_TARGET std::uint32_t raw_fold(std::uint32_t crc, const unsigned char* p,
                                            std::uint64_t n) {
  if (n < 256) return raw_hw(crc, p, n);
  const FoldConstants& k = fold_constants();
  __m512i a0 = _mm512_loadu_si512(p), a1 = _mm512_loadu_si512(p + 64),
          a2 = _mm512_loadu_si512(p + 128), a3 = _mm512_loadu_si512(p + 192);
  // A register value is the same as its bytes xored into the first four.
  a0 = _mm512_xor_si512(a0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  p += 256;
  n -= 256;
  const __m512i round = every_lane(k.by256bytes);
  for (; n >= 256; p += 256, n -= 256) {
    a0 = fold(a0, round, _mm512_loadu_si512(p));
    a1 = fold(a1, round, _mm512_loadu_si512(p + 64));
    a2 = fold(a2, round, _mm512_loadu_si512(p + 128));
    a3 = fold(a3, round, _mm512_loadu_si512(p + 192));
  }
  const __m512i by64 = every_lane(k.by64bytes);
  a3 = fold(fold(fold(a0, by64, a1), by64, a2), by64, a3);
  // a3's lanes stand 48, 32, 16 and 0 bytes before the end: fold the first three
  // onto the last (its constants 0: it adds nothing to the sum).
  const __m512i lanes = _mm512_set_epi64(
      0, 0, static_cast<long long>(k.by16bytes.high_half),
      static_cast<long long>(k.by16bytes.low_half), static_cast<long long>(k.by32bytes.high_half),
      static_cast<long long>(k.by32bytes.low_half), static_cast<long long>(k.by48bytes.high_half),
      static_cast<long long>(k.by48bytes.low_half));
  alignas(64) __m128i last[4], moved[4];
  _mm512_store_si512(last, a3);
  _mm512_store_si512(moved, fold(a3, lanes, _mm512_setzero_si512()));
  __m128i v = _mm_ternarylogic_epi64(last[3], moved[0], moved[1], 0x96);
  v = _mm_xor_si128(v, moved[2]);
  const __m128i by16 = _mm_set_epi64x(static_cast<long long>(k.by16bytes.high_half),
                                      static_cast<long long>(k.by16bytes.low_half));
  for (; n >= 16; p += 16, n -= 16)
    v = _mm_ternarylogic_epi64(_mm_clmulepi64_si128(v, by16, 0x00),
                               _mm_clmulepi64_si128(v, by16, 0x11),
                               _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), 0x96);
  std::uint64_t c = _mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(v)));
  c = _mm_crc32_u64(c, static_cast<std::uint64_t>(_mm_extract_epi64(v, 1)));
  return raw_hw(static_cast<std::uint32_t>(c), p, n);
}

bool has_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}

// (__builtin_cpu_supports reports AVX-512 only where the OS saves its registers.)
bool has_fold() {
  static const bool yes = has_sse42() && __builtin_cpu_supports("pclmul") &&
                          __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("vpclmulqdq");
  return yes;
}
#else
bool has_sse42() {
  return false;
}
bool has_fold() {
  return false;
}
#endif

std::uint32_t raw_with(Crc32cMethod method, std::uint32_t crc, const unsigned char* p,
                       std::uint64_t n) {
  switch (method) {
#if defined(__x86_64__)
    case Crc32cMethod::kFold:
      return raw_fold(crc, p, n);
    case Crc32cMethod::kInstruction:
      return raw_instruction(crc, p, n);
#endif
    default:
      return raw_table(tables(), crc, p, n);
  }
}

bool supports(Crc32cMethod method) {
  return method == Crc32cMethod::kTable || (method == Crc32cMethod::kInstruction && has_sse42()) ||
         (method == Crc32cMethod::kFold && has_fold());
}

const char* method_name(Crc32cMethod method) {
  switch (method) {
    case Crc32cMethod::kFold:
      return "fold";
    case Crc32cMethod::kInstruction:
      return "instruction";
    default:
      return "table";
  }
}

// The fastest the CPU has, or the one TPRELOAD_CRC32C names (fold, instruction
// or table: the same values, for comparing the methods' cost in one build); a
// name that is not a method, or one this CPU cannot run, is a warning.
Crc32cMethod choose_method() {
  const Crc32cMethod best = has_fold()    ? Crc32cMethod::kFold
                            : has_sse42() ? Crc32cMethod::kInstruction
                                          : Crc32cMethod::kTable;
  const char* env = std::getenv("TPRELOAD_CRC32C");
  if (!env || !*env) return best;
  for (Crc32cMethod m : {Crc32cMethod::kTable, Crc32cMethod::kInstruction, Crc32cMethod::kFold}) {
    if (std::strcmp(env, method_name(m)) != 0) continue;
    if (supports(m)) return m;
    log().warn("TPRELOAD_CRC32C={}: this CPU cannot run that CRC-32C method; using {}", env,
               method_name(best));
    return best;
  }
  log().warn("TPRELOAD_CRC32C={} is not a CRC-32C method (fold, instruction or table); using {}",
             env, method_name(best));
  return best;
}

Crc32cMethod best_method() {
  static const Crc32cMethod m = choose_method();
  return m;
}

std::uint32_t raw(std::uint32_t crc, const void* data, std::uint64_t n) {
  return raw_with(best_method(), crc, static_cast<const unsigned char*>(data), n);
}

// Appends a block's raw CRC to the running register (the register advanced over
// the block's length, then the block's own raw value: CRC linearity).
std::uint32_t append(const Tables& t, std::uint32_t reg, std::uint32_t block_raw,
                     std::uint64_t block_len) {
  static const unsigned char zeros[kCrc32cBlock] = {};
  const std::uint32_t shifted =
      block_len == kCrc32cBlock ? shift_block(t, reg) : raw(reg, zeros, block_len);
  return shifted ^ block_raw;
}

}  // namespace

std::uint32_t crc32c_raw(const void* data, std::uint64_t n) {
  return raw(0, data, n);
}

std::uint32_t crc32c(const void* data, std::uint64_t n) {
  return crc32c_extend(0, data, n);
}

std::uint32_t crc32c_extend(std::uint32_t so_far, const void* data, std::uint64_t n) {
  return raw(so_far ^ 0xFFFFFFFFu, data, n) ^ 0xFFFFFFFFu;
}

std::uint32_t crc32c_from_blocks(const std::uint32_t* raw_blocks, std::uint64_t n) {
  const Tables& t = tables();
  std::uint32_t reg = 0xFFFFFFFFu;
  for (std::uint64_t i = 0; i < crc32c_blocks(n); ++i)
    reg = append(t, reg, raw_blocks[i], std::min(kCrc32cBlock, n - i * kCrc32cBlock));
  return reg ^ 0xFFFFFFFFu;
}

Crc32cMethod crc32c_method() {
  return best_method();
}

const char* crc32c_method_name(Crc32cMethod method) {
  return method_name(method);
}

bool crc32c_supports(Crc32cMethod method) {
  return supports(method);
}

namespace detail {
std::uint32_t crc32c_raw_table(std::uint32_t crc, const void* data, std::uint64_t n) {
  return raw_table(tables(), crc, static_cast<const unsigned char*>(data), n);
}

std::uint32_t crc32c_raw_with(Crc32cMethod method, std::uint32_t crc, const void* data,
                              std::uint64_t n) {
  if (!crc32c_supports(method)) return raw(crc, data, n);
  return raw_with(method, crc, static_cast<const unsigned char*>(data), n);
}
}  // namespace detail

}  // namespace tpreload
