// libFuzzer target: the safetensors header parser. Input: 4 bytes of data-section
// length (little-endian, modulo 1 MiB), then the header's JSON text.
//
// Differential: the fast parser may only accept what the general parser accepts,
// with the same entries, so that parse_safetensors_header's answer (value or
// error text) never depends on which of the two read the header.
#include <cstring>
#include <string_view>

#include "fuzz_util.h"
#include "tpreload/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  std::uint32_t data_bytes = 0;
  std::memcpy(&data_bytes, data, 4);
  data_bytes %= 1u << 20;
  const std::string_view text(reinterpret_cast<const char*>(data + 4), size - 4);
  tpreload::SafetensorsHeader fast;
  if (tpreload::detail::parse_safetensors_entries_fast(text, fast)) {
    tpreload::SafetensorsHeader general;
    try {
      tpreload::detail::parse_safetensors_entries_general(text, general, "fuzz");
    } catch (const tpreload::Error&) {
      abort();  // the fast parser took a header the general one refuses
    }
    if (fast.tensors != general.tensors || fast.metadata != general.metadata) abort();
  }
  tpreload::fuzz::expect_only_our_errors([&] {
    const auto h = tpreload::parse_safetensors_header(text, 8 + text.size() + data_bytes, "fuzz");
    // What it accepted must be consistent: every tensor inside the data section.
    for (const auto& t : h.tensors)
      if (t.data.offset + t.data.length > h.data_bytes) abort();
  });
  return 0;
}
