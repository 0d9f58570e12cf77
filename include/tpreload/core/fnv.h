// FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3), over
// bytes: the model fingerprint of the report (docs/REPORT.md), and the values
// ranks compare for texts (agree_on_values). The same on every build and host,
// unlike std::hash. fnv1a("") == 0xcbf29ce484222325, fnv1a("a") ==
// 0xaf63dc4c8601ec8c.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tpreload {

inline constexpr std::uint64_t kFnvOffsetBasis = 0xcbf29ce484222325ull;
inline constexpr std::uint64_t kFnvPrime = 0x100000001b3ull;

// The hash of some bytes whose hash was `so_far`, followed by these `n`. (Named
// apart from the text overload: a literal and a hash would otherwise pick this
// one, reading the hash as a length.)
inline std::uint64_t fnv1a_bytes(const void* data, std::size_t n,
                                 std::uint64_t so_far = kFnvOffsetBasis) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) so_far = (so_far ^ b[i]) * kFnvPrime;
  return so_far;
}

inline std::uint64_t fnv1a(std::string_view text, std::uint64_t so_far = kFnvOffsetBasis) {
  return fnv1a_bytes(text.data(), text.size(), so_far);
}

// FNV-1a's step on a whole 64-bit word (a value, not its bytes), and on a text:
// its bytes, then its length (so that "ab" + "c" and "a" + "bc" differ).
inline std::uint64_t fnv1a_word(std::uint64_t so_far, std::uint64_t value) {
  return (so_far ^ value) * kFnvPrime;
}
inline std::uint64_t fnv1a_word(std::uint64_t so_far, std::string_view text) {
  return fnv1a_word(fnv1a(text, so_far), text.size());
}

}  // namespace tpreload
