#include "tpreload/model/config.h"

#include <sys/stat.h>
#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "../../core/json_depth.h"
#include "../families/family.h"
#include "../families/keys.h"
#include "../families/layout.h"
#include "../quantization/fp8_config.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

using nlohmann::json;
using namespace families;

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

// rope_parameters per attention type given for a family that reads it flat.
[[noreturn]] void refuse_rope_per_type(const std::string& origin, const Family& f) {
  std::vector<std::string> readers;
  for (const Family* r : registry())
    if (r->rope_per_attention_type) readers.push_back(r->architecture);
  std::string list;
  for (std::size_t i = 0; i < readers.size(); ++i)
    list += (i == 0 ? "" : i + 1 == readers.size() ? " and " : ", ") + readers[i];
  raise<ModelError>(origin,
                    ": rope_parameters per attention type (full_attention, sliding_attention) is "
                    "read for ",
                    list, " only, not ", f.architecture);
}

// The family config.json names; throws ModelError naming the known ones for
// another.
const families::Family& architecture_of(const json& j, const std::string& origin) {
  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty() || !j["architectures"][0].is_string())
    raise<ModelError>(origin, ": field 'architectures' is missing or not a list of names");
  const auto name = j["architectures"][0].get<std::string>();
  if (const families::Family* f = families::find(name)) return *f;
  std::string known;
  for (const families::Family* f : families::registry())
    known += (known.empty() ? "" : ", ") + std::string(f->architecture);
  raise<ModelError>(origin, ": architecture '", name, "' is not supported (supported: ", known,
                    ")");
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
    for (const families::Family* f : families::registry()) out.emplace_back(f->architecture);
    return out;
  }();
  return names;
}

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> all = [] {
    std::vector<ModelFamily> out;
    for (const Family* f : registry()) out.push_back({f->architecture, f->name, f->vllm_model});
    return out;
  }();
  return all;
}

std::string model_family_names() {
  const std::vector<ModelFamily>& all = model_families();
  std::string out;
  for (std::size_t i = 0; i < all.size(); ++i)
    out += (i == 0 ? "" : i + 1 == all.size() ? " and " : ", ") + all[i].name;
  return out;
}

MoeNames moe_names(const ModelConfig& c) {
  if (families::of(c).experts == families::Experts::kMixtral)
    return {"block_sparse_moe", "w1", "w3", "w2"};
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
  const families::Family& f = architecture_of(j, origin);
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
  c.rms_norm_eps = positive_number(j, f.layer_norm_eps ? "layer_norm_eps" : "rms_norm_eps",
                                   f.rms_norm_eps, origin);
  // Rope per attention type (Gemma 3 and OLMo 3 as transformers 5 writes
  // them): the full layers' read as a flat rope_parameters is, the sliding
  // ones' by the family.
  const json per_type = rope_per_attention_type(j, origin);
  if (!per_type.is_null() && !f.rope_per_attention_type) refuse_rope_per_type(origin, f);
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
      rope_number(rope, "partial_rotary_factor", origin, f.partial_rotary_factor, params);
  if (c.partial_rotary_factor > 1)
    raise<ModelError>(origin, ": partial_rotary_factor must be at most 1, got ",
                      c.partial_rotary_factor);
  c.tie_word_embeddings = j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_null()
                              ? flag(j, "tie_word_embeddings", origin)
                              : f.tied;
  read_biases(j, origin, f.biases, c);
  c.qk_norm = f.qk_norm;
  if (f.parse) f.parse({j, origin, per_type}, c);
  c.dtype = parse_dtype(j, origin);
  c.fp8 = detail::parse_fp8_checkpoint(j, origin);
  if (c.fp8.quantized() && f.stacked != families::Stacked::kNone)
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
  const families::Family& f = families::of(c);
  json j = {{"architectures", {c.architecture}},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_dim},
            {"vocab_size", c.vocab_size},
            {f.layer_norm_eps ? "layer_norm_eps" : "rms_norm_eps", c.rms_norm_eps},
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
  if (c.partial_rotary_factor != 1 || f.partial_rotary_factor != 1)
    j["partial_rotary_factor"] = c.partial_rotary_factor;
  if (c.activation != Activation::kSilu) j["hidden_activation"] = activation_name(c.activation);
  write_biases(f.biases, c, j);
  if (c.logit_scale != 1) j["logit_scale"] = c.logit_scale;
  if (f.write) f.write(c, j);
  return j.dump(2);
}

namespace layout {

CheckpointTensorSpec split_as(std::string name, std::vector<std::int64_t> shape, ShardKind kind,
                              std::optional<DType> param_dtype) {
  CheckpointTensorSpec spec{std::move(name), std::move(shape), param_dtype};
  spec.kind = kind;
  return spec;
}

void push_merged_replicated(std::vector<CheckpointTensorSpec>& specs, const std::string& param,
                            std::initializer_list<std::pair<std::string, std::int64_t>> parts,
                            std::int64_t columns) {
  for (const auto& [name, rows] : parts) {
    CheckpointTensorSpec spec{name, {rows, columns}};
    spec.param = param;
    specs.push_back(std::move(spec));
  }
}

}  // namespace layout

namespace {

using layout::split_as;

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

// GraniteMoE's experts of layer prefix `p` (families::Stacked::kExperts), as vLLM's
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

// `split`'s parts (as the loaders take them: column-parallel shards of the
// split's name, each its role of `roles`), or the stacked tensor (as the
// checkpoint holds it): rows of `columns` (a bias: 0, one value per row).
void push_stacked(std::vector<CheckpointTensorSpec>& specs, const RowSplit& split,
                  std::int64_t columns, bool stacked, std::initializer_list<ShardRole> roles) {
  auto shape = [&](std::int64_t rows) {
    return columns > 0 ? std::vector<std::int64_t>{rows, columns} : std::vector<std::int64_t>{rows};
  };
  std::int64_t rows = 0;
  auto role = roles.begin();
  for (const RowPart& part : split.parts) {
    if (!stacked) {
      CheckpointTensorSpec spec{part.name, shape(part.rows)};
      spec.param = split.name;
      spec.role = *role;
      spec.kind = ShardKind::kColumn;
      specs.push_back(std::move(spec));
    }
    ++role;
    rows += part.rows;
  }
  if (stacked) specs.push_back({split.name, shape(rows)});
}

// Expert `e`'s gate, up or down projection of a FusedMoE whose experts are
// under `experts` ("model.layers.3.mlp.experts."): a shard of its w13_weight
// or w2_weight.
CheckpointTensorSpec expert_part(std::string name, std::vector<std::int64_t> shape,
                                 const std::string& experts, std::int64_t e, ShardRole role) {
  CheckpointTensorSpec spec{std::move(name), std::move(shape)};
  const bool down = role == ShardRole::kDown;
  spec.param = experts + (down ? "w2_weight" : "w13_weight");
  spec.role = role;
  spec.kind = down ? ShardKind::kExpertDown : ShardKind::kExpertGateUp;
  spec.expert = e;
  return spec;
}

// An FP8 checkpoint's tensors: each quantized weight float8_e4m3fn (and so its
// parameter), its float32 scales after it (fp8_scales_of).
std::vector<CheckpointTensorSpec> with_fp8_scales(const Fp8Checkpoint& fp8,
                                                  std::vector<CheckpointTensorSpec> specs) {
  std::vector<CheckpointTensorSpec> out;
  out.reserve(2 * specs.size());
  for (CheckpointTensorSpec& spec : specs) {
    if (!fp8_quantized_weight(fp8, spec.name)) {
      out.push_back(std::move(spec));
      continue;
    }
    spec.dtype = spec.param_dtype = DType::kFloat8E4M3;
    const auto scales = fp8_scales_of(fp8, spec.name);
    const std::vector<std::int64_t> shape = spec.shape;
    out.push_back(std::move(spec));
    for (const auto& [name, kind] : scales)
      out.push_back({name, fp8_scale_shape(fp8, kind, shape), DType::kFloat32, DType::kFloat32});
  }
  return out;
}

// The attention of layer prefix `p` as most families have it: q/k/v_proj
// (stacked in qkv_proj where the checkpoint stacks them, `qkv`), o_proj, their
// biases and the q/k norms the config names.
void attention_specs(const ModelConfig& c, const std::string& p, bool qkv,
                     std::vector<CheckpointTensorSpec>& specs) {
  using R = ShardRole;
  const std::int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  push_stacked(specs, stacked_qkv(c, p, "weight"), h, qkv, {R::kQ, R::kK, R::kV});
  if (c.attention_bias)
    push_stacked(specs, stacked_qkv(c, p, "bias"), 0, qkv, {R::kQ, R::kK, R::kV});
  specs.push_back(split_as(p + "self_attn.o_proj.weight", {h, q}, ShardKind::kRow));
  // (vLLM's Qwen2 and Qwen3 attention has no o_proj bias: Hugging Face's Qwen3
  // would take one, no released Qwen3 checkpoint has it, and vLLM could not
  // load it. A row-parallel layer's bias is whole on every rank.)
  if (c.o_proj_bias) specs.push_back({p + "self_attn.o_proj.bias", {h}});
  // (QkNorm: one weight for every head, the whole projection's, or each
  // head's, split by head as q's and k's rows)
  const std::int64_t hd = c.head_dim, heads = c.num_attention_heads,
                     kv_heads = c.num_key_value_heads;
  if (c.qk_norm == QkNorm::kShared) {
    specs.push_back({p + "self_attn.q_norm.weight", {hd}});
    specs.push_back({p + "self_attn.k_norm.weight", {hd}});
  } else if (c.qk_norm == QkNorm::kWhole) {
    specs.push_back({p + "self_attn.q_norm.weight", {heads * hd}});
    specs.push_back({p + "self_attn.k_norm.weight", {kv_heads * hd}});
  } else if (c.qk_norm == QkNorm::kPerHead) {
    for (const auto& [name, rows, role] :
         {std::tuple{"q_norm", heads, R::kQ}, std::tuple{"k_norm", kv_heads, R::kK}}) {
      CheckpointTensorSpec spec =
          split_as(p + "self_attn." + name + ".weight", {rows, hd}, ShardKind::kHeads);
      spec.role = role;
      specs.push_back(std::move(spec));
    }
  }
}

std::vector<CheckpointTensorSpec> tensor_specs(const ModelConfig& c, families::Stacked stacked) {
  using R = ShardRole;
  const std::int64_t h = c.hidden_size, inter = c.intermediate_size;
  std::vector<CheckpointTensorSpec> specs;
  // (about a layer's attention, norms and MLP, and every expert's three)
  specs.reserve(static_cast<std::size_t>(4 + c.num_hidden_layers * (24 + 3 * c.num_experts)));
  specs.push_back(split_as("model.embed_tokens.weight", {c.vocab_size, h}, ShardKind::kVocab));
  // A gate/up/down MLP of `n` under `m` whose gate and up no checkpoint stacks
  // (a shared expert's): gate_up_proj's two shards, down_proj by columns.
  auto apart_mlp = [&](const std::string& m, std::int64_t n) {
    push_stacked(
        specs,
        {m + "gate_up_proj.weight", {{m + "gate_proj.weight", n}, {m + "up_proj.weight", n}}}, h,
        false, {R::kGate, R::kUp});
    specs.push_back(split_as(m + "down_proj.weight", {h, n}, ShardKind::kRow));
  };
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LayerNorms norms = layer_norms(c);
    auto push_norm = [&](const std::string& name) {
      if (!name.empty()) specs.push_back({p + name + ".weight", {h}});
    };
    push_norm(norms.attention_in);
    const bool qkv = stacked == families::Stacked::kQkvAndGateUp,
               gate_up = qkv || stacked == families::Stacked::kGateUp;
    if (const auto attention = families::of(c).attention) {
      attention(c, p, specs);
    } else {
      attention_specs(c, p, qkv, specs);
    }
    for (const std::string* name : {&norms.attention_out, &norms.mlp_in, &norms.mlp_out})
      push_norm(*name);
    if (const std::int64_t si = c.shared_mlp_intermediate_size; si > 0) {  // (Granite's)
      push_stacked(specs, stacked_shared_mlp(c, p), h, stacked == families::Stacked::kExperts,
                   {R::kGate, R::kUp});
      specs.push_back(split_as(p + "shared_mlp.output_linear.weight", {h, si}, ShardKind::kRow));
    }
    if (c.sparse_layer(l) && stacked == families::Stacked::kExperts) {  // (GraniteMoE's)
      for (const RowSplit& split : stacked_experts(c, p))
        specs.push_back({split.name, split.shape});
      continue;
    }
    if (c.sparse_layer(l)) {
      const std::int64_t mi = c.moe_intermediate_size;
      const MoeNames names = moe_names(c);
      // (GLM-4.5's router and the score corrections: float32 parameters)
      const std::optional<DType> router_dtype =
          c.float32_router ? std::optional<DType>(DType::kFloat32) : std::nullopt;
      const std::string m = p + names.module + ".";
      specs.push_back({m + "gate.weight", {c.num_experts, h}, router_dtype});
      if (c.score_correction)
        specs.push_back({m + "gate.e_score_correction_bias", {c.num_experts}, DType::kFloat32});
      for (std::int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        specs.push_back(
            expert_part(x + names.gate + ".weight", {mi, h}, m + "experts.", e, R::kGate));
        specs.push_back(expert_part(x + names.up + ".weight", {mi, h}, m + "experts.", e, R::kUp));
        specs.push_back(
            expert_part(x + names.down + ".weight", {h, mi}, m + "experts.", e, R::kDown));
      }
      if (const std::int64_t si = c.shared_expert_intermediate_size; si > 0) {
        apart_mlp(p + "mlp.shared_expert.", si);
        specs.push_back({p + "mlp.shared_expert_gate.weight", {1, h}});
      }
      if (const std::int64_t si = c.shared_experts_intermediate_size;
          si > 0)  // (GLM-4.5's, DeepSeek's)
        apart_mlp(p + "mlp.shared_experts.", si);
      continue;
    }
    if (c.shared_mlp_intermediate_size > 0) continue;  // (the layer's whole MLP)
    push_stacked(specs, stacked_gate_up(c, p, "weight"), h, gate_up, {R::kGate, R::kUp});
    specs.push_back(split_as(p + "mlp.down_proj.weight", {h, inter}, ShardKind::kRow));
    if (c.mlp_bias) {
      push_stacked(specs, stacked_gate_up(c, p, "bias"), 0, gate_up, {R::kGate, R::kUp});
      specs.push_back({p + "mlp.down_proj.bias", {h}});
    }
  }
  specs.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings)
    specs.push_back(split_as("lm_head.weight", {c.vocab_size, h}, ShardKind::kVocab));
  if (c.fp8.quantized()) return with_fp8_scales(c.fp8, std::move(specs));
  return specs;
}

}  // namespace

std::vector<CheckpointTensorSpec> checkpoint_tensor_specs(const ModelConfig& c) {
  return tensor_specs(c, families::of(c).stacked);
}

std::vector<CheckpointTensorSpec> loader_tensor_specs(const ModelConfig& c) {
  return tensor_specs(c, families::Stacked::kNone);
}

std::vector<RowSplit> stacked_checkpoint_tensors(const ModelConfig& c) {
  std::vector<RowSplit> out;
  const families::Stacked stacked = families::of(c).stacked;
  if (stacked == families::Stacked::kNone) return out;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (stacked == families::Stacked::kExperts) {
      if (c.sparse_layer(l))
        for (RowSplit& split : stacked_experts(c, p)) out.push_back(std::move(split));
      if (c.shared_mlp_intermediate_size > 0) out.push_back(stacked_shared_mlp(c, p));
      continue;
    }
    if (stacked == families::Stacked::kQkvAndGateUp) {
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
static_assert(sizeof(ModelConfig) == 1016,
              "ModelConfig changed: add its new field to config_fields(), then this size");
#endif

std::vector<ConfigField> config_fields(const ModelConfig& c) {
  std::vector<ConfigField> out;
  // (field: a difference changes the parameters or the bytes they hold;
  // forward: only what a forward pass computes with them)
  auto field = [&](const char* name, const auto& value) {
    out.push_back({name, show(value), true});
  };
  auto forward = [&](const char* name, const auto& value) {
    out.push_back({name, show(value), false});
  };
  auto scaling = [](const RopeScaling& s) { return s.json.empty() ? std::string("none") : s.json; };
  field("architectures", c.architecture);
  field("hidden_size", c.hidden_size);
  field("intermediate_size", c.intermediate_size);
  field("num_hidden_layers", c.num_hidden_layers);
  field("num_attention_heads", c.num_attention_heads);
  field("num_key_value_heads", c.num_key_value_heads);
  field("head_dim", c.head_dim);
  field("vocab_size", c.vocab_size);
  forward(c.layer_norm ? "layer_norm_eps" : "rms_norm_eps", c.rms_norm_eps);
  forward("rope_theta", c.rope_theta);
  forward("rope_scaling", scaling(c.rope_scaling));
  forward("partial_rotary_factor", c.partial_rotary_factor);
  forward("interleaved rotary", c.rope_interleaved);
  field("tie_word_embeddings", c.tie_word_embeddings);
  forward("hidden_activation", std::string(activation_name(c.activation)));
  forward("Gemma-style normalization", c.gemma_normalization);
  field("norm layout", norm_layout_name(c.norm_layout));
  forward("query_pre_attn_scalar", c.query_pre_attn_scalar);
  forward("attn_logit_softcapping", c.attn_logit_softcapping);
  forward("final_logit_softcapping", c.final_logit_softcapping);
  forward("sliding_window", c.sliding_window);
  forward("sliding_layers", c.sliding_layers);
  forward("the sliding layers' rope_theta", c.sliding_rope_theta);
  forward("the sliding layers' rope scaling", scaling(c.sliding_rope_scaling));
  forward("embedding_multiplier", c.embedding_multiplier);
  forward("attention_multiplier", c.attention_multiplier);
  forward("residual_multiplier", c.residual_multiplier);
  forward("logits_scaling", c.logits_scaling);
  forward("logit_scale", c.logit_scale);
  forward("mean-centred norms (LayerNorm)", c.layer_norm);
  forward("full layers without rotary", c.nope_full_layers);
  field("attention_bias", c.attention_bias);
  field("o_proj_bias", c.o_proj_bias);
  field("mlp_bias", c.mlp_bias);
  field("q/k norms", std::string(qk_norm_name(c.qk_norm)));
  field("num_experts", c.num_experts);
  forward("num_experts_per_tok", c.num_experts_per_tok);
  field("moe_intermediate_size", c.moe_intermediate_size);
  field("decoder_sparse_step", c.decoder_sparse_step);
  field("mlp_only_layers", c.mlp_only_layers);
  forward("norm_topk_prob", c.norm_topk_prob);
  field("shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  field("shared_intermediate_size", c.shared_mlp_intermediate_size);
  field("first_k_dense_replace", c.first_k_dense_replace);
  field("float32 router", c.float32_router);
  field("e_score_correction_bias", c.score_correction);
  forward("sigmoid routing", c.sigmoid_routing);
  forward("n_group", c.n_group);
  forward("topk_group", c.topk_group);
  forward("routed_scaling_factor", c.routed_scaling_factor);
  field("n_shared_experts x moe_intermediate_size", c.shared_experts_intermediate_size);
  field("q_lora_rank", c.q_lora_rank);
  field("kv_lora_rank", c.kv_lora_rank);
  field("qk_nope_head_dim", c.qk_nope_head_dim);
  field("qk_rope_head_dim", c.qk_rope_head_dim);
  field("v_head_dim", c.v_head_dim);
  field("torch_dtype", c.dtype);
  field("quantization_config", c.fp8.text());
  return out;
}

std::vector<std::string> config_differences(const ModelConfig& a, const ModelConfig& b,
                                            ConfigFields which) {
  const std::vector<ConfigField> x = config_fields(a), y = config_fields(b);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < x.size(); ++i)
    if ((which == ConfigFields::kAll || x[i].weights) && x[i].value != y[i].value)
      out.push_back(detail::concat(x[i].name, " ", x[i].value, " vs ", y[i].value));
  return out;
}

}  // namespace tpreload
