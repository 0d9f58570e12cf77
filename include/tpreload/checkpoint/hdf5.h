// HDF5 checkpoints (read through the libhdf5 C API).
//
// Conventions (docs/CHECKPOINTS.md has the details):
// - One dataset per tensor. A dataset's path with '/' replaced by '.' is the tensor
//   name, so both layouts read the same: a flat dataset "/model.norm.weight" at the
//   root and a nested one "/model/norm/weight" are "model.norm.weight" (a name that
//   occurs in both layouts is an error).
// - Any storage libhdf5 reads: contiguous, compact, chunked, gzip-compressed.
// - Types: IEEE float16/32/64 (float16 as h5py writes numpy.float16), signed
//   int8/32/64, uint8, bool as h5py's int8 enum {FALSE, TRUE}; bfloat16 is a uint16
//   dataset with a string attribute dtype="bfloat16". Any other type (int16, a
//   compound, a string, ...) is an error, and so is the bfloat16 attribute on a
//   dataset that is not 16-bit unsigned. A "dtype" attribute, when present, must
//   name the dataset's type. Byte order is converted: bytes are always
//   little-endian.
#pragma once

#include <memory>
#include <string>

#include "tpreload/checkpoint/weight_source.h"

namespace tpreload {

// Open an HDF5 file and list its datasets (names, types and shapes only; no data is
// read). Tensors are listed depth-first, group by group: within a group in
// creation order when every group tracks it (files written by write_hdf5), else
// in name order. view() always returns nullopt;
// read() selects just the requested elements (a hyperslab of the flattened
// tensor), so memory stays bounded by the range. libhdf5 calls are serialised by a
// process-wide lock. Throws CheckpointError "hdf5 file '<path>': ..." naming the
// tensor and dataset, including the HDF5 error stack for library failures.
std::unique_ptr<WeightSource> open_hdf5(const std::string& path);

// Whether `path` is a regular file with the HDF5 signature (no exception).
bool is_hdf5_file(const std::string& path);

}  // namespace tpreload
