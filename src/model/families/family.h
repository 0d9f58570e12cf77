// A model family: how one architecture's config.json reads (its Hugging Face
// config class's defaults, and the keys vLLM's model class reads), how it is
// written back, and what its checkpoint stacks. One file per family under
// src/model/families/, one row in registry.cpp; parse_model_config() and the
// checkpoint layout (config.cpp) read the rest from the ModelConfig the family
// fills. Internal to the model rules.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tpreload/core/head_rows.h"
#include "tpreload/model/config.h"

namespace tpreload::families {

using nlohmann::json;

// Which attention and MLP biases a family's vLLM model takes, and from which
// keys (read_biases(), write_biases() in keys.h).
enum class Biases : std::uint8_t {
  kLlama,         // attention_bias or bias: q/k/v and o_proj; qkv_bias decides q/k/v; mlp_bias
  kQkv,           // q/k/v always, no others (Qwen2's)
  kQkvOptional,   // attention_bias: q/k/v only (Qwen3's)
  kQkvAndO,       // attention_bias: q/k/v and o_proj (Gemma 2's and 3's)
  kGranite,       // attention_bias or bias: q/k/v and o_proj (no qkv_bias); mlp_bias
  kQkvUnlessOff,  // attention_bias, true when absent: q/k/v only (GLM-4's)
  kNone,          // (Mixtral's)
};

// The experts' keys and names (parse_experts(), write_experts() in keys.h).
enum class Experts : std::uint8_t {
  kNone,
  kQwen,        // num_experts, moe_intermediate_size, decoder_sparse_step, mlp_only_layers,
                // norm_topk_prob
  kQwenShared,  // the same and shared_expert_intermediate_size (Qwen2-MoE)
  kMixtral,     // num_local_experts of intermediate_size in every layer, renormalised;
                // named block_sparse_moe.experts.<e>.{w1,w3,w2}
  kGlm,         // GLM-4.5's own keys (glm4_moe.cpp)
};

// What the checkpoint stacks by rows (stacked_checkpoint_tensors()).
enum class Stacked : std::uint8_t {
  kNone,
  kQkvAndGateUp,  // self_attn.qkv_proj and mlp.gate_up_proj (Phi-3's)
  kGateUp,        // mlp.gate_up_proj alone (GLM-4's)
  // GraniteMoE's experts: block_sparse_moe.input_linear [E, 2 x I, hidden]
  // (each expert's gate rows, then its up rows), output_linear [E, hidden, I]
  // and the router's router.layer [E, hidden], as vLLM's granitemoe.py splits
  // them into Mixtral's w1, w3, w2 and gate; and the shared MLP's
  // shared_mlp.input_linear [2 x S, hidden] (gate rows, then up rows), as
  // vLLM's MergedColumnParallelLinear splits it
  kExperts,
};

// The keys a family's parse hook reads: the config, its name in errors, and
// rope_parameters per attention type where transformers 5 writes them so
// (null otherwise; rope_per_attention_type() in keys.h).
struct Keys {
  const json& j;
  const std::string& origin;
  const json& per_type;
};

// A parameter of a decoder layer that the family computes from a loaded
// weight after each load (DerivedStep in sharding.h): `window`'s geometry
// (heads, head_rows, first, rows, cols, transpose; core/head_rows.h) of `from`
// on the rank, in the model's dtype.
struct DerivedParam {
  std::string name, from;
  HeadRows window;
};

struct Family {
  const char* architecture = "";  // config.json's "architectures"[0]
  const char* name = "";          // as people write it: "Llama", "Qwen3-MoE"
  const char* vllm_model = "";    // vLLM's model file: "llama.py"
  // Absent keys take these (the Hugging Face config class's defaults):
  // num_key_value_heads (0: num_attention_heads), head_dim (0: hidden_size /
  // num_attention_heads), rope_theta (0: none, the family requires it),
  // the norms' epsilon, partial_rotary_factor, tie_word_embeddings.
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  double rope_theta = 1e4;
  double rms_norm_eps = 1e-6;
  double partial_rotary_factor = 1;
  bool tied = false;
  // The norms' epsilon is layer_norm_eps (Cohere's LayerNorm), not rms_norm_eps.
  bool layer_norm_eps = false;
  // Reads rope_parameters per attention type (Gemma 3's and OLMo's sliding
  // layers turn at their own rotary).
  bool rope_per_attention_type = false;
  Biases biases = Biases::kNone;
  QkNorm qk_norm = QkNorm::kNone;  // before the parse hook, which may change it
  Experts experts = Experts::kNone;
  Stacked stacked = Stacked::kNone;
  // The family's own keys, read after the common ones (sizes, heads, rotary,
  // tying, biases, q/k norms) and before the dtype and quantization; throws
  // ModelError naming keys.origin. Null: none.
  void (*parse)(const Keys& keys, ModelConfig& c) = nullptr;
  // The family's own keys written into `j`, over the common ones, so that
  // parsing the text gives `c` back. Null: none.
  void (*write)(const ModelConfig& c, json& j) = nullptr;
  // The attention tensors of the decoder layer whose names start with `prefix`
  // ("model.layers.3."), where the family's are not q/k/v/o_proj (layout.h);
  // null: those (with the biases and q/k norms the config names).
  void (*attention)(const ModelConfig& c, const std::string& prefix,
                    std::vector<CheckpointTensorSpec>& specs) = nullptr;
  // The parameters of decoder layer `layer` it derives on a rank of tp_size
  // (its post-reload step); null: none.
  std::vector<DerivedParam> (*derived)(const ModelConfig& c, std::int64_t layer,
                                       int tp_size) = nullptr;
};

// Every family, in registry.cpp's order.
const std::vector<const Family*>& registry();
// The family of `architecture`; null for none.
const Family* find(const std::string& architecture);
// The family of a config parse_model_config() read (or one built by hand with a
// known architecture); throws ModelError for another.
const Family& of(const ModelConfig& c);

}  // namespace tpreload::families
