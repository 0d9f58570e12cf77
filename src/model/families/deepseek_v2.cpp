// DeepSeek-V2 and V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM; vLLM's
// deepseek_v2.py, which serves both, and Kimi-K2 and Moonlight, whose configs
// name DeepseekV3ForCausalLM): multi-head latent attention, dense layers
// before first_k_dense_replace, then routed experts beside shared ones.
#include <cstdint>

#include "family.h"
#include "keys.h"
#include "layout.h"
#include "tpreload/core/error.h"

namespace tpreload::families {
namespace {

// The defaults of the Hugging Face config classes where V2's and V3's differ
// (DeepseekV2Config's remote code; transformers' DeepseekV3Config, whose
// router is always noaux_tc with sigmoid scores).
struct Defaults {
  std::int64_t routed_experts, shared_experts, first_dense, n_group, topk_group;
  double routed_scaling_factor;
  bool norm_topk_prob;
  const char* topk_method;
  const char* scoring_func;
};
constexpr Defaults kV2{0, 0, 0, 1, 1, 1.0, false, "greedy", "softmax"};
constexpr Defaults kV3{256, 1, 3, 8, 4, 2.5, true, "noaux_tc", "sigmoid"};

// `key` as a count: `fallback` where absent, 0 where null.
std::int64_t count_or(const json& j, const char* key, std::int64_t fallback,
                      const std::string& origin) {
  if (!j.contains(key)) return fallback;
  if (j[key].is_null()) return 0;
  return required_count(j, key, origin, "null or absent for the config class's default");
}

std::string text_or(const json& j, const char* key, const char* fallback,
                    const std::string& origin) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_string()) raise<ModelError>(origin, ": field '", key, "' is not a string");
  return j[key].get<std::string>();
}

// vLLM's DeepseekV2MLAAttention and DeepseekV2MoE read: q_lora_rank (null: q
// straight from the hidden state), kv_lora_rank, qk_nope_head_dim,
// qk_rope_head_dim, v_head_dim (required: every released config gives them);
// the experts (n_routed_experts, null for none; moe_intermediate_size,
// num_experts_per_tok, n_shared_experts), which layers have them (from
// first_k_dense_replace on, every moe_layer_freq-th), and the router:
// topk_method (noaux_tc: a float32 e_score_correction_bias), scoring_func,
// n_group, topk_group, routed_scaling_factor, norm_topk_prob. No biases (the
// MLA projections have none), SiLU only.
void parse_deepseek(const json& j, const std::string& origin, const Defaults& d, ModelConfig& c) {
  silu_only(j, origin, c);
  refuse_true(j, origin, c, {"attention_bias"}, "vLLM's MLA projections have no biases");
  c.q_lora_rank = count_or(j, "q_lora_rank", 1536, origin);
  c.kv_lora_rank = positive_int(j, "kv_lora_rank", origin);
  c.qk_nope_head_dim = positive_int(j, "qk_nope_head_dim", origin);
  c.qk_rope_head_dim = positive_int(j, "qk_rope_head_dim", origin);
  c.v_head_dim = positive_int(j, "v_head_dim", origin);
  c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  c.num_key_value_heads = c.num_attention_heads;  // (MLA: one latent for every head)
  c.rope_interleaved = true;                      // (vLLM's DeepSeek rotary: is_neox_style=False)
  c.num_experts = count_or(j, "n_routed_experts", d.routed_experts, origin);
  if (c.num_experts == 0) return;
  c.moe_intermediate_size = positive_int(j, "moe_intermediate_size", origin);
  c.num_experts_per_tok = positive_int(j, "num_experts_per_tok", origin);
  c.shared_experts_intermediate_size =
      count_or(j, "n_shared_experts", d.shared_experts, origin) * c.moe_intermediate_size;
  c.first_k_dense_replace = count_or(j, "first_k_dense_replace", d.first_dense, origin);
  const std::int64_t freq = positive_int_or(j, "moe_layer_freq", 1, origin);
  for (std::int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l)
    if (l % freq != 0) c.mlp_only_layers.push_back(l);
  const std::string topk = text_or(j, "topk_method", d.topk_method, origin);
  if (topk != "greedy" && topk != "group_limited_greedy" && topk != "noaux_tc")
    raise<ModelError>(origin, ": topk_method '", topk,
                      "' is not greedy, group_limited_greedy or noaux_tc");
  const std::string scoring = text_or(j, "scoring_func", d.scoring_func, origin);
  if (scoring != "softmax" && scoring != "sigmoid")
    raise<ModelError>(origin, ": scoring_func '", scoring, "' is not softmax or sigmoid");
  c.score_correction = topk == "noaux_tc";
  c.sigmoid_routing = scoring == "sigmoid";
  c.n_group = count_or(j, "n_group", d.n_group, origin);
  c.topk_group = count_or(j, "topk_group", d.topk_group, origin);
  if (c.n_group == 0) c.n_group = 1;
  if (c.topk_group == 0) c.topk_group = 1;
  if (c.num_experts % c.n_group != 0)
    raise<ModelError>(origin, ": n_routed_experts ", c.num_experts,
                      " is not a multiple of n_group ", c.n_group);
  if (c.topk_group > c.n_group)
    raise<ModelError>(origin, ": topk_group ", c.topk_group, " exceeds n_group ", c.n_group);
  c.routed_scaling_factor =
      positive_number(j, "routed_scaling_factor", d.routed_scaling_factor, origin);
  c.norm_topk_prob = j.contains("norm_topk_prob") && !j["norm_topk_prob"].is_null()
                         ? flag(j, "norm_topk_prob", origin)
                         : d.norm_topk_prob;
}

// moe_layer_freq as parse_deepseek() turned it into mlp_only_layers: the
// smallest that gives them back.
std::int64_t moe_layer_freq(const ModelConfig& c) {
  for (std::int64_t f = 1; f <= c.num_hidden_layers; ++f) {
    std::vector<std::int64_t> dense;
    for (std::int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l)
      if (l % f != 0) dense.push_back(l);
    if (dense == c.mlp_only_layers) return f;
  }
  raise<ModelError>(c.architecture, ": its dense layers are no moe_layer_freq's");
}

void write_deepseek(const ModelConfig& c, json& j) {
  j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  if (c.num_experts == 0) {
    j["n_routed_experts"] = nullptr;
    return;
  }
  j["n_routed_experts"] = c.num_experts;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_shared_experts"] = c.shared_experts_intermediate_size / c.moe_intermediate_size;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = moe_layer_freq(c);
  j["topk_method"] = c.score_correction ? "noaux_tc"
                     : c.n_group > 1    ? "group_limited_greedy"
                                        : "greedy";
  j["scoring_func"] = c.sigmoid_routing ? "sigmoid" : "softmax";
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["norm_topk_prob"] = c.norm_topk_prob;
}

// MLA's tensors of layer prefix `p`, as vLLM's DeepseekV2MLAAttention holds
// them: with q_lora_rank, q_a_proj and kv_a_proj_with_mqa merged into the
// replicated fused_qkv_a_proj (shards 0 and 1), q_a_layernorm, q_b_proj
// column-parallel; without, q_proj column-parallel and kv_a_proj_with_mqa
// replicated; kv_a_layernorm, kv_b_proj column-parallel (each head's
// qk_nope_head_dim rows of k, then its v_head_dim rows of v), o_proj
// row-parallel over heads x v_head_dim.
void mla_attention(const ModelConfig& c, const std::string& p,
                   std::vector<CheckpointTensorSpec>& specs) {
  using layout::split_as;
  const std::string a = p + "self_attn.";
  const std::int64_t h = c.hidden_size, heads = c.num_attention_heads,
                     kv_a = c.kv_lora_rank + c.qk_rope_head_dim;
  if (c.q_lora_rank > 0) {
    layout::push_merged_replicated(
        specs, a + "fused_qkv_a_proj.weight",
        {{a + "q_a_proj.weight", c.q_lora_rank}, {a + "kv_a_proj_with_mqa.weight", kv_a}}, h);
    specs.push_back({a + "q_a_layernorm.weight", {c.q_lora_rank}});
    specs.push_back(
        split_as(a + "q_b_proj.weight", {heads * c.head_dim, c.q_lora_rank}, ShardKind::kColumn));
  } else {
    specs.push_back(split_as(a + "q_proj.weight", {heads * c.head_dim, h}, ShardKind::kColumn));
    specs.push_back({a + "kv_a_proj_with_mqa.weight", {kv_a, h}});
  }
  specs.push_back({a + "kv_a_layernorm.weight", {c.kv_lora_rank}});
  specs.push_back(split_as(a + "kv_b_proj.weight",
                           {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank},
                           ShardKind::kColumn));
  specs.push_back(split_as(a + "o_proj.weight", {h, heads * c.v_head_dim}, ShardKind::kRow));
}

// vLLM's MLA backends' absorbed matrices (MLACommonImpl.process_weights_after_
// loading), from the rank's kv_b_proj [heads x (qk_nope + v), kv_lora_rank]
// dequantized: W_UK_T [heads, qk_nope, kv_lora_rank], each head's first qk_nope
// rows; W_UV [heads, kv_lora_rank, v], its next v rows transposed.
std::vector<DerivedParam> mla_derived(const ModelConfig& c, std::int64_t layer, int tp_size) {
  const std::string a = "model.layers." + std::to_string(layer) + ".self_attn.",
                    at = a + "mla_attn.mla_attn.";
  DerivedParam uk{at + "W_UK_T", a + "kv_b_proj.weight", {}}, uv{at + "W_UV", uk.from, {}};
  for (HeadRows* w : {&uk.window, &uv.window}) {
    w->heads = c.num_attention_heads / tp_size;
    w->head_rows = c.qk_nope_head_dim + c.v_head_dim;
    w->cols = c.kv_lora_rank;
  }
  uk.window.rows = c.qk_nope_head_dim;
  uv.window.first = c.qk_nope_head_dim;
  uv.window.rows = c.v_head_dim;
  uv.window.transpose = true;
  return {uk, uv};
}

Family deepseek(const char* architecture, const char* name) {
  Family f;
  f.architecture = architecture;
  f.name = name;
  f.vllm_model = "deepseek_v2.py";
  f.attention = mla_attention;
  f.derived = mla_derived;
  f.write = write_deepseek;
  return f;
}

}  // namespace

const Family& deepseek_v2() {
  static const Family f = [] {
    Family f = deepseek("DeepseekV2ForCausalLM", "DeepSeek-V2");
    f.parse = [](const Keys& k, ModelConfig& c) { parse_deepseek(k.j, k.origin, kV2, c); };
    return f;
  }();
  return f;
}

const Family& deepseek_v3() {
  static const Family f = [] {
    Family f = deepseek("DeepseekV3ForCausalLM", "DeepSeek-V3");
    f.parse = [](const Keys& k, ModelConfig& c) { parse_deepseek(k.j, k.origin, kV3, c); };
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
