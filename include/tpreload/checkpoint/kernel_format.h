// Kernel-format shards: weights already processed (fused, quantized) and split per
// tensor-parallel rank, so that a reload copies them straight into parameters.
//
// Directory layout:
//   kernel_format.json                 {"format": "tpreload-kernel", "version": 1,
//                                        "tp_size": N, "dtype": "bfloat16",
//                                        "quantization": null | "int8" | "fp8" | "fp8-block",
//                                        "expert_parallel": false | true (optional),
//                                        "config": {...model config.json...}}
//   rank-00000-of-0000N.safetensors    rank 0's parameters under their in-model names
//   ...                                 (e.g. model.layers.0.self_attn.qkv_proj.weight)
//   rank-0000(N-1)-of-0000N.safetensors
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/checkpoint/writers.h"

namespace tpreload {

inline constexpr const char* kKernelFormatFile = "kernel_format.json";
inline constexpr const char* kKernelFormatName = "tpreload-kernel";
inline constexpr int kKernelFormatVersion = 1;

// "rank-00002-of-00004.safetensors".
std::string kernel_format_shard_name(int rank, int tp_size);

// kernel_format.json text for `info` (config_json must be a JSON object; UsageError
// otherwise).
std::string kernel_format_json(const KernelFormatInfo& info);

// Parse and validate `dir`/kernel_format.json. Throws CheckpointError
// "kernel format '<file>': ..." for a missing file, bad JSON, wrong format name or
// version, a non-positive tp_size, an unknown dtype, a quantization other than
// null/"int8", or a config that is not an object. config_json is the config
// object re-serialised (2-space indent).
KernelFormatInfo read_kernel_format_info(const std::string& dir);

// Open a kernel-format directory: the info above plus every rank's file (each must
// exist, and no other .safetensors file may be present). tensors() lists rank 0's
// tensors, then rank 1's, ..., each with TensorInfo::tp_rank set; a name is unique
// within a rank. kernel_format() returns the info. view() is zero-copy. `known`:
// as for open_weight_source() (kernel_format.json's tp_size is part of what it
// was made from). Throws CheckpointError.
std::unique_ptr<WeightSource> open_kernel_format(
    const std::string& dir, std::shared_ptr<const KnownListing> known = nullptr);

// Fill `dst` with the bytes of per_rank[rank][index].
using RankFillFn = std::function<void(int rank, std::size_t index, MutableBytes dst)>;

// Write a kernel-format directory (created if missing): one safetensors file per
// rank (per_rank.size() must equal info.tp_size) and kernel_format.json, written
// last; every file atomically. Throws UsageError for a size mismatch or invalid
// info, CheckpointError for I/O failures.
void write_kernel_format(const std::string& dir, const KernelFormatInfo& info,
                         const std::vector<std::vector<TensorSpec>>& per_rank,
                         const RankFillFn& fill);
void write_kernel_format(const std::string& dir, const KernelFormatInfo& info,
                         const std::vector<std::vector<InMemoryTensor>>& per_rank);

}  // namespace tpreload
