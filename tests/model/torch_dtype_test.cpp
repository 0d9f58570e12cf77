#include <gtest/gtest.h>

#include "tpreload/core/error.h"
#include "tpreload/model/torch_dtype.h"

namespace tpreload {
namespace {

TEST(TorchDType, EveryDTypeMapsBothWaysWithTheSameElementSize) {
  for (DType dtype : kAllDTypes) {
    const c10::ScalarType scalar = dtype_to_torch(dtype);
    // (FP8 on a LibTorch without FP8 types is held as uint8: the same bytes)
    const DType back = dtype_is_float8(dtype) && !TPRELOAD_TORCH_HAS_FLOAT8 ? DType::kUInt8 : dtype;
    EXPECT_EQ(dtype_from_torch(scalar), back) << dtype_name(dtype);
    EXPECT_EQ(c10::elementSize(scalar), dtype_size(dtype)) << dtype_name(dtype);
  }
}

TEST(TorchDType, UnsupportedScalarTypeIsAUsageError) {
  EXPECT_THROW(dtype_from_torch(c10::ScalarType::ComplexFloat), UsageError);
}

}  // namespace
}  // namespace tpreload
