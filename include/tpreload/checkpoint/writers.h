// Checkpoint writers: safetensors (one file, or a Hugging Face sharded set with
// model.safetensors.index.json) and HDF5 (one dataset per tensor).
//
// Every writer is atomic: each file is written under a temporary name in its
// directory and renamed into place only after everything succeeded, so a failure
// (a throwing fill callback included) leaves no partial file behind.
//
// Tensor bytes come from a fill callback, called once per tensor, in the order the
// tensors are laid out in the file, with a buffer of exactly nbytes: peak memory is
// one tensor. The callback runs outside the HDF5 lock, so it may read from an HDF5
// source. Overloads take in-memory
// tensors. All writers throw CheckpointError (I/O, HDF5) or UsageError (invalid
// names, shapes, byte counts, shard counts), naming the file and tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/dtype.h"
#include "tpreload/core/span.h"

namespace tpreload {

// A tensor to write: name, dtype and shape; the bytes come from the fill callback.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
};

// Fill `dst` (exactly nbytes of tensors[index]) with that tensor's little-endian bytes.
using FillFn = std::function<void(std::size_t index, MutableBytes dst)>;

using Metadata = std::map<std::string, std::string>;

// ---- safetensors -----------------------------------------------------------------

// Write one .safetensors file. Data is laid out in the order given except that
// tensors are stably grouped by element size, largest first (as the reference
// implementation does, so that every tensor is aligned to its element size); the
// header is padded with spaces to a multiple of 8 bytes. Names must be unique and
// non-empty and must not be "__metadata__".
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                       const FillFn& fill, const Metadata& metadata = {});
void write_safetensors(const std::string& path, const std::vector<InMemoryTensor>& tensors,
                       const Metadata& metadata = {});

// Hugging Face file name of shard `index` (0-based) of `count`:
// "model-00001-of-00003.safetensors".
std::string safetensors_shard_name(int index, int count);

// Write `num_shards` files model-0000i-of-0000K.safetensors into `dir` (created if
// missing) plus model.safetensors.index.json ({"metadata": {"total_size": N},
// "weight_map": {name: file}}). Tensors keep their order and are cut into
// contiguous runs of about equal bytes; every shard holds at least one tensor, so
// num_shards must be in [1, tensors.size()]. `metadata` goes into every shard's
// "__metadata__". Returns the file names written (shards, then the index).
std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   const std::vector<TensorSpec>& tensors,
                                                   const FillFn& fill, int num_shards,
                                                   const Metadata& metadata = {});
std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   const std::vector<InMemoryTensor>& tensors,
                                                   int num_shards, const Metadata& metadata = {});

// ---- HDF5 ------------------------------------------------------------------------

enum class Hdf5Layout {
  kNested,  // "a.b.c" -> dataset c in group /a/b (the default)
  kFlat,    // "a.b.c" -> dataset "/a.b.c" at the root
};

struct Hdf5WriteOptions {
  Hdf5Layout layout = Hdf5Layout::kNested;
  int gzip_level = 0;  // 0: contiguous, uncompressed; 1-9: chunked + gzip (deflate)
  std::uint64_t chunk_bytes = 1 << 20;  // target chunk size when chunked
};

// Write an HDF5 file, one dataset per tensor, in creation order (tracked, so that
// readers list tensors in the order written). Types are little-endian: float16 as
// the 16-bit IEEE type h5py uses, bfloat16 as uint16 with a string attribute
// dtype="bfloat16", bool as h5py's int8 enum {FALSE=0, TRUE=1}. In the nested
// layout a name may not be both a tensor and a group prefix of another tensor.
void write_hdf5(const std::string& path, const std::vector<TensorSpec>& tensors, const FillFn& fill,
                const Hdf5WriteOptions& options = {});
void write_hdf5(const std::string& path, const std::vector<InMemoryTensor>& tensors,
                const Hdf5WriteOptions& options = {});

// ---- copying ---------------------------------------------------------------------

// The specs of every tensor of `source` and a fill callback reading each one whole
// through source.read(). For kernel-format sources (tp_rank >= 0) throws UsageError.
std::vector<TensorSpec> specs_of(const WeightSource& source);
FillFn fill_from(WeightSource& source);

}  // namespace tpreload
