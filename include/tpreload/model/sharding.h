// The tensor-parallel sharding rules of vLLM's parallel layers, as pure data: for
// a checkpoint tensor and a tensor-parallel rank, which slice of it lands where in
// which local parameter. One table drives the weight loaders, the reload plan
// (which bytes each rank needs, for scatter), and `reload_ckpt shard`, so the
// three cannot disagree. No torch here.
//
// Rules (vllm/model_executor/layers/linear.py, vocab_parallel_embedding.py):
//  - column-parallel (q/k/v, gate/up): split output dim 0;
//  - row-parallel (o_proj, down_proj): split input dim 1; a bias is not split;
//  - QKV: qkv_proj = [q shard; k shard; v shard]; when tp > num_key_value_heads a
//    KV head is replicated: rank r holds KV head r / (tp / num_kv_heads);
//  - merged column: gate_up_proj = [gate shard; up shard];
//  - vocab-parallel (embed_tokens, lm_head): vocab padded up to a multiple of 64,
//    split evenly; rows past the real vocab are zero;
//  - RMSNorm weights replicated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tpreload/core/dtype.h"
#include "tpreload/model/config.h"

namespace tpreload {

inline constexpr std::int64_t kVocabPadding = 64;

enum class ShardKind { kReplicated, kColumn, kRow, kVocab };

// The two forms weights arrive in: checkpoint format (Hugging Face tensors, through
// the weight loaders and post-load processing) or kernel format (already processed
// and sharded per tensor-parallel rank, copied straight into the parameters).
enum class WeightFormat : std::uint8_t { kCheckpoint, kKernel };
std::string_view format_name(WeightFormat format);

// Which part of a stacked parameter a checkpoint tensor fills (vLLM's shard_id):
// q/k/v of qkv_proj, gate/up of gate_up_proj, or the whole parameter.
enum class ShardId : std::uint8_t { kWhole, kQ, kK, kV, kGate, kUp };
std::string_view shard_id_name(ShardId id);  // "whole", "q", "k", "v", "gate", "up"
constexpr std::uint8_t shard_bit(ShardId id) {
  return std::uint8_t(1u << static_cast<unsigned>(id));
}

// A parameter's index in ShardingRules::params(): names are resolved to slots
// once, when a reload is planned, and never looked up per piece.
using ParamSlot = std::uint32_t;
inline constexpr ParamSlot kNoSlot = ~ParamSlot{0};

// A parameter of the (unwrapped) model on one rank.
struct ParamSpec {
  std::string name;                 // in-model name, e.g. "model.layers.0.mlp.gate_up_proj.weight"
  std::vector<std::int64_t> shape;  // local shape on this rank
  DType dtype = DType::kFloat32;
  ShardKind kind = ShardKind::kReplicated;
  std::int64_t layer = -1;      // decoder layer index, -1 outside the layers
  bool from_checkpoint = true;  // false for derived params (int8 weight_scale)
  // The shard bits that must all load for the parameter to count as loaded:
  // q|k|v for qkv_proj, gate|up for gate_up_proj, whole otherwise.
  std::uint8_t shards = shard_bit(ShardId::kWhole);
  // int8: the slot of this weight's float32 weight_scale; kNoSlot otherwise.
  ParamSlot scale_slot = kNoSlot;
};

// Where one checkpoint tensor goes on one rank.
struct Placement {
  std::string checkpoint_name;
  std::string param;         // in-model target name (no ".base_layer.")
  ParamSlot slot = kNoSlot;  // `param`'s index in ShardingRules::params()
  ShardId shard = ShardId::kWhole;
  std::vector<std::int64_t> source_shape;  // full checkpoint shape the rules expect
  int source_dim = -1;                     // -1: the whole tensor; 0 or 1: a slice along it
  std::int64_t source_start = 0;           // slice [start, start + length) along source_dim
  std::int64_t source_length = 0;
  std::int64_t dest_row = 0;         // the slice lands at rows [dest_row, ...) of the param
  std::int64_t zero_rows_from = -1;  // vocab padding: rows from here to the end are zeroed

  // Shape of the slice this rank needs (== source_shape when source_dim is -1).
  std::vector<std::int64_t> slice_shape() const;
};

// Why a checkpoint tensor has no placement.
enum class SkipReason { kNone, kNoParameter, kTiedHead };

class ShardingRules {
 public:
  // Throws ModelError when the config cannot be split tp_size ways (heads, KV
  // heads or intermediate size not divisible). `quantization` is "" or "int8".
  ShardingRules(ModelConfig config, int tp_size, std::string quantization = "");

  const ModelConfig& config() const { return config_; }
  int tp_size() const { return tp_size_; }
  const std::string& quantization() const { return quantization_; }
  std::int64_t padded_vocab() const { return padded_vocab_; }

  // Every parameter a rank holds (same names and shapes on every rank), sorted by
  // name. With int8, linear weights are int8 and each has a float32 weight_scale.
  const std::vector<ParamSpec>& params() const { return params_; }
  const ParamSpec* find_param(const std::string& name) const;
  // The slot of `name`, also spelled with ".base_layer." (LoRA); kNoSlot if none.
  ParamSlot find_slot(const std::string& name) const;

  // Placement of a checkpoint tensor on `tp_rank`, or nullopt with the reason.
  std::optional<Placement> place(const std::string& checkpoint_name, int tp_rank,
                                 SkipReason* why = nullptr) const;

  // The KV head group rank r holds (first KV head index) and how many.
  std::int64_t kv_heads_per_rank() const;
  std::int64_t kv_head_start(int tp_rank) const;

 private:
  struct Rule {
    std::string param;
    ShardId shard;
    ShardKind kind;
    std::vector<std::int64_t> source_shape;
    ParamSlot slot = kNoSlot;
  };
  const Rule* find_rule(const std::string& checkpoint_name) const;
  void build_rules();
  void build_params();

  ModelConfig config_;
  int tp_size_;
  std::string quantization_;
  std::int64_t padded_vocab_;
  std::vector<std::pair<std::string, Rule>> rules_;  // sorted by checkpoint name
  std::vector<ParamSpec> params_;
};

// The decoder layer index in a name ("model.layers.12.mlp..." -> 12), -1 if none.
std::int64_t layer_of(const std::string& name);

// "a.b.base_layer.weight" -> "a.b.weight" (LoRA's wrapped spelling); others unchanged.
std::string strip_base_layer(std::string name);
// "a.b.weight" -> "a.b.base_layer.weight".
std::string with_base_layer(const std::string& name);

}  // namespace tpreload
