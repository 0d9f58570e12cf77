// Granite and its lines with experts: Granite (vLLM's granite.py: its
// embedding, attention, residual and logits scaling; attention_bias or bias,
// mlp_bias); GraniteMoE (granitemoe.py): and Mixtral's experts stacked in three
// tensors a layer, no biases, head_dim from the heads; GraniteMoeShared
// (granitemoeshared.py): and a shared MLP beside the experts;
// GraniteMoeHybrid (granitemoehybrid.py) with attention layers only: experts
// or none, a shared MLP or none, q/k/v and o_proj biases as attention_bias
// says, rotary or none by position_embedding_type.
#include "family.h"
#include "keys.h"
#include "tpreload/core/error.h"

namespace tpreload::families {
namespace {

enum class Line : std::uint8_t { kGranite, kGraniteMoe, kGraniteMoeShared, kGraniteMoeHybrid };

// GraniteMoeHybrid's keys (vLLM's granitemoehybrid.py) for a model whose every
// layer is attention: Mamba layers refused; num_local_experts and
// shared_intermediate_size required (0 for none; not both); rotary where
// position_embedding_type is "rope", none where it is "nope", null or absent
// (as Hugging Face's and vLLM's models turn it only for "rope").
void parse_granite_hybrid(const json& j, const std::string& origin, ModelConfig& c) {
  // (layers_block_type: the older key, GraniteMoeHybridConfig's alias of it)
  const bool older = !j.contains("layer_types") && j.contains("layers_block_type");
  const char* key = older ? "layers_block_type" : "layer_types";
  if (j.contains("layer_types") && j.contains("layers_block_type") &&
      j["layer_types"] != j["layers_block_type"])
    raise<ModelError>(origin, ": layer_types ", j["layer_types"].dump(), " and layers_block_type ",
                      j["layers_block_type"].dump(), " differ");
  const json types = j.contains(key) ? j[key] : json();
  if (!types.is_array() || static_cast<std::int64_t>(types.size()) != c.num_hidden_layers)
    raise<ModelError>(origin, ": field '", key, "' must list the ", c.num_hidden_layers,
                      " layers of GraniteMoeHybridForCausalLM, got ",
                      j.contains(key) ? types.dump() : std::string("nothing"));
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (types[l] == "mamba")
      raise<ModelError>(origin, ": ", key, "[", l,
                        "] is \"mamba\": GraniteMoeHybrid's Mamba layers are not supported, "
                        "only models whose every layer is \"attention\" (as granite-4.0-micro)");
    if (types[l] != "attention")
      raise<ModelError>(origin, ": ", key, "[", l, "] is ", types[l].dump(),
                        ", not \"attention\" or \"mamba\"");
  }
  c.num_experts = required_count(j, "num_local_experts", origin, "0 for a model without experts");
  c.shared_mlp_intermediate_size =
      required_count(j, "shared_intermediate_size", origin, "0 for a model without a shared MLP");
  if (c.num_experts == 0 && c.shared_mlp_intermediate_size == 0)
    raise<ModelError>(origin,
                      ": num_local_experts and shared_intermediate_size are both 0: the layers "
                      "would have no MLP");
  const json rope = j.contains("position_embedding_type") ? j["position_embedding_type"] : json();
  if (!rope.is_null() && rope != "rope" && rope != "nope")
    raise<ModelError>(origin, ": position_embedding_type ", rope.dump(),
                      " is not \"rope\", \"nope\" or null");
  c.nope_full_layers = rope != "rope";  // (no sliding layers: every layer then)
}

// Granite's multipliers (GraniteConfig: 1 when absent; vLLM's granite.py takes
// attention_multiplier as the attention's scale itself), and its MLP's
// activation, which vLLM's GraniteMLP takes as silu only. The lines with
// experts: head_dim from the heads; GraniteMoE and GraniteMoeShared without
// biases, as vLLM's granitemoe.py builds them (Hugging Face's model would
// take attention_bias: refused); GraniteMoeShared's shared MLP
// (shared_intermediate_size, 0 when absent, GraniteMoeSharedConfig's);
// GraniteMoeHybrid's keys.
void parse_granite(const json& j, const std::string& origin, Line line, ModelConfig& c) {
  silu_only(j, origin, c);
  if (line == Line::kGraniteMoeHybrid) {
    head_dim_from_heads(c, origin, "granitemoehybrid.py");
    parse_granite_hybrid(j, origin, c);
  } else if (line != Line::kGranite) {
    head_dim_from_heads(c, origin,
                        line == Line::kGraniteMoe ? "granitemoe.py" : "granitemoeshared.py");
    refuse_true(j, origin, c, {"attention_bias"},
                "vLLM's model builds no biases; no released model of it sets it");
  }
  if (line == Line::kGraniteMoeShared && j.contains("shared_intermediate_size"))
    c.shared_mlp_intermediate_size =
        required_count(j, "shared_intermediate_size", origin, "0 for a model without a shared MLP");
  // (null refused: vLLM would multiply by None, transformers 5 refuses it)
  c.embedding_multiplier = positive_number_or(j, "embedding_multiplier", 1, origin);
  c.attention_multiplier = positive_number_or(j, "attention_multiplier", 1, origin);
  c.residual_multiplier = positive_number_or(j, "residual_multiplier", 1, origin);
  c.logits_scaling = positive_number_or(j, "logits_scaling", 1, origin);
}

// Granite's multipliers, and the experts of the lines with them (GraniteMoE's
// Mixtral keys; GraniteMoeHybrid's where it has any).
void parse_line(const Keys& k, Line line, ModelConfig& c) {
  parse_granite(k.j, k.origin, line, c);
  if (line == Line::kGranite || (line == Line::kGraniteMoeHybrid && c.num_experts == 0)) return;
  parse_experts(k.j, k.origin, Experts::kMixtral, c);
}

void write_line(const ModelConfig& c, Line line, json& j) {
  j["embedding_multiplier"] = c.embedding_multiplier;
  j["attention_multiplier"] = c.attention_multiplier;
  j["residual_multiplier"] = c.residual_multiplier;
  j["logits_scaling"] = c.logits_scaling;
  if (line == Line::kGranite) return;
  write_experts(Experts::kMixtral, c, j);
  if (line == Line::kGraniteMoe) return;
  j["shared_intermediate_size"] = c.shared_mlp_intermediate_size;
  if (line != Line::kGraniteMoeHybrid) return;
  j["layer_types"] = std::vector<std::string>(c.num_hidden_layers, "attention");
  j["position_embedding_type"] = c.nope_full_layers ? "nope" : "rope";
}

}  // namespace

const Family& granite() {
  static const Family f = [] {
    Family f;
    f.architecture = "GraniteForCausalLM";
    f.name = "Granite";
    f.vllm_model = "granite.py";
    f.biases = Biases::kGranite;
    f.parse = [](const Keys& k, ModelConfig& c) { parse_line(k, Line::kGranite, c); };
    f.write = [](const ModelConfig& c, json& j) { write_line(c, Line::kGranite, j); };
    return f;
  }();
  return f;
}

const Family& granite_moe() {
  static const Family f = [] {
    Family f;
    f.architecture = "GraniteMoeForCausalLM";
    f.name = "GraniteMoE";
    f.vllm_model = "granitemoe.py";
    f.experts = Experts::kMixtral;
    f.stacked = Stacked::kExperts;
    f.parse = [](const Keys& k, ModelConfig& c) { parse_line(k, Line::kGraniteMoe, c); };
    f.write = [](const ModelConfig& c, json& j) { write_line(c, Line::kGraniteMoe, j); };
    return f;
  }();
  return f;
}

const Family& granite_moe_hybrid() {
  static const Family f = [] {
    Family f;
    f.architecture = "GraniteMoeHybridForCausalLM";
    f.name = "GraniteMoeHybrid (attention layers only)";
    f.vllm_model = "granitemoehybrid.py";
    f.biases = Biases::kQkvAndO;
    f.experts = Experts::kMixtral;
    f.stacked = Stacked::kExperts;
    f.parse = [](const Keys& k, ModelConfig& c) { parse_line(k, Line::kGraniteMoeHybrid, c); };
    f.write = [](const ModelConfig& c, json& j) { write_line(c, Line::kGraniteMoeHybrid, j); };
    return f;
  }();
  return f;
}

const Family& granite_moe_shared() {
  static const Family f = [] {
    Family f;
    f.architecture = "GraniteMoeSharedForCausalLM";
    f.name = "GraniteMoeShared";
    f.vllm_model = "granitemoeshared.py";
    f.experts = Experts::kMixtral;
    f.stacked = Stacked::kExperts;
    f.parse = [](const Keys& k, ModelConfig& c) { parse_line(k, Line::kGraniteMoeShared, c); };
    f.write = [](const ModelConfig& c, json& j) { write_line(c, Line::kGraniteMoeShared, j); };
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
