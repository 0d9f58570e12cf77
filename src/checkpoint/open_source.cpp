// open_weight_source(): dispatch on what a path names (see weight_source.h).
#include <algorithm>
#include <cstring>

#include "file_util.h"
#include "tpreload/checkpoint/hdf5.h"
#include "tpreload/checkpoint/kernel_format.h"
#include "tpreload/checkpoint/safetensors.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"

namespace tpreload {

void WeightSource::read_split(std::size_t index, ByteRange range,
                              const std::vector<MutableBytes>& parts) {
  detail::check_split(tensors().at(index).name, range, parts);
  std::vector<std::byte> scratch;
  ConstBytes bytes;
  if (auto v = view(index, range)) {
    bytes = *v;
  } else {
    scratch.resize(range.length);
    read(index, range, MutableBytes(scratch.data(), scratch.size()));
    bytes = ConstBytes(scratch.data(), scratch.size());
  }
  std::size_t at = 0;
  for (const MutableBytes& part : parts) {
    if (part.size > 0) std::memcpy(part.data, bytes.data + at, part.size);
    at += part.size;
  }
}

// Small requests that continue each other within one tensor (a row-parallel
// piece's column windows, row after row) are one read_split: one read of the
// rows for sources that read tensor by tensor (HDF5), not one per window. Large
// requests are read straight into their destinations (a read_split without a
// view would read them into a scratch buffer and copy them).
void WeightSource::read_many(const std::vector<ReadRequest>& requests) {
  constexpr std::uint64_t kSmall = 64 * 1024;
  std::vector<MutableBytes> parts;
  for (std::size_t i = 0; i < requests.size();) {
    const ReadRequest& first = requests[i];
    std::size_t j = i + 1;
    while (j < requests.size() && requests[j].index == first.index &&
           requests[j].range.offset == requests[j - 1].range.end() &&
           requests[j - 1].range.length < kSmall && requests[j].range.length < kSmall)
      ++j;
    for (std::size_t k = i; k < j; ++k)
      if (requests[k].dst.size != requests[k].range.length)
        raise<UsageError>("tensor '", tensors().at(requests[k].index).name, "': read of ",
                          requests[k].range.length, " bytes into a ", requests[k].dst.size,
                          "-byte buffer");
    if (j == i + 1) {
      read(first.index, first.range, first.dst);
    } else {
      parts.clear();
      for (std::size_t k = i; k < j; ++k) parts.push_back(requests[k].dst);
      read_split(first.index,
                 {first.range.offset, requests[j - 1].range.end() - first.range.offset}, parts);
    }
    i = j;
  }
}

namespace {

bool has_hdf5_extension(const std::string& path) {
  return detail::ends_with(path, ".h5") || detail::ends_with(path, ".hdf5");
}

// A directory's checkpoint: kernel_format.json, else its safetensors (an HDF5
// file beside them, such as a Hugging Face repository's TensorFlow
// tf_model.h5, is not read), else its one HDF5 file.
std::unique_ptr<WeightSource> open_directory(const std::string& dir,
                                             const std::shared_ptr<const KnownListing>& known) {
  if (detail::is_regular_file(detail::join_path(dir, kKernelFormatFile)))
    return open_kernel_format(dir, known);
  if (detail::is_regular_file(detail::join_path(dir, "model.safetensors.index.json")) ||
      !detail::list_files(dir, ".safetensors").empty())
    return open_safetensors(dir, known);
  auto h5 = detail::list_files(dir, ".h5");
  for (auto& name : detail::list_files(dir, ".hdf5")) h5.push_back(name);
  if (h5.size() == 1) return open_hdf5(detail::join_path(dir, h5.front()));
  if (h5.size() > 1) {
    std::string named;  // the first three
    for (std::size_t i = 0; i < std::min<std::size_t>(h5.size(), 3); ++i)
      named += (i ? ", '" : "'") + h5[i] + "'";
    raise<CheckpointError>("directory '", dir, "' holds ", h5.size(), " HDF5 files (", named,
                           h5.size() > 3 ? ", ..." : "", "); name one of them");
  }
  raise<CheckpointError>("directory '", dir,
                         "' holds no checkpoint: expected kernel_format.json, "
                         "model.safetensors.index.json, *.safetensors or one .h5/.hdf5 file");
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

}  // namespace

std::unique_ptr<WeightSource> open_weight_source(const std::string& path,
                                                 std::shared_ptr<const KnownListing> known) {
  if (detail::is_directory(path)) return open_directory(path, known);
  if (!detail::is_regular_file(path))
    raise<CheckpointError>("checkpoint '", path, "': no such file or directory");
  const std::string base = base_name(path);
  if (base == kKernelFormatFile || base == "model.safetensors.index.json")
    return open_directory(parent_dir(path), known);
  if (detail::ends_with(path, ".safetensors")) return open_safetensors(path, known);
  if (has_hdf5_extension(path) || is_hdf5_file(path)) return open_hdf5(path);
  raise<CheckpointError>("checkpoint '", path,
                         "': not a .safetensors, .h5/.hdf5 or HDF5 file, nor a checkpoint "
                         "directory");
}

}  // namespace tpreload
