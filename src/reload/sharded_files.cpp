#include "tpreload/reload/sharded_files.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tpreload/checkpoint/writers.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kManifest = "manifest.json";
constexpr const char* kFormat = "tpreload-sharded-source";
constexpr const char* kBoxesKey = "tpreload.boxes";

std::string rank_file(int rank) {
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05d.safetensors", rank);
  return name;
}

}  // namespace

std::string_view split_by_name(SplitBy by) {
  return by == SplitBy::kRows ? "rows" : by == SplitBy::kColumns ? "cols" : "whole";
}

std::optional<SplitBy> parse_split_by(std::string_view name) {
  for (SplitBy by : {SplitBy::kRows, SplitBy::kColumns, SplitBy::kWhole})
    if (split_by_name(by) == name) return by;
  return std::nullopt;
}

std::vector<Box> split_boxes(const std::vector<std::int64_t>& shape, std::size_t index, SplitBy by,
                             int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    raise<UsageError>("split: rank ", rank, " of ", ranks);
  if (by == SplitBy::kWhole || shape.empty()) {
    const int owner =
        by == SplitBy::kWhole ? static_cast<int>(index % static_cast<std::size_t>(ranks)) : 0;
    if (rank != owner) return {};
    return {Box::whole(shape)};
  }
  const int dim = by == SplitBy::kColumns && shape.size() >= 2 ? 1 : 0;
  Box box = slice_box(shape, dim, rank, ranks);
  if (box.elements() == 0 && box.size[static_cast<std::size_t>(dim)] == 0) return {};
  return {box};
}

void read_box(WeightSource& source, std::size_t index, const Box& box, MutableBytes dst,
              std::vector<std::byte>& scratch) {
  const TensorInfo& t = source.tensors().at(index);
  // Rows with every other dimension whole are one run of the tensor.
  bool rows = !box.offset.empty();
  for (std::size_t d = 1; rows && d < box.size.size(); ++d) rows = box.size[d] == t.shape[d];
  if (rows) {
    const std::uint64_t row_bytes =
        t.shape[0] == 0 ? 0 : t.nbytes / static_cast<std::uint64_t>(t.shape[0]);
    return source.read(index, {static_cast<std::uint64_t>(box.offset[0]) * row_bytes, dst.size},
                       dst);
  }
  if (box == Box::whole(t.shape)) return source.read(index, {0, t.nbytes}, dst);
  scratch.resize(t.nbytes);
  source.read(index, {0, t.nbytes}, MutableBytes(scratch.data(), scratch.size()));
  copy_region(ConstBytes(scratch.data(), scratch.size()), Box::whole(t.shape), dst, box, box,
              dtype_size(t.dtype));
}

std::vector<HeldTensor> read_split(WeightSource& source, SplitBy by, int rank, int ranks) {
  std::vector<HeldTensor> held;
  std::vector<std::byte> scratch;
  for (std::size_t i = 0; i < source.tensors().size(); ++i) {
    const TensorInfo& t = source.tensors()[i];
    for (const Box& box : split_boxes(t.shape, i, by, rank, ranks)) {
      auto bytes = std::make_shared<std::vector<std::byte>>(
          static_cast<std::size_t>(box.elements()) * dtype_size(t.dtype));
      read_box(source, i, box, MutableBytes(bytes->data(), bytes->size()), scratch);
      held.push_back(
          {t.name, t.dtype, t.shape, box, ConstBytes(bytes->data(), bytes->size()), bytes});
    }
  }
  return held;
}

std::vector<std::string> write_split_source(const std::string& dir, WeightSource& source, int ranks,
                                            SplitBy by) {
  if (ranks < 1) raise<UsageError>("split: --ranks must be at least 1, got ", ranks);
  if (source.kernel_format())
    raise<UsageError>("split: ", source.describe(),
                      " is kernel-format shards; a split is made of a checkpoint");
  fs::create_directories(dir);
  const std::vector<TensorInfo>& tensors = source.tensors();
  std::vector<std::string> files;
  std::vector<std::byte> whole;
  for (int r = 0; r < ranks; ++r) {
    std::vector<TensorSpec> specs;
    std::vector<std::pair<std::size_t, Box>> parts;  // (tensor, box) per spec
    json boxes = json::object();
    for (std::size_t i = 0; i < tensors.size(); ++i)
      for (const Box& box : split_boxes(tensors[i].shape, i, by, r, ranks)) {
        specs.push_back({tensors[i].name, tensors[i].dtype, box.size});
        parts.emplace_back(i, box);
        boxes[tensors[i].name] = {{"shape", tensors[i].shape}, {"offset", box.offset}};
      }
    const FillFn fill = [&](std::size_t k, MutableBytes dst) {
      read_box(source, parts[k].first, parts[k].second, dst, whole);
    };
    files.push_back(rank_file(r));
    write_safetensors((fs::path(dir) / files.back()).string(), specs, fill,
                      {{kBoxesKey, boxes.dump()}});
  }
  const json manifest = {{"format", kFormat},
                         {"version", 1},
                         {"ranks", ranks},
                         {"by", std::string(split_by_name(by))},
                         {"files", files}};
  const std::string path = (fs::path(dir) / kManifest).string();
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary);
    out << manifest.dump(2) << "\n";
    if (!out.flush()) raise<CheckpointError>("split: cannot write '", temporary, "'");
  }
  fs::rename(temporary, path);
  files.push_back(kManifest);
  return files;
}

std::unique_ptr<ShardedSource> open_split_source(const std::string& dir, int rank) {
  const std::string manifest_path = (fs::path(dir) / kManifest).string();
  std::ifstream in(manifest_path);
  if (!in.is_open())
    raise<CheckpointError>("sharded source: no '", manifest_path,
                           "' (a split made by `reload_ckpt split`)");
  json manifest;
  int ranks = 0;
  std::vector<std::string> files;
  try {
    in >> manifest;
    if (manifest.at("format").get<std::string>() != kFormat)
      raise<CheckpointError>("format '", manifest.at("format").get<std::string>(), "'");
    ranks = manifest.at("ranks").get<int>();
    files = manifest.at("files").get<std::vector<std::string>>();
    if (ranks < 1 || files.size() != static_cast<std::size_t>(ranks))
      raise<CheckpointError>(ranks, " ranks with ", files.size(), " files");
  } catch (const std::exception& e) {
    raise<CheckpointError>("sharded source: '", manifest_path,
                           "' is not a split's manifest: ", e.what());
  }
  if (rank >= ranks) return std::make_unique<ShardedSource>();
  const std::string path = (fs::path(dir) / files[static_cast<std::size_t>(rank)]).string();
  std::shared_ptr<WeightSource> file = open_weight_source(path);
  json boxes;
  try {
    boxes = json::parse(file->metadata().at(kBoxesKey));
  } catch (const std::exception& e) {
    raise<CheckpointError>("sharded source: '", path, "' has no valid '", kBoxesKey,
                           "' metadata: ", e.what());
  }
  std::vector<HeldTensor> held;
  for (std::size_t i = 0; i < file->tensors().size(); ++i) {
    const TensorInfo& t = file->tensors()[i];
    HeldTensor h;
    h.name = t.name;
    h.dtype = t.dtype;
    try {
      const json& b = boxes.at(t.name);
      h.shape = b.at("shape").get<std::vector<std::int64_t>>();
      h.box = {b.at("offset").get<std::vector<std::int64_t>>(), t.shape};
    } catch (const std::exception& e) {
      raise<CheckpointError>("sharded source: '", path, "': tensor '", t.name,
                             "' has no box in its metadata: ", e.what());
    }
    if (const auto view = file->view(i, {0, t.nbytes})) {
      h.bytes = *view;
      h.keep_alive = file;
    } else {
      auto bytes = std::make_shared<std::vector<std::byte>>(t.nbytes);
      file->read(i, {0, t.nbytes}, MutableBytes(bytes->data(), bytes->size()));
      h.bytes = ConstBytes(bytes->data(), bytes->size());
      h.keep_alive = bytes;
    }
    held.push_back(std::move(h));
  }
  try {
    return std::make_unique<ShardedSource>(std::move(held));
  } catch (const CheckpointError& e) {
    raise<CheckpointError>("'", path, "': ", e.what());
  }
}

}  // namespace tpreload
