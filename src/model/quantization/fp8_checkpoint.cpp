#include "tpreload/model/fp8_checkpoint.h"

#include <algorithm>

#include "fp8_config.h"
#include "tpreload/core/error.h"
#include "tpreload/model/sharding.h"

namespace tpreload {
namespace {

const std::string kWeight = ".weight";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The linear projections vLLM's FP8 method quantizes, by module name (Mixtral's
// experts' w1, w3, w2 too; DeepSeek's MLA projections); routers ("gate",
// "shared_expert_gate") are not.
bool linear_projection(const std::string& module) {
  static const char* const kNames[] = {
      "q_proj", "k_proj", "v_proj", "o_proj",   "gate_proj", "up_proj",   "down_proj",
      "w1",     "w2",     "w3",     "q_a_proj", "q_b_proj",  "kv_b_proj", "kv_a_proj_with_mqa"};
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
  std::string s = blocks() ? "fp8, weight_block_size [" + std::to_string(block_n) + ", " +
                                 std::to_string(block_k) + "]"
                           : std::string("fp8, per tensor, activation_scheme ") +
                                 (static_activations ? "static" : "dynamic");
  s += ", ignored [";
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

const char* fp8_scale_leaf(Fp8Scale kind) {
  switch (kind) {
    case Fp8Scale::kGrid:
      return "weight_scale_inv";
    case Fp8Scale::kWeight:
      return "weight_scale";
    case Fp8Scale::kInput:
      return "input_scale";
  }
  return "";
}

std::vector<std::pair<std::string, Fp8Scale>> fp8_scales_of(const Fp8Checkpoint& fp8,
                                                            const std::string& weight_name) {
  const std::string module = weight_name.substr(0, weight_name.size() - kWeight.size() + 1);
  std::vector<std::pair<std::string, Fp8Scale>> out;
  if (fp8.blocks()) return {{module + fp8_scale_leaf(Fp8Scale::kGrid), Fp8Scale::kGrid}};
  if (fp8.static_activations)  // ("input_scale" sorts first)
    out.push_back({module + fp8_scale_leaf(Fp8Scale::kInput), Fp8Scale::kInput});
  out.push_back({module + fp8_scale_leaf(Fp8Scale::kWeight), Fp8Scale::kWeight});
  return out;
}

std::optional<std::pair<std::string, Fp8Scale>> fp8_weight_of_scale(const std::string& name) {
  for (const Fp8Scale kind : {Fp8Scale::kGrid, Fp8Scale::kWeight, Fp8Scale::kInput}) {
    const std::string leaf = std::string(".") + fp8_scale_leaf(kind);
    if (ends_with(name, leaf)) return {{name.substr(0, name.size() - leaf.size()) + kWeight, kind}};
  }
  return std::nullopt;
}

std::vector<std::int64_t> fp8_scale_shape(const Fp8Checkpoint& fp8, Fp8Scale kind,
                                          std::vector<std::int64_t> shape) {
  if (kind != Fp8Scale::kGrid) return {};
  const std::size_t n = shape.size();
  if (n < 2 || !fp8.blocks()) return shape;
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
                      "' is not supported (supported: fp8, block-scaled or per tensor)");
  const nlohmann::json scheme =
      q.contains("activation_scheme") ? q["activation_scheme"] : nlohmann::json();
  const std::string activations = scheme.is_null()     ? "dynamic"
                                  : scheme.is_string() ? scheme.get<std::string>()
                                                       : "";
  if (activations != "dynamic" && activations != "static")
    raise<ModelError>(origin, ": quantization_config.activation_scheme ", scheme.dump(),
                      " is not \"static\" or \"dynamic\"");
  const auto& block = q.contains("weight_block_size") ? q["weight_block_size"] : nlohmann::json();
  if (block.is_null()) {
    fp8.per_tensor = true;
    fp8.static_activations = activations == "static";
  } else {
    if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() ||
        !block[1].is_number_integer() || block[0].get<std::int64_t>() <= 0 ||
        block[1].get<std::int64_t>() <= 0)
      raise<ModelError>(
          origin, ": quantization_config.weight_block_size must be two positive integers, got ",
          block.dump());
    fp8.block_n = block[0].get<std::int64_t>();
    fp8.block_k = block[1].get<std::int64_t>();
    if (activations != "dynamic")
      raise<ModelError>(origin, ": quantization_config.activation_scheme \"", activations,
                        "\" with weight_block_size is refused (vLLM's block FP8 is dynamic only)");
  }
  // vLLM's Fp8Config: ignored_layers, else modules_to_not_convert.
  fp8.ignored = string_list(q, "ignored_layers", origin);
  if (fp8.ignored.empty()) fp8.ignored = string_list(q, "modules_to_not_convert", origin);
  return fp8;
}

}  // namespace detail
}  // namespace tpreload
