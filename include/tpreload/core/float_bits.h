// Conversions between float32 and the 16-bit floating types by their bit
// patterns, as plain inline functions that compile for the host and, in .cu
// files, for the device: the CPU and the GPU convert with the same code, so they
// give the same bytes.
//
//   float -> bfloat16: round to nearest, ties to even (torch's rounding); a NaN
//                      stays a quiet NaN with its sign and top payload bits.
//   float -> float16:  IEEE round to nearest, ties to even; overflow gives
//                      infinity, a NaN gives 0x7E00 with its sign.
//   bfloat16, float16 -> float: exact (a NaN keeps its bits).
//   double -> float:   round to nearest, ties to even; a NaN becomes the quiet
//                      NaN 0x7FC00000 with its sign (hardware casts differ on
//                      payloads, so the bits are set here).
//   float -> double:   exact; a NaN becomes 0x7FF8000000000000 with its sign.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TPRELOAD_HOST_DEVICE __host__ __device__
#else
#define TPRELOAD_HOST_DEVICE
#endif

namespace tpreload::fbits {

TPRELOAD_HOST_DEVICE inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TPRELOAD_HOST_DEVICE inline float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TPRELOAD_HOST_DEVICE inline float from_bfloat16(std::uint16_t b) {
  return float_of(static_cast<std::uint32_t>(b) << 16);
}

TPRELOAD_HOST_DEVICE inline std::uint16_t to_bfloat16(float value) {
  const std::uint32_t u = bits_of(value);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Every case computed and one selected by masks, without branches, so that
// loops over many values vectorize (the int8 kernel's float16 rows).
TPRELOAD_HOST_DEVICE inline float from_half(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  const std::uint32_t special = sign | 0x7F800000u | (man << 13);  // infinity, NaN
  const std::uint32_t normal = sign | ((exp + 112u) << 23) | (man << 13);
  // zero or subnormal: man x 2^-24, exact in float
  const std::uint32_t small =
      bits_of(static_cast<float>(static_cast<std::int32_t>(man)) * 5.9604644775390625e-8f) | sign;
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(exp == 0x1Fu);
  const std::uint32_t is_small = 0u - static_cast<std::uint32_t>(exp == 0u);
  return float_of((special & is_special) | (small & is_small) |
                  (normal & ~(is_special | is_small)));
}

TPRELOAD_HOST_DEVICE inline std::uint16_t to_half(float value) {
  constexpr std::uint32_t kInf32 = 255u << 23, kHalfMax = (127u + 16u) << 23;
  constexpr std::uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  std::uint32_t u = bits_of(value);
  const std::uint32_t sign = u & 0x80000000u;
  u ^= sign;
  std::uint32_t out;
  if (u >= kHalfMax) {
    out = u > kInf32 ? 0x7E00u : 0x7C00u;
  } else if (u < (113u << 23)) {  // a half subnormal or zero: the FPU rounds the sum
    out = bits_of(float_of(u) + float_of(kDenormMagic)) - kDenormMagic;
  } else {
    const std::uint32_t odd = (u >> 13) & 1u;
    u += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xFFFu + odd;
    out = u >> 13;
  }
  return static_cast<std::uint16_t>(out | (sign >> 16));
}

TPRELOAD_HOST_DEVICE inline float narrow(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  if ((u & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull)
    return float_of(0x7FC00000u | static_cast<std::uint32_t>((u >> 32) & 0x80000000u));
  return static_cast<float>(d);  // IEEE round to nearest, ties to even, on host and device
}

TPRELOAD_HOST_DEVICE inline double widen(float f) {
  const std::uint32_t u = bits_of(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    const std::uint64_t bits =
        0x7FF8000000000000ull | (static_cast<std::uint64_t>(u & 0x80000000u) << 32);
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }
  return static_cast<double>(f);
}

}  // namespace tpreload::fbits
