#include "tpreload/model/synthetic_model.h"

#include <fstream>

#include "tpreload/core/error.h"

namespace tpreload {

std::vector<TensorSpec> checkpoint_specs(const ModelConfig& config) {
  std::vector<TensorSpec> specs;
  for (const auto& s : checkpoint_tensor_specs(config))
    specs.push_back({s.name, s.dtype.value_or(config.dtype), s.shape});
  return specs;
}

void generate_model_checkpoint(const ModelConfig& config, const std::string& dir,
                               const GenerateOptions& options) {
  generate_checkpoint(dir, checkpoint_specs(config), options);
  std::ofstream out(dir + "/config.json");
  out << (config.json.empty() ? model_config_to_json(config) : config.json);
  if (!out) raise<CheckpointError>("cannot write '", dir, "/config.json'");
}

}  // namespace tpreload
