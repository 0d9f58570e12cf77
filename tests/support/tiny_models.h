// Small model configs and seeded Hugging Face-style checkpoints for tests: they
// exercise GQA with tp > num_kv_heads, Qwen2 biases, tied and untied heads, and
// vocabularies that are not multiples of 64.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/model/config.h"

namespace tpreload::testdata {

// "llama_gqa" (untied, bfloat16, q/k/v/o biases, 8 heads / 2 KV heads, vocab 100),
// "qwen2_tied" (tied, float32, biases, 8 heads / 4 KV heads, vocab 130),
// "mistral_mqa" (untied, float16, 8 heads / 1 KV head, vocab 200),
// "qwen3_dense" (Qwen3: head_dim 16 != hidden / heads, q/k norms, q/k/v biases),
// "qwen3_moe" (Qwen3-MoE: 8 experts, top 2, renormalised; layer 1 dense; tied),
// "qwen3_moe_plain" (float16, every second layer sparse, top 3, not renormalised),
// "qwen2_moe" (Qwen2-MoE: q/k/v biases, layer 0 dense, top 3 of 8 experts not
// renormalised, a shared expert of intermediate size 40 with its sigmoid gate),
// "mixtral" (Mixtral: block_sparse_moe with w1/w3/w2 experts in every layer, 8 of
// intermediate_size 48, top 2, renormalised; rope_theta left to its default),
// "llama_mlp_bias" (o_proj and gate/up/down biases, none on q/k/v: bias, qkv_bias
// false, mlp_bias; 4 KV heads, vocab 110),
// "phi3" (Phi-3: q/k/v stacked in qkv_proj and gate/up in gate_up_proj in the
// checkpoint, their biases too; 8 heads / 2 KV heads, rotary over half of each
// head, vocab 105),
// "gemma" (Gemma: one KV head of 8 heads, head_dim 16 with hidden 48, tied head
// by default, tanh GeLU although hidden_act says "gelu", vocab 130),
// "gemma2" (Gemma 2: pre/post feed-forward norms, attention scaled by
// query_pre_attn_scalar 24, scores capped at 2 and logits at 3, layers 0 and 2
// attending to windows of 3 positions; q/k/v and o_proj biases, which no
// released Gemma 2 has),
// "gemma3" (Gemma 3: Gemma 2's norms and scaling without soft-capping, q/k
// norms, layers 0 and 1 of 3 sliding (sliding_window_pattern 3) over windows of
// 3 positions with rotary at rope_local_base_freq 100, layer 2 at rope_theta
// with linear scaling by 4, vocab 150),
// "granite" (Granite: embedding multiplier 4, attention multiplier 0.25,
// residual multiplier 0.5, logits scaling 3; q/k/v/o and MLP biases; tied;
// 8 heads / 2 KV heads, vocab 115),
// "olmo2" (OLMo 2: no input norms, the attention's and MLP's outputs normed,
// q and k normed over all heads; 8 heads / 2 KV heads, untied, vocab 120),
// "olmo3" (OLMo 3: OLMo 2's layout, layers 0, 2 and 3 of 4 sliding (layer_types,
// not the default pattern) over windows of 3 at rope_theta unscaled, layer 1 at
// rope_theta with linear scaling by 4; 2 KV heads, tied, vocab 125),
// "glm4" (GLM-4: input_layernorm, post_self_attn_layernorm,
// post_attention_layernorm and post_mlp_layernorm; gate/up stacked in the
// checkpoint, q/k/v apart with biases (attention_bias absent: true); rotary on
// interleaved pairs over half of each head of 16 (partial_rotary_factor
// absent); 8 heads / 2 KV heads (absent), vocab 135),
// "ernie45" (ERNIE 4.5: Llama's layout, rotary on interleaved pairs over whole
// heads of 16; tied, 2 KV heads and rope_theta 500000 by default, vocab 120),
// "cohere" (Cohere: LayerNorm, attention and MLP in parallel on the input
// norm, logits times logit_scale 0.25, interleaved rotary; tied by default;
// 8 heads / 2 KV heads, vocab 125),
// "cohere2" (Cohere 2: Cohere's layout, layers 0-2 of 4 sliding over
// windows of 3 with rotary at base 50000, layer 3 attending to all without
// rotary; logits x 0.5, vocab 130),
// "cohere_plus" (Command R+: Cohere's layout with use_qk_norm, q and k each head
// normed by its own LayerNorm weights before rotary, split by head; 8 heads / 2 KV
// heads, logits x 0.125, vocab 115),
// "exaone4" (EXAONE 4 as the 32B: OLMo's post-norms, q and k normed per head, 8
// heads of 16 over a hidden size of 64, layers 0, 2 and 3 of 4 sliding (layer_types, not the
// "LLLG" pattern beside it) over windows of 3 with rotary at 1e6 with llama3
// scaling, layer 1 attending to all without rotary; 2 KV heads, untied,
// vocab 110),
// "exaone4_full" (EXAONE 4 as the 1.2B: a null window, every layer full and
// turning rotary; 8 heads / 2 KV heads, tied, vocab 120),
// "granite_moe" (GraniteMoE: Granite's multipliers, 8 experts of 16 rows (top
// 2, renormalised) in every layer, held as the checkpoint stacks them:
// block_sparse_moe.input_linear [8, 32, 64], output_linear [8, 64, 16],
// router.layer [8, 64]; tied, vocab 105),
// "deepseek_v3" (DeepSeek-V3: multi-head latent attention with q_lora_rank 32,
// q_a_proj and kv_a_proj_with_mqa merged into the replicated fused_qkv_a_proj,
// yarn rotary; layer 0 dense, layers 1-2 with 8 experts of 16 and a shared one,
// noaux_tc routing with its float32 score correction; an MTP layer in its
// config), "deepseek_v2_lite" (DeepSeek-V2-Lite: q_proj straight from the hidden
// state, kv_a_proj_with_mqa replicated alone, no rotary scaling; experts on
// layer 2 only (moe_layer_freq 2), two shared; softmax routing in the best of
// two groups, weights x 2),
// "llama_wide" (hidden 256, one layer: tensors of 128-512 KiB, for tests that
// need buckets of many 64 KiB verify blocks; not in kTinyConfigs).
ModelConfig tiny_config(const std::string& name);
inline const char* const kTinyConfigs[] = {"llama_gqa",      "qwen2_tied",
                                           "mistral_mqa",    "qwen3_dense",
                                           "qwen3_moe",      "qwen3_moe_plain",
                                           "qwen2_moe",      "mixtral",
                                           "glm4_moe",       "llama_mlp_bias",
                                           "phi3",           "gemma",
                                           "gemma2",         "gemma3",
                                           "granite",        "olmo2",
                                           "olmo3",          "glm4",
                                           "ernie45",        "cohere",
                                           "cohere2",        "cohere_plus",
                                           "exaone4",        "exaone4_full",
                                           "granite_moe",    "granite_moe_shared",
                                           "granite_hybrid", "granite_hybrid_moe",
                                           "deepseek_v3",    "deepseek_v2_lite"};

// Every tensor of `config`'s Hugging Face checkpoint, name and shape, in the
// order of the modeling module tree: written here per family from the
// Hugging Face modules (Phi-3's q/k/v and gate/up stacked, GLM-4's gate/up,
// the Granite lines' experts and shared MLP) and sizes read from the config's
// JSON, not from checkpoint_tensor_specs (families_test checks that one
// against this list). Unquantized checkpoints only.
using CheckpointTensors = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;
CheckpointTensors hf_checkpoint_tensors(const ModelConfig& config);

// Every tensor of hf_checkpoint_tensors(config), with values drawn from a
// generator seeded by `seed`, in the config's dtype.
std::map<std::string, at::Tensor> random_checkpoint(const ModelConfig& config, std::uint64_t seed);

}  // namespace tpreload::testdata

namespace tpreload {
class WeightSource;
}

namespace tpreload::testdata {

// In-memory tensors viewing `tensors` (kept alive by each entry).
std::vector<InMemoryTensor> in_memory(const std::map<std::string, at::Tensor>& tensors);

// An in-memory source over `tensors` (which it keeps alive).
std::unique_ptr<WeightSource> memory_source(const std::map<std::string, at::Tensor>& tensors);

// The checkpoint with Phi-3's stacked tensors cut into Hugging Face's separate
// ones by the tests' own row arithmetic (self_attn.qkv_proj: num_attention_heads
// x head_dim rows of q_proj, then num_key_value_heads x head_dim of k_proj and
// of v_proj; mlp.gate_up_proj: gate's rows the first half, up's the second;
// weights and biases; GraniteMoE's block_sparse_moe.input_linear [E, 2I, H]:
// expert e's w1 the first I rows of [e], its w3 the next; output_linear [E, H,
// I]: its w2 [e]; router.layer: the router, gate; Granite's
// shared_mlp.input_linear: gate_proj's rows the first half, up_proj's the
// second), every other tensor as it is.
std::map<std::string, at::Tensor> unstacked(const ModelConfig& config,
                                            const std::map<std::string, at::Tensor>& ckpt);

// What rank `tp_rank` of `tp_size` must hold for every in-model parameter, sliced
// from the checkpoint by rules written here, independently of ShardingRules
// (experts: every expert's slice, or whole experts with `expert_parallel`).
std::map<std::string, at::Tensor> expected_shards(const ModelConfig& config,
                                                  const std::map<std::string, at::Tensor>& ckpt,
                                                  int tp_size, int tp_rank,
                                                  bool expert_parallel = false);

// DeepSeek's absorbed MLA matrices on a rank of tp, as vLLM's MLA backends
// compute them from the rank's kv_b_proj `kv_b` [heads x (qk_nope + v),
// kv_lora_rank] (already dequantized, any floating dtype): the values rounded to
// the model's dtype, viewed per head; W_UK_T [heads, qk_nope, kv_lora_rank] its
// first qk_nope rows, W_UV [heads, kv_lora_rank, v] its next v rows
// transposed; into out under attention prefix `a` ("...self_attn.").
void mla_absorbed(const ModelConfig& config, const at::Tensor& kv_b, const std::string& a, int tp,
                  std::map<std::string, at::Tensor>& out);

// Per-row int8 quantization written out element by element, as the spec
// (tpreload/model/quantize.h) states it: scale = max|w| / 127 (1 for a zero
// row), q = clamp(nearbyint(w / scale), -127, 127).
void quantize_reference(const at::Tensor& shard, at::Tensor& q, at::Tensor& scale);

// Whether an int8 model holds `param` as int8, decided from its name: the
// decoder's linear layers (q/k/v, o, gate/up, down), not embeddings, norms,
// the router or the experts.
bool int8_linear(const std::string& param);

// expected_shards for an int8 model: each int8_linear weight as
// quantize_reference's bytes, with its `<name>_scale`.
std::map<std::string, at::Tensor> expected_int8_shards(
    const ModelConfig& config, const std::map<std::string, at::Tensor>& ckpt, int tp_size,
    int tp_rank);

// Logits of a plain single-process Hugging Face-style forward pass over the
// checkpoint tensors (float64 compute; Qwen3 q/k norms and MoE blocks token by
// token), independent of TensorParallelModel.
//
// This, expected_shards and unstacked read what they compute with (heads, KV
// heads, head_dim, epsilon, rope_theta and rotary scaling, the rotary share,
// tied embeddings, the experts' counts) from `config.json` themselves, with
// each family's Hugging Face defaults written in the test support where a tiny
// config leaves a key out, not from ModelConfig's parsed fields: a wrong
// default in the parser shows as a difference (the family comes from
// config.architecture).
at::Tensor reference_logits(const ModelConfig& config,
                            const std::map<std::string, at::Tensor>& ckpt,
                            const std::vector<std::int64_t>& tokens);

// Whether two tensors hold the same bytes (and dtype and shape).
bool same_bytes(const at::Tensor& a, const at::Tensor& b);

}  // namespace tpreload::testdata
