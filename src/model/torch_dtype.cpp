#include "tpreload/model/torch_dtype.h"

#include "tpreload/core/error.h"

namespace tpreload {
namespace {

constexpr std::pair<DType, c10::ScalarType> kPairs[] = {
    {DType::kFloat32, c10::ScalarType::Float},
    {DType::kFloat16, c10::ScalarType::Half},
    {DType::kBFloat16, c10::ScalarType::BFloat16},
    {DType::kInt8, c10::ScalarType::Char},
    {DType::kInt32, c10::ScalarType::Int},
    {DType::kInt64, c10::ScalarType::Long},
    {DType::kUInt8, c10::ScalarType::Byte},
    {DType::kBool, c10::ScalarType::Bool},
    {DType::kFloat64, c10::ScalarType::Double},
#if TPRELOAD_TORCH_HAS_FLOAT8
    {DType::kFloat8E4M3, c10::ScalarType::Float8_e4m3fn},
    {DType::kFloat8E5M2, c10::ScalarType::Float8_e5m2},
#endif
};

}  // namespace

DType dtype_from_torch(c10::ScalarType type) {
  for (auto [dtype, scalar] : kPairs)
    if (scalar == type) return dtype;
  raise<UsageError>("torch scalar type ", c10::toString(type), " has no tpreload dtype");
}

DType dtype_from_torch(c10::ScalarType type, DType expected) {
  if (!TPRELOAD_TORCH_HAS_FLOAT8 && dtype_is_float8(expected) && type == c10::ScalarType::Byte)
    return expected;
  return dtype_from_torch(type);
}

c10::ScalarType dtype_to_torch(DType dtype) {
  for (auto [d, scalar] : kPairs)
    if (d == dtype) return scalar;
  if (dtype_is_float8(dtype)) return c10::ScalarType::Byte;  // (a LibTorch without float8)
  raise<UsageError>("invalid DType value ", static_cast<int>(dtype));
}

}  // namespace tpreload
