// Block-scaled FP8 checkpoints (DeepSeek-V3, Kimi-K2, Qwen3-*-FP8, GLM-4.5-FP8):
// config.json's quantization_config as vLLM's Fp8Config reads it, and what it
// makes of a checkpoint's tensors and of the model's parameters. The one place
// that knows this scheme; the config, the sharding rules and the tests ask it.
// No torch here.
//
// With quant_method "fp8" and weight_block_size [n, k], every linear weight of
// the decoder layers (q/k/v/o_proj, gate/up/down_proj, the experts' and shared
// experts' projections) is float8_e4m3fn, [N, K], with a float32
// `<module>.weight_scale_inv` of [ceil(N / n), ceil(K / k)] beside it (one scale
// per block); the embeddings, the LM head, the norms and the routers are not
// quantized, and neither is a module listed in `ignored_layers` (or, where that
// is absent, `modules_to_not_convert`). After loading, vLLM's parameters are
// the checkpoint's bytes sliced as the weights' loaders slice the weights, in
// units of blocks: `qkv_proj.weight_scale_inv` holds q's, k's and v's scale rows
// of the rank, `gate_up_proj` gate's then up's, a row-parallel layer's scale the
// rank's columns, `experts.w13_weight_scale_inv` [E, 2 I_local / n, ceil(H / k)]
// and `w2_weight_scale_inv` [E, ceil(H / n), I_local / k]. A rank's share that
// is not whole blocks is refused as vLLM refuses it (ShardingRules).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tpreload {

struct Fp8Checkpoint {
  std::int64_t block_n = 0, block_k = 0;  // weight_block_size; 0: not an FP8 checkpoint
  std::vector<std::string> ignored;       // module names left unquantized, as listed
  bool quantized() const { return block_n > 0; }
  // "none", or "fp8, weight_block_size [128, 128], ignored [lm_head]": what
  // ranks and kernel-format shards compare.
  std::string text() const;
};

// Whether the checkpoint tensor `name` is a quantized weight of `fp8`: a
// decoder layer's linear projection ("model.layers.<l>.<...>.<proj>.weight")
// whose module is not ignored.
bool fp8_quantized_weight(const Fp8Checkpoint& fp8, const std::string& name);

// The scale tensor beside weight `name`: "<module>.weight_scale_inv".
std::string fp8_scale_name(const std::string& weight_name);
// "<module>.weight_scale_inv" -> "<module>.weight"; nullopt for any other name.
std::optional<std::string> fp8_weight_of_scale(const std::string& name);

// The scale grid of a weight (or a weight's local shard) of `shape`: its last
// two dimensions divided by the blocks, rounded up.
std::vector<std::int64_t> fp8_scale_shape(const Fp8Checkpoint& fp8,
                                          std::vector<std::int64_t> shape);

}  // namespace tpreload
