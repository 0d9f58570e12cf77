#include <gtest/gtest.h>

#include "tpreload/core/error.h"
#include "tpreload/model/torch_dtype.h"

namespace tpreload {
namespace {

TEST(TorchDType, EveryDTypeMapsBothWaysWithTheSameElementSize) {
  for (DType dtype : kAllDTypes) {
    const c10::ScalarType scalar = dtype_to_torch(dtype);
    EXPECT_EQ(dtype_from_torch(scalar), dtype) << dtype_name(dtype);
    EXPECT_EQ(c10::elementSize(scalar), dtype_size(dtype)) << dtype_name(dtype);
  }
}

TEST(TorchDType, UnsupportedScalarTypeIsAUsageError) {
  EXPECT_THROW(dtype_from_torch(c10::ScalarType::ComplexFloat), UsageError);
}

}  // namespace
}  // namespace tpreload
