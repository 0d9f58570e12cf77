// The quantization schemes a model can be built with (ModelOptions::quantization,
// --quantization, kernel_format.json's "quantization"): the one list every
// front end and file format checks names against. What each scheme does lives
// with the rules (sharding.h): int8 in quantize.h, fp8 in fp8_checkpoint.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tpreload {

// The schemes by name: "int8" (weight-only, per-row scales), "fp8" (vLLM's
// online FP8: dynamic per-tensor scales, computed where the weights land) and
// "fp8-block" (online FP8 with a float32 scale per 128 x 128 block).
const std::vector<std::string>& quantization_schemes();
// "" (none) and the schemes: what an option may be set to.
std::vector<std::string> quantization_choices();
// "" (none) or one of quantization_schemes().
bool known_quantization(std::string_view name);
// For messages and help: "\"int8\" or \"fp8\"".
std::string quantization_list();
// One line per scheme: what --quantization NAME does.
std::string quantization_help();

// Whether `name` quantizes weights to FP8 where they land ("fp8", "fp8-block").
bool online_fp8(std::string_view name);
// The block edge of an online block-scaled scheme ("fp8-block": 128), else 0.
std::int64_t online_fp8_block(std::string_view name);

}  // namespace tpreload
