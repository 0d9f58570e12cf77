#include "tpreload/core/quantization.h"

#include <algorithm>

namespace tpreload {

const std::vector<std::string>& quantization_schemes() {
  static const std::vector<std::string> kSchemes = {"int8", "fp8", "fp8-block"};
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
         "fused weight (an expert) arrived; fp8-block: online FP8 with a float32 "
         "weight_scale_inv per 128 x 128 block of the rank's fused weight (each expert apart), "
         "amax (at least 1e-4) times 1/448, as vLLM's per_block_cast_to_fp8, quantized once "
         "128 rows (on a GPU, a fused weight or expert) arrived. Checkpoint-format loads "
         "quantize; kernel-format loads copy shards made with the same scheme";
}

bool online_fp8(std::string_view name) {
  return name == "fp8" || name == "fp8-block";
}

std::int64_t online_fp8_block(std::string_view name) {
  return name == "fp8-block" ? 128 : 0;
}

}  // namespace tpreload
