#include "tpreload/core/dtype.h"

#include "tpreload/core/error.h"

namespace tpreload {
namespace {

struct DTypeInfo {
  DType dtype;
  std::size_t size;
  std::string_view name;
  std::string_view safetensors;
  bool floating;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kFloat32, 4, "float32", "F32", true},
    {DType::kFloat16, 2, "float16", "F16", true},
    {DType::kBFloat16, 2, "bfloat16", "BF16", true},
    {DType::kInt8, 1, "int8", "I8", false},
    {DType::kInt32, 4, "int32", "I32", false},
    {DType::kInt64, 8, "int64", "I64", false},
    {DType::kUInt8, 1, "uint8", "U8", false},
    {DType::kBool, 1, "bool", "BOOL", false},
    {DType::kFloat64, 8, "float64", "F64", true},
    {DType::kFloat8E4M3, 1, "float8_e4m3fn", "F8_E4M3", false},
    {DType::kFloat8E5M2, 1, "float8_e5m2", "F8_E5M2", false},
};

const DTypeInfo& info(DType dtype) {
  for (const auto& i : kInfo)
    if (i.dtype == dtype) return i;
  raise<UsageError>("invalid DType value ", static_cast<int>(dtype));
}

}  // namespace

std::size_t dtype_size(DType dtype) {
  return info(dtype).size;
}
std::string_view dtype_name(DType dtype) {
  return info(dtype).name;
}
std::string_view dtype_safetensors_name(DType dtype) {
  return info(dtype).safetensors;
}
bool dtype_is_floating(DType dtype) {
  return info(dtype).floating;
}
bool dtype_is_float8(DType dtype) {
  return dtype == DType::kFloat8E4M3 || dtype == DType::kFloat8E5M2;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.name == name) return i.dtype;
  if (name == "float") return DType::kFloat32;
  if (name == "half") return DType::kFloat16;
  if (name == "double") return DType::kFloat64;
  return std::nullopt;
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.safetensors == name) return i.dtype;
  return std::nullopt;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace tpreload
