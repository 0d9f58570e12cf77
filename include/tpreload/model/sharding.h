// The tensor-parallel sharding rules of vLLM's parallel layers, as pure data: for
// a checkpoint tensor and a tensor-parallel rank, which slice of it lands where in
// which local parameter. One table drives the weight loaders, the reload plan
// (which bytes each rank needs, for scatter), and `reload_ckpt shard`, so the
// three cannot disagree. No torch here.
//
// Rules (vllm/model_executor/layers/linear.py, vocab_parallel_embedding.py,
// fused_moe/layer.py):
//  - column-parallel (q/k/v, gate/up): split output dim 0;
//  - row-parallel (o_proj, down_proj): split input dim 1; a bias is not split;
//  - QKV: qkv_proj = [q shard; k shard; v shard]; when tp > num_key_value_heads a
//    KV head is replicated: rank r holds KV head r / (tp / num_kv_heads);
//  - merged column: gate_up_proj = [gate shard; up shard] (Granite's shared MLP:
//    shared_mlp.input_linear, its output_linear row-parallel);
//  - merged replicated: DeepSeek's fused_qkv_a_proj = [q_a_proj; kv_a_proj_with_mqa]
//    whole on every rank; its q_b_proj (or q_proj) and kv_b_proj column-parallel
//    alone, o_proj row-parallel;
//  - vocab-parallel (embed_tokens, lm_head): vocab padded up to a multiple of 64,
//    split evenly; rows past the real vocab are zero;
//  - RMSNorm weights (and the q_norm/k_norm of one weight for every head,
//    Qwen3's, Gemma 3's and EXAONE 4's, and OLMo's whole-projection ones) and
//    the MoE router (mlp.gate; Mixtral's block_sparse_moe.gate; Qwen2-MoE's
//    mlp.shared_expert_gate) replicated; Qwen2-MoE's mlp.shared_expert split as a
//    dense MLP;
//  - per-head norm weights (Command R+'s q_norm [heads, head_dim] and k_norm [KV
//    heads, head_dim]; ShardKind::kHeads): split by head along dim 0 as q's and
//    k's rows are;
//  - FusedMoE experts: experts.w13_weight [E_local, 2 x I_local, hidden] holds, per
//    local expert, its gate_proj rows then its up_proj rows; experts.w2_weight
//    [E_local, hidden, I_local] its down_proj (Mixtral's w1, w3 and w2, under
//    block_sparse_moe: moe_names() in config.h). Tensor-parallel experts (the
//    default): every rank holds all E experts, I_local = I / tp, gate/up split by
//    rows and down by columns as a dense MLP. Expert parallelism: rank r holds the
//    E / tp experts [r x E_local, (r + 1) x E_local) whole (I_local = I); an expert
//    tensor is held by one rank of each replica.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tpreload/core/dtype.h"
#include "tpreload/core/head_rows.h"
#include "tpreload/model/config.h"
#include "tpreload/model/fp8_checkpoint.h"

namespace tpreload {

class WeightSource;

inline constexpr std::int64_t kVocabPadding = 64;

// The two forms weights arrive in: checkpoint format (Hugging Face tensors, through
// the weight loaders and post-load processing) or kernel format (already processed
// and sharded per tensor-parallel rank, copied straight into the parameters).
enum class WeightFormat : std::uint8_t { kCheckpoint, kKernel };
std::string_view format_name(WeightFormat format);

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
  std::int64_t layer = -1;  // decoder layer index, -1 outside the layers
  // false for parameters no checkpoint holds: int8 and online FP8 scales, a
  // family's derived parameters (DerivedStep)
  bool from_checkpoint = true;
  // How many checkpoint tensors fill it (vLLM's shard ids): 3 for qkv_proj (q, k,
  // v), 2 for gate_up_proj (gate, up), 2 x E_local for experts.w13_weight (gate,
  // up of each local expert), E_local for experts.w2_weight, 1 otherwise. It
  // counts as loaded once every one of them arrived.
  std::uint32_t shards = 1;
  // int8: the slot of this weight's float32 weight_scale; kNoSlot otherwise.
  ParamSlot scale_slot = kNoSlot;
  // A per-tensor FP8 scale (weight_scale, input_scale): a checkpoint-format load
  // stages one float32 per shard (the scale of each part of its weight, row
  // `shard` of the staging) and the layer's processing writes the parameter
  // (ShardingRules::scale_steps); a kernel-format load copies it.
  bool staged = false;
  // Online FP8 (quantization "fp8" or "fp8-block"): a float8_e4m3fn weight whose
  // checkpoint rows (bfloat16, float16 or float32) are taken in the model's
  // dtype (rounded to it, as vLLM's parameter holds them) and quantized as each
  // unit of rows arrives (ParameterSink::stage_rows), into it and its
  // weight_scale, or with blocks its weight_scale_inv grid (scale_slot).
  bool quantize_fp8 = false;

  // Whether checkpoint rows of the model's floating dtype are quantized into it
  // (int8, online FP8) rather than copied or converted.
  bool quantized_on_load() const { return dtype == DType::kInt8 || quantize_fp8; }
};

// One step of processing an FP8 layer on one rank, once its weights (and staged
// scales) arrived. A per-tensor FP8 checkpoint's: the largest of staged scales
// [first, first + count) of parameter `scale` becomes row `out_row` of it; rows
// [row, row + rows) of FP8 parameter `weight` (none: kNoSlot), quantized with
// staged scale `from`, are requantized to it (fp8::requantize_step). Online FP8's
// (`quantize`): rows [row, row + rows) of the weight's staged float32 rows are
// quantized into it with one scale, amax / 448, written to row `out_row` of
// `scale` (fp8::quantize_step); with `block` (online block-scaled FP8), in
// block x block tiles, each tile's scale into the grid `scale` from its row
// `out_row` on (fp8::quantize_block_step).
struct ScaleStep {
  std::int64_t layer = -1;
  ParamSlot scale = kNoSlot;
  std::uint32_t first = 0, count = 0;
  std::int64_t out_row = 0;
  ParamSlot weight = kNoSlot;
  std::int64_t row = 0, rows = 0;
  std::uint32_t from = 0;
  bool quantize = false;
  std::int64_t block = 0;
};

// A parameter a family computes on every rank from a loaded weight after each
// checkpoint-format load (its post-reload step; DeepSeek's MLA: W_UK_T and W_UV
// from kv_b_proj, as vLLM's process_weights_after_loading computes them):
// `window` (tpreload/core/head_rows.h: its geometry, scale kind and blocks;
// no pointers) of parameter `from`, times `scale`'s values (a grid; one per
// row: int8; one: per-tensor FP8), into `out`, in the model's dtype. A
// kernel-format load copies `out` as any other parameter.
struct DerivedStep {
  std::int64_t layer = -1;
  ParamSlot out = kNoSlot, from = kNoSlot, scale = kNoSlot;
  HeadRows window;
};

// Where one checkpoint tensor goes on one rank.
struct Placement {
  std::string checkpoint_name;
  std::string param;         // in-model target name (no ".base_layer.")
  ParamSlot slot = kNoSlot;  // `param`'s index in ShardingRules::params()
  std::uint32_t shard = 0;   // which of the parameter's shards it fills
  // False when this rank holds none of it (an expert another rank holds under
  // expert parallelism): then only checkpoint_name, param, slot and source_shape
  // (what the tensor must look like, for every rank's plan) are set.
  bool held = true;
  std::vector<std::int64_t> source_shape;  // full checkpoint shape the rules expect
  int source_dim = -1;                     // -1: the whole tensor; 0 or 1: a slice along it
  std::int64_t source_start = 0;           // slice [start, start + length) along source_dim
  std::int64_t source_length = 0;
  // The slice lands at rows [dest_row, ...) of the parameter, counted as rows of
  // its last dimension (param_rows() in row_writes.h; for 2-D parameters, its rows).
  std::int64_t dest_row = 0;
  std::int64_t zero_rows_from = -1;  // vocab padding: rows from here to the end are zeroed

  // Shape of the slice this rank needs (== source_shape when source_dim is -1).
  std::vector<std::int64_t> slice_shape() const;
  // Its rows and the bytes of one of its rows in `dtype` (shape_rows and
  // shape_row_bytes of slice_shape(), without building it: planning asks per
  // rank and piece, 10^7 times for Kimi-K2).
  std::int64_t slice_rows() const;
  std::uint64_t slice_row_bytes(DType dtype) const;
};

// Why a checkpoint tensor has no placement.
enum class SkipReason { kNone, kNoParameter, kTiedHead };

// How much of a parameter a load brings: none, part or all of its shards.
enum class Brought : std::uint8_t { kNone, kPart, kAll };

class ShardingRules;
// Why `step` cannot be processed on `tp_rank` after a load that brought its
// staged scale parameter and its weight (kAll where it has none) as given: ""
// when the load brought all of them, or none. A fused weight is requantized to
// the largest of all its parts' scales, so a part alone cannot be processed.
std::string scale_step_problem(const ShardingRules& rules, const ScaleStep& step, int tp_rank,
                               Brought scale, Brought weight);

class ShardingRules {
 public:
  // Throws ModelError when the config cannot be split tp_size ways (heads, KV
  // heads, intermediate size, experts or their intermediate size, Qwen2-MoE's
  // shared expert's intermediate size not divisible),
  // or expert parallelism is asked of a dense model. `quantization` is "" or a
  // scheme of quantization_schemes(): "int8" (decoder linear weights; experts
  // stay in the model's dtype), "fp8" or "fp8-block" (decoder linear weights
  // and experts).
  // `derived` false leaves out the family's derived parameters and their steps
  // (DerivedStep), for a model that holds them itself: vLLM's DeepSeek holds
  // W_UK_T and W_UV as views of a bfloat16 kv_b_proj, which a reload writes.
  ShardingRules(ModelConfig config, int tp_size, std::string quantization = "",
                bool expert_parallel = false, bool derived = true);

  const ModelConfig& config() const { return config_; }
  int tp_size() const { return tp_size_; }
  bool expert_parallel() const { return expert_parallel_; }
  bool holds_derived() const { return holds_derived_; }
  // Experts each rank holds and their intermediate size (0 for dense models).
  std::int64_t local_experts() const;
  std::int64_t local_moe_intermediate() const;
  const std::string& quantization() const { return quantization_; }
  std::int64_t padded_vocab() const { return padded_vocab_; }

  // Every parameter a rank holds (same names and shapes on every rank), sorted by
  // name. With int8, linear weights are int8 and each has a float32 weight_scale
  // (a row each); with fp8, linear weights and experts are float8_e4m3fn, each
  // with a float32 weight_scale ([1], or one per expert).
  const std::vector<ParamSpec>& params() const { return params_; }
  const ParamSpec* find_param(const std::string& name) const;
  // The slot of `name`, also spelled with ".base_layer." (LoRA) or, for FusedMoE's
  // experts, ".experts.routed_experts." (newer vLLM); kNoSlot if none.
  ParamSlot find_slot(const std::string& name) const;

  // Placement of a checkpoint tensor on `tp_rank`, or nullopt with the reason.
  // Without `names` its checkpoint_name and param are left empty (a plan keeps
  // them for rank 0 only: two strings per tensor and rank were most of a large
  // plan's memory).
  std::optional<Placement> place(const std::string& checkpoint_name, int tp_rank,
                                 SkipReason* why = nullptr, bool names = true) const;

  // The FP8 processing on `tp_rank`, in layer order (vLLM's Fp8LinearMethod
  // and Fp8MoEMethod, fp8_checkpoint.h). A per-tensor FP8 checkpoint: each
  // linear's parts requantized to the largest of their scales, each expert's
  // gate and up to the larger of theirs, the down projections' scales as they
  // are, every input_scale the largest of its parts'. Online FP8: each linear
  // weight quantized whole, each expert's w13 and w2 apart. Empty otherwise.
  std::vector<ScaleStep> scale_steps(int tp_rank) const;

  // The family's post-reload steps, in layer order (the same on every rank).
  const std::vector<DerivedStep>& derived_steps() const { return derived_; }
  // Without the derived parameters (holds_derived() false): each one left out,
  // the weight it is computed from, and whether that weight is quantized.
  struct LeftOut {
    std::string name, from;
    bool quantized = false;
  };
  const std::vector<LeftOut>& derived_left_out() const { return left_out_; }

  // The KV head group rank r holds (first KV head index) and how many.
  std::int64_t kv_heads_per_rank() const;
  std::int64_t kv_head_start(int tp_rank) const;

 private:
  // What a checkpoint tensor is to its parameter.
  using Role = ShardRole;
  struct Rule {
    std::string param;
    Role role = Role::kWhole;
    ShardKind kind = ShardKind::kReplicated;
    std::vector<std::int64_t> source_shape;
    ParamSlot slot = kNoSlot;
    std::int64_t expert = -1;            // experts only
    std::optional<DType> param_dtype{};  // CheckpointTensorSpec::param_dtype
    // An FP8 checkpoint's scale (fp8_checkpoint.h), placed as its weight, of
    // weight_shape, is placed: a grid in units of blocks; a per-tensor scale
    // as the staged scale of its weight's shard.
    std::optional<Fp8Scale> fp8_scale{};
    std::vector<std::int64_t> weight_shape{};
    // A part of a replicated parameter merged from several (MergedReplicatedLinear:
    // DeepSeek's fused_qkv_a_proj): its shard, the rows before it, and the
    // parameter's rows and shards (0: not merged).
    std::uint32_t merged_shard = 0;
    std::int64_t merged_row = 0;
    std::int64_t merged_rows = 0;
    std::uint32_t merged_shards = 0;
  };
  const Rule* find_rule(const std::string& checkpoint_name) const;
  void check_fp8_blocks() const;
  // (`shape`: the rule's source_shape, or a scale's weight_shape)
  void place_rule(const Rule& rule, const std::vector<std::int64_t>& shape, int tp_rank,
                  Placement& pl) const;
  void to_blocks(const Rule& rule, Placement& pl) const;
  void build_rules();
  void build_params();
  void build_derived();
  // (`rows`: the placed tensor's, which q, gate and up split by tp)
  void place_column(const Rule& rule, std::int64_t rows, int tp_rank, Placement& pl) const;
  void place_expert(const Rule& rule, int tp_rank, Placement& pl) const;

  ModelConfig config_;
  int tp_size_;
  std::string quantization_;
  bool expert_parallel_ = false;
  bool holds_derived_ = true;
  std::int64_t padded_vocab_;
  std::vector<std::pair<std::string, Rule>> rules_;  // sorted by checkpoint name
  // (rules_'s names' hashes, sorted, with their index: find_rule compares
  // integers, not names with long common prefixes; copies with the rules)
  std::vector<std::pair<std::size_t, std::uint32_t>> by_hash_;
  std::vector<ParamSpec> params_;
  std::vector<DerivedStep> derived_;
  std::vector<LeftOut> left_out_;
};

// What a checkpoint-format load reads of `source`: the source with the
// config's stacked tensors (stacked_checkpoint_tensors(): Phi-3's qkv_proj and
// gate_up_proj, GLM-4's gate_up_proj, GraniteMoE's experts, Granite's shared
// MLP's input_linear) listed as the parts
// the rules take (make_row_split_source(),
// which `source` must outlive), as vLLM's weight loaders split them; null when
// the config stacks none or `source` is kernel format (already the model's
// parameters). A checkpoint whose stacked tensor has other rows (or, split by
// rows of its last dimension, another shape) than the config's is refused when
// the view is listed (CheckpointError).
std::unique_ptr<WeightSource> loader_view(WeightSource& source, const ModelConfig& config);

// The decoder layer index in a name ("model.layers.12.mlp..." -> 12), -1 if none.
std::int64_t layer_of(const std::string& name);

// "a.b.base_layer.weight" -> "a.b.weight" (LoRA's wrapped spelling); others unchanged.
std::string strip_base_layer(std::string name);
// "a.b.weight" -> "a.b.base_layer.weight".
std::string with_base_layer(const std::string& name);
// FusedMoE's expert parameters as newer vLLM's RoutedExperts layout nests them, one
// module deeper: "<p>.experts.w13_weight" <-> "<p>.experts.routed_experts.w13_weight"
// (w13_* and w2_* only). with_routed_experts gives "" for any other name;
// strip_routed_experts returns any other name unchanged.
std::string with_routed_experts(const std::string& name);
std::string strip_routed_experts(const std::string& name);

}  // namespace tpreload
