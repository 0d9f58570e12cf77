#include "keys.h"

#include <algorithm>
#include <type_traits>

#include "tpreload/core/error.h"

namespace tpreload::families {
namespace {

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

}  // namespace

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

double positive_number(const json& j, const char* key, double fallback, const std::string& origin,
                       const char* within) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number())
    raise<ModelError>(origin, ": field '", within, key, "' must be a number, got ", j[key].dump());
  const double value = j[key].get<double>();
  if (!(value > 0))  // (nlohmann refuses numbers beyond a double: no infinity gets here)
    raise<ModelError>(origin, ": field '", within, key, "' must be a positive number, got ",
                      j[key].dump());
  return value;
}

double rope_number(const json& j, const char* key, const std::string& origin, double fallback,
                   const std::string& params) {
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

RopeScaling rope_scaling_of(const json& j, const std::string& origin, const std::string& params) {
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
  setting("mscale", r.mscale);
  setting("mscale_all_dim", r.mscale_all_dim);
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

double positive_number_or(const json& j, const char* key, double fallback,
                          const std::string& origin) {
  if (j.contains(key) && j[key].is_null())
    raise<ModelError>(origin, ": field '", key, "' must be a positive number, got null");
  return positive_number(j, key, fallback, origin);
}

std::int64_t positive_int_or(const json& j, const char* key, std::int64_t fallback,
                             const std::string& origin) {
  return j.contains(key) ? positive_int(j, key, origin) : fallback;
}

void silu_only(const json& j, const std::string& origin, const ModelConfig& c) {
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    raise<ModelError>(origin, ": ", c.architecture, " takes hidden_act silu only, got ",
                      j["hidden_act"].dump());
}

void refuse_true(const json& j, const std::string& origin, const ModelConfig& c,
                 std::initializer_list<const char*> keys, const char* why) {
  for (const char* key : keys)
    if (flag(j, key, origin))
      raise<ModelError>(origin, ": ", key, " true is refused for ", c.architecture, " (", why, ")");
}

void head_dim_from_heads(const ModelConfig& c, const std::string& origin, const char* model_file) {
  if (c.head_dim * c.num_attention_heads != c.hidden_size)
    raise<ModelError>(origin, ": ", c.architecture,
                      " takes head_dim as hidden_size / num_attention_heads (vLLM's ", model_file,
                      " reads no head_dim), but head_dim ", c.head_dim, " x ",
                      c.num_attention_heads, " heads is not hidden_size ", c.hidden_size);
}

std::int64_t required_count(const json& j, const char* key, const std::string& origin,
                            const char* why) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() < 0)
    raise<ModelError>(origin, ": field '", key, "' must be a non-negative integer (", why,
                      "), got ", j.contains(key) ? j[key].dump() : std::string("nothing"));
  return j[key].get<std::int64_t>();
}

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

void read_biases(const json& j, const std::string& origin, Biases kind, ModelConfig& c) {
  switch (kind) {
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
}

void write_biases(Biases kind, const ModelConfig& c, json& j) {
  switch (kind) {
    case Biases::kLlama:  // (o_proj's in attention_bias, q/k/v's in qkv_bias where it differs)
      j["attention_bias"] = c.o_proj_bias;
      if (c.attention_bias != c.o_proj_bias) j["qkv_bias"] = c.attention_bias;
      if (c.mlp_bias) j["mlp_bias"] = true;
      break;
    case Biases::kQkvOptional:
    case Biases::kQkvAndO:
    case Biases::kQkvUnlessOff:
      j["attention_bias"] = c.attention_bias;
      break;
    case Biases::kGranite:
      j["attention_bias"] = c.attention_bias;
      j["mlp_bias"] = c.mlp_bias;
      break;
    case Biases::kQkv:  // (not a setting)
    case Biases::kNone:
      break;
  }
}

void write_experts(Experts kind, const ModelConfig& c, json& j) {
  if (kind == Experts::kMixtral) {
    j["num_local_experts"] = c.num_experts;
    if (c.num_experts > 0) j["num_experts_per_tok"] = c.num_experts_per_tok;
    return;
  }
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["decoder_sparse_step"] = c.decoder_sparse_step;
  j["mlp_only_layers"] = c.mlp_only_layers;
  j["norm_topk_prob"] = c.norm_topk_prob;
  if (c.shared_expert_intermediate_size > 0)
    j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
}

void write_windows(const ModelConfig& c, json& j) {
  j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  json types = json::array();
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    types.push_back(c.sliding_type(l) ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
}

void write_sliding_rope(const ModelConfig& c, const char* local_key, json& j) {
  if (c.sliding_rope_theta <= 0) return;
  const bool plain = c.sliding_rope_scaling.json.empty() &&
                     (local_key != nullptr || c.sliding_rope_theta == c.rope_theta);
  if (plain) {
    if (local_key) j[local_key] = c.sliding_rope_theta;
    return;
  }
  auto of = [](double theta, const RopeScaling& s) {
    json r = s.json.empty() ? json{{"rope_type", "default"}} : json::parse(s.json);
    r["rope_theta"] = theta;
    return r;
  };
  j["rope_parameters"] = {{"full_attention", of(c.rope_theta, c.rope_scaling)},
                          {"sliding_attention", of(c.sliding_rope_theta, c.sliding_rope_scaling)}};
  j.erase("rope_theta");
  j.erase("rope_scaling");
}

void read_logit_scale(const Keys& keys, ModelConfig& c) {
  c.logit_scale = positive_number_or(keys.j, "logit_scale", 1, keys.origin);
}

}  // namespace tpreload::families
