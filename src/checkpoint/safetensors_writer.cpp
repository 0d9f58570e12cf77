// safetensors writers (see writers.h).
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "file_util.h"
#include "shape_util.h"
#include "tpreload/checkpoint/writers.h"
#include "tpreload/core/error.h"
#include "writer_util.h"

namespace tpreload {
namespace detail {

std::vector<std::uint64_t> checked_specs(const std::vector<TensorSpec>& tensors,
                                         const std::string& path) {
  std::set<std::string> seen;
  std::vector<std::uint64_t> sizes;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      raise<UsageError>("writing '", path, "': invalid tensor name '", t.name, "'");
    if (!seen.insert(t.name).second)
      raise<UsageError>("writing '", path, "': duplicate tensor name '", t.name, "'");
    const auto n = checked_nbytes(t.shape, t.dtype);
    if (!n)
      raise<UsageError>("writing '", path, "': tensor '", t.name, "': shape ",
                        shape_string(t.shape), " is negative or overflows 64 bits");
    sizes.push_back(*n);
  }
  return sizes;
}

std::vector<TensorSpec> specs_from_memory(const std::vector<InMemoryTensor>& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  return specs;
}

FillFn fill_from_memory(const std::vector<InMemoryTensor>& tensors) {
  return [&tensors](std::size_t index, MutableBytes dst) {
    const InMemoryTensor& t = tensors.at(index);
    if (t.bytes.size != dst.size)
      raise<UsageError>("in-memory tensor '", t.name, "': shape ", shape_string(t.shape), " x ",
                        dtype_name(t.dtype), " needs ", dst.size, " bytes, got ", t.bytes.size);
    if (dst.size > 0) std::memcpy(dst.data, t.bytes.data, dst.size);
  };
}

}  // namespace detail

namespace {

using ordered_json = nlohmann::ordered_json;

// Data order: stably grouped by element size, largest first.
std::vector<std::size_t> data_order(const std::vector<TensorSpec>& tensors) {
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype);
  });
  return order;
}

std::string header_text(const std::vector<TensorSpec>& tensors,
                        const std::vector<std::uint64_t>& sizes,
                        const std::vector<std::size_t>& order, const Metadata& metadata) {
  ordered_json j = ordered_json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const std::size_t i : order) {
    j[tensors[i].name] = {{"dtype", std::string(dtype_safetensors_name(tensors[i].dtype))},
                          {"shape", tensors[i].shape},
                          {"data_offsets", {offset, offset + sizes[i]}}};
    offset += sizes[i];
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void write_file(detail::AtomicFile& out, const std::vector<TensorSpec>& tensors,
                const std::vector<std::size_t>& indices, const FillFn& fill,
                const Metadata& metadata) {
  std::vector<TensorSpec> subset;
  for (const std::size_t i : indices) subset.push_back(tensors[i]);
  const auto sizes = detail::checked_specs(subset, out.target());
  const auto order = data_order(subset);
  const std::string header = header_text(subset, sizes, order, metadata);
  unsigned char len[8];
  for (int b = 0; b < 8; ++b) len[b] = static_cast<unsigned char>(header.size() >> (8 * b));
  out.write(len, 8);
  out.write(header.data(), header.size());
  std::vector<std::byte> buffer;
  for (const std::size_t i : order) {
    buffer.assign(sizes[i], std::byte{0});
    fill(indices[i], MutableBytes(buffer.data(), buffer.size()));
    out.write(buffer.data(), buffer.size());
  }
}

// Contiguous runs of about equal bytes, each non-empty: the first index of each shard.
std::vector<std::size_t> shard_starts(const std::vector<std::uint64_t>& sizes, int num_shards) {
  const std::size_t n = sizes.size(), k = static_cast<std::size_t>(num_shards);
  unsigned __int128 total = 0;
  for (const auto s : sizes) total += s;
  std::vector<std::size_t> starts;
  std::size_t i = 0;
  unsigned __int128 before = 0;
  for (std::size_t s = 0; s < k; ++s) {
    starts.push_back(i);
    before += sizes[i++];
    const unsigned __int128 target = total * (s + 1) / k;
    while (s + 1 < k && i < n - (k - 1 - s) && before + sizes[i] / 2 <= target)
      before += sizes[i++];
  }
  return starts;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                       const FillFn& fill, const Metadata& metadata) {
  detail::AtomicFile out(path);
  std::vector<std::size_t> all(tensors.size());
  std::iota(all.begin(), all.end(), 0);
  write_file(out, tensors, all, fill, metadata);
  out.commit();
}

void write_safetensors(const std::string& path, const std::vector<InMemoryTensor>& tensors,
                       const Metadata& metadata) {
  write_safetensors(path, detail::specs_from_memory(tensors), detail::fill_from_memory(tensors),
                    metadata);
}

std::string safetensors_shard_name(int index, int count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", index + 1, count);
  return name;
}

std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   const std::vector<TensorSpec>& tensors,
                                                   const FillFn& fill, int num_shards,
                                                   const Metadata& metadata) {
  if (num_shards < 1 || static_cast<std::size_t>(num_shards) > tensors.size())
    raise<UsageError>("writing '", dir, "': ", num_shards, " shards for ", tensors.size(),
                      " tensors (need 1 <= shards <= tensors)");
  const auto sizes = detail::checked_specs(tensors, dir);
  detail::make_directories(dir);
  auto starts = shard_starts(sizes, num_shards);
  starts.push_back(tensors.size());
  std::vector<detail::AtomicFile> files;
  std::vector<std::string> names;
  nlohmann::json weight_map = nlohmann::json::object();
  std::uint64_t total = 0;
  for (int s = 0; s < num_shards; ++s) {
    names.push_back(safetensors_shard_name(s, num_shards));
    files.emplace_back(detail::join_path(dir, names.back()));
    std::vector<std::size_t> indices(starts[s + 1] - starts[s]);
    std::iota(indices.begin(), indices.end(), starts[s]);
    for (const std::size_t i : indices) {
      weight_map[tensors[i].name] = names.back();
      total += sizes[i];
    }
    write_file(files.back(), tensors, indices, fill, metadata);
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  names.push_back("model.safetensors.index.json");
  files.emplace_back(detail::join_path(dir, names.back()));
  files.back().write(text.data(), text.size());
  for (auto& f : files) f.commit();
  return names;
}

std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   const std::vector<InMemoryTensor>& tensors,
                                                   int num_shards, const Metadata& metadata) {
  return write_safetensors_sharded(dir, detail::specs_from_memory(tensors),
                                   detail::fill_from_memory(tensors), num_shards, metadata);
}

std::vector<TensorSpec> specs_of(const WeightSource& source) {
  std::vector<TensorSpec> specs;
  for (const auto& t : source.tensors()) {
    if (t.tp_rank >= 0)
      raise<UsageError>(source.describe(),
                        ": kernel-format shards cannot be copied as one "
                        "checkpoint (tensor '",
                        t.name, "' of rank ", t.tp_rank, ")");
    specs.push_back({t.name, t.dtype, t.shape});
  }
  return specs;
}

FillFn fill_from(WeightSource& source) {
  return [&source](std::size_t index, MutableBytes dst) { source.read(index, {0, dst.size}, dst); };
}

}  // namespace tpreload
