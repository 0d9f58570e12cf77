// Built-in model shapes for the demo, the benchmark and the GPU check, as
// Hugging Face config.json text. No torch here.
#pragma once

#include <string>
#include <vector>

#include "tpreload/model/config.h"

namespace tpreload {

// "tiny" (4 layers, hidden 256), "tinyllama" (TinyLlama-1.1B: 2.2 GB bfloat16),
// "llama3-8b-4l" (Llama-3-8B cut to 4 layers), "qwen3-moe-2l" (Qwen3-30B-A3B cut
// to 2 layers: 128 experts each, 3.7 GB), "small-tensors" (2,300 layers of
// tensors under 64 KB: 20,709 tensors). Throws UsageError naming the known ones.
ModelConfig scenario_config(const std::string& name);
std::vector<std::string> scenario_names();

}  // namespace tpreload
