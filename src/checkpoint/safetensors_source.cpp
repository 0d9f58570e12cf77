// The memory-mapped safetensors source and open_safetensors().
#include "safetensors_source.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "../core/json_depth.h"
#include "file_util.h"
#include "tpreload/checkpoint/safetensors.h"
#include "tpreload/core/error.h"

namespace tpreload::detail {
namespace {

// One file as it was when listed.
struct ListedFile {
  std::string path;
  int tp_rank = -1;
  std::uint64_t size = 0;
  std::string header;  // the raw JSON text
  friend bool operator==(const ListedFile& a, const ListedFile& b) {
    return a.tp_rank == b.tp_rank && a.size == b.size && a.path == b.path && a.header == b.header;
  }
};

// The listing of a set of files, and the files as they were: the listing is a
// function of `files` and `tp_size` alone, so a later open whose files compare
// equal takes it as it is.
struct SafetensorsListing final : KnownListing {
  std::vector<ListedFile> files;
  int tp_size = 0;  // kernel_format.json's, which each rank file's metadata was checked against
  std::vector<TensorInfo> tensors;
  std::vector<std::size_t> file_of;             // per tensor: its index in `files`
  std::map<std::string, std::string> metadata;  // the files' "__metadata__", first file wins
};

class SafetensorsSource final : public WeightSource {
 public:
  SafetensorsSource(const std::vector<SafetensorsShard>& shards, SafetensorsSourceOptions options,
                    const std::shared_ptr<const KnownListing>& known)
      : options_(std::move(options)) {
    // Each file is opened once: its header is read from the descriptor it is
    // mapped through, so header and data are one file's even if another is
    // renamed over the path meanwhile.
    std::vector<ListedFile> files;
    files.reserve(shards.size());
    maps_.reserve(shards.size());
    for (const auto& shard : shards) {
      maps_.push_back(MappedFile::open(shard.path));
      SafetensorsHeaderText h =
          read_safetensors_header_text(maps_.back().fd(), maps_.back().size(), shard.path);
      files.push_back({shard.path, shard.tp_rank, h.file_size, std::move(h.text)});
    }
    const int tp_size = options_.kernel_format ? options_.kernel_format->tp_size : 0;
    const auto* same = dynamic_cast<const SafetensorsListing*>(known.get());
    if (same && same->tp_size == tp_size && same->files == files)
      listing_ = std::static_pointer_cast<const SafetensorsListing>(known);
    else
      listing_ = list(std::move(files), tp_size);
    metadata_ = listing_->metadata;
    for (auto& [key, value] : options_.extra_metadata) metadata_[key] = value;
  }

  std::string describe() const override {
    return concat(options_.label, ": ", maps_.size(), " file(s), ", listing_->tensors.size(),
                  " tensors");
  }
  const std::vector<TensorInfo>& tensors() const override { return listing_->tensors; }
  std::shared_ptr<const KnownListing> known_listing() const override { return listing_; }

  std::optional<ConstBytes> view(std::size_t index, ByteRange range) override {
    const ConstBytes bytes = locate(index, range);
    bytes_read_ += range.length;
    return bytes;
  }

  void read(std::size_t index, ByteRange range, MutableBytes dst) override {
    if (dst.size != range.length)
      raise<UsageError>("tensor '", listing_->tensors.at(index).name, "': read of ", range.length,
                        " bytes into a ", dst.size, "-byte buffer");
    // pread, not a copy out of the mapping: the kernel copies from the page cache
    // through its own large-page map, while a copy out of a fresh mapping takes a
    // page fault and a TLB miss per 4 KiB (4x slower for a 2 GB checkpoint).
    const ConstBytes bytes = locate(index, range);
    const MappedFile& map = maps_[listing_->file_of[index]];
    if (bytes.size > 0)
      for_tensors(index, index, 1, [&] {
        pread_exact(map.fd(), dst.data, bytes.size,
                    static_cast<std::uint64_t>(bytes.data - map.data()), map.path());
      });
    bytes_read_ += range.length;
  }

  void read_split(std::size_t index, ByteRange range,
                  const std::vector<MutableBytes>& parts) override {
    check_split(listing_->tensors.at(index).name, range, parts);
    const ConstBytes bytes = locate(index, range);
    const MappedFile& map = maps_[listing_->file_of[index]];
    for_tensors(index, index, 1, [&] {
      preadv_exact(map.fd(), parts, static_cast<std::uint64_t>(bytes.data - map.data()),
                   map.path());
    });
    bytes_read_ += range.length;
  }

  // Requests that follow each other in one file, or leave at most kReadThrough
  // bytes between them (read into a discarded scratch page: cheaper than another
  // system call), are one preadv.
  void read_many(const std::vector<ReadRequest>& requests) override {
    std::vector<MutableBytes>& run = run_;  // destinations of file-adjacent requests
    run.clear();
    std::size_t shard = 0, first = 0, last = 0, count = 0;  // the run's tensors
    std::uint64_t start = 0, end = 0, wanted = 0;
    auto flush = [&] {
      if (run.empty()) return;
      const MappedFile& map = maps_[shard];
      for_tensors(first, last, count, [&] { preadv_exact(map.fd(), run, start, map.path()); });
      bytes_read_ += wanted;
      run.clear();
      wanted = 0;
      count = 0;
    };
    for (const ReadRequest& r : requests) {
      if (r.dst.size != r.range.length)
        raise<UsageError>("tensor '", listing_->tensors.at(r.index).name, "': read of ",
                          r.range.length, " bytes into a ", r.dst.size, "-byte buffer");
      const ConstBytes bytes = locate(r.index, r.range);
      const std::size_t s = listing_->file_of[r.index];
      const auto offset = static_cast<std::uint64_t>(bytes.data - maps_[s].data());
      if (!run.empty() && s == shard && offset > end && offset - end <= kReadThrough) {
        run.emplace_back(gap_.data(), offset - end);
      } else if (run.empty() || s != shard || offset != end) {
        flush();
        shard = s;
        start = offset;
      }
      if (count++ == 0) first = r.index;
      last = r.index;
      run.push_back(r.dst);
      end = offset + r.range.length;
      wanted += r.range.length;
    }
    flush();
  }

  std::uint64_t bytes_read() const override { return bytes_read_; }
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }
  std::optional<KernelFormatInfo> kernel_format() const override { return options_.kernel_format; }
  void check_mapped_reads() const override {
    for (const MappedFile& map : maps_) map.check_intact();
  }

 private:
  // A read that fails names the tensors it was for (a preadv reads a run of
  // tensors that follow each other in one file: `count` of them, `first` to `last`).
  template <typename Read>
  void for_tensors(std::size_t first, std::size_t last, std::size_t count, Read&& read) {
    try {
      read();
    } catch (const CheckpointError& e) {
      const auto& tensors = listing_->tensors;
      if (count == 1) raise<CheckpointError>("tensor '", tensors.at(first).name, "': ", e.what());
      raise<CheckpointError>(count, " tensors from '", tensors.at(first).name, "' to '",
                             tensors.at(last).name, "': ", e.what());
    }
  }

  // Parses and validates every file's header into a listing. Names must be
  // unique per tp rank across files (one file's header already refuses a name
  // twice).
  std::shared_ptr<const SafetensorsListing> list(std::vector<ListedFile> files, int tp_size) const {
    auto out = std::make_shared<SafetensorsListing>();
    out->tp_size = tp_size;
    std::map<std::pair<int, std::string>, std::string> owner;  // only when there are several files
    for (std::size_t f = 0; f < files.size(); ++f) {
      const ListedFile& file = files[f];
      SafetensorsHeader header = parse_safetensors_header(file.header, file.size, file.path);
      if (file.tp_rank >= 0) check_rank_metadata(file, tp_size, header.metadata);
      out->tensors.reserve(out->tensors.size() + header.tensors.size());
      out->file_of.reserve(out->file_of.size() + header.tensors.size());
      for (auto& t : header.tensors) {  // moved into the listing: the header's copy is not kept
        if (files.size() > 1) {
          const auto [it, inserted] =
              owner.emplace(std::make_pair(file.tp_rank, t.name), file.path);
          if (!inserted)
            raise<CheckpointError>("safetensors file '", file.path, "': tensor '", t.name,
                                   "' is also in '", it->second, "'");
        }
        out->tensors.push_back({std::move(t.name), t.dtype, std::move(t.shape), t.data.length,
                                file.path, header.data_start + t.data.offset, file.tp_rank});
        out->file_of.push_back(f);
      }
      for (const auto& [key, value] : header.metadata) out->metadata.emplace(key, value);
    }
    out->files = std::move(files);
    return out;
  }

  // A kernel-format rank file says in its own metadata which rank of which tp size
  // it holds: a file renamed or copied over another rank's is refused here,
  // before any byte of it is sent.
  void check_rank_metadata(const ListedFile& shard, int tp_size,
                           const std::map<std::string, std::string>& metadata) const {
    auto field = [&](const char* key) {
      const auto it = metadata.find(key);
      return it == metadata.end() ? std::string("(none)") : "'" + it->second + "'";
    };
    const std::string want_rank = "'" + std::to_string(shard.tp_rank) + "'";
    const std::string want_size = "'" + std::to_string(tp_size) + "'";
    if (field("tp_rank") != want_rank || field("tp_size") != want_size)
      raise<CheckpointError>(
          options_.label, ": rank file '", shard.path, "' holds tp rank ", field("tp_rank"),
          " of tp size ", field("tp_size"),
          " by its metadata, but its name and kernel_format.json "
          "make it tp rank ",
          shard.tp_rank, " of ", tp_size,
          " (files renamed, swapped or copied from another kernel-format directory?)");
  }

  ConstBytes locate(std::size_t index, ByteRange range) const {
    const std::vector<TensorInfo>& infos = listing_->tensors;
    if (index >= infos.size())
      raise<UsageError>(options_.label, ": tensor index ", index, " out of ", infos.size());
    const TensorInfo& info = infos[index];
    if (range.end() < range.offset || range.end() > info.nbytes)
      raise<CheckpointError>("safetensors file '", info.file, "': tensor '", info.name,
                             "': range [", range.offset, ", ", range.offset + range.length,
                             ") exceeds its ", info.nbytes, " bytes");
    return {maps_[listing_->file_of[index]].data() + info.file_offset + range.offset, range.length};
  }

  SafetensorsSourceOptions options_;
  std::shared_ptr<const SafetensorsListing> listing_;
  std::vector<MappedFile> maps_;  // one per listing_->files
  std::map<std::string, std::string> metadata_;
  std::atomic<std::uint64_t> bytes_read_{0};
  static constexpr std::uint64_t kReadThrough = 4096;
  std::array<std::byte, kReadThrough> gap_;  // where read_many reads the bytes between requests
  std::vector<MutableBytes> run_;  // read_many's current run (kept: no allocation per run)
};

}  // namespace

std::unique_ptr<WeightSource> make_safetensors_source(
    const std::vector<SafetensorsShard>& shards, SafetensorsSourceOptions options,
    const std::shared_ptr<const KnownListing>& known) {
  return std::make_unique<SafetensorsSource>(shards, std::move(options), known);
}

}  // namespace tpreload::detail

namespace tpreload {
namespace {

using nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr std::uint64_t kMaxIndexBytes = 100'000'000;

template <typename... Args>
[[noreturn]] void index_fail(const std::string& path, Args&&... args) {
  raise<CheckpointError>("safetensors index '", path, "': ", std::forward<Args>(args)...);
}

json parse_index(const std::string& path) {
  const std::uint64_t size = detail::file_size(path);
  if (size > kMaxIndexBytes)
    index_fail(path, "file of ", size, " bytes exceeds the limit of ", kMaxIndexBytes);
  try {
    json j = detail::parse_json(detail::read_text_file(path));
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      index_fail(path, "no 'weight_map' object");
    return j;
  } catch (const json::exception& e) {
    index_fail(path, "not valid JSON: ", e.what());
  }
}

std::map<std::string, std::string> index_metadata(const json& j) {
  std::map<std::string, std::string> out;
  if (!j.contains("metadata") || !j["metadata"].is_object()) return out;
  for (const auto& [key, value] : j["metadata"].items())
    out[key] = value.is_string() ? value.get<std::string>() : value.dump();
  return out;
}

// Files named by the weight map (sorted), each checked to be a plain existing file.
std::vector<std::string> index_files(const std::string& dir, const std::string& path,
                                     const json& weight_map) {
  std::set<std::string> files;
  for (const auto& [name, file] : weight_map.items()) {
    if (!file.is_string())
      index_fail(path, "tensor '", name, "': file is not a string: ", file.dump());
    const auto f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      index_fail(path, "tensor '", name, "': file name '", f, "' is not a plain file name");
    if (!detail::is_regular_file(detail::join_path(dir, f)))
      index_fail(path, "tensor '", name, "': file '", f, "' does not exist");
    files.insert(f);
  }
  return {files.begin(), files.end()};
}

// Every weight_map entry is in its file, and every tensor of the files is mapped.
void check_index(const WeightSource& source, const std::string& path, const json& weight_map) {
  std::map<std::string, std::string> actual;
  for (const auto& t : source.tensors()) {
    const auto slash = t.file.find_last_of('/');
    actual[t.name] = t.file.substr(slash == std::string::npos ? 0 : slash + 1);
  }
  for (const auto& [name, file] : weight_map.items()) {
    const auto it = actual.find(name);
    if (it == actual.end() || it->second != file.get<std::string>())
      index_fail(path, "tensor '", name, "' is mapped to '", file.get<std::string>(),
                 "', which does not contain it");
  }
  for (const auto& [name, file] : actual)
    if (!weight_map.contains(name))
      index_fail(path, "tensor '", name, "' in '", file, "' is missing from the weight_map");
}

std::unique_ptr<WeightSource> open_indexed(const std::string& dir,
                                           const std::shared_ptr<const KnownListing>& known) {
  const std::string path = detail::join_path(dir, kIndexName);
  const json j = parse_index(path);
  std::vector<detail::SafetensorsShard> shards;
  for (const auto& f : index_files(dir, path, j["weight_map"]))
    shards.push_back({detail::join_path(dir, f), -1});
  auto source = detail::make_safetensors_source(
      shards,
      {detail::concat("safetensors '", dir, "' (sharded, index)"), index_metadata(j), std::nullopt},
      known);
  check_index(*source, path, j["weight_map"]);
  return source;
}

}  // namespace

std::unique_ptr<WeightSource> open_safetensors(const std::string& path,
                                               std::shared_ptr<const KnownListing> known) {
  if (!detail::is_directory(path))
    return detail::make_safetensors_source(
        {{path, -1}}, {detail::concat("safetensors '", path, "'"), {}, {}}, known);
  if (detail::is_regular_file(detail::join_path(path, kIndexName)))
    return open_indexed(path, known);
  const auto names = detail::list_files(path, ".safetensors");
  if (names.empty())
    raise<CheckpointError>("directory '", path, "' holds no .safetensors files and no ",
                           kIndexName);
  std::vector<detail::SafetensorsShard> shards;
  for (const auto& n : names) shards.push_back({detail::join_path(path, n), -1});
  return detail::make_safetensors_source(
      shards, {detail::concat("safetensors '", path, "'"), {}, {}}, known);
}

}  // namespace tpreload
