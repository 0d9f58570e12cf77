// Element types a checkpoint or a parameter can hold, with their sizes and the
// names each format uses for them. No torch here: the model layer maps DType to
// c10::ScalarType (see tpreload/model/torch_dtype.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpreload {

enum class DType : std::uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kInt8,
  kInt32,
  kInt64,
  kUInt8,
  kBool,
  kFloat64,
  kFloat8E4M3,  // e4m3fn (core/float8.h)
  kFloat8E5M2,
};

inline constexpr DType kAllDTypes[] = {DType::kFloat32,    DType::kFloat16,   DType::kBFloat16,
                                       DType::kInt8,       DType::kInt32,     DType::kInt64,
                                       DType::kUInt8,      DType::kBool,      DType::kFloat64,
                                       DType::kFloat8E4M3, DType::kFloat8E5M2};

// Bytes per element.
std::size_t dtype_size(DType dtype);

// Canonical lower-case name: "float32", "bfloat16", "float8_e4m3fn", ... (also
// Hugging Face's `torch_dtype` spelling, torch's, and the HDF5 `dtype` attribute value).
std::string_view dtype_name(DType dtype);

// safetensors header spelling: "F32", "F16", "BF16", "I8", "I32", "I64", "U8", "BOOL", "F64",
// "F8_E4M3", "F8_E5M2".
std::string_view dtype_safetensors_name(DType dtype);

// Parse a canonical name; also accepts "float"/"half"/"double" aliases. nullopt if unknown.
std::optional<DType> dtype_from_name(std::string_view name);

// Parse a safetensors spelling. nullopt if unknown (e.g. "F8_E8M0").
std::optional<DType> dtype_from_safetensors(std::string_view name);

// A shape as errors print it: "[2, 3]" ("[]" for a scalar).
std::string shape_string(const std::vector<std::int64_t>& shape);

// Whether the type is floating point that values convert to and from as they
// land (float16, bfloat16, float32, float64). Not the FP8 types: a value becomes
// FP8 only with a scale (a quantization scheme), never by a plain conversion.
bool dtype_is_floating(DType dtype);

// Whether the type is one of the FP8 types (float8_e4m3fn, float8_e5m2).
bool dtype_is_float8(DType dtype);

}  // namespace tpreload
