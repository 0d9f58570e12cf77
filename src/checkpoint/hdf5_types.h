// Internal: classifying an HDF5 dataset's type as a DType (reader side).
#pragma once

#include <hdf5.h>

#include <optional>
#include <string>

#include "tpreload/core/dtype.h"

namespace tpreload::detail {

// The DType of file type `type`, given the dataset's "dtype" attribute (if any).
// On failure returns nullopt and sets `problem` to the text that follows
// "tensor 'x' (dataset '/x'): " in the error. Caller holds the HDF5 lock.
std::optional<DType> classify_h5_type(hid_t type, const std::optional<std::string>& dtype_attr,
                                      std::string& problem);

// A short description of an HDF5 type: "16-bit signed integer", "compound", ...
std::string describe_h5_type(hid_t type);

// The string attribute `name` of `obj` (fixed or variable length), nullopt when
// absent. Throws CheckpointError if it exists but is not a scalar string.
std::optional<std::string> read_string_attribute(hid_t obj, const char* name,
                                                 const std::string& where);

}  // namespace tpreload::detail
