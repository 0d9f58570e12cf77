// Where checkpoint bytes come from. A WeightSource lists its tensors (name, dtype,
// shape, bytes, and where the bytes are) WITHOUT reading tensor data, then hands
// out the bytes of one tensor or a byte range of it: as a zero-copy view where the
// format allows (memory-mapped safetensors, in-memory tensors), or copied into a
// caller's buffer (always).
//
// Sources are opened on the reader rank only; other ranks learn the tensor list
// from the reload engine's metadata broadcast. No torch here.
//
// Errors: opening or listing throws CheckpointError naming the file, the tensor
// and the offending values; read() throws CheckpointError for a failed read.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpreload/core/dtype.h"
#include "tpreload/core/span.h"

namespace tpreload {

struct TensorInfo {
  std::string name;  // e.g. "model.layers.0.self_attn.q_proj.weight"
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::uint64_t nbytes = 0;       // product(shape) * dtype_size(dtype)
  std::string file;               // the file holding the bytes (for messages)
  std::uint64_t file_offset = 0;  // absolute offset of the first byte in `file` (0 if n/a)
  // For kernel-format shards: the tensor-parallel rank this tensor belongs to.
  // -1 for an ordinary (unsharded, checkpoint-format) tensor.
  int tp_rank = -1;

  friend bool operator==(const TensorInfo& a, const TensorInfo& b) {
    return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.nbytes == b.nbytes &&
           a.file == b.file && a.file_offset == b.file_offset && a.tp_rank == b.tp_rank;
  }
  friend bool operator!=(const TensorInfo& a, const TensorInfo& b) { return !(a == b); }
};

// Description of a kernel-format directory (`kernel_format.json`).
struct KernelFormatInfo {
  int tp_size = 1;
  DType dtype = DType::kFloat32;  // dtype of the unquantized parameters
  std::string quantization;       // "" or a scheme of quantization_schemes()
  std::string config_json;        // the model config.json it was made for, verbatim
  bool expert_parallel = false;   // experts split whole over the ranks (MoE models)

  friend bool operator==(const KernelFormatInfo& a, const KernelFormatInfo& b) {
    return a.tp_size == b.tp_size && a.dtype == b.dtype && a.quantization == b.quantization &&
           a.config_json == b.config_json && a.expert_parallel == b.expert_parallel;
  }
  friend bool operator!=(const KernelFormatInfo& a, const KernelFormatInfo& b) { return !(a == b); }
};

// One read of WeightSource::read_many: bytes `range` of tensors()[index] into `dst`.
struct ReadRequest {
  std::size_t index = 0;
  ByteRange range;
  MutableBytes dst;  // dst.size == range.length
};

// A source's listing together with what it was made from (for safetensors:
// every file's path, size and raw header), so that the next open of the same,
// unchanged files takes it instead of parsing again: ~12 ms for a header of
// 20,000 tensors, which in a reload every other rank waits for. A
// ReloadWorkspace keeps the listing of the source its plan was made from
// (ReloadWorkspace::known_listing()). Opaque and immutable: only the kind of
// source that made it reads it, and a source of another kind ignores it.
class KnownListing {
 public:
  virtual ~KnownListing() = default;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // One line for logs: format, path, file and tensor counts.
  virtual std::string describe() const = 0;

  // Every tensor, in a stable order (file order for file formats). Never reads data.
  virtual const std::vector<TensorInfo>& tensors() const = 0;

  // Bytes [range.offset, range.end()) of tensors()[index] without copying, when the
  // format allows it; nullopt otherwise (e.g. HDF5, compressed data). The view
  // stays valid for the lifetime of the source. Throws CheckpointError if the
  // range is out of the tensor's bounds.
  virtual std::optional<ConstBytes> view(std::size_t index, ByteRange range) = 0;

  // Copy bytes [range.offset, range.end()) of tensors()[index] into `dst`
  // (dst.size must equal range.length). Safe to call from one thread at a time.
  virtual void read(std::size_t index, ByteRange range, MutableBytes dst) = 0;

  // Copy bytes [range.offset, range.end()) of tensors()[index] into `parts` in
  // order: the first parts[0].size bytes into parts[0], the next into parts[1], and
  // so on (the sizes must add up to range.length). How a reader cuts row-parallel
  // slices out of full rows with one copy. The default copies out of view() or a
  // read() into a scratch buffer; file sources read straight into the parts.
  virtual void read_split(std::size_t index, ByteRange range,
                          const std::vector<MutableBytes>& parts);

  // read() of each request, in order. File sources merge requests whose bytes
  // follow each other in one file into one preadv, so that a bucket of 2,000
  // small tensors costs a few system calls, not 2,000; the default makes
  // requests that continue each other within one tensor one read_split(). Throws
  // as read() does.
  virtual void read_many(const std::vector<ReadRequest>& requests);

  // Tensor data bytes read or viewed so far (headers and metadata excluded).
  virtual std::uint64_t bytes_read() const = 0;

  // Free-form metadata (safetensors `__metadata__`), empty if the format has none.
  virtual const std::map<std::string, std::string>& metadata() const = 0;

  // Set for kernel-format directories, nullopt for checkpoint-format sources.
  virtual std::optional<KernelFormatInfo> kernel_format() const { return std::nullopt; }

  // Throws CheckpointError naming the file when bytes read through a view (or a
  // mapping inside read()) could not be read because the file changed under it
  // since open (cut short, storage failure). Such reads return zeros instead of
  // ending the process; callers check here after using views. Sources without
  // mappings never throw.
  virtual void check_mapped_reads() const {}

  // This source's listing and what it was made from, for a later open to take
  // (see KnownListing); null for sources that cannot tell their files unchanged
  // without parsing them (HDF5, in-memory tensors).
  virtual std::shared_ptr<const KnownListing> known_listing() const { return nullptr; }
};

// Open what `path` names: a .safetensors file; a directory with
// model.safetensors.index.json (sharded) or with *.safetensors files; a directory
// with kernel_format.json (kernel-format shards); an .h5/.hdf5 file or a directory
// holding exactly one. Throws CheckpointError naming the path when it is none of these.
// `known` (may be null): the listing of an earlier open, taken as this source's
// listing when every file it was made from is byte for byte the same (path, size,
// header); anything else lists and validates the files as if it were not given.
std::unique_ptr<WeightSource> open_weight_source(
    const std::string& path, std::shared_ptr<const KnownListing> known = nullptr);

// A tensor handed over in memory: the bytes are owned by the caller and must
// outlive the source (or be kept alive by `keep_alive`).
struct InMemoryTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  ConstBytes bytes;
  std::shared_ptr<const void> keep_alive;
  // Kernel format: the tensor-parallel rank whose parameter this is (-1 for
  // checkpoint-format tensors).
  int tp_rank = -1;
};

// The in-memory source (vLLM's `weights_iterator`). Checkpoint format by default:
// Hugging Face names, full tensors. With `kernel`, the tensors are in the serving
// layout (vLLM's is_checkpoint_format=False): each named as the model names its
// parameter (".base_layer." spellings accepted) and tagged with its tp rank, and
// a reload copies them by name. Throws CheckpointError for a duplicate name (per
// tp rank), bytes that do not match shape x dtype, or a tp rank outside the
// kernel format's (or given without one).
std::unique_ptr<WeightSource> make_in_memory_source(
    std::vector<InMemoryTensor> tensors, std::optional<KernelFormatInfo> kernel = std::nullopt);

// Tensors handed over one at a time, as a trainer yields them (vLLM's
// weights_iterator consumed lazily: each tensor a gathered temporary that is
// needed only until it has been sent). A reload from a stream
// (reload_from_stream) takes them segment by segment, so that the reader
// holds a few buckets of it at a time, not the model.
class WeightStream {
 public:
  virtual ~WeightStream() = default;
  // One line for logs and the report.
  virtual std::string describe() const = 0;
  // The next tensor, or nullopt once there are no more. Its bytes must stay
  // valid as long as the returned InMemoryTensor (its keep_alive) lives; the
  // reload drops it once its bytes have been sent. May throw: the reload then
  // fails on every rank, naming the error.
  virtual std::optional<InMemoryTensor> next() = 0;
  // Kernel-format tensors (tagged with their tp ranks), as for
  // make_in_memory_source; nullopt for checkpoint tensors.
  virtual std::optional<KernelFormatInfo> kernel_format() const { return std::nullopt; }
};

// A stream that calls `next` for each tensor (nullopt ends it).
std::unique_ptr<WeightStream> make_weight_stream(
    std::function<std::optional<InMemoryTensor>()> next,
    std::optional<KernelFormatInfo> kernel = std::nullopt,
    std::string description = "streamed weights");

}  // namespace tpreload
