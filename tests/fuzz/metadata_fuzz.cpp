// libFuzzer target: the metadata blob the reader rank broadcasts (the listing
// every rank plans from). A blob that parses serializes back to the same bytes.
#include <vector>

#include "fuzz_util.h"
#include "tpreload/reload/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tpreload;
  const std::vector<std::uint8_t> bytes(data, data + size);
  fuzz::expect_only_our_errors([&] {
    const SourceMetadata md = parse_metadata(bytes);
    if (serialize_metadata(md) != bytes) abort();
  });
  return 0;
}
