// Kernel-format shards made by the model's own loaders (`reload_ckpt shard`): for
// each tensor-parallel rank, the checkpoint goes through exactly the weight
// loaders and post-load processing a checkpoint-format load uses, and the
// resulting parameters are written as that rank's file. A kernel-format reload of
// the output therefore gives the same bytes as a checkpoint-format reload.
#pragma once

#include <string>

#include "tpreload/model/config.h"

namespace tpreload {

class WeightSource;

struct ShardOptions {
  int tp_size = 1;
  std::string quantization;      // "" or a scheme of quantization_schemes()
  bool expert_parallel = false;  // MoE models: whole experts per rank
};

// Write `out_dir` (kernel_format.json plus rank-0000r-of-0000N.safetensors). One
// rank's model is held in memory at a time. Throws ModelError if the config cannot
// be split, ValidationError if the checkpoint lacks a tensor some parameter needs
// (naming it), CheckpointError for I/O failures.
void write_kernel_shards(const ModelConfig& config, WeightSource& source,
                         const std::string& out_dir, const ShardOptions& options);

}  // namespace tpreload
