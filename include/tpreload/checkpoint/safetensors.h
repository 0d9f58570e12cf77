// safetensors (https://github.com/huggingface/safetensors) reading.
//
// File layout: an 8-byte little-endian header length N, N bytes of JSON (an object
// mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} plus
// an optional "__metadata__" object of strings), then the data section. Offsets are
// relative to the data section.
//
// The header is validated as the reference implementation does (safetensors
// `tensor.rs` `validate`): N <= 100,000,000 and within the file; valid JSON object;
// known dtypes; shape x dtype size (overflow-checked) equal to end - begin; no
// duplicate names; offsets sorted, starting at 0, contiguous, non-overlapping and
// ending exactly at the end of the file. Every violation throws CheckpointError
// with a one-line message "safetensors file '<path>': ..." naming the tensor and
// the offending values (see docs/CHECKPOINTS.md for the full list).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/dtype.h"
#include "tpreload/core/span.h"

namespace tpreload {

// The largest header length accepted (as the reference implementation).
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// One tensor of a parsed header.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  ByteRange data;  // relative to the start of the data section

  friend bool operator==(const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.data == b.data;
  }
  friend bool operator!=(const SafetensorsEntry& a, const SafetensorsEntry& b) { return !(a == b); }
};

// A parsed and validated header.
struct SafetensorsHeader {
  std::uint64_t header_bytes = 0;               // N, the JSON length
  std::uint64_t data_start = 0;                 // 8 + N: absolute offset of the data section
  std::uint64_t data_bytes = 0;                 // size of the data section
  std::vector<SafetensorsEntry> tensors;        // sorted by data offset (file order)
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Validate `json_text` (the N header bytes) of a file of `file_size` bytes whose
// header length field said N = json_text.size(). `origin` names the file in errors.
// Throws CheckpointError.
SafetensorsHeader parse_safetensors_header(std::string_view json_text, std::uint64_t file_size,
                                           const std::string& origin);

namespace detail {
// The two parsers behind parse_safetensors_header (for tests). The fast one
// takes only headers of the shape writers produce (names and metadata without
// escapes; per tensor exactly "dtype", "shape" and "data_offsets", plain
// integers; every entry valid, no name twice) straight into `out.tensors` and
// `out.metadata`, and returns false for anything else, valid or not, which the
// general parser (any JSON, every problem named) then takes; on false both are
// left empty. Neither sorts nor
// checks the layout; parse_safetensors_header does both after either.
bool parse_safetensors_entries_fast(std::string_view json_text, SafetensorsHeader& out);
void parse_safetensors_entries_general(std::string_view json_text, SafetensorsHeader& out,
                                       const std::string& origin);

// The header of `path` as it is on disk (its JSON text, unparsed) and the
// file's size, read with pread: what read_safetensors_header() parses, and what
// a known listing's files are compared with. Throws CheckpointError for a file
// that cannot be read or whose length field is out of bounds, or that is not a
// regular file.
struct SafetensorsHeaderText {
  std::uint64_t file_size = 0;
  std::string text;
};
SafetensorsHeaderText read_safetensors_header_text(const std::string& path);
// The same from a file open as `fd`, of `size` bytes (`path` names it in errors):
// a source reads the header from the descriptor it maps, so that header and
// data come from one file even when another is renamed over the path.
SafetensorsHeaderText read_safetensors_header_text(int fd, std::uint64_t size,
                                                   const std::string& path);
}  // namespace detail

// Read (with pread: no tensor data is touched) and validate the header of `path`.
// Throws CheckpointError.
SafetensorsHeader read_safetensors_header(const std::string& path);

// Open one .safetensors file, or a directory: with model.safetensors.index.json
// (Hugging Face sharded set; every weight_map entry must name an existing file in
// the directory that holds the tensor, and every tensor of those files must be in
// the weight_map), else every *.safetensors file in it (names must be unique across
// files). Files are memory-mapped; only headers are read. The source lists tensors
// file by file (files in name order, tensors in offset order); view() is zero-copy
// into the mapping. Metadata: each file's "__metadata__" (first file wins), then
// the index's "metadata" (values that are not strings are stored as JSON text).
// Throws CheckpointError.
// `known`: as for open_weight_source().
std::unique_ptr<WeightSource> open_safetensors(const std::string& path,
                                               std::shared_ptr<const KnownListing> known = nullptr);

}  // namespace tpreload
