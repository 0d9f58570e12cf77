#include "tiny_models.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tpreload/model/torch_dtype.h"

namespace tpreload::testdata {

ModelConfig tiny_config(const std::string& name) {
  std::string json;
  if (name == "llama_gqa")
    json = R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":100,
      "rms_norm_eps":1e-5,"rope_theta":10000.0,"tie_word_embeddings":false,
      "attention_bias":true,"torch_dtype":"bfloat16"})";
  else if (name == "qwen2_tied")
    json = R"({"architectures":["Qwen2ForCausalLM"],"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":4,"vocab_size":130,
      "rms_norm_eps":1e-6,"rope_theta":1000000.0,"tie_word_embeddings":true,
      "torch_dtype":"float32"})";
  else if (name == "mistral_mqa")
    json = R"({"architectures":["MistralForCausalLM"],"hidden_size":32,"intermediate_size":64,
      "num_hidden_layers":1,"num_attention_heads":8,"num_key_value_heads":1,"head_dim":8,
      "vocab_size":200,"rms_norm_eps":1e-5,"tie_word_embeddings":false,"torch_dtype":"float16"})";
  else if (name == "qwen3_dense")  // head_dim 16 with hidden 64 / 8 heads: read from the config
    json = R"({"architectures":["Qwen3ForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"head_dim":16,
      "vocab_size":150,"rms_norm_eps":1e-6,"rope_theta":1000000.0,"tie_word_embeddings":false,
      "attention_bias":true,"torch_dtype":"bfloat16"})";
  else if (name == "qwen3_moe")  // layers 0 and 2 sparse, layer 1 dense (mlp_only_layers)
    json = R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":3,"num_attention_heads":8,"num_key_value_heads":4,"head_dim":8,
      "vocab_size":130,"rms_norm_eps":1e-6,"rope_theta":1000000.0,"tie_word_embeddings":true,
      "num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":32,"decoder_sparse_step":1,
      "mlp_only_layers":[1],"norm_topk_prob":true,"dtype":"bfloat16"})";
  else if (name ==
           "qwen3_moe_plain")  // layers 1 and 3 sparse (every second), top 3, no renormalising
    json = R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":32,"intermediate_size":64,
      "num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":2,"head_dim":8,
      "vocab_size":110,"rms_norm_eps":1e-6,"tie_word_embeddings":false,"num_experts":8,
      "num_experts_per_tok":3,"moe_intermediate_size":16,"decoder_sparse_step":2,
      "norm_topk_prob":false,"torch_dtype":"float16"})";
  else if (name == "qwen2_moe")  // layer 0 dense; experts of 16 and a shared expert of 40
    json = R"({"architectures":["Qwen2MoeForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":3,"num_attention_heads":8,"num_key_value_heads":4,"vocab_size":140,
      "rms_norm_eps":1e-6,"rope_theta":1000000.0,"tie_word_embeddings":false,"num_experts":8,
      "num_experts_per_tok":3,"moe_intermediate_size":16,"shared_expert_intermediate_size":40,
      "decoder_sparse_step":1,"mlp_only_layers":[0],"norm_topk_prob":false,
      "torch_dtype":"bfloat16"})";
  else if (name == "glm4_moe")  // GLM-4.5's form: layer 0 dense, layers 1-2 sparse: 16 experts
    // of 16 in 4 groups, the best 2 groups kept, top 3 there, weights x 2.5, 2 shared experts;
    // q/k/v biases, q/k normed per head, heads of 16 over a hidden size of 64, half of each
    // turned (partial_rotary_factor absent); an MTP layer the model does not read
    json = R"({"architectures":["Glm4MoeForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":3,"num_attention_heads":8,"num_key_value_heads":4,"head_dim":16,
      "vocab_size":130,"rms_norm_eps":1e-05,"rope_theta":1000000,"attention_bias":true,
      "use_qk_norm":true,"tie_word_embeddings":false,"n_routed_experts":16,
      "num_experts_per_tok":3,"moe_intermediate_size":16,"n_shared_experts":2,
      "first_k_dense_replace":1,"n_group":4,"topk_group":2,"routed_scaling_factor":2.5,
      "norm_topk_prob":true,"num_nextn_predict_layers":1,"hidden_act":"silu",
      "torch_dtype":"bfloat16"})";
  else if (name == "mixtral")  // every layer sparse, top 2 of 8 renormalised; rope_theta absent
    json = R"({"architectures":["MixtralForCausalLM"],"hidden_size":64,"intermediate_size":48,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":120,
      "rms_norm_eps":1e-5,"tie_word_embeddings":false,"num_local_experts":8,
      "num_experts_per_tok":2,"sliding_window":null,"router_aux_loss_coef":0.02,
      "torch_dtype":"bfloat16"})";
  else if (name == "llama_mlp_bias")  // o_proj and MLP biases, none on q/k/v (qkv_bias false)
    json = R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":4,"vocab_size":110,
      "bias":true,"qkv_bias":false,"mlp_bias":true,"torch_dtype":"bfloat16"})";
  else if (name == "phi3")  // q/k/v and gate/up stacked in the checkpoint; GQA; half rotary
    // (biases as vLLM's Llama reads them, which no released Phi-3 sets: they
    // stack too)
    json = R"({"architectures":["Phi3ForCausalLM"],"hidden_size":64,"intermediate_size":80,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":105,
      "partial_rotary_factor":0.5,"tie_word_embeddings":false,"rope_scaling":null,
      "attention_bias":true,"mlp_bias":true,"sliding_window":2047,"torch_dtype":"bfloat16"})";
  else if (name == "gemma")  // MQA, head_dim 16 != 48 / 8, tied by default, GeLU from hidden_act
    json = R"({"architectures":["GemmaForCausalLM"],"hidden_size":48,"intermediate_size":64,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":1,"head_dim":16,
      "vocab_size":130,"hidden_act":"gelu","torch_dtype":"bfloat16"})";
  else if (name == "gemma2")  // sandwich norms, scaled and capped attention, windows of 3
    json = R"({"architectures":["Gemma2ForCausalLM"],"hidden_size":48,"intermediate_size":64,
      "num_hidden_layers":3,"num_attention_heads":8,"num_key_value_heads":2,"head_dim":16,
      "vocab_size":140,"hidden_act":"gelu_pytorch_tanh","hidden_activation":"gelu_pytorch_tanh",
      "query_pre_attn_scalar":24,
      "attn_logit_softcapping":2.0,"final_logit_softcapping":3.0,"sliding_window":3,
      "attention_bias":true,
      "torch_dtype":"bfloat16"})";
  else if (name == "gemma3")  // q/k norms; layers 0 and 1 slide (pattern 3) at their own base
    json = R"({"architectures":["Gemma3ForCausalLM"],"hidden_size":48,"intermediate_size":64,
      "num_hidden_layers":3,"num_attention_heads":8,"num_key_value_heads":2,"head_dim":16,
      "vocab_size":150,"hidden_activation":"gelu_pytorch_tanh","query_pre_attn_scalar":32,
      "rope_theta":1000000.0,"rope_local_base_freq":100.0,
      "rope_scaling":{"rope_type":"linear","factor":4.0},"sliding_window":3,
      "sliding_window_pattern":3,"attn_logit_softcapping":null,"final_logit_softcapping":null,
      "torch_dtype":"bfloat16"})";
  else if (name == "granite")  // every multiplier away from 1; q/k/v/o and MLP biases; tied
    json = R"({"architectures":["GraniteForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":115,
      "hidden_act":"silu","embedding_multiplier":4.0,"attention_multiplier":0.25,
      "residual_multiplier":0.5,"logits_scaling":3.0,"attention_bias":true,"mlp_bias":true,
      "tie_word_embeddings":true,"rope_theta":10000000.0,"torch_dtype":"bfloat16"})";
  else if (name == "olmo2")  // post-norms, q/k normed whole; 2 KV heads; eps and theta defaults
    json = R"({"architectures":["Olmo2ForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":120,
      "attention_bias":false,"tie_word_embeddings":false,"torch_dtype":"bfloat16"})";
  else if (name == "olmo3")  // layers 0, 2, 3 slide over windows of 3; layer 1 full and scaled
    json = R"({"architectures":["Olmo3ForCausalLM"],"hidden_size":64,"intermediate_size":80,
      "num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":125,
      "sliding_window":3,"layer_types":["sliding_attention","full_attention",
      "sliding_attention","sliding_attention"],"rope_theta":50000.0,
      "rope_scaling":{"rope_type":"linear","factor":4.0},"tie_word_embeddings":true,
      "torch_dtype":"bfloat16"})";
  else if (name == "glm4")  // sandwich norms of its own names; half of each head interleaved
    // (partial_rotary_factor, attention_bias, num_key_value_heads and
    // rms_norm_eps absent: Glm4Config's 0.5, true, 2, 1.5625e-7)
    json = R"({"architectures":["Glm4ForCausalLM"],"hidden_size":64,"intermediate_size":80,
      "num_hidden_layers":2,"num_attention_heads":8,"head_dim":16,"vocab_size":135,
      "hidden_act":"silu","rope_theta":10000.0,"tie_word_embeddings":false,
      "torch_dtype":"bfloat16"})";
  else if (name == "ernie45")  // interleaved rotary over whole heads; tied, KV heads and
    // rope_theta absent (Ernie4_5Config's true, 2, 500000)
    json = R"({"architectures":["Ernie4_5ForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":2,"num_attention_heads":8,"head_dim":16,"vocab_size":120,
      "rms_norm_eps":1e-05,"use_bias":false,"torch_dtype":"bfloat16"})";
  else if (name == "cohere")  // LayerNorm, attention and MLP in parallel, logits x 0.25;
    // tied and rope_theta absent (CohereConfig's true, transformers 4's 10000)
    json = R"({"architectures":["CohereForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":125,
      "layer_norm_eps":1e-05,"logit_scale":0.25,"use_qk_norm":false,"attention_bias":false,
      "hidden_act":"silu","torch_dtype":"bfloat16"})";
  else if (name == "cohere2")  // Cohere's layout; layers 0-2 of 4 slide over windows of 3
    // (sliding_window_pattern absent: 4) and turn rotary, layer 3 turns none
    json = R"({"architectures":["Cohere2ForCausalLM"],"hidden_size":64,"intermediate_size":80,
      "num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":130,
      "layer_norm_eps":1e-05,"logit_scale":0.5,"sliding_window":3,"rope_theta":50000.0,
      "hidden_act":"silu","torch_dtype":"bfloat16"})";
  else if (name == "granite_moe")  // GraniteMoE: Granite's scaling, 8 experts of 16 (top 2)
    // stacked in input_linear / output_linear / router.layer; tied
    json = R"({"architectures":["GraniteMoeForCausalLM"],"hidden_size":64,"intermediate_size":16,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":105,
      "num_local_experts":8,"num_experts_per_tok":2,"embedding_multiplier":6.0,
      "attention_multiplier":0.125,"residual_multiplier":0.5,"logits_scaling":2.0,
      "attention_bias":false,"hidden_act":"silu","tie_word_embeddings":true,"rms_norm_eps":1e-06,
      "torch_dtype":"bfloat16"})";
  else if (name == "cohere_plus")  // Command R+'s use_qk_norm: q and k each head normed by
    // its own LayerNorm weights; 8 heads / 2 KV heads (replicated from tp 4 on)
    json = R"({"architectures":["CohereForCausalLM"],"hidden_size":64,"intermediate_size":80,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":115,
      "layer_norm_eps":1e-05,"logit_scale":0.125,"use_qk_norm":true,"rope_theta":75000000.0,
      "hidden_act":"silu","torch_dtype":"bfloat16"})";
  else if (name == "exaone4")  // (the 32B's form) post-norms, q/k normed per head, 8 heads
    // of 16 over a hidden size of 64, llama3 scaling; layers 0, 2 and 3 slide over windows
    // of 3 and turn rotary, layer 1 turns none (layer_types, not the pattern beside it)
    json = R"({"architectures":["Exaone4ForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":2,"head_dim":16,
      "vocab_size":110,"rms_norm_eps":1e-05,"rope_theta":1000000.0,
      "rope_scaling":{"rope_type":"llama3","factor":16.0,"low_freq_factor":1.0,
      "high_freq_factor":4.0,"original_max_position_embeddings":8192},"sliding_window":3,
      "sliding_window_pattern":"LLLG","layer_types":["sliding_attention","full_attention",
      "sliding_attention","sliding_attention"],"tie_word_embeddings":false,"hidden_act":"silu",
      "torch_dtype":"bfloat16"})";
  else if (name == "exaone4_full")  // (the 1.2B's form) no window: every layer full and
    // turning rotary; tied
    json = R"({"architectures":["Exaone4ForCausalLM"],"hidden_size":64,"intermediate_size":80,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":120,
      "rms_norm_eps":1e-05,"rope_theta":10000.0,"sliding_window":null,
      "sliding_window_pattern":null,"layer_types":["full_attention","full_attention"],
      "tie_word_embeddings":true,"torch_dtype":"bfloat16"})";
  else if (name == "granite_moe_shared")  // GraniteMoeShared: GraniteMoE's 8 experts of 16
    // (top 2) and a shared MLP of 48 in every layer; untied
    json = R"({"architectures":["GraniteMoeSharedForCausalLM"],"hidden_size":64,
      "intermediate_size":16,"shared_intermediate_size":48,"num_hidden_layers":2,
      "num_attention_heads":8,"num_key_value_heads":2,"vocab_size":110,"num_local_experts":8,
      "num_experts_per_tok":2,"embedding_multiplier":4.0,"attention_multiplier":0.25,
      "residual_multiplier":0.75,"logits_scaling":3.0,"attention_bias":false,"hidden_act":"silu",
      "tie_word_embeddings":false,"rms_norm_eps":1e-06,"torch_dtype":"bfloat16"})";
  else if (name == "granite_hybrid")  // (granite-4.0-micro's form) GraniteMoeHybrid with
    // attention layers only and no experts: the shared MLP of 80 is each layer's MLP; rotary
    // at 1e7; q/k/v and o_proj biases (attention_bias); tied
    json = R"({"architectures":["GraniteMoeHybridForCausalLM"],"hidden_size":64,
      "intermediate_size":80,"shared_intermediate_size":80,"num_local_experts":0,
      "num_experts_per_tok":0,"layer_types":["attention","attention"],"num_hidden_layers":2,
      "num_attention_heads":8,"num_key_value_heads":2,"vocab_size":130,
      "position_embedding_type":"rope","rope_theta":10000000,"embedding_multiplier":12.0,
      "attention_multiplier":0.0078125,"residual_multiplier":0.22,"logits_scaling":10.0,
      "attention_bias":true,"mamba_n_heads":128,"hidden_act":"silu","tie_word_embeddings":true,
      "rms_norm_eps":1e-05,"torch_dtype":"bfloat16"})";
  else if (name == "granite_hybrid_moe")  // GraniteMoeHybrid with attention layers only,
    // 8 experts of 16 (top 2) and a shared MLP of 32; no rotary (position_embedding_type
    // "nope"); untied
    json = R"({"architectures":["GraniteMoeHybridForCausalLM"],"hidden_size":64,
      "intermediate_size":16,"shared_intermediate_size":32,"num_local_experts":8,
      "num_experts_per_tok":2,"layer_types":["attention","attention"],"num_hidden_layers":2,
      "num_attention_heads":8,"num_key_value_heads":2,"vocab_size":120,
      "position_embedding_type":"nope","embedding_multiplier":2.0,"attention_multiplier":0.5,
      "residual_multiplier":0.5,"logits_scaling":4.0,"attention_bias":false,"hidden_act":"silu",
      "tie_word_embeddings":false,"rms_norm_eps":1e-05,"torch_dtype":"bfloat16"})";
  else if (name == "deepseek_v3")  // DeepSeek-V3's form: q through q_lora_rank 32 (merged with
    // kv_a_proj_with_mqa in fused_qkv_a_proj), 8 heads of 16 + 8 rotary dims, v of 16;
    // layer 0 dense, layers 1-2 with 8 experts of 16 and a shared one, noaux_tc routing
    // (a float32 e_score_correction_bias); an MTP layer the model does not read
    json = R"({"architectures":["DeepseekV3ForCausalLM"],"hidden_size":64,
      "intermediate_size":96,"num_hidden_layers":3,"num_attention_heads":8,
      "num_key_value_heads":8,"vocab_size":120,"q_lora_rank":32,"kv_lora_rank":16,
      "qk_nope_head_dim":16,"qk_rope_head_dim":8,"v_head_dim":16,"n_routed_experts":8,
      "num_experts_per_tok":2,"moe_intermediate_size":16,"n_shared_experts":1,
      "first_k_dense_replace":1,"moe_layer_freq":1,"n_group":2,"topk_group":1,
      "topk_method":"noaux_tc","scoring_func":"sigmoid","routed_scaling_factor":2.5,
      "norm_topk_prob":true,"num_nextn_predict_layers":1,"rms_norm_eps":1e-06,
      "rope_theta":10000,"rope_scaling":{"type":"yarn","factor":40,"beta_fast":32,
      "beta_slow":1,"mscale":1.0,"mscale_all_dim":1.0,"original_max_position_embeddings":4096},
      "hidden_act":"silu","tie_word_embeddings":false,"torch_dtype":"bfloat16"})";
  else if (name == "deepseek_v2_lite")  // DeepSeek-V2-Lite's form: q straight from the
    // hidden state (q_lora_rank null), kv_a_proj_with_mqa replicated; layer 0 dense, then
    // experts every second layer (moe_layer_freq 2: layer 2 only), two shared ones, softmax
    // routing in the best of 2 groups (DeepSeek-V2's group_limited_greedy; no score
    // correction), weights x 2
    json = R"({"architectures":["DeepseekV2ForCausalLM"],"hidden_size":64,
      "intermediate_size":80,"num_hidden_layers":3,"num_attention_heads":8,
      "num_key_value_heads":8,"vocab_size":110,"q_lora_rank":null,"kv_lora_rank":16,
      "qk_nope_head_dim":8,"qk_rope_head_dim":8,"v_head_dim":8,"n_routed_experts":8,
      "num_experts_per_tok":2,"moe_intermediate_size":16,"n_shared_experts":2,
      "first_k_dense_replace":1,"moe_layer_freq":2,"topk_method":"group_limited_greedy",
      "scoring_func":"softmax","n_group":2,"topk_group":1,"routed_scaling_factor":2.0,
      "norm_topk_prob":false,"rms_norm_eps":1e-06,"rope_theta":10000,"hidden_act":"silu",
      "tie_word_embeddings":false,"torch_dtype":"bfloat16"})";
  else if (name == "llama_wide")  // tensors of 128-512 KiB: many 64 KiB blocks per bucket
    json = R"({"architectures":["LlamaForCausalLM"],"hidden_size":256,"intermediate_size":1024,
      "num_hidden_layers":1,"num_attention_heads":8,"num_key_value_heads":8,"vocab_size":512,
      "torch_dtype":"bfloat16"})";
  else
    throw std::invalid_argument("unknown tiny config '" + name + "'");
  return parse_model_config(json, name);
}

// (a generator of its own, not the process's: ranks as threads draw the same
// checkpoint at once; the same values as at::manual_seed(seed) gives)
std::map<std::string, at::Tensor> random_checkpoint(const ModelConfig& config, std::uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [name, shape] : hf_checkpoint_tensors(config)) {
    const bool norm = name.find("norm") != std::string::npos;
    at::Tensor t = at::randn(shape, generator, at::kFloat) * (norm ? 0.1 : 0.2);
    if (norm) t = t + 1.0;
    tensors[name] = t.to(dtype_to_torch(config.dtype)).contiguous();
  }
  return tensors;
}

}  // namespace tpreload::testdata

#include <cmath>
#include <cstring>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/model/model.h"

namespace tpreload::testdata {

std::vector<InMemoryTensor> in_memory(const std::map<std::string, at::Tensor>& tensors) {
  std::vector<InMemoryTensor> list;
  for (const auto& [name, t] : tensors) {
    auto owned = std::make_shared<at::Tensor>(t.contiguous());
    list.push_back({name, dtype_from_torch(t.scalar_type()), t.sizes().vec(),
                    ConstBytes(owned->data_ptr(), owned->numel() * owned->element_size()),
                    std::shared_ptr<const void>(owned, owned.get())});
  }
  return list;
}

std::unique_ptr<WeightSource> memory_source(const std::map<std::string, at::Tensor>& tensors) {
  return make_in_memory_source(in_memory(tensors));
}

namespace {

at::Tensor rows(const at::Tensor& t, std::int64_t start, std::int64_t count) {
  return t.slice(0, start, start + count);
}

at::Tensor vocab_shard(const at::Tensor& t, std::int64_t vocab, int tp, int r) {
  const std::int64_t padded = (vocab + 63) / 64 * 64, per = padded / tp;
  at::Tensor out = at::zeros({per, t.size(1)}, t.options());
  const std::int64_t start = r * per, end = std::min(vocab, start + per);
  if (end > start) out.slice(0, 0, end - start).copy_(t.slice(0, start, end));
  return out;
}

}  // namespace

namespace {

// The tests' own reading of the configs (not ModelConfig's helpers): Qwen3
// families normalise q and k per head; every Mixtral layer is sparse, and a
// Qwen3-MoE layer unless it is mlp-only or off the sparse step.
bool qwen3(const ModelConfig& c) {
  return c.architecture.rfind("Qwen3", 0) == 0;
}

// Mixtral's experts and router (block_sparse_moe: w1, w3, w2): Mixtral's own,
// and the Granite lines' with experts once their checkpoint's stacked experts
// are taken apart (unstacked()).
bool mixtral(const ModelConfig& c) {
  return c.architecture == "MixtralForCausalLM" || c.architecture == "GraniteMoeForCausalLM" ||
         c.architecture == "GraniteMoeSharedForCausalLM" ||
         c.architecture == "GraniteMoeHybridForCausalLM";
}

bool gemma(const ModelConfig& c) {  // (Gemma, Gemma 2 and Gemma 3)
  return c.architecture.rfind("Gemma", 0) == 0;
}

bool gemma3(const ModelConfig& c) {
  return c.architecture == "Gemma3ForCausalLM";
}

bool olmo(const ModelConfig& c) {  // (OLMo 2 and OLMo 3)
  return c.architecture.rfind("Olmo", 0) == 0;
}

// EXAONE 4 (vLLM's exaone4.py; Exaone4Config's defaults): OLMo's post-norms,
// q and k normed per head; with a sliding_window (4096 when absent) the
// layers `layer_types` marks sliding (else all but every
// sliding_window_pattern-th, 4 when absent) slide and
// turn rotary, the full ones none; with a null window every layer is full and
// turns rotary.
bool exaone4(const ModelConfig& c) {
  return c.architecture == "Exaone4ForCausalLM";
}

// No input norm; the attention's and the MLP's outputs normed before each
// joins the residual.
bool post_norms(const ModelConfig& c) {
  return olmo(c) || exaone4(c);
}

// GLM-4 (vLLM's glm4.py; Glm4Config's defaults): q/k/v biases unless
// attention_bias is false, the attention's and the MLP's inputs normed by
// input_layernorm and post_attention_layernorm and their outputs by
// post_self_attn_layernorm and post_mlp_layernorm, rotary on interleaved
// pairs over partial_rotary_factor of each head (0.5 when absent).
bool glm4(const ModelConfig& c) {
  return c.architecture == "Glm4ForCausalLM";
}

// GLM-4.5 (vLLM's glm4_moe.py): Llama's norms, q/k/v biases as attention_bias
// says, q and k normed per head with use_qk_norm, rotary on halves over
// partial_rotary_factor of each head (0.5 when absent); the layers from
// first_k_dense_replace on sparse, routed by sigmoid over groups (moe()), with
// shared experts; the router and its score correction float32 parameters.
bool glm4_moe(const ModelConfig& c) {
  return c.architecture == "Glm4MoeForCausalLM";
}

// DeepSeek-V2 and V3 (vLLM's deepseek_v2.py): multi-head latent attention
// (mla_expected), dense layers before first_k_dense_replace, then experts on
// every moe_layer_freq-th layer, with shared experts and, for topk_method
// noaux_tc, a float32 e_score_correction_bias; the router in the model's dtype.
bool deepseek(const ModelConfig& c) {
  return c.architecture == "DeepseekV2ForCausalLM" || c.architecture == "DeepseekV3ForCausalLM";
}

// Cohere (vLLM's commandr.py; CohereConfig's defaults): LayerNorm without
// bias, attention and MLP on one normed input, their outputs added to the
// residual together, logits from the embeddings times logit_scale (0.0625
// when absent).
bool cohere(const ModelConfig& c) {  // (Cohere and Cohere 2)
  return c.architecture == "CohereForCausalLM" || c.architecture == "Cohere2ForCausalLM";
}

// Command R+ (use_qk_norm in a Cohere config): q and k normed per head by a
// LayerNorm whose weights are each head's own, [heads, head_dim].
bool cohere_qk_norms(const ModelConfig& c) {
  return cohere(c) && nlohmann::json::parse(c.json).value("use_qk_norm", false);
}

// Rotary on interleaved pairs: GLM-4's, ERNIE 4.5's (vLLM's ernie45.py
// turns its Llama's to GPT-J's pairs) and Cohere's.
bool interleaved_pairs(const ModelConfig& c) {
  return glm4(c) || cohere(c) || c.architecture == "Ernie4_5ForCausalLM";
}

// RMSNorm of q and k before rotary: Qwen3's, Gemma 3's and EXAONE 4's per head, OLMo's
// over the whole projection.
bool qk_norms(const ModelConfig& c) {
  return qwen3(c) || gemma3(c) || olmo(c) || exaone4(c) || cohere_qk_norms(c) ||
         (glm4_moe(c) && nlohmann::json::parse(c.json).value("use_qk_norm", false));
}

// A rotary embedding as the reference reads it from a config's JSON: the
// base, and rope_scaling's settings (or a flat rope_parameters'), with vLLM's
// defaults where one is absent, written here (yarn: beta_fast 32, beta_slow 1,
// extrapolation_factor and attn_factor 1, scaled and truncated; "su" is
// longrope's older name; the context lengths from the settings, else from the
// config's top level).
struct Rotary {
  double theta = 10000;
  std::string type = "default";
  double factor = 1, low_freq_factor = 0, high_freq_factor = 0;
  double original = 0, max_positions = 0;  // (original_ and max_position_embeddings)
  double beta_fast = 32, beta_slow = 1, extrapolation_factor = 1, attn_factor = 1;
  bool apply_yarn_scaling = true, truncate = true;
  std::vector<double> short_factor, long_factor;
  double short_mscale = 0, long_mscale = 0, alpha = 0;
  double mscale = 1, mscale_all_dim = 0;  // (DeepSeek's yarn; vLLM's defaults)
};

// What the reference computes with, read from the config's JSON here rather
// than taken from ModelConfig (whose parsing is under test). Keys a tiny
// config leaves out take the defaults of the family's Hugging Face config
// class, written below for the families whose tiny configs leave them out;
// any other absent key is an error of the test.
struct Reading {
  std::int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, layers = 0, vocab = 0;
  double eps = 0;                     // rms_norm_eps, or Cohere's layer_norm_eps
  double share = 1;                   // partial_rotary_factor
  at::ScalarType dtype = at::kFloat;  // torch_dtype (or transformers 5's dtype)
  bool tied = false;
  Rotary rotary;
  // Sparse layers: how many experts, how many a token takes, whether their
  // weights are renormalised, and which layers are sparse (Qwen-MoE's
  // decoder_sparse_step and mlp_only_layers).
  std::int64_t experts = 0, top_k = 0, sparse_step = 1;
  bool renormalise = false;
  std::vector<std::int64_t> mlp_only;
  // Which projections have biases, as each family's vLLM model takes them from
  // the config: Llama's, Mistral's and Phi-3's o_proj with attention_bias or
  // bias, q/k/v's the same unless qkv_bias says, the MLP's with mlp_bias;
  // Qwen2's (and Qwen2-MoE's) q/k/v always; Qwen3's and GLM-4.5's q/k/v with
  // attention_bias; Gemma 2's, Gemma 3's and GraniteMoeHybrid's q/k/v and o_proj
  // with attention_bias; Granite's with attention_bias or bias, its MLP's with
  // mlp_bias; GLM-4's q/k/v unless attention_bias is false; none elsewhere.
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
};

Reading read_config(const ModelConfig& c) {
  const nlohmann::json j = nlohmann::json::parse(c.json);
  const std::string& a = c.architecture;
  const auto given = [&](const nlohmann::json& o, const char* key) {
    return o.contains(key) && !o[key].is_null();
  };
  // `key`, else `fallback` where the family's config class has that default
  // (`has` false: the reference has none, and the test must give the key).
  auto number = [&](const char* key, bool has, double fallback) {
    if (given(j, key)) return j[key].get<double>();
    if (!has)
      throw std::invalid_argument("the reference has no default for '" + std::string(key) +
                                  "' of " + a + ": write it");
    return fallback;
  };
  Reading r;
  r.hidden = j.at("hidden_size");
  r.heads = j.at("num_attention_heads");
  r.layers = j.at("num_hidden_layers");
  r.vocab = j.at("vocab_size");
  const std::string dtype = j.value("torch_dtype", j.value("dtype", std::string()));
  if (dtype == "bfloat16")
    r.dtype = at::kBFloat16;
  else if (dtype == "float16")
    r.dtype = at::kHalf;
  else if (dtype != "float32")
    throw std::invalid_argument("the reference reads float32, float16 or bfloat16, not '" + dtype +
                                "'");
  // (Glm4Config's and Ernie4_5Config's default: 2 KV heads)
  r.kv_heads = static_cast<std::int64_t>(
      number("num_key_value_heads", glm4(c) || a == "Ernie4_5ForCausalLM", 2));
  // (head_dim: hidden_size / num_attention_heads where it is absent, but for
  // the families whose config classes default it otherwise (Gemma's 256;
  // Qwen3's, GLM-4's and ERNIE 4.5's 128), whose tiny configs give it)
  const bool own_head_dim = gemma(c) || qwen3(c) || glm4(c) || a == "Ernie4_5ForCausalLM";
  r.head_dim =
      static_cast<std::int64_t>(number("head_dim", !own_head_dim, double(r.hidden) / r.heads));
  if (cohere(c)) {
    r.eps = number("layer_norm_eps", true, 1e-5);
  } else {
    // LlamaConfig's, GemmaConfig's and GraniteConfig's 1e-6; Phi3Config's and
    // the OLMo configs' 1e-5; Glm4Config's 1.5625e-7
    const bool small = a == "LlamaForCausalLM" || gemma(c) || a == "GraniteForCausalLM";
    const bool olmo_or_phi = olmo(c) || a == "Phi3ForCausalLM";
    r.eps = number("rms_norm_eps", small || olmo_or_phi || glm4(c),
                   small         ? 1e-6
                   : olmo_or_phi ? 1e-5
                                 : 1.5625e-7);
  }
  // (tied: GemmaConfig's, CohereConfig's and Ernie4_5Config's default; not
  // LlamaConfig's)
  const bool tied_default = gemma(c) || cohere(c) || a == "Ernie4_5ForCausalLM";
  if (given(j, "tie_word_embeddings"))
    r.tied = j["tie_word_embeddings"].get<bool>();
  else if (tied_default || a == "LlamaForCausalLM")
    r.tied = tied_default;
  else
    throw std::invalid_argument("the reference has no default for 'tie_word_embeddings' of " + a);
  // Rotary: a flat rope_parameters (transformers 5) holds what the top level
  // and rope_scaling hold in transformers 4.
  const bool flat_parameters = given(j, "rope_parameters") &&
                               !j["rope_parameters"].contains("full_attention") &&
                               !j["rope_parameters"].contains("sliding_attention");
  const nlohmann::json none = nlohmann::json::object();
  const nlohmann::json& params = flat_parameters ? j["rope_parameters"] : none;
  // (a rope_scaling of the default kind alone, or empty, is none: rope_parameters' then)
  const auto default_kind = [&](const nlohmann::json& o) {
    for (const auto& [key, value] : o.items())
      if ((key != "rope_type" && key != "type") || value != "default") return false;
    return true;
  };
  const bool scaled = given(j, "rope_scaling") && !default_kind(j["rope_scaling"]);
  const nlohmann::json& scaling = scaled ? j["rope_scaling"] : params;
  // (MixtralConfig's 1e6, Ernie4_5Config's 500000, 10000 elsewhere)
  const double theta_default = a == "MixtralForCausalLM"    ? 1e6
                               : a == "Ernie4_5ForCausalLM" ? 5e5
                                                            : 1e4;
  r.rotary.theta = given(params, "rope_theta") ? params["rope_theta"].get<double>()
                                               : number("rope_theta", true, theta_default);
  r.share = given(params, "partial_rotary_factor")
                ? params["partial_rotary_factor"].get<double>()
                : number("partial_rotary_factor", true, glm4(c) || glm4_moe(c) ? 0.5 : 1.0);
  Rotary& s = r.rotary;
  if (given(scaling, "rope_type"))
    s.type = scaling["rope_type"];
  else if (given(scaling, "type"))
    s.type = scaling["type"];
  if (s.type == "su") s.type = "longrope";
  auto setting = [&](const char* key, auto& out) {
    if (given(scaling, key)) out = scaling[key].get<std::decay_t<decltype(out)>>();
  };
  auto context = [&](const char* key, double& out) {
    if (given(scaling, key))
      out = scaling[key].get<double>();
    else if (given(j, key))
      out = j[key].get<double>();
  };
  setting("factor", s.factor);
  setting("low_freq_factor", s.low_freq_factor);
  setting("high_freq_factor", s.high_freq_factor);
  context("original_max_position_embeddings", s.original);
  if (s.type == "longrope") context("max_position_embeddings", s.max_positions);
  setting("beta_fast", s.beta_fast);
  setting("beta_slow", s.beta_slow);
  setting("extrapolation_factor", s.extrapolation_factor);
  setting("attn_factor", s.attn_factor);
  setting("apply_yarn_scaling", s.apply_yarn_scaling);
  setting("truncate", s.truncate);
  setting("short_factor", s.short_factor);
  setting("long_factor", s.long_factor);
  setting("short_mscale", s.short_mscale);
  setting("long_mscale", s.long_mscale);
  setting("alpha", s.alpha);
  setting("mscale", s.mscale);
  setting("mscale_all_dim", s.mscale_all_dim);
  // Experts: Mixtral's lines' num_local_experts, the Qwens' num_experts,
  // GLM-4.5's n_routed_experts.
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"})
    if (given(j, key)) r.experts = j[key];
  if (given(j, "num_experts_per_tok")) r.top_k = j["num_experts_per_tok"];
  r.renormalise = given(j, "norm_topk_prob") && j["norm_topk_prob"].get<bool>();
  if (given(j, "decoder_sparse_step")) r.sparse_step = j["decoder_sparse_step"];
  if (given(j, "mlp_only_layers"))
    r.mlp_only = j["mlp_only_layers"].get<std::vector<std::int64_t>>();
  const auto flag = [&](const char* key) { return given(j, key) && j[key].get<bool>(); };
  if (a == "LlamaForCausalLM" || a == "MistralForCausalLM" || a == "Phi3ForCausalLM") {
    r.o_bias = flag("attention_bias") || flag("bias");
    r.qkv_bias = given(j, "qkv_bias") ? flag("qkv_bias") : r.o_bias;
    r.mlp_bias = flag("mlp_bias");
  } else if (a == "Qwen2ForCausalLM" || a == "Qwen2MoeForCausalLM") {
    r.qkv_bias = true;
  } else if (qwen3(c) || glm4_moe(c)) {
    r.qkv_bias = flag("attention_bias");
  } else if (a == "Gemma2ForCausalLM" || gemma3(c) || a == "GraniteMoeHybridForCausalLM") {
    r.qkv_bias = r.o_bias = flag("attention_bias");
  } else if (a == "GraniteForCausalLM") {
    r.qkv_bias = r.o_bias = flag("attention_bias") || flag("bias");
    r.mlp_bias = flag("mlp_bias");
  } else if (glm4(c)) {
    r.qkv_bias = !given(j, "attention_bias") || flag("attention_bias");
  }
  return r;
}

// Gemma 2's and Gemma 3's attention, as the config's JSON says (read here,
// with Gemma2Config's and Gemma3TextConfig's defaults): scores scaled by
// query_pre_attn_scalar^-1/2, capped at attn_logit_softcapping (Gemma 2 only:
// vLLM's Gemma3Attention takes no cap), the final logits at
// final_logit_softcapping (null: no cap), and layers that attend to the
// sliding_window latest positions (null: none): those `layer_types` marks
// sliding, else Gemma 2's even ones and all of Gemma 3's but every
// sliding_window_pattern-th. Gemma 3 chooses each layer's rotary by its
// type, window or not: the full layers' at rope_theta (1e6 when absent) with
// rope_scaling, the sliding ones' at rope_local_base_freq (10000 when absent)
// unscaled, or each from its entry of transformers 5's rope_parameters per
// attention type (linear scaling or none: the only kinds read here). OLMo 3
// (Olmo3Config's defaults) likewise, without the Gemmas' scaling and caps:
// windows of 4096 on all but every fourth layer, its sliding layers' rotary
// at rope_theta (10000 when absent) unscaled.
struct LayerAttention {
  double scalar = 0, attn_cap = 0, final_cap = 0;
  std::int64_t window = 0;
  std::vector<bool> sliding;
  bool own_rotary = false;  // (Gemma 3's: full and local below)
  double full_base = 0, full_factor = 1, local_base = 0, local_factor = 1;
  bool full_unturned = false;  // (Cohere 2's: no rotary on the full layers)
};

// The base and linear factor of a rotary entry `e` (an object or null), with
// `base` and `factor` where it has none.
void rotary_entry(const nlohmann::json& e, double& base, double& factor) {
  if (!e.is_object()) return;
  base = e.value("rope_theta", base);
  const std::string type = e.value("rope_type", e.value("type", std::string("default")));
  if (type == "linear")
    factor = e.at("factor").get<double>();
  else if (type != "default")
    throw std::invalid_argument("the reference reads linear or default rotary only, not " + type);
}

LayerAttention layer_attention(const ModelConfig& c) {
  LayerAttention g;
  const nlohmann::json j = nlohmann::json::parse(c.json);
  const std::int64_t layers = j.at("num_hidden_layers");
  g.sliding.assign(layers, false);
  // (OLMo 2 slides as OLMo 3 where its config has layer_types)
  const bool olmo3 = c.architecture == "Olmo3ForCausalLM" ||
                     (c.architecture == "Olmo2ForCausalLM" && j.contains("layer_types"));
  const bool cohere2 = c.architecture == "Cohere2ForCausalLM";
  // GraniteMoeHybrid turns rotary only where position_embedding_type is "rope"
  if (c.architecture == "GraniteMoeHybridForCausalLM") {
    g.full_unturned = j.value("position_embedding_type", nlohmann::json()) != "rope";
    return g;
  }
  if (c.architecture != "Gemma2ForCausalLM" && !gemma3(c) && !olmo3 && !cohere2 && !exaone4(c))
    return g;
  auto number = [&](const char* key, double fallback) {
    if (!j.contains(key)) return fallback;
    return j[key].is_null() ? 0.0 : j[key].get<double>();
  };
  if (exaone4(c)) {
    g.window = static_cast<std::int64_t>(number("sliding_window", 4096));
    if (g.window == 0) return g;
    const bool typed = j.contains("layer_types") && !j["layer_types"].is_null();
    const auto pattern = typed ? 0 : static_cast<std::int64_t>(number("sliding_window_pattern", 4));
    for (std::int64_t l = 0; l < layers; ++l)
      g.sliding[l] = typed ? j["layer_types"][l] == "sliding_attention" : (l + 1) % pattern != 0;
    g.full_unturned = true;
    return g;
  }
  if (cohere2) {  // (Cohere2Config: windows of 4096 on all but every 4th layer)
    g.window = static_cast<std::int64_t>(number("sliding_window", 4096));
    const auto pattern = static_cast<std::int64_t>(number("sliding_window_pattern", 4));
    for (std::int64_t l = 0; l < layers; ++l)
      g.sliding[l] = j.contains("layer_types") && !j["layer_types"].is_null()
                         ? j["layer_types"][l] == "sliding_attention"
                         : (l + 1) % pattern != 0;
    g.full_unturned = true;
    return g;
  }
  if (!olmo3) {
    g.scalar = number("query_pre_attn_scalar", 256);
    g.attn_cap = gemma3(c) ? 0 : number("attn_logit_softcapping", 50);
    g.final_cap = number("final_logit_softcapping", gemma3(c) ? 0 : 30);
  }
  g.window = static_cast<std::int64_t>(number("sliding_window", 4096));
  const auto pattern = olmo3 ? 4 : static_cast<std::int64_t>(number("sliding_window_pattern", 6));
  for (std::int64_t l = 0; l < layers; ++l)
    g.sliding[l] = j.contains("layer_types") ? j["layer_types"][l] == "sliding_attention"
                   : gemma3(c) || olmo3      ? (l + 1) % pattern != 0
                                             : l % 2 == 0;
  if (!gemma3(c) && !olmo3) return g;
  g.own_rotary = true;
  g.full_base = number("rope_theta", olmo3 ? 1e4 : 1e6);
  g.local_base = olmo3 ? g.full_base : number("rope_local_base_freq", 10000);
  if (j.contains("rope_scaling")) rotary_entry(j["rope_scaling"], g.full_base, g.full_factor);
  if (j.contains("rope_parameters")) {
    const nlohmann::json& p = j["rope_parameters"];
    if (p.contains("full_attention")) rotary_entry(p["full_attention"], g.full_base, g.full_factor);
    if (p.contains("sliding_attention"))
      rotary_entry(p["sliding_attention"], g.local_base, g.local_factor);
  }
  return g;
}

// Granite's scaling, as its config's JSON says (read here; GraniteConfig's
// 1 when absent): the embeddings times embedding_multiplier, attention scores
// times attention_multiplier (in place of head_dim^-1/2), attention and MLP
// outputs times residual_multiplier, logits over logits_scaling. Every other
// family: none (attention 0: not Granite's).
struct GraniteScales {
  double embedding = 1, attention = 0, residual = 1, logits = 1;
};

GraniteScales granite_scales(const ModelConfig& c) {
  GraniteScales g;
  if (c.architecture.rfind("Granite", 0) != 0) return g;  // (every Granite line)
  const nlohmann::json j = nlohmann::json::parse(c.json);
  g.embedding = j.value("embedding_multiplier", 1.0);
  g.attention = j.value("attention_multiplier", 1.0);
  g.residual = j.value("residual_multiplier", 1.0);
  g.logits = j.value("logits_scaling", 1.0);
  return g;
}

at::Tensor capped(const at::Tensor& x, double cap) {
  return cap > 0 ? cap * at::tanh(x / cap) : x;
}

// Granite's shared MLP's intermediate size, as the config's JSON says (read
// here: shared_intermediate_size, 0 when absent or null).
std::int64_t shared_mlp_size(const ModelConfig& c) {
  const nlohmann::json j = nlohmann::json::parse(c.json);
  return j.contains("shared_intermediate_size") && j["shared_intermediate_size"].is_number()
             ? j["shared_intermediate_size"].get<std::int64_t>()
             : 0;
}

bool sparse(const ModelConfig& c, const Reading& r, std::int64_t layer) {
  // (GraniteMoeHybrid without experts: num_local_experts 0, read here)
  if (mixtral(c)) return nlohmann::json::parse(c.json).value("num_local_experts", 8) > 0;
  if (glm4_moe(c))
    return layer >= nlohmann::json::parse(c.json).at("first_k_dense_replace").get<std::int64_t>();
  if (deepseek(c)) {
    const nlohmann::json j = nlohmann::json::parse(c.json);
    return r.experts > 0 && layer >= j.at("first_k_dense_replace").get<std::int64_t>() &&
           layer % j.at("moe_layer_freq").get<std::int64_t>() == 0;
  }
  if (c.architecture != "Qwen3MoeForCausalLM" && c.architecture != "Qwen2MoeForCausalLM")
    return false;
  if (std::find(r.mlp_only.begin(), r.mlp_only.end(), layer) != r.mlp_only.end()) return false;
  return (layer + 1) % r.sparse_step == 0;
}

// A sparse layer's Hugging Face names: its block and an expert's gate, up and
// down projections (Mixtral's MixtralSparseMoeBlock: w1, w3, w2).
struct ExpertNames {
  std::string block, gate, up, down;
};

ExpertNames expert_names(const ModelConfig& c) {
  if (mixtral(c)) return {"block_sparse_moe.", "w1", "w3", "w2"};
  return {"mlp.", "gate_proj", "up_proj", "down_proj"};
}

// A SwiGLU MLP under `p` on tp rank r: gate's and up's rows r of tp (and their
// biases') stacked into gate_up_proj, down_proj's columns r of tp, down's bias
// replicated. The intermediate size from gate's own tensor.
void expected_mlp(const std::map<std::string, at::Tensor>& ckpt, const std::string& p, int tp,
                  int r, std::map<std::string, at::Tensor>& out) {
  const std::int64_t il = ckpt.at(p + "gate_proj.weight").size(0) / tp;
  out[p + "gate_up_proj.weight"] = at::cat({rows(ckpt.at(p + "gate_proj.weight"), r * il, il),
                                            rows(ckpt.at(p + "up_proj.weight"), r * il, il)});
  out[p + "down_proj.weight"] = ckpt.at(p + "down_proj.weight").slice(1, r * il, r * il + il);
  if (ckpt.count(p + "gate_proj.bias")) {
    out[p + "gate_up_proj.bias"] = at::cat({rows(ckpt.at(p + "gate_proj.bias"), r * il, il),
                                            rows(ckpt.at(p + "up_proj.bias"), r * il, il)});
    out[p + "down_proj.bias"] = ckpt.at(p + "down_proj.bias");
  }
}

// w13 [E_local, 2 x I_local, hidden] and w2 [E_local, hidden, I_local] of rank r:
// every expert's rows/columns r of tp (tensor-parallel experts), or experts
// [r x E/tp, (r + 1) x E/tp) whole (expert parallelism).
void expected_experts(const ModelConfig& c, const std::map<std::string, at::Tensor>& ckpt,
                      const std::string& p, int tp, int r, bool ep,
                      std::map<std::string, at::Tensor>& out) {
  const std::int64_t experts = read_config(c).experts;
  if (experts <= 0) throw std::invalid_argument("the reference reads no expert count for " + p);
  const std::int64_t per = ep ? experts / tp : experts, first = ep ? r * per : 0;
  const ExpertNames n = expert_names(c);
  // (an expert's intermediate size from its own tensor: Mixtral's config spells
  // it intermediate_size)
  const std::int64_t inter = ckpt.at(p + n.block + "experts.0." + n.gate + ".weight").size(0);
  const std::int64_t il = ep ? inter : inter / tp, from = ep ? 0 : r * il;
  std::vector<at::Tensor> w13, w2;
  for (std::int64_t e = first; e < first + per; ++e) {
    const std::string x = p + n.block + "experts." + std::to_string(e) + ".";
    w13.push_back(at::cat({ckpt.at(x + n.gate + ".weight").slice(0, from, from + il),
                           ckpt.at(x + n.up + ".weight").slice(0, from, from + il)}));
    w2.push_back(ckpt.at(x + n.down + ".weight").slice(1, from, from + il));
  }
  out[p + n.block + "experts.w13_weight"] = at::stack(w13);
  out[p + n.block + "experts.w2_weight"] = at::stack(w2);
  out[p + n.block + "gate.weight"] = ckpt.at(p + n.block + "gate.weight");
  if (glm4_moe(c)) {  // the router and its correction in float32; shared experts as an MLP
    out[p + "mlp.gate.weight"] = ckpt.at(p + "mlp.gate.weight").to(at::kFloat);
    out[p + "mlp.gate.e_score_correction_bias"] =
        ckpt.at(p + "mlp.gate.e_score_correction_bias").to(at::kFloat);
    expected_mlp(ckpt, p + "mlp.shared_experts.", tp, r, out);
  }
  if (deepseek(c)) {  // the router in the model's dtype, its correction (noaux_tc) in float32
    const std::string correction = p + "mlp.gate.e_score_correction_bias";
    if (ckpt.count(correction)) out[correction] = ckpt.at(correction).to(at::kFloat);
    if (ckpt.count(p + "mlp.shared_experts.gate_proj.weight"))
      expected_mlp(ckpt, p + "mlp.shared_experts.", tp, r, out);
  }
  // Qwen2-MoE's shared expert: split as a dense MLP whatever the experts do;
  // its gate replicated.
  if (!ckpt.count(p + "mlp.shared_expert_gate.weight")) return;
  expected_mlp(ckpt, p + "mlp.shared_expert.", tp, r, out);
  out[p + "mlp.shared_expert_gate.weight"] = ckpt.at(p + "mlp.shared_expert_gate.weight");
}

}  // namespace

CheckpointTensors hf_checkpoint_tensors(const ModelConfig& c) {
  if (c.fp8.quantized())
    throw std::invalid_argument("hf_checkpoint_tensors lists unquantized checkpoints; " +
                                c.architecture + "'s config is FP8");
  const Reading rd = read_config(c);
  const nlohmann::json j = nlohmann::json::parse(c.json);
  const auto size = [&](const char* key) {
    return j.contains(key) && j[key].is_number() ? j[key].get<std::int64_t>() : 0;
  };
  const std::string& a = c.architecture;
  const std::int64_t h = rd.hidden, hd = rd.head_dim, q = rd.heads * hd, kv = rd.kv_heads * hd;
  const std::int64_t inter = size("intermediate_size"), si = shared_mlp_size(c);
  CheckpointTensors out = {{"model.embed_tokens.weight", {rd.vocab, h}}};
  const auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
    out.push_back({name, std::move(shape)});
  };
  // An MLP of intermediate size `n` under `m` (gate_proj, up_proj, down_proj;
  // Phi-3's and GLM-4's gate and up stacked in gate_up_proj), biased with mlp_bias.
  const auto mlp = [&](const std::string& m, std::int64_t n, bool bias) {
    if (a == "Phi3ForCausalLM" || glm4(c)) {
      add(m + "gate_up_proj.weight", {2 * n, h});
      if (bias) add(m + "gate_up_proj.bias", {2 * n});
    } else {
      add(m + "gate_proj.weight", {n, h});
      add(m + "up_proj.weight", {n, h});
      if (bias) {
        add(m + "gate_proj.bias", {n});
        add(m + "up_proj.bias", {n});
      }
    }
    add(m + "down_proj.weight", {h, n});
    if (bias) add(m + "down_proj.bias", {h});
  };
  for (std::int64_t l = 0; l < rd.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    // The decoder layer's norms (Cohere's LayerNorm has a weight only).
    std::vector<const char*> norms = {"input_layernorm", "post_attention_layernorm"};
    if (cohere(c))  // (attention and MLP on one normed input)
      norms = {"input_layernorm"};
    else if (post_norms(c))  // (OLMo 2/3, EXAONE 4: no input norms)
      norms = {"post_attention_layernorm", "post_feedforward_layernorm"};
    else if (a == "Gemma2ForCausalLM" || gemma3(c))
      norms = {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm"};
    else if (glm4(c))
      norms = {"input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm",
               "post_mlp_layernorm"};
    for (const char* norm : norms) add(p + norm + ".weight", {h});
    // Attention: q, k, v (Phi-3's stacked in qkv_proj), o; DeepSeek's MLA
    // (DeepseekV2Attention's modules).
    const std::string at = p + "self_attn.";
    if (deepseek(c)) {
      const std::int64_t nope = size("qk_nope_head_dim"), rope = size("qk_rope_head_dim"),
                         v = size("v_head_dim"), kv_lora = size("kv_lora_rank"),
                         q_lora = size("q_lora_rank");
      if (q_lora > 0) {
        add(at + "q_a_proj.weight", {q_lora, h});
        add(at + "q_a_layernorm.weight", {q_lora});
        add(at + "q_b_proj.weight", {rd.heads * (nope + rope), q_lora});
      } else {
        add(at + "q_proj.weight", {rd.heads * (nope + rope), h});
      }
      add(at + "kv_a_proj_with_mqa.weight", {kv_lora + rope, h});
      add(at + "kv_a_layernorm.weight", {kv_lora});
      add(at + "kv_b_proj.weight", {rd.heads * (nope + v), kv_lora});
      add(at + "o_proj.weight", {h, rd.heads * v});
    } else if (a == "Phi3ForCausalLM") {
      add(at + "qkv_proj.weight", {q + 2 * kv, h});
      if (rd.qkv_bias) add(at + "qkv_proj.bias", {q + 2 * kv});
    } else {
      add(at + "q_proj.weight", {q, h});
      add(at + "k_proj.weight", {kv, h});
      add(at + "v_proj.weight", {kv, h});
      if (rd.qkv_bias) {
        add(at + "q_proj.bias", {q});
        add(at + "k_proj.bias", {kv});
        add(at + "v_proj.bias", {kv});
      }
    }
    if (!deepseek(c)) add(at + "o_proj.weight", {h, q});  // (MLA's above)
    if (rd.o_bias) add(at + "o_proj.bias", {h});
    if (cohere_qk_norms(c)) {  // (CohereLayerNorm of (heads, head_dim))
      add(at + "q_norm.weight", {rd.heads, hd});
      add(at + "k_norm.weight", {rd.kv_heads, hd});
    } else if (olmo(c)) {  // (over the whole projection)
      add(at + "q_norm.weight", {q});
      add(at + "k_norm.weight", {kv});
    } else if (qk_norms(c)) {  // (one head's)
      add(at + "q_norm.weight", {hd});
      add(at + "k_norm.weight", {hd});
    }
    // Granite's shared MLP: gate and up stacked in input_linear.
    if (si > 0) {
      add(p + "shared_mlp.input_linear.weight", {2 * si, h});
      add(p + "shared_mlp.output_linear.weight", {h, si});
    }
    if (!sparse(c, rd, l)) {
      if (si == 0) mlp(p + "mlp.", inter, rd.mlp_bias);
      continue;
    }
    const std::int64_t e = rd.experts;
    if (a.rfind("Granite", 0) == 0) {  // (GraniteMoeMoE: every expert in three tensors)
      add(p + "block_sparse_moe.input_linear.weight", {e, 2 * inter, h});
      add(p + "block_sparse_moe.output_linear.weight", {e, h, inter});
      add(p + "block_sparse_moe.router.layer.weight", {e, h});
      continue;
    }
    const ExpertNames n = expert_names(c);
    // (Mixtral's experts are intermediate_size wide; the Qwens' and GLM-4.5's
    // moe_intermediate_size)
    const std::int64_t mi = mixtral(c) ? inter : size("moe_intermediate_size");
    add(p + n.block + "gate.weight", {e, h});
    if (glm4_moe(c) || (deepseek(c) && j.value("topk_method", "") == "noaux_tc"))
      add(p + "mlp.gate.e_score_correction_bias", {e});
    for (std::int64_t x = 0; x < e; ++x) {
      const std::string ex = p + n.block + "experts." + std::to_string(x) + ".";
      add(ex + n.gate + ".weight", {mi, h});
      add(ex + n.up + ".weight", {mi, h});
      add(ex + n.down + ".weight", {h, mi});
    }
    if (const std::int64_t shared = size("shared_expert_intermediate_size"); shared > 0) {
      mlp(p + "mlp.shared_expert.", shared, false);  // (Qwen2-MoE's, with its sigmoid gate)
      add(p + "mlp.shared_expert_gate.weight", {1, h});
    }
    if ((glm4_moe(c) || deepseek(c)) && size("n_shared_experts") > 0)
      mlp(p + "mlp.shared_experts.", size("n_shared_experts") * mi, false);
  }
  add("model.norm.weight", {h});
  if (!rd.tied) add("lm_head.weight", {rd.vocab, h});
  return out;
}

// Where a GraniteMoE stacked tensor's layer prefix ends (at
// "block_sparse_moe."), or npos for any other name.
std::size_t granite_experts(const std::string& name) {
  for (const char* leaf : {"input_linear.weight", "output_linear.weight", "router.layer.weight"}) {
    const std::string tail = std::string("block_sparse_moe.") + leaf;
    if (name.size() > tail.size() &&
        name.compare(name.size() - tail.size(), tail.size(), tail) == 0)
      return name.size() - tail.size();
  }
  return std::string::npos;
}

std::map<std::string, at::Tensor> unstacked(const ModelConfig& c,
                                            const std::map<std::string, at::Tensor>& ckpt) {
  std::map<std::string, at::Tensor> out;
  const Reading rd = read_config(c);
  const std::int64_t q = rd.heads * rd.head_dim, kv = rd.kv_heads * rd.head_dim;
  for (const auto& [name, t] : ckpt) {
    const auto at_qkv = name.find("self_attn.qkv_proj.");
    const auto at_gate_up = name.find("mlp.gate_up_proj.");
    if (at_qkv != std::string::npos) {
      const std::string p = name.substr(0, at_qkv) + "self_attn.",
                        leaf = name.substr(at_qkv + std::strlen("self_attn.qkv_proj"));
      out[p + "q_proj" + leaf] = rows(t, 0, q);
      out[p + "k_proj" + leaf] = rows(t, q, kv);
      out[p + "v_proj" + leaf] = rows(t, q + kv, kv);
    } else if (const auto at_moe = granite_experts(name); at_moe != std::string::npos) {
      // GraniteMoE: input_linear [E, 2I, H] holds expert e's w1 (gate) in rows
      // [0, I) of t[e] and its w3 (up) in [I, 2I); output_linear [E, H, I]
      // expert e's w2 in t[e]; router.layer the router.
      const std::string m = name.substr(0, at_moe) + "block_sparse_moe.";
      if (name == m + "router.layer.weight") {
        out[m + "gate.weight"] = t;
        continue;
      }
      for (std::int64_t e = 0; e < t.size(0); ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        if (name == m + "input_linear.weight") {
          out[x + "w1.weight"] = t[e].narrow(0, 0, t.size(1) / 2);
          out[x + "w3.weight"] = t[e].narrow(0, t.size(1) / 2, t.size(1) / 2);
        } else {
          out[x + "w2.weight"] = t[e];
        }
      }
    } else if (const auto at_shared = name.find("shared_mlp.input_linear.");
               at_shared != std::string::npos) {
      // Granite's shared MLP: gate's rows the first half, up's the second.
      const std::string p = name.substr(0, at_shared) + "shared_mlp.";
      out[p + "gate_proj.weight"] = rows(t, 0, t.size(0) / 2);
      out[p + "up_proj.weight"] = rows(t, t.size(0) / 2, t.size(0) / 2);
    } else if (at_gate_up != std::string::npos) {
      const std::string p = name.substr(0, at_gate_up) + "mlp.",
                        leaf = name.substr(at_gate_up + std::strlen("mlp.gate_up_proj"));
      out[p + "gate_proj" + leaf] = rows(t, 0, t.size(0) / 2);
      out[p + "up_proj" + leaf] = rows(t, t.size(0) / 2, t.size(0) / 2);
    } else {
      out[name] = t;
    }
  }
  return out;
}

namespace {

// q/k/v (into qkv_proj: q's heads r of tp, the KV heads rank r holds), o_proj's
// columns r of tp, and the q/k norms of layer prefix `p` on rank r.
void regular_attention(const ModelConfig& c, const std::map<std::string, at::Tensor>& ckpt,
                       const std::string& p, int tp, int r,
                       std::map<std::string, at::Tensor>& out) {
  const Reading rd = read_config(c);
  const std::int64_t hd = rd.head_dim, ql = rd.heads / tp * hd, nkv = rd.kv_heads;
  // KV heads of rank r: one replicated head when tp >= nkv, else nkv/tp of them.
  const std::int64_t kv_first = tp >= nkv ? r * nkv / tp : r * (nkv / tp);
  const std::int64_t kv_count = tp >= nkv ? 1 : nkv / tp;
  for (std::string leaf : {"weight", "bias"}) {
    const std::string q = p + "self_attn.q_proj." + leaf;
    if (!ckpt.count(q)) continue;
    out[p + "self_attn.qkv_proj." + leaf] =
        at::cat({rows(ckpt.at(q), r * ql, ql),
                 rows(ckpt.at(p + "self_attn.k_proj." + leaf), kv_first * hd, kv_count * hd),
                 rows(ckpt.at(p + "self_attn.v_proj." + leaf), kv_first * hd, kv_count * hd)});
  }
  if (ckpt.count(p + "self_attn.o_proj.bias"))  // row-parallel bias: replicated
    out[p + "self_attn.o_proj.bias"] = ckpt.at(p + "self_attn.o_proj.bias");
  out[p + "self_attn.o_proj.weight"] =
      ckpt.at(p + "self_attn.o_proj.weight").slice(1, r * ql, r * ql + ql);
  if (cohere_qk_norms(c)) {  // (each head's own rows: the heads q's and k's rows hold)
    out[p + "self_attn.q_norm.weight"] =
        rows(ckpt.at(p + "self_attn.q_norm.weight"), r * ql / hd, ql / hd);
    out[p + "self_attn.k_norm.weight"] =
        rows(ckpt.at(p + "self_attn.k_norm.weight"), kv_first, kv_count);
  } else if (qk_norms(c)) {
    for (const char* norm : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"})
      out[p + norm] = ckpt.at(p + norm);
  }
}

}  // namespace

void mla_absorbed(const ModelConfig& c, const at::Tensor& kv_b, const std::string& a, int tp,
                  std::map<std::string, at::Tensor>& out) {
  const nlohmann::json j = nlohmann::json::parse(c.json);
  const std::int64_t heads = j.at("num_attention_heads").get<std::int64_t>() / tp;
  const std::int64_t nope = j.at("qk_nope_head_dim").get<std::int64_t>(),
                     v = j.at("v_head_dim").get<std::int64_t>();
  const at::Tensor per_head = kv_b.to(read_config(c).dtype).reshape({heads, nope + v, -1});
  out[a + "mla_attn.mla_attn.W_UK_T"] = per_head.slice(1, 0, nope).contiguous();
  out[a + "mla_attn.mla_attn.W_UV"] =
      per_head.slice(1, nope, nope + v).transpose(1, 2).contiguous();
}

namespace {

// DeepSeek's MLA of attention prefix `a` on rank r, read from the config's
// JSON: q_a_proj's rows then kv_a_proj_with_mqa's in the replicated
// fused_qkv_a_proj (q_lora_rank set) or kv_a_proj_with_mqa alone; q_b_proj's
// (or q_proj's) heads r of tp, each qk_nope_head_dim + qk_rope_head_dim rows;
// kv_b_proj's heads r of tp, each qk_nope_head_dim + v_head_dim rows; o_proj's
// columns of those heads, v_head_dim each; the norms whole.
void mla_expected(const ModelConfig& c, const std::map<std::string, at::Tensor>& ckpt,
                  const std::string& a, int tp, int r, std::map<std::string, at::Tensor>& out) {
  const nlohmann::json j = nlohmann::json::parse(c.json);
  const std::int64_t heads = j.at("num_attention_heads").get<std::int64_t>() / tp;
  const std::int64_t qk =
      j.at("qk_nope_head_dim").get<std::int64_t>() + j.at("qk_rope_head_dim").get<std::int64_t>();
  const std::int64_t kv =
      j.at("qk_nope_head_dim").get<std::int64_t>() + j.at("v_head_dim").get<std::int64_t>();
  const std::int64_t v = j.at("v_head_dim").get<std::int64_t>();
  if (!j.at("q_lora_rank").is_null()) {
    out[a + "fused_qkv_a_proj.weight"] =
        at::cat({ckpt.at(a + "q_a_proj.weight"), ckpt.at(a + "kv_a_proj_with_mqa.weight")});
    out[a + "q_a_layernorm.weight"] = ckpt.at(a + "q_a_layernorm.weight");
    out[a + "q_b_proj.weight"] = rows(ckpt.at(a + "q_b_proj.weight"), r * heads * qk, heads * qk);
  } else {
    out[a + "q_proj.weight"] = rows(ckpt.at(a + "q_proj.weight"), r * heads * qk, heads * qk);
    out[a + "kv_a_proj_with_mqa.weight"] = ckpt.at(a + "kv_a_proj_with_mqa.weight");
  }
  out[a + "kv_a_layernorm.weight"] = ckpt.at(a + "kv_a_layernorm.weight");
  out[a + "kv_b_proj.weight"] = rows(ckpt.at(a + "kv_b_proj.weight"), r * heads * kv, heads * kv);
  mla_absorbed(c, out[a + "kv_b_proj.weight"], a, tp, out);
  out[a + "o_proj.weight"] =
      ckpt.at(a + "o_proj.weight").slice(1, r * heads * v, (r + 1) * heads * v);
}

}  // namespace

std::map<std::string, at::Tensor> expected_shards(const ModelConfig& c,
                                                  const std::map<std::string, at::Tensor>& stacked,
                                                  int tp, int r, bool expert_parallel) {
  const std::map<std::string, at::Tensor> ckpt = unstacked(c, stacked);
  std::map<std::string, at::Tensor> out;
  const Reading rd = read_config(c);
  out["model.embed_tokens.weight"] =
      vocab_shard(ckpt.at("model.embed_tokens.weight"), rd.vocab, tp, r);
  if (!rd.tied) out["lm_head.weight"] = vocab_shard(ckpt.at("lm_head.weight"), rd.vocab, tp, r);
  out["model.norm.weight"] = ckpt.at("model.norm.weight");
  for (std::int64_t l = 0; l < rd.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* norm : {"input_layernorm.weight", "post_attention_layernorm.weight",
                             "pre_feedforward_layernorm.weight",  // (Gemma 2's, replicated)
                             "post_feedforward_layernorm.weight",
                             "post_self_attn_layernorm.weight",  // (GLM-4's)
                             "post_mlp_layernorm.weight"})
      if (ckpt.count(p + norm)) out[p + norm] = ckpt.at(p + norm);
    if (deepseek(c)) {
      mla_expected(c, ckpt, p + "self_attn.", tp, r, out);
    } else {
      regular_attention(c, ckpt, p, tp, r, out);
    }
    // Granite's shared MLP: split as a dense MLP whatever the experts do
    // (gate's and up's rows r of tp stacked into input_linear, output_linear's
    // columns r of tp).
    const std::string shared = p + "shared_mlp.";
    const std::int64_t si = shared_mlp_size(c);
    if (si > 0) {
      if (ckpt.at(shared + "gate_proj.weight").size(0) != si)
        throw std::runtime_error(shared + "gate_proj's rows are not the config's " +
                                 std::to_string(si));
      const std::int64_t il = si / tp;
      out[shared + "input_linear.weight"] =
          at::cat({rows(ckpt.at(shared + "gate_proj.weight"), r * il, il),
                   rows(ckpt.at(shared + "up_proj.weight"), r * il, il)});
      out[shared + "output_linear.weight"] =
          ckpt.at(shared + "output_linear.weight").slice(1, r * il, r * il + il);
    }
    if (sparse(c, rd, l)) {
      expected_experts(c, ckpt, p, tp, r, expert_parallel, out);
      continue;
    }
    if (si == 0) expected_mlp(ckpt, p + "mlp.", tp, r, out);
  }
  return out;
}

namespace {

// The reference computes in float64.
at::Tensor f32(const std::map<std::string, at::Tensor>& ckpt, const std::string& name) {
  return ckpt.at(name).to(at::kDouble);
}

// RMSNorm; Gemma's multiplies by 1 + w (GemmaRMSNorm).
at::Tensor norm(const at::Tensor& x, const at::Tensor& w, const ModelConfig& c, double eps) {
  if (cohere(c)) return at::layer_norm(x, {x.size(-1)}, w, {}, eps);
  return x / at::sqrt(x.pow(2).mean({-1}, true) + eps) * (gemma(c) ? w + 1 : w);
}

// The MLP's activation as the config's JSON asks, read here: SiLU, or for
// Gemma GeLU, exact when hidden_activation is "gelu", else tanh-approximated
// (both written out).
at::Tensor activation(const ModelConfig& c, const at::Tensor& x) {
  if (!gemma(c)) return x / (1 + at::exp(-x));
  const nlohmann::json j = nlohmann::json::parse(c.json);
  if (j.value("hidden_activation", nlohmann::json()) == "gelu")
    return 0.5 * x * (1 + at::erf(x / std::sqrt(2.0)));
  return 0.5 * x * (1 + at::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x.pow(3))));
}

// longrope's choice: the long factors when the model's context is longer
// than the original one, at any sequence length (as vLLM picks them by its
// max_model_len, the model's by default; Hugging Face picks by length).
bool long_rope(const Rotary& s) {
  return s.max_positions > s.original;
}

// The frequency of pair i of a head of d dims, one frequency at a time: as
// Hugging Face's rope init functions compute default, linear, llama3 and
// longrope's frequencies, and as vLLM's YaRNScalingRotaryEmbedding computes
// yarn (with its extrapolation_factor and attn_factor; transformers reads
// attention_factor and mscale instead) and its DynamicNTKScalingRotaryEmbedding
// dynamic (the base for max_position x factor positions at any length, where
// transformers grows it with the sequence; with alpha, base x
// alpha^(d / (d - 2))).
double rope_frequency(const Rotary& s, std::int64_t i, std::int64_t d) {
  const double base = std::pow(s.theta, -2.0 * i / d);
  if (s.type == "linear") return base / s.factor;
  if (s.type == "longrope") return base / (long_rope(s) ? s.long_factor : s.short_factor).at(i);
  if (s.type == "dynamic" && s.alpha > 0)
    return std::pow(s.theta * std::pow(s.alpha, static_cast<double>(d) / (d - 2)), -2.0 * i / d);
  if (s.type == "dynamic") {
    // vLLM: max_len = max_position x factor, then
    // base x (factor x max_len / max_position - (factor - 1))^(d / (d - 2)).
    const double alpha = s.factor * s.factor - (s.factor - 1);
    return std::pow(s.theta * std::pow(alpha, static_cast<double>(d) / (d - 2)), -2.0 * i / d);
  }
  const double context = s.original;
  if (s.type == "yarn") {
    // Pair p turns context * theta^(-2p/d) / 2pi times over the original
    // context: solved for p, the pairs that turn beta_fast and beta_slow times.
    auto pair_turning = [&](double turns) {
      return 0.5 * d * std::log(context / (2 * M_PI * turns)) / std::log(s.theta);
    };
    double first = pair_turning(s.beta_fast), last = pair_turning(s.beta_slow);
    if (s.truncate) {
      first = std::floor(first);
      last = std::ceil(last);
    }
    first = std::max(first, 0.0);
    last = std::min(last, static_cast<double>(d - 1));
    if (last == first) last += 0.001;
    // Pairs up to `first` keep their frequency, pairs from `last` are
    // interpolated (divided by the factor), linearly in the pair index between.
    const double interpolated = std::min(1.0, std::max(0.0, (i - first) / (last - first)));
    const double kept = (1 - interpolated) * s.extrapolation_factor;
    return kept * base + (1 - kept) * base / s.factor;
  }
  if (s.type != "llama3") return base;
  const double wavelen = 2 * M_PI / base;
  if (wavelen < context / s.high_freq_factor) return base;  // high frequencies: kept
  if (wavelen > context / s.low_freq_factor) return base / s.factor;
  const double smooth =
      (context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * base / s.factor + smooth * base;
}

// What cos and sin are multiplied by: yarn's attention scaling (YaRN paper,
// sqrt(1/t) = 0.1 ln(s) + 1), times attn_factor; longrope's short_mscale or
// long_mscale, else sqrt(1 + ln(max / original) / ln(original)) (1 without
// extension), as vLLM computes it (transformers reads attention_factor).
double rope_magnitude(const Rotary& s) {
  if (s.type == "longrope") {
    const double given = long_rope(s) ? s.long_mscale : s.short_mscale;
    if (given > 0) return given;
    const double ratio = s.max_positions / s.original;
    return ratio <= 1 ? 1 : std::sqrt(1 + std::log(ratio) / std::log(s.original));
  }
  if (s.type != "yarn") return 1;
  return (s.apply_yarn_scaling && s.factor > 1 ? 1 + 0.1 * std::log(s.factor) : 1) * s.attn_factor;
}

// Rotary over the first `share` of each head's dimensions (as many as that
// product truncates to), frequencies counted over those alone; the other
// dimensions pass through. Dimension i turns with its partner: i + d/2 (or
// i - d/2), or where `interleaved`, its neighbour i ^ 1 (GPT-J's pairs).
at::Tensor rope(const at::Tensor& x, const Rotary& rotary,  // x: [heads, tokens, head_dim]
                double share, bool interleaved, double magnitude = -1) {
  if (magnitude < 0) magnitude = rope_magnitude(rotary);
  const std::int64_t t = x.size(1), d = static_cast<std::int64_t>(x.size(2) * share);
  std::vector<double> cos_v(t * d), sin_v(t * d);
  for (std::int64_t pos = 0; pos < t; ++pos)
    for (std::int64_t i = 0; i < d; ++i) {
      const double freq = rope_frequency(rotary, interleaved ? i / 2 : i % (d / 2), d);
      cos_v[pos * d + i] = magnitude * std::cos(pos * freq);
      sin_v[pos * d + i] = magnitude * std::sin(pos * freq);
    }
  const at::Tensor cos = at::tensor(cos_v).reshape({t, d}), sin = at::tensor(sin_v).reshape({t, d});
  const at::Tensor turned = x.slice(2, 0, d);
  // rotated[i] = -x[partner] for the first of a pair, x[partner] for the second.
  std::vector<std::int64_t> partner(d);
  std::vector<double> sign(d);
  for (std::int64_t i = 0; i < d; ++i) {
    const bool first = interleaved ? i % 2 == 0 : i < d / 2;
    partner[i] = interleaved ? (first ? i + 1 : i - 1) : (first ? i + d / 2 : i - d / 2);
    sign[i] = first ? -1 : 1;
  }
  const at::Tensor rotated = turned.index_select(2, at::tensor(partner)) * at::tensor(sign);
  return at::cat({turned * cos + rotated * sin, x.slice(2, d, x.size(2))}, 2);
}

// A linear layer of the checkpoint's `name` (with its bias where it has one).
at::Tensor linear_ref(const std::map<std::string, at::Tensor>& ckpt, const at::Tensor& x,
                      const std::string& name) {
  at::Tensor y = at::matmul(x, f32(ckpt, name + ".weight").t());
  return ckpt.count(name + ".bias") ? y + f32(ckpt, name + ".bias") : y;
}

// down(act(gate(x)) * up(x)), each named in full.
at::Tensor swiglu(const ModelConfig& c, const std::map<std::string, at::Tensor>& ckpt,
                  const at::Tensor& x, const std::string& gate, const std::string& up,
                  const std::string& down) {
  return linear_ref(ckpt, activation(c, linear_ref(ckpt, x, gate)) * linear_ref(ckpt, x, up), down);
}

at::Tensor glm4_moe_block(const ModelConfig& c, const std::map<std::string, at::Tensor>& ckpt,
                          const std::string& p, const at::Tensor& y);

// Hugging Face's Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock and
// Qwen2MoeSparseMoeBlock, token by token: softmax router, top-k, renormalised
// (always for Mixtral, with norm_topk_prob for the Qwens), SiLU-gated experts
// weighted by their routing weight, plus (Qwen2-MoE) the shared expert scaled by
// sigmoid of its gate; GLM-4.5's block apart (glm4_moe_block).
at::Tensor moe(const ModelConfig& c, const Reading& r,
               const std::map<std::string, at::Tensor>& ckpt, const std::string& p,
               const at::Tensor& y) {
  if (glm4_moe(c)) return glm4_moe_block(c, ckpt, p, y);
  if (r.top_k <= 0) throw std::invalid_argument("the reference reads no num_experts_per_tok");
  const ExpertNames n = expert_names(c);
  const at::Tensor probs = at::matmul(y, f32(ckpt, p + n.block + "gate.weight").t()).softmax(-1);
  at::Tensor out = at::zeros_like(y);
  for (std::int64_t t = 0; t < y.size(0); ++t) {
    auto [w, idx] = probs[t].topk(r.top_k);
    if (mixtral(c) || r.renormalise) w = w / w.sum();
    const at::Tensor row = y[t].unsqueeze(0);
    for (std::int64_t k = 0; k < r.top_k; ++k) {
      const std::string x =
          p + n.block + "experts." + std::to_string(idx[k].item<std::int64_t>()) + ".";
      out[t] += (swiglu(c, ckpt, row, x + n.gate, x + n.up, x + n.down) * w[k]).squeeze(0);
    }
    const std::string shared = p + "mlp.shared_expert.";
    if (ckpt.count(p + "mlp.shared_expert_gate.weight"))  // Qwen2-MoE: + sigmoid(gate) x MLP
      out[t] +=
          (at::sigmoid(linear_ref(ckpt, row, p + "mlp.shared_expert_gate")) *
           swiglu(c, ckpt, row, shared + "gate_proj", shared + "up_proj", shared + "down_proj"))
              .squeeze(0);
  }
  return out;
}

// GLM-4.5's sparse block as vLLM's grouped_topk routes it, token by token, with
// the config's keys read here (Hugging Face's Glm4MoeMoE masks the groups it
// drops to 0 rather than -inf, which differs only where n_group > 1):
// scores sigmoid(router logits); groups of n_routed_experts / n_group experts
// rated by the sum of their two best scores plus e_score_correction_bias; the
// topk_group best groups kept; there the num_experts_per_tok best by score plus
// correction; weighted by their scores, renormalised (norm_topk_prob, true when
// absent), times routed_scaling_factor; plus the shared experts' MLP.
at::Tensor glm4_moe_block(const ModelConfig& c, const std::map<std::string, at::Tensor>& ckpt,
                          const std::string& p, const at::Tensor& y) {
  const nlohmann::json j = nlohmann::json::parse(c.json);
  const std::int64_t experts = j.at("n_routed_experts"), groups = j.at("n_group"),
                     kept_groups = j.at("topk_group"), top = j.at("num_experts_per_tok");
  const double scale = j.at("routed_scaling_factor");
  const bool renormalise = !j.contains("norm_topk_prob") || j["norm_topk_prob"] == true;
  const std::int64_t per_group = experts / groups;
  const at::Tensor logits = at::matmul(y, f32(ckpt, p + "mlp.gate.weight").t());
  const at::Tensor bias = f32(ckpt, p + "mlp.gate.e_score_correction_bias");
  const std::string shared = p + "mlp.shared_experts.";
  at::Tensor out = at::zeros_like(y);
  for (std::int64_t t = 0; t < y.size(0); ++t) {
    std::vector<double> score(experts), biased(experts);
    for (std::int64_t e = 0; e < experts; ++e) {
      score[e] = 1 / (1 + std::exp(-logits[t][e].item<double>()));
      biased[e] = score[e] + bias[e].item<double>();
    }
    std::vector<std::pair<double, std::int64_t>> rating;  // (-rating, group): best first
    for (std::int64_t g = 0; g < groups; ++g) {
      std::vector<double> in(biased.begin() + g * per_group, biased.begin() + (g + 1) * per_group);
      std::sort(in.rbegin(), in.rend());
      rating.push_back({-(in[0] + (per_group > 1 ? in[1] : 0)), g});
    }
    std::sort(rating.begin(), rating.end());
    std::vector<std::pair<double, std::int64_t>> candidates;  // (-biased, expert)
    for (std::int64_t k = 0; k < kept_groups; ++k)
      for (std::int64_t e = rating[k].second * per_group; e < (rating[k].second + 1) * per_group;
           ++e)
        candidates.push_back({-biased[e], e});
    std::sort(candidates.begin(), candidates.end());
    double sum = 0;
    for (std::int64_t k = 0; k < top; ++k) sum += score[candidates[k].second];
    const at::Tensor row = y[t].unsqueeze(0);
    for (std::int64_t k = 0; k < top; ++k) {
      const std::int64_t e = candidates[k].second;
      const double w = score[e] / (renormalise ? sum : 1) * scale;
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      out[t] +=
          (swiglu(c, ckpt, row, x + "gate_proj", x + "up_proj", x + "down_proj") * w).squeeze(0);
    }
    out[t] += swiglu(c, ckpt, row, shared + "gate_proj", shared + "up_proj", shared + "down_proj")
                  .squeeze(0);
  }
  return out;
}

// DeepSeek-V2's softmax routing (topk_method greedy or group_limited_greedy,
// vLLM's grouped_topk without a correction), token by token, with the config's
// keys read here: groups of n_routed_experts / n_group rated by their best
// probability, the topk_group best kept, there the num_experts_per_tok most
// probable, weighted by their probabilities (renormalised with norm_topk_prob)
// times routed_scaling_factor; plus the shared experts where n_shared_experts.
at::Tensor deepseek_softmax_block(const ModelConfig& c,
                                  const std::map<std::string, at::Tensor>& ckpt,
                                  const std::string& p, const at::Tensor& y) {
  const nlohmann::json j = nlohmann::json::parse(c.json);
  const std::int64_t experts = j.at("n_routed_experts"), groups = j.at("n_group"),
                     kept_groups = j.at("topk_group"), top = j.at("num_experts_per_tok");
  const double scale = j.at("routed_scaling_factor");
  const std::int64_t per_group = experts / groups;
  const at::Tensor probs = at::matmul(y, f32(ckpt, p + "mlp.gate.weight").t()).softmax(-1);
  const std::string shared = p + "mlp.shared_experts.";
  at::Tensor out = at::zeros_like(y);
  for (std::int64_t t = 0; t < y.size(0); ++t) {
    std::vector<std::pair<double, std::int64_t>> rating;  // (-best, group)
    for (std::int64_t g = 0; g < groups; ++g) {
      double best = 0;
      for (std::int64_t e = g * per_group; e < (g + 1) * per_group; ++e)
        best = std::max(best, probs[t][e].item<double>());
      rating.push_back({-best, g});
    }
    std::sort(rating.begin(), rating.end());
    std::vector<std::pair<double, std::int64_t>> candidates;  // (-probability, expert)
    for (std::int64_t k = 0; k < kept_groups; ++k)
      for (std::int64_t e = rating[k].second * per_group; e < (rating[k].second + 1) * per_group;
           ++e)
        candidates.push_back({-probs[t][e].item<double>(), e});
    std::sort(candidates.begin(), candidates.end());
    double sum = 0;
    for (std::int64_t k = 0; k < top; ++k) sum -= candidates[k].first;
    const bool renormalise = j.value("norm_topk_prob", false);
    const at::Tensor row = y[t].unsqueeze(0);
    for (std::int64_t k = 0; k < top; ++k) {
      const std::int64_t e = candidates[k].second;
      const double w = -candidates[k].first / (renormalise ? sum : 1) * scale;
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      out[t] +=
          (swiglu(c, ckpt, row, x + "gate_proj", x + "up_proj", x + "down_proj") * w).squeeze(0);
    }
    if (ckpt.count(shared + "gate_proj.weight"))
      out[t] += swiglu(c, ckpt, row, shared + "gate_proj", shared + "up_proj", shared + "down_proj")
                    .squeeze(0);
  }
  return out;
}

// DeepSeek-V2 and V3 as Hugging Face's DeepseekV3Attention computes them (in
// float64, from the checkpoint's kv_b_proj, not through absorbed matrices):
// q through q_a_proj, q_a_layernorm and q_b_proj (or q_proj), each head's
// qk_nope dims and qk_rope dims; the compressed kv_a_proj_with_mqa's first
// kv_lora_rank values normed and through kv_b_proj into each head's k_nope and
// v, its last qk_rope values the rotary key all heads share; rotary on
// interleaved pairs, yarn's frequencies with DeepSeek's magnitude m(mscale) /
// m(mscale_all_dim) (m(x) = 0.1 x ln(factor) + 1), scores scaled by (qk_nope +
// qk_rope)^-1/2 x m(mscale_all_dim)^2; dense layers, then routed experts
// (noaux_tc: glm4_moe_block's sigmoid groups with the correction; else
// deepseek_softmax_block) with shared experts.
at::Tensor deepseek_logits(const ModelConfig& c, const std::map<std::string, at::Tensor>& ckpt,
                           const std::vector<std::int64_t>& tokens) {
  const nlohmann::json j = nlohmann::json::parse(c.json);
  const Reading rd = read_config(c);
  const std::int64_t n = tokens.size(), heads = rd.heads, nope = j.at("qk_nope_head_dim"),
                     pe = j.at("qk_rope_head_dim"), v = j.at("v_head_dim"),
                     lora = j.at("kv_lora_rank");
  const Rotary& r = rd.rotary;
  double magnitude = 1, scale = 1 / std::sqrt(static_cast<double>(nope + pe));
  if (r.type == "yarn") {
    auto m = [&](double x) { return r.factor <= 1 ? 1 : 0.1 * x * std::log(r.factor) + 1; };
    magnitude = m(r.mscale) / m(r.mscale_all_dim) * r.attn_factor;
    scale *= m(r.mscale_all_dim) * m(r.mscale_all_dim);
  } else if (r.type != "default") {
    throw std::invalid_argument("the reference turns DeepSeek's yarn or default rotary only");
  }
  at::Tensor h = f32(ckpt, "model.embed_tokens.weight").index_select(0, at::tensor(tokens));
  for (std::int64_t l = 0; l < rd.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.";
    const at::Tensor x = norm(h, f32(ckpt, p + "input_layernorm.weight"), c, rd.eps);
    const at::Tensor q = (j.at("q_lora_rank").is_null()
                              ? linear_ref(ckpt, x, a + "q_proj")
                              : linear_ref(ckpt,
                                           norm(linear_ref(ckpt, x, a + "q_a_proj"),
                                                f32(ckpt, a + "q_a_layernorm.weight"), c, rd.eps),
                                           a + "q_b_proj"))
                             .reshape({n, heads, nope + pe})
                             .permute({1, 0, 2});  // [heads, tokens, qk]
    const at::Tensor kv_a = linear_ref(ckpt, x, a + "kv_a_proj_with_mqa");
    const at::Tensor kv =
        linear_ref(ckpt,
                   norm(kv_a.slice(1, 0, lora), f32(ckpt, a + "kv_a_layernorm.weight"), c, rd.eps),
                   a + "kv_b_proj")
            .reshape({n, heads, nope + v})
            .permute({1, 0, 2});  // [heads, tokens, nope + v]
    const at::Tensor q_pe = rope(q.slice(2, nope, nope + pe), r, 1, true, magnitude);
    const at::Tensor k_pe =
        rope(kv_a.slice(1, lora, lora + pe).unsqueeze(0), r, 1, true, magnitude);
    at::Tensor scores = (at::matmul(q.slice(2, 0, nope), kv.slice(2, 0, nope).transpose(1, 2)) +
                         at::matmul(q_pe, k_pe.transpose(1, 2))) *
                        scale;
    scores = scores.masked_fill(at::ones({n, n}, at::kBool).triu(1),
                                -std::numeric_limits<double>::infinity());
    const at::Tensor attn = at::matmul(scores.softmax(-1), kv.slice(2, nope, nope + v))
                                .permute({1, 0, 2})
                                .reshape({n, heads * v});
    h = h + linear_ref(ckpt, attn, a + "o_proj");
    const at::Tensor y = norm(h, f32(ckpt, p + "post_attention_layernorm.weight"), c, rd.eps);
    if (!sparse(c, rd, l))
      h = h + swiglu(c, ckpt, y, p + "mlp.gate_proj", p + "mlp.up_proj", p + "mlp.down_proj");
    else if (j.value("topk_method", "") == "noaux_tc")
      h = h + glm4_moe_block(c, ckpt, p, y);
    else
      h = h + deepseek_softmax_block(c, ckpt, p, y);
  }
  h = norm(h, f32(ckpt, "model.norm.weight"), c, rd.eps);
  return at::matmul(h, f32(ckpt, "lm_head.weight").t()).to(at::kFloat);
}

}  // namespace

at::Tensor reference_logits(const ModelConfig& c, const std::map<std::string, at::Tensor>& stacked,
                            const std::vector<std::int64_t>& tokens) {
  if (deepseek(c)) return deepseek_logits(c, stacked, tokens);
  const std::map<std::string, at::Tensor> ckpt = unstacked(c, stacked);
  const Reading rd = read_config(c);
  const std::int64_t n = tokens.size(), hd = rd.head_dim, nh = rd.heads, nkv = rd.kv_heads;
  const LayerAttention att = layer_attention(c);
  const GraniteScales gs = granite_scales(c);
  // Gemma 3's and OLMo 3's rotary of each type as layer_attention() read it.
  auto rotary = [&](double base, double factor) {
    Rotary r;
    r.theta = base;
    if (factor != 1) {
      r.type = "linear";
      r.factor = factor;
    }
    return r;
  };
  const Rotary full = att.own_rotary ? rotary(att.full_base, att.full_factor) : rd.rotary,
               local = att.own_rotary ? rotary(att.local_base, att.local_factor) : rd.rotary;
  const double share = rd.share;
  at::Tensor h =
      f32(ckpt, "model.embed_tokens.weight").index_select(0, at::tensor(tokens)) * gs.embedding;
  if (gemma(c))  // sqrt(hidden_size), rounded to the model's dtype as vLLM's normalizer is
    h = h * at::tensor(std::sqrt(static_cast<double>(rd.hidden))).to(rd.dtype).to(at::kDouble);
  for (std::int64_t l = 0; l < rd.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    // OLMo and EXAONE 4 norm no input; OLMo q and k over their whole projections.
    const at::Tensor x =
        post_norms(c) ? h : norm(h, f32(ckpt, p + "input_layernorm.weight"), c, rd.eps);
    auto normed = [&](const at::Tensor& y, const char* name) {
      return norm(y, f32(ckpt, p + name), c, rd.eps);
    };
    // (the biases the checkpoint holds, which linear_ref applies, as the
    // config says: a parser that gave the model other ones shows here)
    const bool dense = ckpt.count(p + "mlp.down_proj.weight") > 0;
    for (const auto& [name, want] :
         {std::pair<std::string, bool>{"self_attn.q_proj.bias", rd.qkv_bias},
          {"self_attn.k_proj.bias", rd.qkv_bias},
          {"self_attn.v_proj.bias", rd.qkv_bias},
          {"self_attn.o_proj.bias", rd.o_bias},
          {"mlp.down_proj.bias", rd.mlp_bias && dense}})
      if ((ckpt.count(p + name) > 0) != want)
        throw std::runtime_error(p + name + (want ? " is missing" : " is there") +
                                 ", but the config says " + (want ? "it is" : "it is not"));
    at::Tensor q = linear_ref(ckpt, x, p + "self_attn.q_proj");
    at::Tensor k = linear_ref(ckpt, x, p + "self_attn.k_proj");
    if (olmo(c)) {
      q = norm(q, f32(ckpt, p + "self_attn.q_norm.weight"), c, rd.eps);
      k = norm(k, f32(ckpt, p + "self_attn.k_norm.weight"), c, rd.eps);
    }
    q = q.reshape({n, nh, hd});
    k = k.reshape({n, nkv, hd});
    if (cohere_qk_norms(c)) {  // each head's LayerNorm by its own weights
      q = at::layer_norm(q, {hd}, {}, {}, rd.eps) * f32(ckpt, p + "self_attn.q_norm.weight");
      k = at::layer_norm(k, {hd}, {}, {}, rd.eps) * f32(ckpt, p + "self_attn.k_norm.weight");
    } else if (qk_norms(c) && !olmo(c)) {  // per-head RMSNorm before rotary
      q = norm(q, f32(ckpt, p + "self_attn.q_norm.weight"), c, rd.eps);
      k = norm(k, f32(ckpt, p + "self_attn.k_norm.weight"), c, rd.eps);
    }
    const Rotary& turn = att.sliding[l] ? local : full;
    q = q.transpose(0, 1);
    k = k.transpose(0, 1);
    if (!att.full_unturned || att.sliding[l]) {
      q = rope(q, turn, share, interleaved_pairs(c));
      k = rope(k, turn, share, interleaved_pairs(c));
    }
    at::Tensor v =
        linear_ref(ckpt, x, p + "self_attn.v_proj").reshape({n, nkv, hd}).transpose(0, 1);
    k = k.repeat_interleave(nh / nkv, 0);
    v = v.repeat_interleave(nh / nkv, 0);
    at::Tensor s = at::matmul(q, k.transpose(1, 2));
    s = gs.attention > 0 ? s * gs.attention
                         : s / std::sqrt(att.scalar > 0 ? att.scalar : static_cast<double>(hd));
    s = capped(s, att.attn_cap);
    for (std::int64_t t = 0; t < n; ++t)  // query t sees keys t - window + 1 .. t
      for (std::int64_t key = 0; key < n; ++key)
        if (key > t || (att.sliding[l] && att.window > 0 && t - key >= att.window))
          s.select(1, t).select(1, key).fill_(-INFINITY);
    const at::Tensor a = at::matmul(s.softmax(-1), v).transpose(0, 1).reshape({n, nh * hd});
    at::Tensor attn = linear_ref(ckpt, a, p + "self_attn.o_proj");
    // Gemma 2 and 3 norm the attention's output, and the MLP's input and
    // output; OLMo and EXAONE 4 the attention's and the MLP's outputs alone; GLM-4 all four
    // under its own names.
    const bool sandwich = ckpt.count(p + "pre_feedforward_layernorm.weight") > 0;
    if (sandwich || post_norms(c)) attn = normed(attn, "post_attention_layernorm.weight");
    if (glm4(c)) attn = normed(attn, "post_self_attn_layernorm.weight");
    h = h + attn * gs.residual;
    const at::Tensor y = cohere(c)       ? x  // (in parallel with the attention)
                         : post_norms(c) ? h
                         : sandwich      ? normed(h, "pre_feedforward_layernorm.weight")
                                         : normed(h, "post_attention_layernorm.weight");
    // Granite's shared MLP: added to the experts' output, or the whole MLP.
    const std::string shared = p + "shared_mlp.";
    const bool has_shared = shared_mlp_size(c) > 0;
    at::Tensor mlp = sparse(c, rd, l) ? moe(c, rd, ckpt, p, y)
                     : has_shared     ? at::zeros_like(y)
                                      : swiglu(c, ckpt, y, p + "mlp.gate_proj", p + "mlp.up_proj",
                                               p + "mlp.down_proj");
    if (has_shared)
      mlp = mlp +
            swiglu(c, ckpt, y, shared + "gate_proj", shared + "up_proj", shared + "output_linear");
    if (sandwich || post_norms(c)) mlp = normed(mlp, "post_feedforward_layernorm.weight");
    if (glm4(c)) mlp = normed(mlp, "post_mlp_layernorm.weight");
    h = h + mlp * gs.residual;
  }
  h = norm(h, f32(ckpt, "model.norm.weight"), c, rd.eps);
  const double logit_scale =
      cohere(c) ? nlohmann::json::parse(c.json).value("logit_scale", 0.0625) : 1.0;
  return capped(at::matmul(
                    h, f32(ckpt, rd.tied ? "model.embed_tokens.weight" : "lm_head.weight").t()) /
                    gs.logits * logit_scale,
                att.final_cap)
      .to(at::kFloat);
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

void quantize_reference(const at::Tensor& shard, at::Tensor& q, at::Tensor& scale) {
  const at::Tensor w = shard.to(at::kFloat).contiguous();
  q = at::empty(w.sizes(), at::kChar);
  scale = at::empty({w.size(0)}, at::kFloat);
  const float* src = w.data_ptr<float>();
  for (std::int64_t r = 0; r < w.size(0); ++r) {
    float amax = 0;
    for (std::int64_t c = 0; c < w.size(1); ++c)
      amax = std::max(amax, std::fabs(src[r * w.size(1) + c]));
    const float s = amax == 0 ? 1.0f : amax / 127.0f;
    scale.data_ptr<float>()[r] = s;
    for (std::int64_t c = 0; c < w.size(1); ++c) {
      const float v = std::nearbyint(src[r * w.size(1) + c] / s);  // ties to even
      q.data_ptr<std::int8_t>()[r * w.size(1) + c] =
          static_cast<std::int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
}

bool int8_linear(const std::string& param) {
  if (param.rfind("model.layers.", 0) != 0) return false;
  // (the dense MLP's and, as vLLM quantizes them, Qwen2-MoE's shared expert's
  // and Granite's shared MLP's; DeepSeek's column-parallel q and kv_b, not the
  // replicated fused_qkv_a_proj)
  for (const char* leaf :
       {".self_attn.qkv_proj.weight", ".self_attn.o_proj.weight", ".gate_up_proj.weight",
        ".self_attn.q_proj.weight", ".self_attn.q_b_proj.weight", ".self_attn.kv_b_proj.weight",
        ".down_proj.weight", ".shared_mlp.input_linear.weight", ".shared_mlp.output_linear.weight"})
    if (param.size() > std::strlen(leaf) &&
        param.compare(param.size() - std::strlen(leaf), std::strlen(leaf), leaf) == 0)
      return true;
  return false;
}

std::map<std::string, at::Tensor> expected_int8_shards(
    const ModelConfig& config, const std::map<std::string, at::Tensor>& ckpt, int tp_size,
    int tp_rank) {
  std::map<std::string, at::Tensor> out, deferred;
  for (const auto& [param, shard] : expected_shards(config, ckpt, tp_size, tp_rank)) {
    if (!int8_linear(param)) {
      out[param] = shard;
      continue;
    }
    at::Tensor q, scale;
    quantize_reference(shard, q, scale);
    out[param] = q;
    out[param + "_scale"] = scale;
    // (DeepSeek's absorbed matrices: from kv_b_proj as int8 holds it, q x its row scale)
    const std::string kv_b = "kv_b_proj.weight";
    if (param.size() > kv_b.size() &&
        param.compare(param.size() - kv_b.size(), kv_b.size(), kv_b) == 0)
      mla_absorbed(config, q.to(at::kFloat) * scale.unsqueeze(1),
                   param.substr(0, param.size() - kv_b.size()), tp_size, deferred);
  }
  for (auto& [param, t] : deferred) out[param] = t;
  return out;
}

}  // namespace tpreload::testdata
