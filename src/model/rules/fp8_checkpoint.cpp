#include "tpreload/model/fp8_checkpoint.h"

#include <algorithm>

#include "fp8_config.h"
#include "tpreload/core/error.h"
#include "tpreload/model/sharding.h"

namespace tpreload {
namespace {

const std::string kWeight = ".weight";
const std::string kScaleInv = ".weight_scale_inv";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The linear projections vLLM's FP8 method quantizes, by module name (Mixtral's
// experts' w1, w3, w2 too); routers ("gate", "shared_expert_gate") are not.
bool linear_projection(const std::string& module) {
  static const char* const kNames[] = {"q_proj",  "k_proj",    "v_proj", "o_proj", "gate_proj",
                                       "up_proj", "down_proj", "w1",     "w2",     "w3"};
  return std::any_of(std::begin(kNames), std::end(kNames),
                     [&](const char* n) { return module == n; });
}

std::vector<std::string> string_list(const nlohmann::json& j, const char* key,
                                     const std::string& origin) {
  std::vector<std::string> out;
  if (!j.contains(key) || j[key].is_null()) return out;
  if (!j[key].is_array())
    raise<ModelError>(origin, ": quantization_config.", key, " must be a list of module names");
  for (const auto& v : j[key]) {
    if (!v.is_string())
      raise<ModelError>(origin, ": quantization_config.", key,
                        " must be a list of module names, has ", v.dump());
    out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace

std::string Fp8Checkpoint::text() const {
  if (!quantized()) return "none";
  std::string s = "fp8, weight_block_size [" + std::to_string(block_n) + ", " +
                  std::to_string(block_k) + "], ignored [";
  for (std::size_t i = 0; i < ignored.size(); ++i) s += (i ? ", " : "") + ignored[i];
  return s + "]";
}

bool fp8_quantized_weight(const Fp8Checkpoint& fp8, const std::string& name) {
  if (!fp8.quantized() || layer_of(name) < 0 || !ends_with(name, kWeight)) return false;
  const std::string module = name.substr(0, name.size() - kWeight.size());
  const auto dot = module.rfind('.');
  if (!linear_projection(dot == std::string::npos ? module : module.substr(dot + 1))) return false;
  return std::find(fp8.ignored.begin(), fp8.ignored.end(), module) == fp8.ignored.end();
}

std::string fp8_scale_name(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - kWeight.size()) + kScaleInv;
}

std::optional<std::string> fp8_weight_of_scale(const std::string& name) {
  if (!ends_with(name, kScaleInv)) return std::nullopt;
  return name.substr(0, name.size() - kScaleInv.size()) + kWeight;
}

std::vector<std::int64_t> fp8_scale_shape(const Fp8Checkpoint& fp8,
                                          std::vector<std::int64_t> shape) {
  const std::size_t n = shape.size();
  if (n < 2 || !fp8.quantized()) return shape;
  shape[n - 2] = (shape[n - 2] + fp8.block_n - 1) / fp8.block_n;
  shape[n - 1] = (shape[n - 1] + fp8.block_k - 1) / fp8.block_k;
  return shape;
}

namespace detail {

Fp8Checkpoint parse_fp8_checkpoint(const nlohmann::json& config, const std::string& origin) {
  Fp8Checkpoint fp8;
  if (!config.contains("quantization_config") || config["quantization_config"].is_null())
    return fp8;
  const nlohmann::json& q = config["quantization_config"];
  if (!q.is_object()) raise<ModelError>(origin, ": quantization_config must be an object");
  const std::string method = q.contains("quant_method") && q["quant_method"].is_string()
                                 ? q["quant_method"].get<std::string>()
                                 : std::string();
  if (method != "fp8")
    raise<ModelError>(origin, ": quantization_config.quant_method '", method,
                      "' is not supported (supported: fp8 with weight_block_size)");
  const auto& block = q.contains("weight_block_size") ? q["weight_block_size"] : nlohmann::json();
  if (block.is_null())
    raise<ModelError>(origin,
                      ": an FP8 checkpoint without weight_block_size (one scale per tensor) is not "
                      "supported yet; block-scaled FP8 is (weight_block_size [128, 128])");
  if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() ||
      !block[1].is_number_integer() || block[0].get<std::int64_t>() <= 0 ||
      block[1].get<std::int64_t>() <= 0)
    raise<ModelError>(origin,
                      ": quantization_config.weight_block_size must be two positive integers, got ",
                      block.dump());
  fp8.block_n = block[0].get<std::int64_t>();
  fp8.block_k = block[1].get<std::int64_t>();
  if (q.contains("activation_scheme") && q["activation_scheme"] != "dynamic")
    raise<ModelError>(origin, ": quantization_config.activation_scheme ",
                      q["activation_scheme"].dump(),
                      " with weight_block_size is refused (vLLM's block FP8 is dynamic only)");
  // vLLM's Fp8Config: ignored_layers, else modules_to_not_convert.
  fp8.ignored = string_list(q, "ignored_layers", origin);
  if (fp8.ignored.empty()) fp8.ignored = string_list(q, "modules_to_not_convert", origin);
  return fp8;
}

}  // namespace detail
}  // namespace tpreload
