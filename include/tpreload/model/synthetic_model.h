// Synthetic checkpoints for a model config (the demo, the benchmark, the GPU
// check, `reload_ckpt generate`). No torch here.
#pragma once

#include <string>
#include <vector>

#include "tpreload/checkpoint/synthetic.h"
#include "tpreload/model/config.h"

namespace tpreload {

// Every tensor a Hugging Face checkpoint for `config` holds, in the config's dtype
// (an FP8 checkpoint's quantized weights and scales in theirs).
std::vector<TensorSpec> checkpoint_specs(const ModelConfig& config);

// Write a seeded checkpoint for `config` into `dir` (generate_checkpoint) and
// its config.json beside it. Throws as generate_checkpoint does, and
// CheckpointError when config.json cannot be written.
void generate_model_checkpoint(const ModelConfig& config, const std::string& dir,
                               const GenerateOptions& options);

}  // namespace tpreload
