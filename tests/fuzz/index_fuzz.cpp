// libFuzzer target: a sharded checkpoint's model.safetensors.index.json, opened
// as a directory beside one real shard ("model-00001-of-00001.safetensors"
// holding tensor "a"), so that weight maps naming it reach the shard checks.
#include "fuzz_util.h"
#include "tpreload/checkpoint/safetensors.h"
#include "tpreload/checkpoint/writers.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tpreload;
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/index";
    ::mkdir(d.c_str(), 0700);
    const std::uint16_t value = 0x3f80;
    std::vector<InMemoryTensor> t = {{"a", DType::kBFloat16, {1}, ConstBytes(&value, 2)}};
    write_safetensors(d + "/model-00001-of-00001.safetensors", t);
    return d;
  }();
  fuzz::write_file(dir + "/model.safetensors.index.json", data, size);
  fuzz::expect_only_our_errors([&] {
    auto source = open_safetensors(dir);
    for (const auto& info : source->tensors())
      if (info.name.empty()) abort();
  });
  return 0;
}
