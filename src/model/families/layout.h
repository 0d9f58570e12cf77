// The pieces a checkpoint layout is built from (checkpoint_tensor_specs() in
// config.h): the common layout in config.cpp and a family's own attention
// (Family::attention) use them alike. Internal to the model rules.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tpreload/model/config.h"

namespace tpreload::layout {

// A tensor loaded whole (kReplicated), or split `kind` as its own parameter.
CheckpointTensorSpec split_as(std::string name, std::vector<std::int64_t> shape, ShardKind kind,
                              std::optional<DType> param_dtype = std::nullopt);

// Tensors of `columns` columns that the loaders stack by rows into one
// replicated parameter, `param`, in the order given (vLLM's
// MergedReplicatedLinear: shard i at the rows of the parts before it; DeepSeek's
// fused_qkv_a_proj from q_a_proj and kv_a_proj_with_mqa).
void push_merged_replicated(std::vector<CheckpointTensorSpec>& specs, const std::string& param,
                            std::initializer_list<std::pair<std::string, std::int64_t>> parts,
                            std::int64_t columns);

}  // namespace tpreload::layout
