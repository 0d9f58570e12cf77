// Mapping between tpreload's DType and LibTorch's scalar types.
#pragma once

#include <c10/core/ScalarType.h>

#include "tpreload/core/dtype.h"

namespace tpreload {

// Throws UsageError for a scalar type tpreload does not handle (e.g. complex).
DType dtype_from_torch(c10::ScalarType type);
c10::ScalarType dtype_to_torch(DType dtype);

}  // namespace tpreload
