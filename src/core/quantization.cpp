#include "tpreload/core/quantization.h"

#include <algorithm>

namespace tpreload {

const std::vector<std::string>& quantization_schemes() {
  static const std::vector<std::string> kSchemes = {"int8", "fp8"};
  return kSchemes;
}

std::vector<std::string> quantization_choices() {
  std::vector<std::string> out = {""};
  for (const auto& s : quantization_schemes()) out.push_back(s);
  return out;
}

bool known_quantization(std::string_view name) {
  const auto& s = quantization_schemes();
  return name.empty() || std::find(s.begin(), s.end(), name) != s.end();
}

std::string quantization_list() {
  const auto& s = quantization_schemes();
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i)
    out += (i == 0 ? "" : i + 1 == s.size() ? " or " : ", ") + ("\"" + s[i] + "\"");
  return out;
}

std::string quantization_help() {
  return "int8: weight-only int8 parameters with per-row float32 scales, quantized as rows "
         "land; fp8: vLLM's online FP8 (float8_e4m3fn weights with one float32 scale per "
         "linear and per expert, amax / 448 over the rank's fused weight), quantized once a "
         "layer's weights arrived. Checkpoint-format loads quantize; kernel-format loads copy "
         "shards made with the same scheme";
}

}  // namespace tpreload
