// Sharded sources on disk: a checkpoint split into one safetensors file per
// source rank, each holding that rank's boxes, plus a manifest, so that the
// sharded path (sharded_source.h) runs from the command line: `reload_ckpt
// split` writes one, `reload_runner --weights DIR --sharded-source` has each
// rank read its own file. Layout of DIR:
//   manifest.json   {"format": "tpreload-sharded-source", "version": 1,
//                    "ranks": N, "by": "rows", "files": ["rank-00000.safetensors", ...]}
//   rank-0000r.safetensors  rank r's boxes as tensors of the box's shape, under
//                    the checkpoint's names; its __metadata__ "tpreload.boxes" a
//                    JSON object: name -> {"shape": full shape, "offset": [...]}.
// A rank at or past N holds nothing. No torch here.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/reload/sharded_source.h"

namespace tpreload {

// How a split cuts each tensor among the source ranks: near-equal slices of
// its first dimension (FSDP), of its second (a Megatron row-parallel cut; 1-D
// tensors by their only dimension), or whole tensors in turn (tensor i on
// rank i mod N). A 0-d tensor goes whole to rank 0 when sliced.
enum class SplitBy { kRows, kColumns, kWhole };
std::string_view split_by_name(SplitBy by);
// "rows", "cols", "whole" (nullopt for another name).
std::optional<SplitBy> parse_split_by(std::string_view name);

// Rank `rank`'s boxes of a tensor of `shape` (tensor number `index` of the
// checkpoint) when split `by` among `ranks`: none, one, or (never more) as
// slice_box() cuts them.
std::vector<Box> split_boxes(const std::vector<std::int64_t>& shape, std::size_t index, SplitBy by,
                             int rank, int ranks);

// The elements of `box` of tensors()[index] of `source`, row-major, into
// `dst` (box.elements() x the dtype's size bytes): one read where the box is
// whole rows (every dimension after the first whole) or the whole tensor,
// else the whole tensor read into `scratch` and the box copied out of it.
// Throws as WeightSource::read does.
void read_box(WeightSource& source, std::size_t index, const Box& box, MutableBytes dst,
              std::vector<std::byte>& scratch);

// Rank `rank`'s boxes of every tensor of `source` split `by` among `ranks`,
// read (read_box) into memory each box owns: what a trainer's rank holds,
// made from a checkpoint (benchmarks, checks). Throws as read_box does.
std::vector<HeldTensor> read_split(WeightSource& source, SplitBy by, int rank, int ranks);

// Writes the split of every tensor of `source` (checkpoint format) into `dir`
// (created if missing): one file per rank (one with no boxes holds no
// tensors), then the manifest. Atomic per file (writers.h); a failure leaves
// no manifest. Returns the file names. Throws UsageError for ranks < 1 or a
// kernel-format source, CheckpointError as the writers and `source` do.
std::vector<std::string> write_split_source(const std::string& dir, WeightSource& source, int ranks,
                                            SplitBy by);

// Rank `rank`'s part of a split in `dir`: its file's boxes, viewed in the
// file's mapping (read into memory where the file cannot be mapped), kept open
// by the returned source. Throws CheckpointError naming the file for a missing
// or malformed manifest or file (a tensor without its box, a box that does not
// fit its shape).
std::unique_ptr<ShardedSource> open_split_source(const std::string& dir, int rank);

}  // namespace tpreload
