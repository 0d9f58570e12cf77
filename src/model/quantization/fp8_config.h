// config.json's quantization_config read into an Fp8Checkpoint (internal to the
// rules: config.cpp calls it).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tpreload/model/fp8_checkpoint.h"

namespace tpreload::detail {

// Absent or null: not FP8. Throws ModelError naming `origin` for another
// quant_method, a malformed block size, activation scheme or list of ignored
// modules, or a static activation scheme with blocks.
Fp8Checkpoint parse_fp8_checkpoint(const nlohmann::json& config, const std::string& origin);

}  // namespace tpreload::detail
