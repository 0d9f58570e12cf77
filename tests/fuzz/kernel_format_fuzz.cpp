// libFuzzer target: kernel_format.json, read from a directory.
#include "fuzz_util.h"
#include "tpreload/checkpoint/kernel_format.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tpreload;
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/kernel";
    ::mkdir(d.c_str(), 0700);
    return d;
  }();
  fuzz::write_file(dir + "/kernel_format.json", data, size);
  fuzz::expect_only_our_errors([&] {
    const KernelFormatInfo info = read_kernel_format_info(dir);
    if (info.tp_size < 1) abort();
    // What was accepted writes back out and reads the same.
    const std::string again = kernel_format_json(info);
    fuzz::write_file(dir + "/kernel_format.json",
                     reinterpret_cast<const std::uint8_t*>(again.data()), again.size());
    const KernelFormatInfo back = read_kernel_format_info(dir);
    if (back.tp_size != info.tp_size || back.dtype != info.dtype ||
        back.quantization != info.quantization || back.expert_parallel != info.expert_parallel ||
        back.config_json != info.config_json)
      abort();
  });
  return 0;
}
