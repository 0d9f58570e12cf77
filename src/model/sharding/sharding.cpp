#include "tpreload/model/sharding.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "../families/family.h"
#include "tpreload/checkpoint/row_split.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"
#include "tpreload/core/quantization.h"
#include "tpreload/model/fp8_checkpoint.h"
#include "tpreload/model/row_writes.h"

namespace tpreload {
namespace {

// The weights vLLM's online FP8 quantizes: every decoder linear projection and
// expert (fp8_quantized_weight, nothing ignored).
const Fp8Checkpoint kOnlineFp8 = [] {
  Fp8Checkpoint f;
  f.per_tensor = true;
  return f;
}();

// Online FP8's scale of "<module>.weight": "_scale" (one per weight or expert)
// or, with blocks, "_scale_inv" (a grid), as vLLM names them.
const char* online_scale_suffix(const std::string& quantization) {
  return online_fp8_block(quantization) ? "_scale_inv" : "_scale";
}

// "model.layers.0.self_attn.q_proj.weight" -> {"model.layers.0.self_attn.", "q_proj", "weight"}
struct NameParts {
  std::string prefix, module, leaf;
};

NameParts split_name(const std::string& name) {
  const auto last = name.rfind('.');
  const auto before = last == std::string::npos ? std::string::npos : name.rfind('.', last - 1);
  if (last == std::string::npos) return {"", "", name};
  if (before == std::string::npos) return {"", name.substr(0, last), name.substr(last + 1)};
  return {name.substr(0, before + 1), name.substr(before + 1, last - before - 1),
          name.substr(last + 1)};
}

void require_divisible(std::int64_t value, std::int64_t by, const char* what, int tp) {
  if (by <= 0 || value % by != 0)
    raise<ModelError>("cannot split the model ", tp, " ways: ", what, " ", value,
                      " is not divisible by ", by);
}

}  // namespace

std::int64_t layer_of(const std::string& name) {
  static const std::string kPrefix = "model.layers.";
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  std::int64_t value = 0;
  std::size_t i = kPrefix.size();
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i)
    value = value * 10 + (name[i] - '0');
  return value;
}

std::string_view format_name(WeightFormat format) {
  return format == WeightFormat::kCheckpoint ? "checkpoint" : "kernel";
}

namespace {
const std::string kBaseLayer = ".base_layer.";
}

std::string strip_base_layer(std::string name) {
  const auto at = name.find(kBaseLayer);
  if (at != std::string::npos) name.replace(at, kBaseLayer.size(), ".");
  return name;
}

std::string with_base_layer(const std::string& name) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return name;
  return name.substr(0, dot) + kBaseLayer + name.substr(dot + 1);
}

namespace {
const std::string kExperts = ".experts.";
const std::string kRoutedExperts = ".experts.routed_experts.";
bool is_fused_expert_leaf(const std::string& leaf) {
  return leaf.rfind("w13_", 0) == 0 || leaf.rfind("w2_", 0) == 0;
}
}  // namespace

std::string with_routed_experts(const std::string& name) {
  const auto at = name.rfind(kExperts);
  if (at == std::string::npos || !is_fused_expert_leaf(name.substr(at + kExperts.size())))
    return {};
  return name.substr(0, at) + kRoutedExperts + name.substr(at + kExperts.size());
}

std::string strip_routed_experts(const std::string& name) {
  const auto at = name.rfind(kRoutedExperts);
  if (at == std::string::npos || !is_fused_expert_leaf(name.substr(at + kRoutedExperts.size())))
    return name;
  return name.substr(0, at) + kExperts + name.substr(at + kRoutedExperts.size());
}

std::vector<std::int64_t> Placement::slice_shape() const {
  std::vector<std::int64_t> shape = source_shape;
  if (source_dim >= 0) shape[source_dim] = source_length;
  return shape;
}

std::int64_t Placement::slice_rows() const {
  if (source_dim == 0) return source_length;
  return source_shape.empty() ? 1 : source_shape[0];
}

std::uint64_t Placement::slice_row_bytes(DType dtype) const {
  std::uint64_t n = dtype_size(dtype);
  for (std::size_t d = 1; d < source_shape.size(); ++d)
    n *= static_cast<std::uint64_t>(static_cast<int>(d) == source_dim ? source_length
                                                                      : source_shape[d]);
  return n;
}

ShardingRules::ShardingRules(ModelConfig config, int tp_size, std::string quantization,
                             bool expert_parallel, bool derived)
    : config_(std::move(config)),
      tp_size_(tp_size),
      quantization_(std::move(quantization)),
      expert_parallel_(expert_parallel),
      holds_derived_(derived) {
  if (tp_size_ < 1) raise<ModelError>("tensor-parallel size must be at least 1, got ", tp_size_);
  if (!known_quantization(quantization_))
    raise<ModelError>("unknown quantization '", quantization_,
                      "' (supported: ", quantization_list(), ")");
  if (!quantization_.empty() && config_.fp8.quantized())
    raise<ModelError>("quantization ", quantization_, " of an FP8 checkpoint: its weights are ",
                      "already quantized (", config_.fp8.text(), ")");
  const auto& c = config_;
  require_divisible(c.num_attention_heads, tp_size_, "num_attention_heads", tp_size_);
  if (tp_size_ >= c.num_key_value_heads)
    require_divisible(tp_size_, c.num_key_value_heads, "tensor-parallel size (KV replication)",
                      tp_size_);
  else
    require_divisible(c.num_key_value_heads, tp_size_, "num_key_value_heads", tp_size_);
  // intermediate_size where a layer's dense MLP reads it: not in a model whose
  // every layer is sparse (Mixtral's lines, where it is the experts' size and
  // split, or not, as theirs; GLM-4.5 without dense layers), nor where Granite's
  // shared MLP is the only one.
  bool dense_layer = false;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    dense_layer = dense_layer || (!c.sparse_layer(l) && c.shared_mlp_intermediate_size == 0);
  if (dense_layer) require_divisible(c.intermediate_size, tp_size_, "intermediate_size", tp_size_);
  if (expert_parallel_ && c.num_experts == 0)
    raise<ModelError>("expert parallelism needs a mixture-of-experts model; ", c.architecture,
                      " has no experts");
  if (c.num_experts > 0 && expert_parallel_)
    require_divisible(c.num_experts, tp_size_,
                      "num_experts (expert parallelism places whole experts)", tp_size_);
  else if (c.num_experts > 0)
    require_divisible(c.moe_intermediate_size, tp_size_,
                      moe_names(c).module == "block_sparse_moe" ? "intermediate_size (the experts')"
                                                                : "moe_intermediate_size",
                      tp_size_);
  require_divisible(c.shared_expert_intermediate_size, tp_size_, "shared_expert_intermediate_size",
                    tp_size_);
  require_divisible(c.shared_mlp_intermediate_size, tp_size_, "shared_intermediate_size", tp_size_);
  require_divisible(c.shared_experts_intermediate_size, tp_size_,
                    "n_shared_experts x moe_intermediate_size", tp_size_);
  padded_vocab_ = (c.vocab_size + kVocabPadding - 1) / kVocabPadding * kVocabPadding;
  require_divisible(padded_vocab_, tp_size_, "padded vocab size", tp_size_);
  build_rules();
  check_fp8_blocks();
  build_params();
}

std::int64_t ShardingRules::kv_heads_per_rank() const {
  return std::max<std::int64_t>(1, config_.num_key_value_heads / tp_size_);
}

std::int64_t ShardingRules::kv_head_start(int tp_rank) const {
  const std::int64_t nkv = config_.num_key_value_heads;
  if (tp_size_ >= nkv) return tp_rank / (tp_size_ / nkv);
  return tp_rank * (nkv / tp_size_);
}

std::int64_t ShardingRules::local_experts() const {
  return expert_parallel_ ? config_.num_experts / tp_size_ : config_.num_experts;
}

std::int64_t ShardingRules::local_moe_intermediate() const {
  return expert_parallel_ ? config_.moe_intermediate_size
                          : config_.moe_intermediate_size / tp_size_;
}

void ShardingRules::build_rules() {
  // What each tensor the loaders take feeds, as the layout says (its fused
  // parameter, its shard of it, how that is split); an FP8 scale is placed as
  // its weight, in the weight's fused parameter's scale.
  const std::vector<CheckpointTensorSpec> specs = loader_tensor_specs(config_);
  std::unordered_map<std::string_view, const CheckpointTensorSpec*> by_name;
  by_name.reserve(specs.size());
  for (const auto& spec : specs) by_name.emplace(spec.name, &spec);
  rules_.reserve(specs.size());
  // (a replicated parameter merged from parts: its rows and shards, and each
  // part's shard and the rows before it, in the layout's order)
  std::map<std::string, std::pair<std::uint32_t, std::int64_t>> merged, part;
  for (const auto& spec : specs)
    if (spec.kind == ShardKind::kReplicated && !spec.param.empty() && spec.param != spec.name) {
      auto& [shards, rows] = merged[spec.param];
      part[spec.name] = {shards++, rows};
      rows += spec.shape[0];
    }
  auto rule_of = [&](const CheckpointTensorSpec& spec) {
    Rule rule{spec.param.empty() ? spec.name : spec.param, spec.role, spec.kind, spec.shape};
    rule.expert = spec.expert;
    if (const auto at = part.find(spec.name); at != part.end()) {
      std::tie(rule.merged_shard, rule.merged_row) = at->second;
      std::tie(rule.merged_shards, rule.merged_rows) = merged.at(rule.param);
    }
    return rule;
  };
  for (const auto& spec : specs) {
    const auto scale = fp8_weight_of_scale(spec.name);
    const auto weight = scale ? by_name.find(scale->first) : by_name.end();
    Rule rule;
    if (weight != by_name.end()) {
      // ("...qkv_proj.weight_scale_inv", "...experts.w13_weight_scale",
      // "...gate_up_proj.input_scale")
      rule = rule_of(*weight->second);
      const std::string leaf = fp8_scale_leaf(scale->second);  // (the param ends in "weight")
      rule.param = rule.param.substr(0, rule.param.size() - 6) +
                   (scale->second == Fp8Scale::kInput ? leaf : "weight" + leaf.substr(6));
      rule.fp8_scale = scale->second;
      rule.weight_shape = rule.source_shape;
      rule.source_shape = spec.shape;
    } else {
      rule = rule_of(spec);
    }
    rule.param_dtype = spec.param_dtype;
    rules_.emplace_back(spec.name, rule);
  }
  std::sort(rules_.begin(), rules_.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  by_hash_.reserve(rules_.size());
  for (std::size_t i = 0; i < rules_.size(); ++i)
    by_hash_.emplace_back(std::hash<std::string>{}(rules_[i].first), static_cast<std::uint32_t>(i));
  std::sort(by_hash_.begin(), by_hash_.end());
}

// vLLM's block checks (validate_fp8_block_shape, Fp8MoEMethod): each rank's
// share of a quantized weight's output rows is whole blocks for merged layers
// (q/k/v, gate/up) and split experts, and its share of a row-parallel layer's
// or split experts' input columns where tp splits them.
void ShardingRules::check_fp8_blocks() const {
  const Fp8Checkpoint& fp8 = config_.fp8;
  if (!fp8.quantized()) return;  // (the block checks below: block FP8 only)
  auto need = [&](std::int64_t size, std::int64_t block, const std::string& what) {
    if (size % block != 0)
      raise<ModelError>("cannot load the FP8 checkpoint with tp ", tp_size_, ": ", what, " ", size,
                        " is not a multiple of the block ", block, " (weight_block_size [",
                        fp8.block_n, ", ", fp8.block_k, "]; vLLM refuses it too)");
  };
  // A fused parameter is quantized whole or not at all.
  std::unordered_map<std::string_view, const std::pair<std::string, Rule>*> first_part;
  first_part.reserve(rules_.size());
  for (const auto& entry : rules_) {
    const auto [it, fresh] = first_part.emplace(entry.second.param, &entry);
    if (fresh) continue;
    const auto& [other, other_rule] = *it->second;
    if (other_rule.param_dtype != entry.second.param_dtype) {
      const bool this_one = entry.second.param_dtype == DType::kFloat8E4M3;
      raise<ModelError>("the FP8 checkpoint quantizes '", this_one ? entry.first : other,
                        "' but not '", this_one ? other : entry.first, "', which vLLM fuses into '",
                        entry.second.param,
                        "': ignored_layers must list all of a fused layer's parts or none (vLLM "
                        "refuses it too)");
    }
  }
  if (!fp8.blocks()) return;
  for (const auto& [name, rule] : rules_) {
    if (rule.fp8_scale != Fp8Scale::kGrid) continue;
    const std::string of = "'" + name.substr(0, name.size() - 10) + "'";  // (no "_scale_inv")
    const auto& w = rule.weight_shape;
    if (rule.kind == ShardKind::kColumn && (rule.role == Role::kK || rule.role == Role::kV))
      need(kv_heads_per_rank() * config_.head_dim, fp8.block_n, "the rows per rank of " + of);
    else if (rule.kind == ShardKind::kColumn)
      need(w[0] / tp_size_, fp8.block_n, "the rows per rank of " + of);
    else if (rule.kind == ShardKind::kRow && tp_size_ > 1)
      need(w[1] / tp_size_, fp8.block_k, "the columns per rank of " + of);
    else if (rule.kind == ShardKind::kExpertGateUp)
      need(local_moe_intermediate(), fp8.block_n, "the rows per rank of " + of);
    else if (rule.kind == ShardKind::kExpertDown && !expert_parallel_ && tp_size_ > 1)
      need(local_moe_intermediate(), fp8.block_k, "the columns per rank of " + of);
    else if (rule.merged_shards > 0 && rule.merged_shard + 1 < rule.merged_shards)
      need(w[0], fp8.block_n, "the rows of " + of + " (a part of a merged replicated layer)");
  }
}

void ShardingRules::build_params() {
  const auto& c = config_;
  const std::int64_t q_local = c.num_attention_heads / tp_size_ * c.head_dim;
  const std::int64_t qkv_rows = q_local + 2 * kv_heads_per_rank() * c.head_dim;
  std::unordered_set<std::string_view> seen;  // params_ is sorted only at the end
  seen.reserve(rules_.size());
  for (const auto& [name, rule] : rules_) {
    if (!seen.insert(rule.param).second) continue;
    const NameParts p = split_name(rule.param);
    // (an FP8 scale grid: the weight's local shape first, in blocks at the end)
    ParamSpec spec{rule.param, rule.fp8_scale ? rule.weight_shape : rule.source_shape,
                   rule.param_dtype.value_or(c.dtype), rule.kind, layer_of(rule.param)};
    const std::int64_t experts = local_experts(), expert_inter = local_moe_intermediate();
    if (rule.kind == ShardKind::kVocab) spec.shape[0] = padded_vocab_ / tp_size_;
    if (p.module == "qkv_proj") {
      spec.shape[0] = qkv_rows;
      spec.shards = 3;
    }
    // Gate and up merged (the dense MLP's, Qwen2-MoE's shared expert's, or
    // Granite's shared MLP's input_linear).
    if (rule.kind == ShardKind::kColumn && (rule.role == Role::kGate || rule.role == Role::kUp)) {
      spec.shape[0] = 2 * (rule.fp8_scale ? rule.weight_shape : rule.source_shape)[0] / tp_size_;
      spec.shards = 2;
    }
    if (rule.kind == ShardKind::kExpertGateUp) {
      spec.shape = {experts, 2 * expert_inter, c.hidden_size};
      spec.shards = static_cast<std::uint32_t>(2 * experts);
    }
    if (rule.kind == ShardKind::kExpertDown) {
      spec.shape = {experts, c.hidden_size, expert_inter};
      spec.shards = static_cast<std::uint32_t>(experts);
    }
    if (rule.kind == ShardKind::kColumn && rule.role == Role::kWhole) spec.shape[0] /= tp_size_;
    if (rule.merged_shards > 0) {
      spec.shape[0] = rule.merged_rows;
      spec.shards = rule.merged_shards;
    }
    if (rule.kind == ShardKind::kRow) spec.shape[1] /= tp_size_;
    if (rule.fp8_scale == Fp8Scale::kGrid) {
      spec.shape = fp8_scale_shape(c.fp8, Fp8Scale::kGrid, spec.shape);
    } else if (rule.fp8_scale) {  // per tensor: one per expert, else one; a staged one per shard
      spec.shape = rule.fp8_scale == Fp8Scale::kWeight && rule.expert >= 0
                       ? std::vector<std::int64_t>{experts}
                       : std::vector<std::int64_t>{};
      spec.staged = true;
    }
    if (rule.kind == ShardKind::kHeads)
      spec.shape[0] =
          rule.role == Role::kQ ? c.num_attention_heads / tp_size_ : kv_heads_per_rank();
    const bool quantized = quantization_ == "int8" && spec.layer >= 0 && spec.shape.size() == 2 &&
                           (rule.kind == ShardKind::kColumn || rule.kind == ShardKind::kRow);
    if (quantized) {
      spec.dtype = DType::kInt8;
      ParamSpec scale{p.prefix + p.module + ".weight_scale",
                      {spec.shape[0]},
                      DType::kFloat32,
                      rule.kind,
                      spec.layer};
      scale.from_checkpoint = false;
      params_.push_back(scale);
    }
    if (online_fp8(quantization_) && fp8_quantized_weight(kOnlineFp8, name)) {
      spec.dtype = DType::kFloat8E4M3;
      spec.quantize_fp8 = true;
      const bool expert =
          rule.kind == ShardKind::kExpertGateUp || rule.kind == ShardKind::kExpertDown;
      ParamSpec scale{"", {expert ? experts : 1}, DType::kFloat32, rule.kind, spec.layer};
      if (const std::int64_t b = online_fp8_block(quantization_)) {
        // (a grid per expert, over the expert's rows)
        scale.shape = spec.shape;
        for (std::size_t d = scale.shape.size() - 2; d < scale.shape.size(); ++d)
          scale.shape[d] = (scale.shape[d] + b - 1) / b;
      }
      scale.name = rule.param + online_scale_suffix(quantization_);
      scale.from_checkpoint = false;
      params_.push_back(scale);
    }
    params_.push_back(spec);
  }
  // The family's derived parameters: split by heads as their weight is.
  if (const auto derived = families::of(c).derived; derived && holds_derived_)
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
      for (const families::DerivedParam& d : derived(c, l, tp_size_)) {
        const HeadRows& w = d.window;
        ParamSpec spec{d.name,
                       {w.heads, w.transpose ? w.cols : w.rows, w.transpose ? w.rows : w.cols},
                       c.dtype,
                       ShardKind::kColumn,
                       l};
        spec.from_checkpoint = false;
        params_.push_back(std::move(spec));
      }
  std::sort(params_.begin(), params_.end(),
            [](const ParamSpec& a, const ParamSpec& b) { return a.name < b.name; });
  // Slots are positions in the sorted list: resolve the int8 scales and the rules.
  for (ParamSpec& spec : params_)
    if (spec.dtype == DType::kInt8 || spec.quantize_fp8)
      spec.scale_slot = find_slot(
          spec.name + (spec.quantize_fp8 ? online_scale_suffix(quantization_) : "_scale"));
  for (auto& [name, rule] : rules_) rule.slot = find_slot(rule.param);
  build_derived();
}

// Each derived parameter's step: its weight's slot, and the scale that
// dequantizes it (int8's rows, online FP8's, or an FP8 checkpoint's grid or
// per-tensor scale).
void ShardingRules::build_derived() {
  const auto derived = families::of(config_).derived;
  if (!derived) return;
  for (std::int64_t l = 0; l < config_.num_hidden_layers; ++l)
    for (const families::DerivedParam& d : derived(config_, l, tp_size_)) {
      const ParamSlot from = find_slot(d.from), out = holds_derived_ ? find_slot(d.name) : kNoSlot;
      if (from == kNoSlot || (holds_derived_ && out == kNoSlot))
        raise<ModelError>("derived parameter '", d.name, "' of '", d.from, "': no such parameter");
      DerivedStep step{l, out, from, kNoSlot, d.window};
      const ParamSpec& w = params_[from];
      const std::string base = d.from.substr(0, d.from.size() - 6);  // (without "weight")
      HeadRows& window = step.window;
      if (w.dtype == DType::kInt8) {
        step.scale = w.scale_slot;
        window.scale_kind = HeadRows::Scale::kRow;
      } else if (w.quantize_fp8) {
        step.scale = w.scale_slot;
        window.block_n = window.block_k = online_fp8_block(quantization_);
        window.scale_kind = window.block_n ? HeadRows::Scale::kBlocks : HeadRows::Scale::kTensor;
      } else if (w.dtype == DType::kFloat8E4M3 && config_.fp8.blocks()) {
        step.scale = find_slot(base + "weight_scale_inv");
        window.scale_kind = HeadRows::Scale::kBlocks;
        window.block_n = config_.fp8.block_n;
        window.block_k = config_.fp8.block_k;
      } else if (w.dtype == DType::kFloat8E4M3) {
        step.scale = find_slot(base + "weight_scale");
        window.scale_kind = HeadRows::Scale::kTensor;
      }
      if (window.scale_kind != HeadRows::Scale::kNone && step.scale == kNoSlot)
        raise<ModelError>("derived parameter '", d.name, "': '", d.from, "' has no scale");
      if (holds_derived_)
        derived_.push_back(step);
      else  // (what a step would dequantize, the model's own tensors hold)
        left_out_.push_back({d.name, d.from, window.scale_kind != HeadRows::Scale::kNone});
    }
}

ParamSlot ShardingRules::find_slot(const std::string& name) const {
  const ParamSpec* spec = find_param(name);
  if (!spec && name.find(".base_layer.") != std::string::npos)
    spec = find_param(strip_base_layer(name));
  if (!spec && name.find(kRoutedExperts) != std::string::npos)
    spec = find_param(strip_routed_experts(name));
  return spec ? static_cast<ParamSlot>(spec - params_.data()) : kNoSlot;
}

const ParamSpec* ShardingRules::find_param(const std::string& name) const {
  const auto it =
      std::lower_bound(params_.begin(), params_.end(), name,
                       [](const ParamSpec& p, const std::string& n) { return p.name < n; });
  return it != params_.end() && it->name == name ? &*it : nullptr;
}

const ShardingRules::Rule* ShardingRules::find_rule(const std::string& checkpoint_name) const {
  const std::size_t hash = std::hash<std::string>{}(checkpoint_name);
  for (auto it = std::lower_bound(by_hash_.begin(), by_hash_.end(), std::pair(hash, 0u));
       it != by_hash_.end() && it->first == hash; ++it)
    if (rules_[it->second].first == checkpoint_name) return &rules_[it->second].second;
  return nullptr;
}

std::optional<Placement> ShardingRules::place(const std::string& checkpoint_name, int tp_rank,
                                              SkipReason* why, bool names) const {
  if (why) *why = SkipReason::kNone;
  const Rule* rule = find_rule(checkpoint_name);
  if (!rule) {
    if (why)
      *why = checkpoint_name == "lm_head.weight" && config_.tie_word_embeddings
                 ? SkipReason::kTiedHead
                 : SkipReason::kNoParameter;
    return std::nullopt;
  }
  Placement pl;
  if (names) {
    pl.checkpoint_name = checkpoint_name;
    pl.param = rule->param;
  }
  pl.slot = rule->slot;
  if (!rule->fp8_scale) {
    place_rule(*rule, rule->source_shape, tp_rank, pl);
    return pl;
  }
  place_rule(*rule, rule->weight_shape, tp_rank, pl);  // placed as its weight, then in blocks
  if (*rule->fp8_scale == Fp8Scale::kGrid) {
    to_blocks(*rule, pl);
    return pl;
  }
  // A per-tensor scale: whole, staged as its weight's shard.
  pl.source_shape = rule->source_shape;
  pl.source_dim = -1;
  pl.source_start = pl.source_length = 0;
  pl.dest_row = pl.shard;
  pl.zero_rows_from = -1;
  return pl;
}

std::string scale_step_problem(const ShardingRules& rules, const ScaleStep& step, int tp_rank,
                               Brought scale, Brought weight) {
  const bool has_weight = step.weight != kNoSlot;
  if (!has_weight) weight = scale;
  if ((scale == Brought::kAll && weight == Brought::kAll) ||
      (scale == Brought::kNone && weight == Brought::kNone))
    return "";
  const auto& params = rules.params();
  if (step.quantize)
    return detail::concat("online FP8 layer ", step.layer, " on tp rank ", tp_rank,
                          ": this load brings only part of '", params[step.weight].name,
                          "': a weight is quantized with one scale over all of it (each expert's "
                          "over the expert), so a load must bring all of it or none");
  const ParamSlot part = scale != Brought::kAll ? step.scale : step.weight;
  const ParamSlot other = part == step.scale ? step.weight : step.scale;
  const bool none = (part == step.scale ? scale : weight) == Brought::kNone;
  return detail::concat(
      "per-tensor FP8 layer ", step.layer, " on tp rank ", tp_rank, ": this load brings ",
      none ? "none of '" : "only part of '", params[part].name, "'",
      has_weight ? detail::concat(", beside '", params[other].name, "'") : std::string(),
      ": a fused weight is requantized to the largest of all its parts' scales, so a load "
      "must bring every part's weight and scale, or none");
}

std::vector<ScaleStep> ShardingRules::scale_steps(int tp_rank) const {
  std::vector<ScaleStep> steps;
  if (online_fp8(quantization_)) {  // whole weights, experts apart (same on every rank)
    const std::int64_t block = online_fp8_block(quantization_);
    for (ParamSlot slot = 0; slot < params_.size(); ++slot) {
      const ParamSpec& w = params_[slot];
      if (!w.quantize_fp8) continue;
      const std::int64_t experts = w.shape.size() == 3 ? w.shape[0] : 1;
      const std::int64_t rows = param_rows(w.shape) / experts;
      // (a grid's rows per expert; one scale per expert without blocks)
      const std::int64_t grid_rows = block ? (rows + block - 1) / block : 1;
      for (std::int64_t e = 0; e < experts; ++e) {
        ScaleStep step{w.layer, w.scale_slot, 0, 0, e * grid_rows, slot, e * rows, rows};
        step.quantize = true;
        step.block = block;
        steps.push_back(step);
      }
    }
    return steps;
  }
  if (!config_.fp8.per_tensor) return steps;
  for (const auto& [name, rule] : rules_) {
    if (!rule.fp8_scale) continue;
    const std::optional<Placement> pl = place(name, tp_rank);
    if (!pl || !pl->held) continue;  // (an expert another rank holds)
    const ParamSpec& scale = params_[rule.slot];
    ScaleStep step{scale.layer, rule.slot, 0, scale.shards, 0};
    if (rule.fp8_scale == Fp8Scale::kWeight && rule.kind == ShardKind::kExpertGateUp) {
      step.first = pl->shard / 2 * 2;  // the expert's gate and up
      step.count = 2;
      step.out_row = pl->shard / 2;
    } else if (rule.fp8_scale == Fp8Scale::kWeight && rule.kind == ShardKind::kExpertDown) {
      step.first = pl->shard;  // as it is: w2 is not requantized
      step.count = 1;
      step.out_row = pl->shard;
      steps.push_back(step);
      continue;
    }
    if (rule.fp8_scale == Fp8Scale::kWeight) {
      const std::optional<Placement> w = place(fp8_weight_of_scale(name)->first, tp_rank);
      const std::vector<std::int64_t> slice = w->slice_shape();
      step.weight = w->slot;
      step.row = w->dest_row;
      step.rows = slice.empty() ? 1 : slice[0];  // (rows of the last dimension: a 2-D slice's)
      step.from = w->shard;
    }
    const bool repeated =  // (an input_scale's max: once for its parts)
        step.weight == kNoSlot && std::any_of(steps.begin(), steps.end(), [&](const ScaleStep& s) {
          return s.scale == step.scale && s.out_row == step.out_row && s.weight == kNoSlot;
        });
    if (!repeated) steps.push_back(step);
  }
  std::stable_sort(steps.begin(), steps.end(),
                   [](const ScaleStep& a, const ScaleStep& b) { return a.layer < b.layer; });
  return steps;
}

void ShardingRules::place_rule(const Rule& rule, const std::vector<std::int64_t>& shape,
                               int tp_rank, Placement& pl) const {
  pl.source_shape = shape;
  if (rule.kind == ShardKind::kVocab) {
    const std::int64_t per = padded_vocab_ / tp_size_, start = tp_rank * per;
    const std::int64_t length = std::clamp<std::int64_t>(config_.vocab_size - start, 0, per);
    pl.source_dim = 0;
    pl.source_start = std::min(start, config_.vocab_size);
    pl.source_length = length;
    if (length < per) pl.zero_rows_from = length;
  } else if (rule.kind == ShardKind::kRow) {
    const std::int64_t per = shape[1] / tp_size_;
    pl.source_dim = 1;
    pl.source_start = tp_rank * per;
    pl.source_length = per;
  } else if (rule.kind == ShardKind::kHeads) {  // (the heads q's and k's rows hold)
    const bool q = rule.role == Role::kQ;
    pl.source_dim = 0;
    pl.source_length = q ? config_.num_attention_heads / tp_size_ : kv_heads_per_rank();
    pl.source_start = q ? tp_rank * pl.source_length : kv_head_start(tp_rank);
  } else if (rule.kind == ShardKind::kColumn) {
    place_column(rule, shape[0], tp_rank, pl);
  } else if (rule.kind == ShardKind::kExpertGateUp || rule.kind == ShardKind::kExpertDown) {
    place_expert(rule, tp_rank, pl);
  } else if (rule.merged_shards > 0) {  // (whole, at the rows of the parts before it)
    pl.shard = rule.merged_shard;
    pl.dest_row = rule.merged_row;
  }
}

// A weight's placement `pl` as its scale grid's: the slice and the rows it
// lands at in blocks (a whole dimension: the whole grid's, which rounds up).
// check_fp8_blocks() made every split whole blocks.
void ShardingRules::to_blocks(const Rule& rule, Placement& pl) const {
  const std::int64_t bn = config_.fp8.block_n, bk = config_.fp8.block_k;
  const std::vector<std::int64_t>& w = rule.weight_shape;
  const std::size_t rows_dim = w.size() - 2;
  pl.source_shape = rule.source_shape;
  if (!pl.held) return;
  if (pl.source_dim >= 0) {
    const std::int64_t block = static_cast<std::size_t>(pl.source_dim) == rows_dim ? bn : bk;
    const std::int64_t whole = w[static_cast<std::size_t>(pl.source_dim)];
    pl.source_start /= block;
    pl.source_length = pl.source_length == whole
                           ? rule.source_shape[static_cast<std::size_t>(pl.source_dim)]
                           : pl.source_length / block;
  }
  // Rows of the parameter's last dimension: a down projection's expert e at
  // e x (its grid's rows), every other at its weight's row over the block.
  if (rule.kind == ShardKind::kExpertDown)
    pl.dest_row = pl.dest_row / config_.hidden_size * rule.source_shape[rows_dim];
  else  // (a merged replicated part's: the rows before it round up, as vLLM's)
    pl.dest_row = (pl.dest_row + bn - 1) / bn;
}

void ShardingRules::place_column(const Rule& rule, std::int64_t rows, int tp_rank,
                                 Placement& pl) const {
  const auto& c = config_;
  const std::int64_t q_local = c.num_attention_heads / tp_size_ * c.head_dim;
  const std::int64_t kv_local = kv_heads_per_rank() * c.head_dim;
  pl.source_dim = 0;
  if (rule.role == Role::kK || rule.role == Role::kV) {
    pl.shard = rule.role == Role::kK ? 1 : 2;
    pl.source_start = kv_head_start(tp_rank) * c.head_dim;
    pl.source_length = kv_local;
    pl.dest_row = q_local + (rule.role == Role::kV ? kv_local : 0);
  } else {  // q, gate, up
    const std::int64_t per = rows / tp_size_;
    pl.shard = rule.role == Role::kUp ? 1 : 0;
    pl.source_start = tp_rank * per;
    pl.source_length = per;
    pl.dest_row = rule.role == Role::kUp ? per : 0;
  }
}

// An expert's gate/up rows land at rows [2 x e x I_local (+ I_local for up), ...)
// of w13 viewed as rows of hidden; its down_proj at rows [e x hidden, ...) of w2
// viewed as rows of I_local. Tensor-parallel experts take the rank's rows
// (gate/up) or columns (down) of every expert; expert parallelism takes whole
// experts, each on one rank.
void ShardingRules::place_expert(const Rule& rule, int tp_rank, Placement& pl) const {
  const std::int64_t inter = local_moe_intermediate(), hidden = config_.hidden_size;
  std::int64_t local = rule.expert;
  if (expert_parallel_) {
    const std::int64_t per = local_experts();
    if (rule.expert / per != tp_rank) {
      pl.held = false;
      return;
    }
    local = rule.expert - tp_rank * per;
  }
  if (rule.kind == ShardKind::kExpertGateUp) {
    const bool up = rule.role == Role::kUp;
    pl.shard = static_cast<std::uint32_t>(2 * local + (up ? 1 : 0));
    pl.dest_row = 2 * local * inter + (up ? inter : 0);
    if (!expert_parallel_) {
      pl.source_dim = 0;
      pl.source_start = tp_rank * inter;
      pl.source_length = inter;
    }
  } else {
    pl.shard = static_cast<std::uint32_t>(local);
    pl.dest_row = local * hidden;
    if (!expert_parallel_) {
      pl.source_dim = 1;
      pl.source_start = tp_rank * inter;
      pl.source_length = inter;
    }
  }
}

std::unique_ptr<WeightSource> loader_view(WeightSource& source, const ModelConfig& config) {
  if (source.kernel_format()) return nullptr;
  std::vector<RowSplit> stacked = stacked_checkpoint_tensors(config);
  if (stacked.empty()) return nullptr;
  return make_row_split_source(source, std::move(stacked), config.architecture + "'s config");
}

}  // namespace tpreload
