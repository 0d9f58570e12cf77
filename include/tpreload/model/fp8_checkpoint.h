// FP8 checkpoints: config.json's quantization_config as vLLM's Fp8Config reads
// it, and what it makes of a checkpoint's tensors and of the model's parameters.
// The one place that knows these schemes; the config, the sharding rules and the
// tests ask it. No torch here.
//
// With quant_method "fp8", every linear weight of the decoder layers (q/k/v/o_proj,
// gate/up/down_proj, the experts' and shared experts' projections) is
// float8_e4m3fn, [N, K]; the embeddings, the LM head, the norms and the routers
// are not quantized, and neither is a module listed in `ignored_layers` (or,
// where that is absent, `modules_to_not_convert`). Beside each quantized weight:
//
// Block-scaled (weight_block_size [n, k]; DeepSeek-V3, Kimi-K2, Qwen3-*-FP8,
// GLM-4.5-FP8): a float32 `<module>.weight_scale_inv` of [ceil(N / n),
// ceil(K / k)] (one scale per block). After loading, vLLM's parameters are the
// checkpoint's bytes sliced as the weights' loaders slice the weights, in units
// of blocks: `qkv_proj.weight_scale_inv` holds q's, k's and v's scale rows of
// the rank, `gate_up_proj` gate's then up's, a row-parallel layer's scale the
// rank's columns, `experts.w13_weight_scale_inv` [E, 2 I_local / n, ceil(H / k)]
// and `w2_weight_scale_inv` [E, ceil(H / n), I_local / k]. A rank's share that
// is not whole blocks is refused as vLLM refuses it (ShardingRules).
//
// Per tensor (no weight_block_size; AutoFP8's checkpoints, e.g.
// neuralmagic's *-FP8 releases): a float32 scalar `<module>.weight_scale`, and with
// activation_scheme "static" a float32 scalar `<module>.input_scale`. vLLM
// loads the scales of a fused layer's parts side by side, then processes the
// layer (Fp8LinearMethod, Fp8MoEMethod): a linear's weight is requantized
// from each part's scale to the largest (requantize_with_max_scale; a layer of
// one part too), `weight_scale` becomes that one scalar and `input_scale` the
// largest of the parts'; an MoE layer's w13_weight is requantized per expert to
// the larger of its gate's and up's scales, `w13_weight_scale` [E_local] holds
// those, `w2_weight_scale` [E_local] the down projections' scales as they are,
// and `w13_input_scale` / `w2_input_scale` become the largest of the rank's
// experts'. The model's parameters are those processed tensors (what a
// kernel-format reload copies); a checkpoint-format reload stages the scales
// and processes each layer once all of its parts arrived
// (ParameterSink::process_layer, ShardingRules::scale_steps).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tpreload {

struct Fp8Checkpoint {
  std::int64_t block_n = 0, block_k = 0;  // weight_block_size; 0: none
  bool per_tensor = false;                // FP8 without weight_block_size
  bool static_activations = false;        // per tensor, activation_scheme "static"
  std::vector<std::string> ignored;       // module names left unquantized, as listed
  bool quantized() const { return blocks() || per_tensor; }
  bool blocks() const { return block_n > 0; }
  // "none", "fp8, weight_block_size [128, 128], ignored [lm_head]" or "fp8, per
  // tensor, activation_scheme static, ignored []": what ranks and kernel-format
  // shards compare.
  std::string text() const;
};

// Whether the checkpoint tensor `name` is a quantized weight of `fp8`: a
// decoder layer's linear projection ("model.layers.<l>.<...>.<proj>.weight")
// whose module is not ignored.
bool fp8_quantized_weight(const Fp8Checkpoint& fp8, const std::string& name);

// What a scale tensor of an FP8 checkpoint is to its weight.
enum class Fp8Scale : std::uint8_t {
  kGrid,    // "<module>.weight_scale_inv": block scales
  kWeight,  // "<module>.weight_scale": the weight's one scale (per tensor)
  kInput,   // "<module>.input_scale": the activations' static scale (per tensor)
};
// The leaf a scale of `kind` has beside "<module>.weight": "weight_scale_inv",
// "weight_scale" or "input_scale".
const char* fp8_scale_leaf(Fp8Scale kind);

// The scale tensors beside quantized weight `name`, in name order: its grid
// (blocks), or its weight_scale and, with static activations, input_scale.
std::vector<std::pair<std::string, Fp8Scale>> fp8_scales_of(const Fp8Checkpoint& fp8,
                                                            const std::string& weight_name);
// "<module>.weight_scale_inv" / ".weight_scale" / ".input_scale" -> "<module>.weight"
// and the kind; nullopt for any other name.
std::optional<std::pair<std::string, Fp8Scale>> fp8_weight_of_scale(const std::string& name);

// The shape of a scale of `kind` of a weight (or a weight's local shard) of
// `shape`: a grid is the last two dimensions divided by the blocks, rounded up;
// a per-tensor scale a scalar ({}).
std::vector<std::int64_t> fp8_scale_shape(const Fp8Checkpoint& fp8, Fp8Scale kind,
                                          std::vector<std::int64_t> shape);

}  // namespace tpreload
