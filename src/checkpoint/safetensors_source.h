// Internal: the memory-mapped safetensors source over one or more files, shared by
// open_safetensors() and the kernel-format source.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpreload/checkpoint/weight_source.h"

namespace tpreload::detail {

struct SafetensorsShard {
  std::string path;
  int tp_rank = -1;  // kernel-format rank, -1 for checkpoint files
};

struct SafetensorsSourceOptions {
  std::string label;  // describe() prefix, e.g. "safetensors 'dir' (sharded)"
  std::map<std::string, std::string> extra_metadata;  // overrides the files' metadata
  std::optional<KernelFormatInfo> kernel_format;
};

// Open, map and validate every shard (headers only). Names must be unique per
// tp_rank. Takes `known`'s listing when it was made from the same shards, byte
// for byte, and the same kernel tp_size (see KnownListing). Throws
// CheckpointError.
std::unique_ptr<WeightSource> make_safetensors_source(
    const std::vector<SafetensorsShard>& shards, SafetensorsSourceOptions options,
    const std::shared_ptr<const KnownListing>& known = nullptr);

}  // namespace tpreload::detail
