#include "tpreload/model/scenarios.h"

#include <string>
#include <utility>
#include <vector>

#include "tpreload/core/error.h"

namespace tpreload {
namespace {

// The DeepSeek scenarios' keys but the expert count.
const char* const kDeepseekV3TwoLayers =
    R"("architectures":["DeepseekV3ForCausalLM"],"hidden_size":7168,"intermediate_size":18432,
  "moe_intermediate_size":2048,"num_hidden_layers":2,"first_k_dense_replace":1,"moe_layer_freq":1,
  "num_attention_heads":128,"num_key_value_heads":128,"q_lora_rank":1536,"kv_lora_rank":512,
  "qk_nope_head_dim":128,"qk_rope_head_dim":64,"v_head_dim":128,"n_shared_experts":1,
  "num_experts_per_tok":8,"n_group":8,"topk_group":4,"topk_method":"noaux_tc",
  "scoring_func":"sigmoid","norm_topk_prob":true,"routed_scaling_factor":2.5,"vocab_size":32000,
  "rope_theta":10000,"tie_word_embeddings":false,"torch_dtype":"bfloat16",
  "quantization_config":{"quant_method":"fp8","activation_scheme":"dynamic","fmt":"e4m3",
  "weight_block_size":[128,128]})";

std::string deepseek_v3_two_layers(int experts) {
  return std::string("{") + kDeepseekV3TwoLayers +
         ",\"n_routed_experts\":" + std::to_string(experts) + "}";
}

const std::vector<std::pair<std::string, std::string>>& scenarios() {
  static const std::vector<std::pair<std::string, std::string>> kScenarios = {
      {"tiny", R"({"architectures":["LlamaForCausalLM"],"hidden_size":256,"intermediate_size":768,
      "num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":4,"vocab_size":4000,
      "torch_dtype":"bfloat16"})"},
      {"tinyllama",
       R"({"architectures":["LlamaForCausalLM"],"hidden_size":2048,"intermediate_size":5632,
      "num_hidden_layers":22,"num_attention_heads":32,"num_key_value_heads":4,"vocab_size":32000,
      "torch_dtype":"bfloat16"})"},
      {"llama3-8b-4l",
       R"({"architectures":["LlamaForCausalLM"],"hidden_size":4096,"intermediate_size":14336,
      "num_hidden_layers":4,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
      "rope_theta":500000.0,"torch_dtype":"bfloat16"})"},
      // The same as FP8 checkpoints (random codes and scales): block-scaled as
      // DeepSeek-V3 and Qwen3-FP8 ship them, and per tensor with static
      // activations (requantized per layer on load).
      {"llama3-8b-4l-fp8",
       R"({"architectures":["LlamaForCausalLM"],"hidden_size":4096,"intermediate_size":14336,
      "num_hidden_layers":4,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
      "rope_theta":500000.0,"torch_dtype":"bfloat16","quantization_config":{"quant_method":"fp8",
      "activation_scheme":"dynamic","weight_block_size":[128,128]}})"},
      {"llama3-8b-4l-fp8-tensor",
       R"({"architectures":["LlamaForCausalLM"],"hidden_size":4096,"intermediate_size":14336,
      "num_hidden_layers":4,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
      "rope_theta":500000.0,"torch_dtype":"bfloat16","quantization_config":{"quant_method":"fp8",
      "activation_scheme":"static"}})"},
      // Qwen3-30B-A3B's shapes cut to 2 layers: 128 experts of moe_intermediate 768
      // per layer (768 expert tensors of 3 MiB), 3.7 GB in bfloat16.
      {"qwen3-moe-2l", R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":2048,
      "intermediate_size":6144,"num_hidden_layers":2,"num_attention_heads":32,"num_key_value_heads":4,
      "head_dim":128,"vocab_size":151936,"num_experts":128,"num_experts_per_tok":8,
      "moe_intermediate_size":768,"norm_topk_prob":true,"rope_theta":1000000.0,
      "tie_word_embeddings":false,"torch_dtype":"bfloat16"})"},
      // DeepSeek-V3's widths as released (hidden 7168, 128 heads of MLA with
      // q_lora_rank 1536 and kv_lora_rank 512, 256 experts of 2048, block FP8)
      // on 2 layers, one dense and one sparse, with a 32000-row vocabulary:
      // 13.0 GB, of which the sparse layer's experts are 11.3 GB. On a 24 GiB
      // machine the model and the page cache cannot both hold it: run it --cold.
      {"deepseek-v3-2l-fp8", deepseek_v3_two_layers(256)},
      // The same with 128 experts (7.4 GB): model and page cache fit, warm.
      {"deepseek-v3-2l-fp8-128e", deepseek_v3_two_layers(128)},
      // 9 tensors per layer, all under 64 KB: 20,709 tensors.
      {"small-tensors",
       R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2300,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":256,
      "torch_dtype":"bfloat16"})"},
  };
  return kScenarios;
}

}  // namespace

ModelConfig scenario_config(const std::string& name) {
  for (const auto& [key, json] : scenarios())
    if (name == key) return parse_model_config(json, "scenario '" + name + "'");
  std::string known;
  for (const auto& [key, json] : scenarios())
    known += (known.empty() ? "" : ", ") + std::string(key);
  raise<UsageError>("unknown scenario '", name, "' (", known, ")");
}

std::vector<std::string> scenario_names() {
  std::vector<std::string> names;
  for (const auto& [key, json] : scenarios()) names.emplace_back(key);
  return names;
}

}  // namespace tpreload
