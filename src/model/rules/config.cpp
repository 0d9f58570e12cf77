#include "tpreload/model/config.h"

#include <sys/stat.h>
#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "../../core/json_depth.h"
#include "fp8_config.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

using nlohmann::json;

// A q/k norm's name in config_fields.
const char* qk_norm_name(QkNorm norm) {
  switch (norm) {
    case QkNorm::kShared:
      return "one weight for every head";
    case QkNorm::kWhole:
      return "over the whole projection";
    case QkNorm::kPerHead:
      return "each head its own weights";
    case QkNorm::kNone:
      break;
  }
  return "none";
}

// A layout's name in config_fields.
std::string norm_layout_name(NormLayout layout) {
  switch (layout) {
    case NormLayout::kSandwich:
      return "sandwich";
    case NormLayout::kGlm:
      return "GLM's sandwich";
    case NormLayout::kPost:
      return "post-norms";
    case NormLayout::kParallel:
      return "parallel";
    case NormLayout::kPre:
      break;
  }
  return "pre-norms";
}

// Field values as config_differences names them.
std::string show(const std::string& v) {
  return "'" + v + "'";
}
std::string show(bool v) {
  return v ? "true" : "false";
}
std::string show(DType v) {
  return std::string(dtype_name(v));
}
template <typename T>
std::string show(const T& v) {
  return json(v).dump();
}

// A true/false field; absent or null is false.
bool flag(const json& j, const char* key, const std::string& origin) {
  if (!j.contains(key) || j[key].is_null()) return false;
  if (!j[key].is_boolean())
    raise<ModelError>(origin, ": field '", key, "' must be true or false, got ", j[key].dump());
  return j[key].get<bool>();
}

std::int64_t positive_int(const json& j, const char* key, const std::string& origin) {
  if (!j.contains(key)) raise<ModelError>(origin, ": field '", key, "' is missing");
  if (!j[key].is_number_integer())
    raise<ModelError>(origin, ": field '", key, "' must be an integer, got ", j[key].dump());
  const auto value = j[key].get<std::int64_t>();
  if (value <= 0) raise<ModelError>(origin, ": field '", key, "' must be positive, got ", value);
  return value;
}

// A positive number at `key` of `j`, or `fallback` where it is absent or null.
double positive_number(const json& j, const char* key, double fallback, const std::string& origin,
                       const char* within = "") {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number())
    raise<ModelError>(origin, ": field '", within, key, "' must be a number, got ", j[key].dump());
  const double value = j[key].get<double>();
  if (!(value > 0))  // (nlohmann refuses numbers beyond a double: no infinity gets here)
    raise<ModelError>(origin, ": field '", within, key, "' must be a positive number, got ",
                      j[key].dump());
  return value;
}

// How each supported family's config.json reads, as its Hugging Face config
// class (the defaults of absent keys) and vLLM's model class (biases, q/k norms,
// experts) read it.
enum class Biases {
  kLlama,         // attention_bias or bias: q/k/v and o_proj; qkv_bias decides q/k/v; mlp_bias
  kQkv,           // q/k/v always, no others (Qwen2's)
  kQkvOptional,   // attention_bias: q/k/v only (Qwen3's)
  kQkvAndO,       // attention_bias: q/k/v and o_proj (Gemma 2's and 3's)
  kGranite,       // attention_bias or bias: q/k/v and o_proj (no qkv_bias); mlp_bias
  kQkvUnlessOff,  // attention_bias, true when absent: q/k/v only (GLM-4's)
  kNone,          // (Mixtral's)
};
// What the checkpoint stacks by rows (stacked_checkpoint_tensors()).
enum class Stacked {
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
enum class Experts {
  kNone,
  kQwen,        // num_experts, moe_intermediate_size, decoder_sparse_step, mlp_only_layers,
                // norm_topk_prob
  kQwenShared,  // the same and shared_expert_intermediate_size (Qwen2-MoE)
  kMixtral,     // num_local_experts of intermediate_size in every layer, renormalised
  kGlm,         // GLM-4.5's: n_routed_experts, sigmoid routing over groups, shared experts
                // (parse_glm4_moe)
};
// The line of models a family belongs to, where it needs more than the
// columns of Family: each adds its own keys and layout (parse_model_config).
enum class Line {
  kPlain,
  // Gemma: tied head by default (and required), GeLU, Gemma's normalization;
  // Gemma 2: and its sandwich norms, attention scaling, soft-capping, windows;
  // Gemma 3: and its sliding layers' own rotary.
  kGemma,
  kGemma2,
  kGemma3,
  // Granite: its embedding, attention, residual and logits scaling; GraniteMoE
  // (vLLM's granitemoe.py): and Mixtral's experts, no biases, head_dim from the
  // heads; GraniteMoeShared (granitemoeshared.py): and a shared MLP beside the
  // experts; GraniteMoeHybrid (granitemoehybrid.py) with attention layers
  // only: experts or none, a shared MLP or none, attention biases as
  // attention_bias says, rotary or none by position_embedding_type.
  kGranite,
  kGraniteMoe,
  kGraniteMoeShared,
  kGraniteMoeHybrid,
  // OLMo 2: post-norms only, q and k normed over the whole projection; OLMo 3:
  // and its sliding windows (vLLM serves both with its olmo2.py).
  kOlmo2,
  kOlmo3,
  // GLM-4 (Glm4Config's defaults; vLLM's glm4.py): sandwich norms under its
  // own names, rotary on interleaved pairs over partial_rotary_factor of each
  // head (0.5 when absent).
  kGlm,
  // GLM-4.5 (vLLM's glm4_moe.py): Llama's norms, q/k/v biases as attention_bias
  // says, q and k normed per head with use_qk_norm, rotary on halves over
  // partial_rotary_factor of each head (0.5 when absent), dense layers then
  // sparse ones with sigmoid routing and shared experts (parse_glm4_moe).
  kGlm4Moe,
  // ERNIE 4.5 (Ernie4_5Config's defaults; vLLM's ernie45.py, its Llama):
  // rotary on interleaved pairs over whole heads, tied by default, no biases.
  kErnie,
  // Cohere (CohereConfig's defaults; vLLM's commandr.py): LayerNorm without
  // bias (layer_norm_eps), attention and MLP in parallel on one normed input,
  // logits from the embeddings times logit_scale, interleaved rotary; Cohere 2
  // (Cohere2Config): and sliding windows, its full layers turning no rotary.
  kCohere,
  kCohere2,
  // EXAONE 4 (Exaone4Config's defaults; vLLM's exaone4.py): post-norms only,
  // q and k normed per head, and where it has windows its full layers turning
  // no rotary.
  kExaone4,
};
struct Family {
  const char* architecture;
  std::int64_t kv_heads;            // num_key_value_heads when absent; 0: num_attention_heads
  std::int64_t head_dim;            // head_dim when absent; 0: hidden_size / num_attention_heads
  double rope_theta, rms_norm_eps;  // when absent
  Biases biases;
  QkNorm qk_norm;  // (Command R+'s kPerHead from its use_qk_norm)
  Experts experts;
  Stacked stacked;
  Line line = Line::kPlain;

  bool gemma() const {
    return line == Line::kGemma || line == Line::kGemma2 || line == Line::kGemma3;
  }
  bool olmo() const { return line == Line::kOlmo2 || line == Line::kOlmo3; }
  bool cohere() const { return line == Line::kCohere || line == Line::kCohere2; }
  bool granite() const { return line == Line::kGranite || granite_moe(); }
  bool granite_moe() const {
    return line == Line::kGraniteMoe || line == Line::kGraniteMoeShared ||
           line == Line::kGraniteMoeHybrid;
  }
};
constexpr Family kFamilies[] = {
    // (vLLM's CohereAttention and CohereMLP: no biases whatever the config says)
    {"CohereForCausalLM", 0, 0, 1e4, 1e-5, Biases::kNone, QkNorm::kNone, Experts::kNone,
     Stacked::kNone, Line::kCohere},
    {"Cohere2ForCausalLM", 0, 0, 1e4, 1e-5, Biases::kNone, QkNorm::kNone, Experts::kNone,
     Stacked::kNone, Line::kCohere2},
    // (vLLM's Ernie4_5ForCausalLM: its Llama without o_proj's bias; no
    // Ernie4_5Config key gives it any other)
    {"Ernie4_5ForCausalLM", 2, 128, 5e5, 1e-5, Biases::kNone, QkNorm::kNone, Experts::kNone,
     Stacked::kNone, Line::kErnie},
    // (Hugging Face's Exaone4Attention and Exaone4MLP take no biases; vLLM's
    // would take them from attention_bias, bias and mlp_bias: refused; its
    // rope_theta when absent differs from Hugging Face's: required)
    {"Exaone4ForCausalLM", 32, 0, 0, 1e-5, Biases::kNone, QkNorm::kShared, Experts::kNone,
     Stacked::kNone, Line::kExaone4},
    // (vLLM's Gemma has no biases whatever the config says; its Gemma 2 reads
    // attention_bias)
    {"GemmaForCausalLM", 16, 256, 1e4, 1e-6, Biases::kNone, QkNorm::kNone, Experts::kNone,
     Stacked::kNone, Line::kGemma},
    {"Gemma2ForCausalLM", 4, 256, 1e4, 1e-6, Biases::kQkvAndO, QkNorm::kNone, Experts::kNone,
     Stacked::kNone, Line::kGemma2},
    // (vLLM's Gemma3Attention: attention_bias for q/k/v and o_proj; q/k norms)
    {"Gemma3ForCausalLM", 4, 256, 1e6, 1e-6, Biases::kQkvAndO, QkNorm::kShared, Experts::kNone,
     Stacked::kNone, Line::kGemma3},
    // (vLLM's Glm4Attention: q/k/v biases as attention_bias says; its MLP is
    // Llama's, without biases)
    {"Glm4ForCausalLM", 2, 128, 1e4, 1.5625e-7, Biases::kQkvUnlessOff, QkNorm::kNone,
     Experts::kNone, Stacked::kGateUp, Line::kGlm},
    // (vLLM's Glm4MoeAttention: q/k/v biases as attention_bias says, none on
    // o_proj; q/k norms with use_qk_norm: parse_glm4_moe)
    {"Glm4MoeForCausalLM", 8, 0, 1e4, 1e-5, Biases::kQkvOptional, QkNorm::kNone, Experts::kGlm,
     Stacked::kNone, Line::kGlm4Moe},
    // (vLLM's GraniteAttention and GraniteMLP: attention_bias or bias, mlp_bias)
    {"GraniteForCausalLM", 0, 0, 1e4, 1e-6, Biases::kGranite, QkNorm::kNone, Experts::kNone,
     Stacked::kNone, Line::kGranite},
    // (vLLM's granitemoe.py: Granite's scaling, Mixtral's experts stacked in
    // three tensors a layer; no biases, head_dim hidden_size / heads)
    {"GraniteMoeForCausalLM", 0, 0, 1e4, 1e-6, Biases::kNone, QkNorm::kNone, Experts::kMixtral,
     Stacked::kExperts, Line::kGraniteMoe},
    // (vLLM's GraniteMoeHybridAttention: q/k/v and o_proj biases as
    // attention_bias says; its experts, where num_local_experts is not 0,
    // GraniteMoE's)
    {"GraniteMoeHybridForCausalLM", 0, 0, 1e4, 1e-6, Biases::kQkvAndO, QkNorm::kNone,
     Experts::kMixtral, Stacked::kExperts, Line::kGraniteMoeHybrid},
    // (vLLM's granitemoeshared.py: GraniteMoE's layers and a shared MLP)
    {"GraniteMoeSharedForCausalLM", 0, 0, 1e4, 1e-6, Biases::kNone, QkNorm::kNone,
     Experts::kMixtral, Stacked::kExperts, Line::kGraniteMoeShared},
    {"LlamaForCausalLM", 0, 0, 1e4, 1e-6, Biases::kLlama, QkNorm::kNone, Experts::kNone,
     Stacked::kNone},
    {"MistralForCausalLM", 8, 0, 1e4, 1e-6, Biases::kLlama, QkNorm::kNone, Experts::kNone,
     Stacked::kNone},
    {"MixtralForCausalLM", 8, 0, 1e6, 1e-5, Biases::kNone, QkNorm::kNone, Experts::kMixtral,
     Stacked::kNone},
    // (vLLM's Olmo2Attention and Olmo2MLP: no biases whatever the config says)
    {"Olmo2ForCausalLM", 0, 0, 1e4, 1e-5, Biases::kNone, QkNorm::kWhole, Experts::kNone,
     Stacked::kNone, Line::kOlmo2},
    {"Olmo3ForCausalLM", 0, 0, 1e4, 1e-5, Biases::kNone, QkNorm::kWhole, Experts::kNone,
     Stacked::kNone, Line::kOlmo3},
    // (vLLM's Phi3ForCausalLM is its Llama: biases as Llama's keys say, which
    // no Phi-3 config sets)
    {"Phi3ForCausalLM", 0, 0, 1e4, 1e-5, Biases::kLlama, QkNorm::kNone, Experts::kNone,
     Stacked::kQkvAndGateUp},
    {"Qwen2ForCausalLM", 32, 0, 1e4, 1e-6, Biases::kQkv, QkNorm::kNone, Experts::kNone,
     Stacked::kNone},
    {"Qwen2MoeForCausalLM", 16, 0, 1e4, 1e-6, Biases::kQkv, QkNorm::kNone, Experts::kQwenShared,
     Stacked::kNone},
    {"Qwen3ForCausalLM", 32, 128, 1e4, 1e-6, Biases::kQkvOptional, QkNorm::kShared, Experts::kNone,
     Stacked::kNone},
    {"Qwen3MoeForCausalLM", 4, 0, 1e4, 1e-6, Biases::kQkvOptional, QkNorm::kShared, Experts::kQwen,
     Stacked::kNone},
};

const Family* family_of(const std::string& architecture) {
  for (const Family& f : kFamilies)
    if (architecture == f.architecture) return &f;
  return nullptr;
}

// The family of a config this file parsed (or one built by hand with a known
// architecture).
const Family& family(const ModelConfig& c) {
  const Family* f = family_of(c.architecture);
  if (!f) raise<ModelError>("architecture '", c.architecture, "' is not supported");
  return *f;
}

// rope_theta or partial_rotary_factor (`key`): at the top level (transformers
// 4), or in rope_parameters (transformers 5 and vLLM move both there; `params`
// names that object, as it is keyed in `j`); both, they must agree; `fallback`
// without either.
double rope_number(const json& j, const char* key, const std::string& origin, double fallback,
                   const std::string& params = "rope_parameters") {
  const double top = positive_number(j, key, fallback, origin);
  if (!j.contains(params) || j[params].is_null()) return top;
  const json& p = j[params];
  if (!p.is_object())
    raise<ModelError>(origin, ": field '", params, "' must be an object, got ", p.dump());
  const double nested = positive_number(p, key, top, origin, (params + ".").c_str());
  if (j.contains(key) && !j[key].is_null() && nested != top)
    raise<ModelError>(origin, ": ", key, " ", j[key].dump(), " and ", params, ".", key, " ",
                      p[key].dump(), " differ");
  return nested;
}

// A copy of `j` with every number a double (8 and 8.0 are the same setting).
json numbers_as_doubles(const json& j) {
  if (j.is_number()) return json(j.get<double>());
  json out = j;
  if (j.is_object() || j.is_array())
    for (auto& item : out) item = numbers_as_doubles(item);
  return out;
}

// The scaling settings of `key` (an object, or absent or null), written so
// that settings that mean the same compare equal: numbers as doubles, the older
// `type` folded into `rope_type`, rope_theta and partial_rotary_factor left
// out; null when nothing but a
// default kind is left.
json scaling_settings(const json& j, const char* key, const std::string& origin) {
  if (!j.contains(key) || j[key].is_null()) return nullptr;
  if (!j[key].is_object())
    raise<ModelError>(origin, ": field '", key, "' must be an object, got ", j[key].dump());
  json s = numbers_as_doubles(j[key]);
  s.erase("rope_theta");  // (read on their own: rope_number())
  s.erase("partial_rotary_factor");
  if (s.contains("type")) {
    if (s.contains("rope_type") && s["rope_type"] != s["type"])
      raise<ModelError>(origin, ": ", key, ".rope_type ", s["rope_type"].dump(), " and ", key,
                        ".type ", s["type"].dump(), " differ");
    s["rope_type"] = s["type"];
    s.erase("type");
  }
  if (s.contains("rope_type") && !s["rope_type"].is_string())
    raise<ModelError>(origin, ": field '", key, ".rope_type' must be a name, got ",
                      s["rope_type"].dump());
  if (s.empty() || (s.size() == 1 && s.contains("rope_type") && s["rope_type"] == "default"))
    return nullptr;
  return s;
}

// rope_scaling where it is set, else rope_parameters (as transformers 5 and
// vLLM read them; `params` as rope_number() takes it). Fields the forward pass
// needs are checked there, not here: a reload does not depend on them.
RopeScaling rope_scaling_of(const json& j, const std::string& origin,
                            const std::string& params = "rope_parameters") {
  RopeScaling r;
  json s = scaling_settings(j, "rope_scaling", origin);
  if (s.is_null()) {
    s = scaling_settings(j, params.c_str(), origin);
    r.source = params;
  }
  if (s.is_null()) return r;
  if (s.contains("rope_type")) r.type = s["rope_type"].get<std::string>();
  if (r.type == "su") r.type = "longrope";  // (Phi-3's first name for it; vLLM's too)
  // The model's context lengths as vLLM hands them to get_rope: the original
  // one from the top level where the config has it there (Phi-3), else from
  // the settings (Llama 3.1, Qwen's yarn); longrope's extended one from the
  // top level. Given both ways, they must agree. They join the settings, so
  // the ranks and kernel-format shards compare them too.
  auto context = [&](const char* key) {
    const bool top = j.contains(key) && j[key].is_number();
    const bool inner = s.contains(key) && !s[key].is_null();
    if (top && inner && (!s[key].is_number() || s[key].get<double>() != j[key].get<double>()))
      raise<ModelError>(origin, ": ", key, " ", j[key].dump(), " and ", r.source, ".", key, " ",
                        s[key].dump(), " differ");
    if (top && !inner) s[key] = j[key].get<double>();
  };
  if (r.type == "longrope" || r.type == "llama3" || r.type == "yarn")
    context("original_max_position_embeddings");
  if (r.type == "longrope") context("max_position_embeddings");
  // A number, or true or false for the flags; absent or null leaves the default.
  auto setting = [&](const char* key, auto& out) {
    constexpr bool flag = std::is_same_v<std::decay_t<decltype(out)>, bool>;
    if (!s.contains(key) || s[key].is_null()) return;
    if (flag ? !s[key].is_boolean() : !s[key].is_number())
      raise<ModelError>(origin, ": field '", r.source, ".", key, "' must be ",
                        flag ? "true or false" : "a number", ", got ", s[key].dump());
    out = s[key].get<std::decay_t<decltype(out)>>();
  };
  setting("factor", r.factor);
  setting("low_freq_factor", r.low_freq_factor);
  setting("high_freq_factor", r.high_freq_factor);
  setting("original_max_position_embeddings", r.original_max_position_embeddings);
  setting("beta_fast", r.beta_fast);
  setting("beta_slow", r.beta_slow);
  setting("extrapolation_factor", r.extrapolation_factor);
  setting("attn_factor", r.attn_factor);
  setting("apply_yarn_scaling", r.apply_yarn_scaling);
  setting("truncate", r.truncate);
  setting("max_position_embeddings", r.max_position_embeddings);
  setting("short_mscale", r.short_mscale);
  setting("long_mscale", r.long_mscale);
  setting("alpha", r.alpha);
  for (auto [key, out] :
       {std::pair{"short_factor", &r.short_factor}, std::pair{"long_factor", &r.long_factor}}) {
    if (!s.contains(key) || s[key].is_null()) continue;
    if (!s[key].is_array() ||
        !std::all_of(s[key].begin(), s[key].end(), [](const json& v) { return v.is_number(); }))
      raise<ModelError>(origin, ": field '", r.source, ".", key,
                        "' must be a list of numbers, got ", s[key].dump());
    for (const json& v : s[key]) out->push_back(v.get<double>());
  }
  r.json = s.dump();
  return r;
}

const Family& architecture_of(const json& j, const std::string& origin) {
  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty() || !j["architectures"][0].is_string())
    raise<ModelError>(origin, ": field 'architectures' is missing or not a list of names");
  const auto name = j["architectures"][0].get<std::string>();
  if (const Family* f = family_of(name)) return *f;
  std::string known;
  for (const Family& f : kFamilies)
    known += (known.empty() ? "" : ", ") + std::string(f.architecture);
  raise<ModelError>(origin, ": architecture '", name, "' is not supported (supported: ", known,
                    ")");
}

// Gemma's MLP activation (vLLM's _get_gemma_act_fn): `hidden_activation`,
// tanh-approximated GeLU when absent (whatever `hidden_act` says: Gemma's first
// configs gave exact GeLU there by mistake).
Activation gemma_activation(const json& j, const std::string& origin) {
  if (!j.contains("hidden_activation") || j["hidden_activation"].is_null())
    return Activation::kGeluTanh;
  const json& a = j["hidden_activation"];
  if (a == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  if (a == "gelu") return Activation::kGelu;
  raise<ModelError>(origin, ": hidden_activation ", a.dump(),
                    " is not one Gemma takes (gelu_pytorch_tanh, gelu)");
}

// A positive number at `key`, or `fallback` (its config class's default)
// where the key is absent; null is refused, where positive_number() takes it
// for absent (a setting its config class cannot leave unset).
double positive_number_or(const json& j, const char* key, double fallback,
                          const std::string& origin) {
  if (j.contains(key) && j[key].is_null())
    raise<ModelError>(origin, ": field '", key, "' must be a positive number, got null");
  return positive_number(j, key, fallback, origin);
}

// A positive integer at `key`, or `fallback` (its config class's default)
// where the key is absent.
std::int64_t positive_int_or(const json& j, const char* key, std::int64_t fallback,
                             const std::string& origin) {
  return j.contains(key) ? positive_int(j, key, origin) : fallback;
}

// `hidden_act` silu or absent, for the families whose MLP vLLM computes
// with SiLU only (GraniteMLP; GLM-4's and ERNIE 4.5's LlamaMLP, which refuses
// any other).
void silu_only(const json& j, const std::string& origin, const ModelConfig& c) {
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    raise<ModelError>(origin, ": ", c.architecture, " takes hidden_act silu only, got ",
                      j["hidden_act"].dump());
}

// Refuses each of `keys` set true, where Hugging Face's model and vLLM's would
// not compute the same from it: "<key> true is refused for <architecture>
// (<why>)".
void refuse_true(const json& j, const std::string& origin, const ModelConfig& c,
                 std::initializer_list<const char*> keys, const char* why) {
  for (const char* key : keys)
    if (flag(j, key, origin))
      raise<ModelError>(origin, ": ", key, " true is refused for ", c.architecture, " (", why, ")");
}

// head_dim as hidden_size / num_attention_heads, for the families whose vLLM
// model (`model_file`) reads no head_dim key: a config whose head_dim differs
// is refused.
void head_dim_from_heads(const ModelConfig& c, const std::string& origin, const char* model_file) {
  if (c.head_dim * c.num_attention_heads != c.hidden_size)
    raise<ModelError>(origin, ": ", c.architecture,
                      " takes head_dim as hidden_size / num_attention_heads (vLLM's ", model_file,
                      " reads no head_dim), but head_dim ", c.head_dim, " x ",
                      c.num_attention_heads, " heads is not hidden_size ", c.hidden_size);
}

// A non-negative integer at `key`, which must be present: for settings
// whose defaults are not certain enough to assume.
std::int64_t required_count(const json& j, const char* key, const std::string& origin,
                            const char* why) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() < 0)
    raise<ModelError>(origin, ": field '", key, "' must be a non-negative integer (", why,
                      "), got ", j.contains(key) ? j[key].dump() : std::string("nothing"));
  return j[key].get<std::int64_t>();
}

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
  c.sigmoid_routing = true;
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

// A soft-capping value: absent, `fallback`; null, 0 (not capped); else positive.
double softcap(const json& j, const char* key, double fallback, const std::string& origin) {
  if (j.contains(key) && j[key].is_null()) return 0;
  return positive_number(j, key, fallback, origin);
}

// The attention windows: sliding_window (4096 when absent, null for none) and
// the layers of the sliding type, whether or not a window is set (Gemma 3's
// and OLMo 3's turn at their own rotary either way; Hugging Face's and vLLM's
// choose the rotary by type and the mask by the window): those `layer_types`
// marks "sliding_attention", else all but every `pattern`-th layer.
void parse_windows(const json& j, const std::string& origin, std::int64_t pattern, ModelConfig& c) {
  c.sliding_window = !j.contains("sliding_window")   ? 4096
                     : j["sliding_window"].is_null() ? 0
                                                     : positive_int(j, "sliding_window", origin);
  if (!j.contains("layer_types") || j["layer_types"].is_null()) {
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
      if ((l + 1) % pattern != 0) c.sliding_layers.push_back(l);
    return;
  }
  const json& types = j["layer_types"];
  if (!types.is_array() || static_cast<std::int64_t>(types.size()) != c.num_hidden_layers)
    raise<ModelError>(origin, ": field 'layer_types' must list the ", c.num_hidden_layers,
                      " layers' attention, got ", types.dump());
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (types[l] == "sliding_attention")
      c.sliding_layers.push_back(l);
    else if (types[l] != "full_attention")
      raise<ModelError>(origin, ": layer_types[", l, "] is ", types[l].dump(),
                        ", not \"sliding_attention\" or \"full_attention\"");
  }
}

// Gemma 2's and Gemma 3's keys, with Gemma2Config's and Gemma3TextConfig's
// defaults (vLLM's gemma2.py and gemma3.py): the GeLU must be the tanh one, in
// hidden_activation (absent: its default) and, for Gemma 2, in hidden_act
// where the config has it (vLLM's Gemma2MLP and Gemma3MLP refuse any other). Gemma 3's
// attention is never soft-capped (vLLM's Gemma3Attention passes no cap) and its
// logits only where final_logit_softcapping says so; without `layer_types`
// Gemma 2 slides on the even layers, Gemma 3 on all but every
// sliding_window_pattern-th (6 when absent), as the config classes fill it.
void parse_gemma_sandwich(const json& j, const std::string& origin, bool gemma3, ModelConfig& c) {
  // (vLLM's Gemma3MLP reads hidden_activation alone, Gemma2MLP both)
  for (const char* key : {"hidden_activation", gemma3 ? nullptr : "hidden_act"})
    if (key && j.contains(key) && j[key] != "gelu_pytorch_tanh")
      raise<ModelError>(origin, ": ", c.architecture, " takes ", key,
                        " gelu_pytorch_tanh only, got ", j[key].dump());
  c.activation = Activation::kGeluTanh;
  c.norm_layout = NormLayout::kSandwich;
  c.query_pre_attn_scalar = positive_number_or(j, "query_pre_attn_scalar", 256, origin);
  c.attn_logit_softcapping = gemma3 ? 0 : softcap(j, "attn_logit_softcapping", 50, origin);
  c.final_logit_softcapping = softcap(j, "final_logit_softcapping", gemma3 ? 0 : 30, origin);
  // (Gemma 2's even layers: all but every second)
  parse_windows(j, origin, gemma3 ? positive_int_or(j, "sliding_window_pattern", 6, origin) : 2, c);
}

// transformers 5 writes Gemma 3's and OLMo 3's rope_parameters per attention type,
// {"full_attention": {...}, "sliding_attention": {...}}; null where the
// config's rope_parameters is flat (or absent). Each entry must be an object.
json rope_per_attention_type(const json& j, const std::string& origin) {
  if (!j.contains("rope_parameters") || !j["rope_parameters"].is_object()) return nullptr;
  const json& p = j["rope_parameters"];
  if (!p.contains("full_attention") && !p.contains("sliding_attention")) return nullptr;
  for (const auto& [type, params] : p.items())
    if ((type != "full_attention" && type != "sliding_attention") ||
        !(params.is_object() || params.is_null()))
      raise<ModelError>(origin, ": rope_parameters per attention type holds '", type,
                        "': ", params.dump(),
                        " (only full_attention and sliding_attention objects)");
  return p;
}

// The rotary of the layers of the sliding type, for the families that turn
// them apart from the full ones: Gemma 3's at rope_local_base_freq (10000
// when absent), OLMo 3's at rope_theta (`local_key` null), each with the
// default scaling (transformers 4; vLLM's Gemma3Attention and
// Olmo2Attention), or rope_parameters.sliding_attention from `per_type`
// (transformers 5; a base given both ways must agree). No
// partial_rotary_factor but 1 is taken.
void parse_sliding_rope(const json& j, const json& per_type, const std::string& origin,
                        const char* local_key, double local_default, ModelConfig& c) {
  // A partial rotary, which neither family has, vLLM's versions read
  // differently (every dimension whatever the key says, or each attention
  // type's own).
  auto whole_heads = [&](double factor, const std::string& key) {
    if (factor != 1)
      raise<ModelError>(origin, ": ", key, " ", json(factor).dump(), " is refused for ",
                        c.architecture,
                        " (its rotary turns every dimension of a head; no such model sets it)");
  };
  whole_heads(c.partial_rotary_factor, "partial_rotary_factor");
  const double local =
      local_key ? positive_number(j, local_key, local_default, origin) : local_default;
  c.sliding_rope_theta = local;
  if (per_type.is_null() || !per_type.contains("sliding_attention")) return;
  const std::string params = "rope_parameters.sliding_attention";
  const json view = {{params, per_type["sliding_attention"]}};
  c.sliding_rope_theta = rope_number(view, "rope_theta", origin, local, params);
  if (local_key && j.contains(local_key) && !j[local_key].is_null() &&
      c.sliding_rope_theta != local)
    raise<ModelError>(origin, ": ", local_key, " ", j[local_key].dump(), " and ", params,
                      ".rope_theta ", json(c.sliding_rope_theta).dump(), " differ");
  c.sliding_rope_scaling = rope_scaling_of(view, origin, params);
  whole_heads(rope_number(view, "partial_rotary_factor", origin, 1, params),
              params + ".partial_rotary_factor");
}

// Cohere's layout (CohereConfig's defaults, transformers 4's rope_theta of
// 10000; vLLM's commandr.py): LayerNorm without bias, attention and MLP in
// parallel, logits from the embeddings whatever tie_word_embeddings says
// (refused false), times logit_scale (0.0625 when absent), rotary on
// interleaved pairs. Cohere 2 (Cohere2Config; vLLM's commandr.py too) adds
// sliding_window (4096 when absent) on the layers `layer_types` marks, else
// on all but every sliding_window_pattern-th (4), and turns rotary on those
// layers alone. vLLM builds no biases (attention_bias true refused). With
// use_qk_norm (Command R+) q and k are normed per head, each head by its own
// LayerNorm weights (QkNorm::kPerHead), before rotary.
void parse_cohere(const json& j, const std::string& origin, bool cohere2, ModelConfig& c) {
  head_dim_from_heads(c, origin, "commandr.py");
  silu_only(j, origin, c);
  if (!c.tie_word_embeddings)
    raise<ModelError>(origin, ": ", c.architecture,
                      " computes its logits with the embeddings (vLLM's model has no lm_head), "
                      "but the config sets tie_word_embeddings false");
  refuse_true(j, origin, c, {"attention_bias"},
              "vLLM's model takes no biases; no released Command R sets it");
  // (Command R+: q and k normed per head by its own LayerNorm weights; Cohere
  // 2's config class has no such key and Hugging Face's model no such norms,
  // where vLLM's, which serves both, would apply them)
  if (cohere2)
    refuse_true(j, origin, c, {"use_qk_norm"},
                "Hugging Face's Cohere2Attention has no q/k norms, vLLM's commandr.py would "
                "apply them");
  if (flag(j, "use_qk_norm", origin)) c.qk_norm = QkNorm::kPerHead;
  c.layer_norm = c.rope_interleaved = true;
  c.norm_layout = NormLayout::kParallel;
  c.logit_scale = positive_number_or(j, "logit_scale", 0.0625, origin);
  if (!cohere2) return;
  // (vLLM turns no layer without a window: no Cohere 2 leaves it null)
  if (j.contains("sliding_window") && j["sliding_window"].is_null())
    raise<ModelError>(origin, ": ", c.architecture,
                      " takes a positive 'sliding_window', got null (vLLM would turn no layer's "
                      "rotary then)");
  // (the pattern read only where layer_types is not given, as Cohere2Config reads it)
  const bool typed = j.contains("layer_types") && !j["layer_types"].is_null();
  parse_windows(j, origin, typed ? 4 : positive_int_or(j, "sliding_window_pattern", 4, origin), c);
  c.nope_full_layers = true;
}

// OLMo 2's and OLMo 3's layout (Olmo2Config's and Olmo3Config's defaults;
// vLLM's olmo2.py serves both): no input_layernorm, the attention's and the
// MLP's outputs normed before each joins the residual, q and k each normed
// over its whole projection before rotary, head_dim hidden_size / heads (vLLM
// reads no head_dim key). OLMo 3 (and an OLMo 2 config with `layer_types` and
// a `sliding_window`, as vLLM reads it) slides on the layers of the sliding
// type (all but every fourth without `layer_types`), which turn at
// rope_theta unscaled; a null window is refused.
void parse_olmo(const json& j, const json& per_type, const std::string& origin, bool olmo3,
                ModelConfig& c) {
  head_dim_from_heads(c, origin, "olmo2.py");
  c.norm_layout = NormLayout::kPost;
  const bool typed = j.contains("layer_types") && !j["layer_types"].is_null();
  if (!olmo3 && !typed) {  // (OLMo 2 without windows: no sliding layers to turn apart)
    if (!per_type.is_null() && per_type.contains("sliding_attention"))
      raise<ModelError>(origin, ": rope_parameters.sliding_attention is given but ", c.architecture,
                        " has no sliding layers without 'layer_types'");
    return;
  }
  // No OLMo sets a null window, and the references disagree on its rotary
  // (vLLM scales every layer then, Hugging Face the full ones alone); Olmo2Config
  // has no sliding_window, so vLLM needs it given with layer_types.
  if (j.contains("sliding_window") && j["sliding_window"].is_null())
    raise<ModelError>(origin, ": ", c.architecture,
                      " takes a positive 'sliding_window', got null (vLLM and Hugging Face "
                      "turn such a model's sliding layers differently)");
  if (!olmo3 && !j.contains("sliding_window"))
    raise<ModelError>(origin, ": ", c.architecture,
                      " with 'layer_types' needs a 'sliding_window' (Olmo2Config has none to "
                      "default to)");
  parse_windows(j, origin, 4, c);
  parse_sliding_rope(j, per_type, origin, nullptr, c.rope_theta, c);
}

// EXAONE 4's layout (Exaone4Config's defaults; vLLM's exaone4.py): no
// input_layernorm, the attention's and the MLP's outputs normed before each
// joins the residual, q and k normed per head before rotary, SiLU. With a
// sliding_window (4096 when absent) the layers of the sliding type
// (layer_types, else all but every sliding_window_pattern-th, 4 when absent)
// slide and turn rotary and the full ones turn none (Hugging Face's "global
// NoPE"); with a null window (and layer_types, which Exaone4Config cannot
// fill without one) every layer is full and turns rotary. Refused
// where the two references would serve other logits: rope_theta absent (10000
// in Hugging Face's config, 1000000 in vLLM's), a bias (vLLM's model reads
// attention_bias, bias and mlp_bias, Hugging Face's builds none), logit_scale
// (vLLM's alone reads it), a window with no sliding layer (Hugging Face turns
// no layer then, vLLM every layer) and sliding layers without a window (the
// reverse).
void parse_exaone4(const json& j, const std::string& origin, ModelConfig& c) {
  silu_only(j, origin, c);
  if (c.rope_theta == 0)
    raise<ModelError>(origin, ": ", c.architecture,
                      " needs 'rope_theta' (Hugging Face's Exaone4Config takes 10000 where it is "
                      "absent, vLLM 1000000)");
  refuse_true(j, origin, c, {"attention_bias", "bias", "mlp_bias"},
              "Hugging Face's model builds no biases, vLLM's would read them; no released "
              "EXAONE 4 sets it");
  if (positive_number_or(j, "logit_scale", 1, origin) != 1)
    raise<ModelError>(origin, ": logit_scale ", j["logit_scale"].dump(), " is refused for ",
                      c.architecture, " (vLLM's model reads it, Hugging Face's does not)");
  c.norm_layout = NormLayout::kPost;
  const bool typed = j.contains("layer_types") && !j["layer_types"].is_null();
  const bool windowed = !j.contains("sliding_window") || !j["sliding_window"].is_null();
  // (Exaone4Config reads a null window as a pattern of 0, and without
  // layer_types then divides by it: neither reference loads such a config)
  if (!windowed && !typed)
    raise<ModelError>(origin, ": ", c.architecture,
                      " with a null sliding_window needs 'layer_types' (Exaone4Config cannot "
                      "fill them without a window)");
  // (the pattern read only where layer_types is not given, as Exaone4Config
  // reads it: an integer there, where released configs write "LLLG" beside
  // layer_types)
  if (!typed && j.contains("sliding_window_pattern") && !j["sliding_window_pattern"].is_number())
    raise<ModelError>(origin, ": ", c.architecture, " reads sliding_window_pattern ",
                      j["sliding_window_pattern"].dump(),
                      " only beside 'layer_types' (Exaone4Config takes an integer there)");
  parse_windows(j, origin, typed ? 4 : positive_int_or(j, "sliding_window_pattern", 4, origin), c);
  if (windowed && c.sliding_layers.empty())
    raise<ModelError>(origin, ": ", c.architecture, " has a sliding_window of ", c.sliding_window,
                      " but no sliding layer (Hugging Face would turn no layer's rotary, vLLM "
                      "every layer's)");
  if (!windowed && !c.sliding_layers.empty())
    raise<ModelError>(origin, ": ", c.architecture,
                      " has sliding layers in 'layer_types' but a null sliding_window (Hugging "
                      "Face would turn every layer's rotary, vLLM none)");
  c.nope_full_layers = windowed;
}

// The number of experts: `num_experts` or `num_local_experts` (transformers 5
// maps the one onto the other), the same where both are given; `fallback`
// without either.
std::int64_t expert_count(const json& j, std::int64_t fallback, const std::string& origin) {
  const bool experts = j.contains("num_experts"), local = j.contains("num_local_experts");
  const std::int64_t n = experts ? positive_int(j, "num_experts", origin)
                         : local ? positive_int(j, "num_local_experts", origin)
                                 : fallback;
  if (experts && local && positive_int(j, "num_local_experts", origin) != n)
    raise<ModelError>(origin, ": num_experts ", n, " and num_local_experts ",
                      j["num_local_experts"].dump(), " differ");
  return n;
}

// The expert keys of `kind` (Family::experts; vLLM's MixtralMoE renormalises:
// renormalize=True).
void parse_experts(const json& j, const std::string& origin, Experts kind, ModelConfig& c) {
  // Absent keys: MixtralConfig's, Qwen3MoeConfig's and Qwen2MoeConfig's defaults.
  const bool mixtral = kind == Experts::kMixtral, shared = kind == Experts::kQwenShared;
  const char* const count = mixtral ? "num_local_experts" : "num_experts";
  c.num_experts = expert_count(j, mixtral ? 8 : shared ? 60 : 128, origin);
  c.num_experts_per_tok = positive_int_or(j, "num_experts_per_tok",
                                          mixtral  ? 2
                                          : shared ? 4
                                                   : 8,
                                          origin);
  if (mixtral) {
    c.moe_intermediate_size = c.intermediate_size;
    c.norm_topk_prob = true;
  } else {
    c.moe_intermediate_size =
        positive_int_or(j, "moe_intermediate_size", shared ? 1408 : 768, origin);
    c.decoder_sparse_step = positive_int_or(j, "decoder_sparse_step", 1, origin);
    c.norm_topk_prob = flag(j, "norm_topk_prob", origin);
    if (shared)
      c.shared_expert_intermediate_size =
          positive_int_or(j, "shared_expert_intermediate_size", 5632, origin);
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
      if (!j["mlp_only_layers"].is_array())
        raise<ModelError>(origin, ": field 'mlp_only_layers' must be a list of layer indices");
      for (const auto& v : j["mlp_only_layers"]) {
        if (!v.is_number_integer() || v.get<std::int64_t>() < 0 ||
            v.get<std::int64_t>() >= c.num_hidden_layers)
          raise<ModelError>(origin, ": 'mlp_only_layers' holds ", v.dump(),
                            ", not a layer index in [0, ", c.num_hidden_layers, ")");
        c.mlp_only_layers.push_back(v.get<std::int64_t>());
      }
    }
  }
  if (c.num_experts_per_tok > c.num_experts)
    raise<ModelError>(origin, ": num_experts_per_tok ", c.num_experts_per_tok, " exceeds ", count,
                      " ", c.num_experts);
}

// "torch_dtype", or "dtype" as newer transformers write it.
DType parse_dtype(const json& j, const std::string& origin) {
  const char* key =
      j.contains("torch_dtype") && !j["torch_dtype"].is_null() ? "torch_dtype" : "dtype";
  if (j.contains(key) && !j[key].is_null() && !j[key].is_string())
    raise<ModelError>(origin, ": field '", key, "' is not a string");
  const std::string dtype = j.value(key, std::string("float32"));
  const auto parsed = dtype_from_name(dtype);
  if (!parsed || !dtype_is_floating(*parsed))
    raise<ModelError>(origin, ": ", key, " '", dtype,
                      "' is not a floating type (float32, float16, bfloat16)");
  return *parsed;
}

void check_heads(const ModelConfig& c, const std::string& origin) {
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    raise<ModelError>(origin, ": num_attention_heads ", c.num_attention_heads,
                      " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
}

}  // namespace

const char* activation_name(Activation activation) {
  switch (activation) {
    case Activation::kGeluTanh:
      return "gelu_pytorch_tanh";
    case Activation::kGelu:
      return "gelu";
    case Activation::kSilu:
      break;
  }
  return "silu";
}

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Family& f : kFamilies) out.emplace_back(f.architecture);
    return out;
  }();
  return names;
}

MoeNames moe_names(const ModelConfig& c) {
  if (family(c).experts == Experts::kMixtral) return {"block_sparse_moe", "w1", "w3", "w2"};
  return {"mlp", "gate_proj", "up_proj", "down_proj"};
}

bool ModelConfig::sliding_type(std::int64_t layer) const {
  return std::find(sliding_layers.begin(), sliding_layers.end(), layer) != sliding_layers.end();
}

bool ModelConfig::sliding_layer(std::int64_t layer) const {
  return sliding_window > 0 && sliding_type(layer);
}

LayerNorms layer_norms(const ModelConfig& c) {
  switch (c.norm_layout) {
    case NormLayout::kSandwich:
      return {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
              "post_feedforward_layernorm"};
    case NormLayout::kGlm:
      return {"input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm",
              "post_mlp_layernorm"};
    case NormLayout::kPost:
      return {"", "post_attention_layernorm", "", "post_feedforward_layernorm"};
    case NormLayout::kParallel:
      return {"input_layernorm", "", "", ""};
    case NormLayout::kPre:
      break;
  }
  return {"input_layernorm", "", "post_attention_layernorm", ""};
}

bool ModelConfig::sparse_layer(std::int64_t layer) const {
  if (num_experts <= 0 || layer < first_k_dense_replace) return false;
  for (std::int64_t l : mlp_only_layers)
    if (l == layer) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

ModelConfig parse_model_config(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = detail::parse_json(text);
  } catch (const json::exception& e) {
    raise<ModelError>(origin, ": not valid JSON: ", e.what());
  }
  ModelConfig c;
  const Family& f = architecture_of(j, origin);
  c.architecture = f.architecture;
  c.hidden_size = positive_int(j, "hidden_size", origin);
  c.intermediate_size = positive_int(j, "intermediate_size", origin);
  c.num_hidden_layers = positive_int(j, "num_hidden_layers", origin);
  c.num_attention_heads = positive_int(j, "num_attention_heads", origin);
  // Absent keys take the defaults of the architecture's Hugging Face config
  // class, as vLLM (which loads the config through it) sees them; a null
  // num_key_value_heads means num_attention_heads there, a null head_dim
  // hidden_size / num_attention_heads.
  if (!j.contains("num_key_value_heads"))
    c.num_key_value_heads = f.kv_heads > 0 ? f.kv_heads : c.num_attention_heads;
  else if (j["num_key_value_heads"].is_null())
    c.num_key_value_heads = c.num_attention_heads;
  else
    c.num_key_value_heads = positive_int(j, "num_key_value_heads", origin);
  c.vocab_size = positive_int(j, "vocab_size", origin);
  if (j.contains("head_dim") && !j["head_dim"].is_null())
    c.head_dim = positive_int(j, "head_dim", origin);
  else if (!j.contains("head_dim") && f.head_dim > 0)
    c.head_dim = f.head_dim;
  else if (c.hidden_size % c.num_attention_heads != 0)
    raise<ModelError>(origin, ": hidden_size ", c.hidden_size,
                      " is not a multiple of num_attention_heads ", c.num_attention_heads,
                      " and no head_dim is given");
  else
    c.head_dim = c.hidden_size / c.num_attention_heads;
  // (Cohere's LayerNorm: layer_norm_eps)
  c.rms_norm_eps =
      positive_number(j, f.cohere() ? "layer_norm_eps" : "rms_norm_eps", f.rms_norm_eps, origin);
  // Rope per attention type (Gemma 3 and OLMo 3 as transformers 5 writes
  // them): the full layers' read as a flat rope_parameters is, the sliding
  // ones' below.
  const json per_type = rope_per_attention_type(j, origin);
  if (!per_type.is_null() && f.line != Line::kGemma3 && !f.olmo())
    raise<ModelError>(origin,
                      ": rope_parameters per attention type (full_attention, "
                      "sliding_attention) is read for Gemma3ForCausalLM, Olmo2ForCausalLM and "
                      "Olmo3ForCausalLM only, not ",
                      f.architecture);
  json full = per_type.is_null() ? json(nullptr) : j;
  std::string params = "rope_parameters";
  if (!per_type.is_null()) {
    params = "rope_parameters.full_attention";
    full.erase("rope_parameters");
    if (per_type.contains("full_attention")) full[params] = per_type["full_attention"];
  }
  const json& rope = per_type.is_null() ? j : full;
  c.rope_theta = rope_number(rope, "rope_theta", origin, f.rope_theta, params);
  c.rope_scaling = rope_scaling_of(rope, origin, params);
  c.partial_rotary_factor =
      rope_number(rope, "partial_rotary_factor", origin,
                  f.line == Line::kGlm || f.line == Line::kGlm4Moe ? 0.5 : 1.0, params);
  if (c.partial_rotary_factor > 1)
    raise<ModelError>(origin, ": partial_rotary_factor must be at most 1, got ",
                      c.partial_rotary_factor);
  c.tie_word_embeddings = j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_null()
                              ? flag(j, "tie_word_embeddings", origin)
                              : f.gemma() || f.line == Line::kErnie || f.cohere();
  if (f.gemma()) {
    if (!c.tie_word_embeddings)
      raise<ModelError>(origin, ": ", f.architecture,
                        " ties its LM head to the embeddings (vLLM asserts "
                        "tie_word_embeddings), but the config sets it false");
    c.gemma_normalization = true;
    if (f.line == Line::kGemma)
      c.activation = gemma_activation(j, origin);
    else
      parse_gemma_sandwich(j, origin, f.line == Line::kGemma3, c);
    if (f.line == Line::kGemma3)
      parse_sliding_rope(j, per_type, origin, "rope_local_base_freq", 1e4, c);
  }
  switch (f.biases) {
    case Biases::kLlama:
      c.o_proj_bias = flag(j, "attention_bias", origin) || flag(j, "bias", origin);
      c.attention_bias = j.contains("qkv_bias") && !j["qkv_bias"].is_null()
                             ? flag(j, "qkv_bias", origin)
                             : c.o_proj_bias;
      c.mlp_bias = flag(j, "mlp_bias", origin);
      break;
    case Biases::kQkv:
      c.attention_bias = true;
      break;
    case Biases::kQkvOptional:
      c.attention_bias = flag(j, "attention_bias", origin);
      break;
    case Biases::kQkvAndO:
      c.attention_bias = c.o_proj_bias = flag(j, "attention_bias", origin);
      break;
    case Biases::kGranite:
      c.attention_bias = c.o_proj_bias =
          flag(j, "attention_bias", origin) || flag(j, "bias", origin);
      c.mlp_bias = flag(j, "mlp_bias", origin);
      break;
    case Biases::kQkvUnlessOff:
      c.attention_bias = !j.contains("attention_bias") || flag(j, "attention_bias", origin);
      break;
    case Biases::kNone:
      break;
  }
  c.qk_norm = f.qk_norm;
  if (f.line == Line::kExaone4) parse_exaone4(j, origin, c);
  if (f.olmo()) parse_olmo(j, per_type, origin, f.line == Line::kOlmo3, c);
  if (f.granite()) parse_granite(j, origin, f.line, c);
  if (f.line == Line::kGlm4Moe) parse_glm4_moe(j, origin, c);
  if (f.cohere()) parse_cohere(j, origin, f.line == Line::kCohere2, c);
  // (vLLM's LlamaForCausalLM, which serves Llama, Mistral, Phi-3 and ERNIE 4.5,
  // multiplies the logits by a logit_scale where the config has one)
  if (f.biases == Biases::kLlama || f.line == Line::kErnie)
    c.logit_scale = positive_number_or(j, "logit_scale", 1, origin);
  if (f.line == Line::kGlm || f.line == Line::kErnie) {
    silu_only(j, origin, c);
    c.rope_interleaved = true;
    if (f.line == Line::kGlm) c.norm_layout = NormLayout::kGlm;
  }
  // (Hugging Face's Ernie4_5 gives every projection a bias with use_bias;
  // vLLM's takes none, and would skip them without a word: other logits)
  if (f.line == Line::kErnie)
    refuse_true(j, origin, c, {"use_bias"},
                "vLLM's model takes no biases; no released ERNIE 4.5 sets it");
  // (GraniteMoeHybrid's experts as GraniteMoE's, where it has any)
  if (f.experts != Experts::kNone && f.experts != Experts::kGlm &&
      !(f.line == Line::kGraniteMoeHybrid && c.num_experts == 0))
    parse_experts(j, origin, f.experts, c);
  c.dtype = parse_dtype(j, origin);
  c.fp8 = detail::parse_fp8_checkpoint(j, origin);
  if (c.fp8.quantized() && f.stacked != Stacked::kNone)
    raise<ModelError>(origin, ": FP8 checkpoints of ", f.architecture,
                      " are not supported yet (its checkpoint stacks projections that vLLM "
                      "splits, and their scales with them)");
  check_heads(c, origin);
  c.json = text;
  return c;
}

namespace {
bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
}  // namespace

std::string model_directory(const std::string& path) {
  if (is_directory(path)) return path;
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

ModelConfig load_model_config(const std::string& path) {
  const std::string file = is_directory(path) ? path + "/config.json" : path;
  std::ifstream in(file);
  if (!in) raise<ModelError>("cannot open model config '", file, "'");
  std::stringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), file);
}

std::string model_config_to_json(const ModelConfig& c) {
  const Family& f = family(c);
  json j = {{"architectures", {c.architecture}},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_dim},
            {"vocab_size", c.vocab_size},
            {f.cohere() ? "layer_norm_eps" : "rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"torch_dtype", std::string(dtype_name(c.dtype))}};
  if (c.fp8.quantized()) {
    j["quantization_config"] = {
        {"quant_method", "fp8"},
        {"activation_scheme", c.fp8.static_activations ? "static" : "dynamic"},
        {"ignored_layers", c.fp8.ignored}};
    if (c.fp8.blocks())
      j["quantization_config"]["weight_block_size"] = {c.fp8.block_n, c.fp8.block_k};
  }
  if (!c.rope_scaling.json.empty()) j["rope_scaling"] = json::parse(c.rope_scaling.json);
  // (GLM-4's and GLM-4.5's 0.5 when absent)
  if (c.partial_rotary_factor != 1 || f.line == Line::kGlm || f.line == Line::kGlm4Moe)
    j["partial_rotary_factor"] = c.partial_rotary_factor;
  if (c.activation != Activation::kSilu) j["hidden_activation"] = activation_name(c.activation);
  const bool gemma2_or_3 = f.line == Line::kGemma2 || f.line == Line::kGemma3;
  // The sliding layers' own rotary: Gemma 3's base in rope_local_base_freq,
  // OLMo 3's the full layers' (nothing to write); any other (a scaled one, or
  // OLMo 3's at another base) in transformers 5's form.
  const bool plain = c.sliding_rope_scaling.json.empty() &&
                     (f.line == Line::kGemma3 || c.sliding_rope_theta == c.rope_theta);
  if (c.sliding_rope_theta > 0 && plain && f.line == Line::kGemma3) {
    j["rope_local_base_freq"] = c.sliding_rope_theta;
  } else if (c.sliding_rope_theta > 0 && !plain) {
    auto of = [](double theta, const RopeScaling& s) {
      json r = s.json.empty() ? json{{"rope_type", "default"}} : json::parse(s.json);
      r["rope_theta"] = theta;
      return r;
    };
    j["rope_parameters"] = {
        {"full_attention", of(c.rope_theta, c.rope_scaling)},
        {"sliding_attention", of(c.sliding_rope_theta, c.sliding_rope_scaling)}};
    j.erase("rope_theta");
    j.erase("rope_scaling");
  }
  if (gemma2_or_3) {  // (null for 0, as their configs take "none")
    auto or_null = [](double v) { return v > 0 ? json(v) : json(nullptr); };
    j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
    j["attn_logit_softcapping"] = or_null(c.attn_logit_softcapping);
    j["final_logit_softcapping"] = or_null(c.final_logit_softcapping);
  }
  // (the Gemmas', OLMo 3's, Cohere 2's and EXAONE 4's windows; EXAONE 4's
  // null where it has none, which its config class would default to 4096)
  const bool hybrid = f.line == Line::kGraniteMoeHybrid;
  if (gemma2_or_3 || c.sliding_rope_theta > 0 || (c.nope_full_layers && !hybrid) ||
      f.line == Line::kExaone4) {
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    json types = json::array();
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
      types.push_back(c.sliding_type(l) ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  // Llama and Mistral spell o_proj's bias attention_bias, q/k/v's qkv_bias where
  // it differs; Qwen2's q/k/v biases are not a setting.
  if (f.biases == Biases::kLlama) {
    j["attention_bias"] = c.o_proj_bias;
    if (c.attention_bias != c.o_proj_bias) j["qkv_bias"] = c.attention_bias;
    if (c.mlp_bias) j["mlp_bias"] = true;
  } else if (f.biases == Biases::kQkvOptional || f.biases == Biases::kQkvAndO ||
             f.biases == Biases::kQkvUnlessOff) {
    j["attention_bias"] = c.attention_bias;
  } else if (f.biases == Biases::kGranite) {
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = c.mlp_bias;
  }
  if (f.cohere() || c.logit_scale != 1) j["logit_scale"] = c.logit_scale;
  if (c.qk_norm == QkNorm::kPerHead) j["use_qk_norm"] = true;
  if (f.granite()) {
    j["embedding_multiplier"] = c.embedding_multiplier;
    j["attention_multiplier"] = c.attention_multiplier;
    j["residual_multiplier"] = c.residual_multiplier;
    j["logits_scaling"] = c.logits_scaling;
  }
  if (hybrid) {  // (every layer attention)
    j["layer_types"] = std::vector<std::string>(c.num_hidden_layers, "attention");
    j["position_embedding_type"] = c.nope_full_layers ? "nope" : "rope";
  }
  if (f.granite_moe() && f.line != Line::kGraniteMoe)
    j["shared_intermediate_size"] = c.shared_mlp_intermediate_size;
  if (f.experts == Experts::kGlm) {
    j["head_dim"] = c.head_dim;
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
  } else if (f.experts == Experts::kMixtral) {
    j["num_local_experts"] = c.num_experts;
    if (c.num_experts > 0) j["num_experts_per_tok"] = c.num_experts_per_tok;
  } else if (c.num_experts > 0) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["norm_topk_prob"] = c.norm_topk_prob;
    if (c.shared_expert_intermediate_size > 0)
      j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  }
  return j.dump(2);
}

namespace {

// A stacked tensor of layer prefix `p`, with `leaf` "weight" or "bias", and its
// parts (stacked_checkpoint_tensors()).
RowSplit stacked_qkv(const ModelConfig& c, const std::string& p, const std::string& leaf) {
  const std::int64_t q = c.num_attention_heads * c.head_dim,
                     kv = c.num_key_value_heads * c.head_dim;
  const std::string a = p + "self_attn.";
  return {a + "qkv_proj." + leaf,
          {{a + "q_proj." + leaf, q}, {a + "k_proj." + leaf, kv}, {a + "v_proj." + leaf, kv}},
          false,
          {}};
}
RowSplit stacked_gate_up(const ModelConfig& c, const std::string& p, const std::string& leaf) {
  return {p + "mlp.gate_up_proj." + leaf,
          {{p + "mlp.gate_proj." + leaf, c.intermediate_size},
           {p + "mlp.up_proj." + leaf, c.intermediate_size}},
          false,
          {}};
}

// GraniteMoE's experts of layer prefix `p` (Stacked::kExperts), as vLLM's
// granitemoe.py splits them: input_linear's rows (of hidden) each expert's
// gate (w1) then up (w3), output_linear's (of I) each expert's down (w2), and
// router.layer whole as the router (gate).
std::vector<RowSplit> stacked_experts(const ModelConfig& c, const std::string& p) {
  const MoeNames n = moe_names(c);
  const std::string m = p + n.module + ".";
  const std::int64_t e = c.num_experts, mi = c.moe_intermediate_size, h = c.hidden_size;
  RowSplit in{m + "input_linear.weight", {}, true, {e, 2 * mi, h}},
      out{m + "output_linear.weight", {}, true, {e, h, mi}};
  for (std::int64_t x = 0; x < e; ++x) {
    const std::string expert = m + "experts." + std::to_string(x) + ".";
    in.parts.push_back({expert + n.gate + ".weight", mi});
    in.parts.push_back({expert + n.up + ".weight", mi});
    out.parts.push_back({expert + n.down + ".weight", h});
  }
  return {std::move(in),
          std::move(out),
          {m + "router.layer.weight", {{m + "gate.weight", e}}, false, {e, h}}};
}

// Granite's shared MLP's input_linear of layer prefix `p`: its gate rows, then
// its up rows, as vLLM's MergedColumnParallelLinear splits a tensor loaded
// whole. The parts' names are the view's own (no checkpoint holds them).
RowSplit stacked_shared_mlp(const ModelConfig& c, const std::string& p) {
  const std::int64_t si = c.shared_mlp_intermediate_size;
  return {p + "shared_mlp.input_linear.weight",
          {{p + "shared_mlp.gate_proj.weight", si}, {p + "shared_mlp.up_proj.weight", si}},
          false,
          {}};
}

// `split`'s parts (as the loaders take them), or the stacked tensor (as the
// checkpoint holds it): rows of `columns` (a bias: 0, one value per row).
void push_stacked(std::vector<CheckpointTensorSpec>& specs, const RowSplit& split,
                  std::int64_t columns, bool stacked) {
  auto shape = [&](std::int64_t rows) {
    return columns > 0 ? std::vector<std::int64_t>{rows, columns} : std::vector<std::int64_t>{rows};
  };
  std::int64_t rows = 0;
  for (const RowPart& part : split.parts) {
    if (!stacked) specs.push_back({part.name, shape(part.rows)});
    rows += part.rows;
  }
  if (stacked) specs.push_back({split.name, shape(rows)});
}

// An FP8 checkpoint's tensors: each quantized weight float8_e4m3fn (and so its
// parameter), its float32 scales after it (fp8_scales_of).
std::vector<CheckpointTensorSpec> with_fp8_scales(const Fp8Checkpoint& fp8,
                                                  std::vector<CheckpointTensorSpec> specs) {
  std::vector<CheckpointTensorSpec> out;
  for (CheckpointTensorSpec& spec : specs) {
    const bool quantized = fp8_quantized_weight(fp8, spec.name);
    if (quantized) spec.dtype = spec.param_dtype = DType::kFloat8E4M3;
    out.push_back(spec);
    if (!quantized) continue;
    for (const auto& [name, kind] : fp8_scales_of(fp8, spec.name))
      out.push_back(
          {name, fp8_scale_shape(fp8, kind, spec.shape), DType::kFloat32, DType::kFloat32});
  }
  return out;
}

std::vector<CheckpointTensorSpec> tensor_specs(const ModelConfig& c, Stacked stacked) {
  const std::int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                     inter = c.intermediate_size;
  std::vector<CheckpointTensorSpec> specs = {{"model.embed_tokens.weight", {c.vocab_size, h}}};
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LayerNorms norms = layer_norms(c);
    auto push_norm = [&](const std::string& name) {
      if (!name.empty()) specs.push_back({p + name + ".weight", {h}});
    };
    push_norm(norms.attention_in);
    const bool qkv = stacked == Stacked::kQkvAndGateUp,
               gate_up = qkv || stacked == Stacked::kGateUp;
    push_stacked(specs, stacked_qkv(c, p, "weight"), h, qkv);
    if (c.attention_bias) push_stacked(specs, stacked_qkv(c, p, "bias"), 0, qkv);
    specs.push_back({p + "self_attn.o_proj.weight", {h, q}});
    // (vLLM's Qwen2 and Qwen3 attention has no o_proj bias: Hugging Face's Qwen3
    // would take one, no released Qwen3 checkpoint has it, and vLLM could not
    // load it.)
    if (c.o_proj_bias) specs.push_back({p + "self_attn.o_proj.bias", {h}});
    // (QkNorm: one weight for every head, the whole projection's, or each head's)
    const std::int64_t hd = c.head_dim, heads = c.num_attention_heads,
                       kv_heads = c.num_key_value_heads;
    if (c.qk_norm == QkNorm::kShared) {
      specs.push_back({p + "self_attn.q_norm.weight", {hd}});
      specs.push_back({p + "self_attn.k_norm.weight", {hd}});
    } else if (c.qk_norm == QkNorm::kWhole) {
      specs.push_back({p + "self_attn.q_norm.weight", {heads * hd}});
      specs.push_back({p + "self_attn.k_norm.weight", {kv_heads * hd}});
    } else if (c.qk_norm == QkNorm::kPerHead) {
      specs.push_back({p + "self_attn.q_norm.weight", {heads, hd}});
      specs.push_back({p + "self_attn.k_norm.weight", {kv_heads, hd}});
    }
    for (const std::string* name : {&norms.attention_out, &norms.mlp_in, &norms.mlp_out})
      push_norm(*name);
    if (const std::int64_t si = c.shared_mlp_intermediate_size; si > 0) {  // (Granite's)
      push_stacked(specs, stacked_shared_mlp(c, p), h, stacked == Stacked::kExperts);
      specs.push_back({p + "shared_mlp.output_linear.weight", {h, si}});
    }
    if (c.sparse_layer(l) && stacked == Stacked::kExperts) {  // (GraniteMoE's)
      for (const RowSplit& split : stacked_experts(c, p))
        specs.push_back({split.name, split.shape});
      continue;
    }
    if (c.sparse_layer(l)) {
      const std::int64_t mi = c.moe_intermediate_size;
      const MoeNames names = moe_names(c);
      // (GLM-4.5's router and score correction: float32 parameters)
      const std::optional<DType> router_dtype =
          c.sigmoid_routing ? std::optional<DType>(DType::kFloat32) : std::nullopt;
      specs.push_back({p + names.module + ".gate.weight", {c.num_experts, h}, router_dtype});
      if (c.sigmoid_routing)
        specs.push_back(
            {p + names.module + ".gate.e_score_correction_bias", {c.num_experts}, router_dtype});
      for (std::int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = p + names.module + ".experts." + std::to_string(e) + ".";
        specs.push_back({x + names.gate + ".weight", {mi, h}});
        specs.push_back({x + names.up + ".weight", {mi, h}});
        specs.push_back({x + names.down + ".weight", {h, mi}});
      }
      if (const std::int64_t si = c.shared_expert_intermediate_size; si > 0) {
        specs.push_back({p + "mlp.shared_expert.gate_proj.weight", {si, h}});
        specs.push_back({p + "mlp.shared_expert.up_proj.weight", {si, h}});
        specs.push_back({p + "mlp.shared_expert.down_proj.weight", {h, si}});
        specs.push_back({p + "mlp.shared_expert_gate.weight", {1, h}});
      }
      if (const std::int64_t si = c.shared_experts_intermediate_size; si > 0) {  // (GLM-4.5's)
        specs.push_back({p + "mlp.shared_experts.gate_proj.weight", {si, h}});
        specs.push_back({p + "mlp.shared_experts.up_proj.weight", {si, h}});
        specs.push_back({p + "mlp.shared_experts.down_proj.weight", {h, si}});
      }
      continue;
    }
    if (c.shared_mlp_intermediate_size > 0) continue;  // (the layer's whole MLP)
    push_stacked(specs, stacked_gate_up(c, p, "weight"), h, gate_up);
    specs.push_back({p + "mlp.down_proj.weight", {h, inter}});
    if (c.mlp_bias) {
      push_stacked(specs, stacked_gate_up(c, p, "bias"), 0, gate_up);
      specs.push_back({p + "mlp.down_proj.bias", {h}});
    }
  }
  specs.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, h}});
  if (c.fp8.quantized()) return with_fp8_scales(c.fp8, std::move(specs));
  return specs;
}

}  // namespace

std::vector<CheckpointTensorSpec> checkpoint_tensor_specs(const ModelConfig& c) {
  return tensor_specs(c, family(c).stacked);
}

std::vector<CheckpointTensorSpec> loader_tensor_specs(const ModelConfig& c) {
  return tensor_specs(c, Stacked::kNone);
}

std::vector<RowSplit> stacked_checkpoint_tensors(const ModelConfig& c) {
  std::vector<RowSplit> out;
  const Stacked stacked = family(c).stacked;
  if (stacked == Stacked::kNone) return out;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (stacked == Stacked::kExperts) {
      if (c.sparse_layer(l))
        for (RowSplit& split : stacked_experts(c, p)) out.push_back(std::move(split));
      if (c.shared_mlp_intermediate_size > 0) out.push_back(stacked_shared_mlp(c, p));
      continue;
    }
    if (stacked == Stacked::kQkvAndGateUp) {
      out.push_back(stacked_qkv(c, p, "weight"));
      if (c.attention_bias) out.push_back(stacked_qkv(c, p, "bias"));
    }
    out.push_back(stacked_gate_up(c, p, "weight"));
    if (c.mlp_bias) out.push_back(stacked_gate_up(c, p, "bias"));
  }
  return out;
}

// (A field added to ModelConfig joins the list below; on the platform the
// project builds on, the size of the struct changes with most additions: a
// check that fails until the list is looked at.)
#if defined(__GLIBCXX__) && defined(__x86_64__) && _GLIBCXX_USE_CXX11_ABI && \
    !defined(_GLIBCXX_DEBUG)
static_assert(sizeof(ModelConfig) == 944,
              "ModelConfig changed: add its new field to config_fields(), then this size");
#endif

std::vector<ConfigField> config_fields(const ModelConfig& c) {
  std::vector<ConfigField> out;
  auto field = [&](const char* name, const auto& value) { out.push_back({name, show(value)}); };
  auto scaling = [](const RopeScaling& s) { return s.json.empty() ? std::string("none") : s.json; };
  field("architectures", c.architecture);
  field("hidden_size", c.hidden_size);
  field("intermediate_size", c.intermediate_size);
  field("num_hidden_layers", c.num_hidden_layers);
  field("num_attention_heads", c.num_attention_heads);
  field("num_key_value_heads", c.num_key_value_heads);
  field("head_dim", c.head_dim);
  field("vocab_size", c.vocab_size);
  field(c.layer_norm ? "layer_norm_eps" : "rms_norm_eps", c.rms_norm_eps);
  field("rope_theta", c.rope_theta);
  field("rope_scaling", scaling(c.rope_scaling));
  field("partial_rotary_factor", c.partial_rotary_factor);
  field("interleaved rotary", c.rope_interleaved);
  field("tie_word_embeddings", c.tie_word_embeddings);
  field("hidden_activation", std::string(activation_name(c.activation)));
  field("Gemma-style normalization", c.gemma_normalization);
  field("norm layout", norm_layout_name(c.norm_layout));
  field("query_pre_attn_scalar", c.query_pre_attn_scalar);
  field("attn_logit_softcapping", c.attn_logit_softcapping);
  field("final_logit_softcapping", c.final_logit_softcapping);
  field("sliding_window", c.sliding_window);
  field("sliding_layers", c.sliding_layers);
  field("the sliding layers' rope_theta", c.sliding_rope_theta);
  field("the sliding layers' rope scaling", scaling(c.sliding_rope_scaling));
  field("embedding_multiplier", c.embedding_multiplier);
  field("attention_multiplier", c.attention_multiplier);
  field("residual_multiplier", c.residual_multiplier);
  field("logits_scaling", c.logits_scaling);
  field("logit_scale", c.logit_scale);
  field("mean-centred norms (LayerNorm)", c.layer_norm);
  field("full layers without rotary", c.nope_full_layers);
  field("attention_bias", c.attention_bias);
  field("o_proj_bias", c.o_proj_bias);
  field("mlp_bias", c.mlp_bias);
  field("q/k norms", std::string(qk_norm_name(c.qk_norm)));
  field("num_experts", c.num_experts);
  field("num_experts_per_tok", c.num_experts_per_tok);
  field("moe_intermediate_size", c.moe_intermediate_size);
  field("decoder_sparse_step", c.decoder_sparse_step);
  field("mlp_only_layers", c.mlp_only_layers);
  field("norm_topk_prob", c.norm_topk_prob);
  field("shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  field("shared_intermediate_size", c.shared_mlp_intermediate_size);
  field("first_k_dense_replace", c.first_k_dense_replace);
  field("sigmoid routing with e_score_correction_bias", c.sigmoid_routing);
  field("n_group", c.n_group);
  field("topk_group", c.topk_group);
  field("routed_scaling_factor", c.routed_scaling_factor);
  field("n_shared_experts x moe_intermediate_size", c.shared_experts_intermediate_size);
  field("torch_dtype", c.dtype);
  field("quantization_config", c.fp8.text());
  return out;
}

std::vector<std::string> config_differences(const ModelConfig& a, const ModelConfig& b) {
  const std::vector<ConfigField> x = config_fields(a), y = config_fields(b);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (x[i].value != y[i].value)
      out.push_back(detail::concat(x[i].name, " ", x[i].value, " vs ", y[i].value));
  return out;
}

}  // namespace tpreload
