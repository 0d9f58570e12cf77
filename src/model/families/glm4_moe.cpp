// GLM-4.5 (Glm4MoeForCausalLM; vLLM's glm4_moe.py): Llama's norms, q/k/v
// biases as attention_bias says (none on o_proj), q and k normed per head with
// use_qk_norm, rotary on halves over partial_rotary_factor of each head (0.5
// when absent), dense layers then sparse ones with sigmoid routing and shared
// experts.
#include "family.h"
#include "keys.h"
#include "tpreload/core/error.h"

namespace tpreload::families {
namespace {

// GLM-4.5's keys, as vLLM's glm4_moe.py reads them from the released
// Glm4MoeConfig (whose earlier versions named and defaulted them otherwise, so
// that what shapes the experts and their routing is required):
// n_routed_experts, num_experts_per_tok, moe_intermediate_size,
// n_shared_experts (0 or null: none), first_k_dense_replace, n_group and
// topk_group (n_routed_experts a multiple of n_group, topk_group at most
// n_group, num_experts_per_tok within topk_group groups' experts),
// routed_scaling_factor and head_dim (which vLLM reads as it is, with no
// fallback); norm_topk_prob (true when absent, false when null, as both
// models read a null) and use_qk_norm (false). SiLU only; never tied (vLLM's
// Glm4MoeForCausalLM always has its own lm_head).
void parse_glm4_moe(const json& j, const std::string& origin, ModelConfig& c) {
  const char* why = "vLLM's glm4_moe.py reads it; Glm4MoeConfig's versions default it differently";
  if (!j.contains("head_dim") || j["head_dim"].is_null())
    raise<ModelError>(origin, ": field 'head_dim' is missing or null (vLLM's glm4_moe.py reads ",
                      "config.head_dim, with no fallback to hidden_size / num_attention_heads)");
  if (!j.contains("routed_scaling_factor") || j["routed_scaling_factor"].is_null())
    raise<ModelError>(origin, ": field 'routed_scaling_factor' is missing or null (", why, ")");
  silu_only(j, origin, c);
  refuse_true(j, origin, c, {"tie_word_embeddings"},
              "vLLM's Glm4MoeForCausalLM always loads its own lm_head");
  c.num_experts = positive_int(j, "n_routed_experts", origin);
  c.num_experts_per_tok = positive_int(j, "num_experts_per_tok", origin);
  c.moe_intermediate_size = positive_int(j, "moe_intermediate_size", origin);
  const std::int64_t shared =
      j.contains("n_shared_experts") && j["n_shared_experts"].is_null()
          ? 0
          : required_count(j, "n_shared_experts", origin, "null or 0 for none");
  c.shared_experts_intermediate_size = shared * c.moe_intermediate_size;
  c.first_k_dense_replace = required_count(j, "first_k_dense_replace", origin, why);
  c.n_group = positive_int(j, "n_group", origin);
  c.topk_group = positive_int(j, "topk_group", origin);
  c.routed_scaling_factor = positive_number(j, "routed_scaling_factor", 1, origin);
  c.norm_topk_prob = !j.contains("norm_topk_prob") || flag(j, "norm_topk_prob", origin);
  c.sigmoid_routing = c.float32_router = c.score_correction = true;
  if (flag(j, "use_qk_norm", origin)) c.qk_norm = QkNorm::kShared;
  if (c.num_experts % c.n_group != 0)
    raise<ModelError>(origin, ": n_routed_experts ", c.num_experts,
                      " is not a multiple of n_group ", c.n_group);
  // (vLLM's grouped top-k refuses groups of one expert, or in other versions
  // skips the grouping: no released GLM-4.5 has them)
  if (c.n_group > 1 && c.num_experts <= c.n_group)
    raise<ModelError>(origin, ": n_group ", c.n_group, " leaves groups of one expert (",
                      c.num_experts, " routed experts), which vLLM's grouped top-k does not ",
                      "route by groups");
  if (c.topk_group > c.n_group)
    raise<ModelError>(origin, ": topk_group ", c.topk_group, " exceeds n_group ", c.n_group);
  const std::int64_t reachable = c.topk_group * (c.num_experts / c.n_group);
  if (c.num_experts_per_tok > reachable)
    raise<ModelError>(origin, ": num_experts_per_tok ", c.num_experts_per_tok, " exceeds the ",
                      reachable, " experts of topk_group ", c.topk_group, " groups of ",
                      c.num_experts / c.n_group);
}

void write_glm4_moe(const ModelConfig& c, json& j) {
  j["n_routed_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["n_shared_experts"] = c.shared_experts_intermediate_size / c.moe_intermediate_size;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["use_qk_norm"] = c.qk_norm == QkNorm::kShared;
}

}  // namespace

const Family& glm4_moe() {
  static const Family f = [] {
    Family f;
    f.architecture = "Glm4MoeForCausalLM";
    f.name = "GLM-4.5";
    f.vllm_model = "glm4_moe.py";
    f.kv_heads = 8;
    f.rms_norm_eps = 1e-5;
    f.partial_rotary_factor = 0.5;
    f.biases = Biases::kQkvOptional;
    f.experts = Experts::kGlm;
    f.parse = [](const Keys& k, ModelConfig& c) { parse_glm4_moe(k.j, k.origin, c); };
    f.write = write_glm4_moe;
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
