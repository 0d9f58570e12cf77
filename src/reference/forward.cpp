// The reference forward pass (CPU, float32 compute) over a TensorParallelModel's
// parameters: embedding, RMSNorm, DeepSeek's multi-head latent attention,
// (Cohere: LayerNorm), rotary attention with grouped-query heads (Gemma 2 and
// 3, OLMo 3: sliding windows; the Gemmas: scaled, soft-capped; Granite: its
// multipliers; OLMo: post-norms and whole-projection q/k norms; GLM-4, ERNIE
// 4.5 and Cohere: interleaved rotary; Cohere: attention and MLP in parallel), the
// norms layer_norms() names, the SiLU- or GeLU-gated MLP or
// experts and the LM head. Row-parallel outputs and vocab-parallel pieces are
// summed over the TP group.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/core/float8.h"
#include "tpreload/core/quantization.h"
#include "tpreload/model/model.h"
#include "tpreload/model/torch_dtype.h"
#include "tpreload/reference/forward.h"

namespace tpreload {
namespace {

void allreduce_sum(at::Tensor& t, Communicator& comm) {
  if (comm.size() == 1) return;
  t = t.contiguous();
  comm.allreduce_floats(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()));
}

// `x` normed by its `variance` and scaled by `weight` (Gemma's: 1 + weight).
at::Tensor normed(const at::Tensor& x, const at::Tensor& variance, const at::Tensor& weight,
                  const ModelConfig& c) {
  const at::Tensor scale = weight.to(at::kFloat);
  return x * at::rsqrt(variance + c.rms_norm_eps) * (c.gemma_normalization ? scale + 1 : scale);
}

// RMSNorm over the last dimension; Cohere's LayerNorm (layer_norm, no bias)
// centres `x` on its mean first.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, const ModelConfig& c) {
  const at::Tensor centred = c.layer_norm ? x - x.mean({-1}, /*keepdim=*/true) : x;
  return normed(centred, centred.pow(2).mean({-1}, /*keepdim=*/true), weight, c);
}

// RMSNorm over a whole projection that the tp group holds split by columns
// (OLMo's q_norm and k_norm): `x` [tokens, local] is the rank's columns from
// `first` on of `whole`; the squares are summed over the group, where every
// column is held by `copies` ranks (replicated KV heads).
at::Tensor rms_norm_split(const at::Tensor& x, const at::Tensor& weight, std::int64_t first,
                          std::int64_t whole, std::int64_t copies, const ModelConfig& c,
                          Communicator& comm) {
  at::Tensor squares = x.pow(2).sum({-1}, /*keepdim=*/true);
  allreduce_sum(squares, comm);
  return normed(x, squares / static_cast<double>(copies * whole),
                weight.narrow(0, first, x.size(1)), c);
}

// The MLP's activation of its gate rows.
at::Tensor activate(const at::Tensor& gate, Activation activation) {
  switch (activation) {
    case Activation::kGeluTanh:
      return at::gelu(gate, "tanh");
    case Activation::kGelu:
      return at::gelu(gate);
    case Activation::kSilu:
      break;
  }
  return at::silu(gate);
}

// The rotary embedding of a head of `dim` dims: its frequencies,
// theta^(-2i/dim), scaled as `s` says (the config's, or the sliding layers'),
// and the factor cos and sin are multiplied by (vLLM's
// LinearScalingRotaryEmbedding, Llama3RotaryEmbedding and
// YaRNScalingRotaryEmbedding: llama3 keeps the high frequencies, divides the
// low ones by the factor and blends those between; yarn blends the same way
// over pairs bounded by rotation counts within the original context, and
// scales cos and sin; DynamicNTKScalingRotaryEmbedding's base for the
// extended context, DynamicNTKAlphaRotaryEmbedding's with alpha;
// Phi3LongRoPEScaledRotaryEmbedding's per-pair factors, the long ones where
// the model's context exceeds the original one). Throws ModelError for a
// scaling it does not compute.
struct Rope {
  at::Tensor inv_freq;
  double scale = 1;
  bool interleaved = false;  // (GLM-4's pairs: ModelConfig::rope_interleaved)
};

Rope scaled_rope(double theta, const RopeScaling& s, std::int64_t dim) {
  auto frequencies = [&](double base) {
    return 1.0 / at::pow(base, at::arange(0, dim, 2, at::kDouble) / static_cast<double>(dim));
  };
  const at::Tensor inv = frequencies(theta);
  if (s.type == "default") return {inv};
  if (s.type != "linear" && s.type != "llama3" && s.type != "yarn" && s.type != "dynamic" &&
      s.type != "longrope")
    raise<ModelError>("forward: rope_type '", s.type, "' (", s.source, " ", s.json,
                      ") is not computed here (default, linear, llama3, yarn, dynamic and "
                      "longrope are); reloading its weights is not affected");
  auto needs = [&](const char* key, double value) {
    if (!(value > 0))
      raise<ModelError>("forward: rope_type '", s.type, "' needs a positive '", s.source, ".", key,
                        "' (", s.json, ")");
  };
  if (s.type == "longrope") {
    needs("original_max_position_embeddings", s.original_max_position_embeddings);
    needs("max_position_embeddings", s.max_position_embeddings);
    for (const auto& [key, list] :
         {std::pair{"short_factor", &s.short_factor}, std::pair{"long_factor", &s.long_factor}})
      if (static_cast<std::int64_t>(list->size()) != dim / 2 ||
          !std::all_of(list->begin(), list->end(), [](double f) { return f > 0; }))
        raise<ModelError>("forward: rope_type 'longrope' needs ", dim / 2, " positive '", s.source,
                          ".", key, "' values (one per rotary pair), got ", list->size());
    // The long factors wherever the model's context exceeds the original
    // one, as vLLM picks them (by its max_model_len, the model's unless set
    // lower), not by the sequence's length as Hugging Face does.
    const double original = s.original_max_position_embeddings;
    const bool long_context = s.max_position_embeddings > original;
    const std::vector<double>& factors = long_context ? s.long_factor : s.short_factor;
    const double scale = s.max_position_embeddings / original;
    const double derived = scale <= 1 ? 1 : std::sqrt(1 + std::log(scale) / std::log(original));
    const double mscale = long_context ? s.long_mscale : s.short_mscale;
    return {inv / at::tensor(factors, at::kDouble), mscale > 0 ? mscale : derived};
  }
  if (s.type == "dynamic") {  // (vLLM's base for the context extended by the factor)
    const double d = static_cast<double>(dim);
    if (s.alpha > 0) return {frequencies(theta * std::pow(s.alpha, d / (d - 2)))};
    needs("factor", s.factor);
    return {frequencies(theta * std::pow(s.factor * s.factor - s.factor + 1, d / (d - 2)))};
  }
  needs("factor", s.factor);
  if (s.type == "linear") return {inv / s.factor};
  needs("original_max_position_embeddings", s.original_max_position_embeddings);
  const double context = s.original_max_position_embeddings;
  if (s.type == "yarn") {
    needs("beta_fast", s.beta_fast);
    needs("beta_slow", s.beta_slow);
    // The pair index at which a frequency turns `rotations` times in the
    // original context; the blend runs from beta_fast's pair to beta_slow's.
    const double d = static_cast<double>(dim);
    auto pair_of = [&](double rotations) {
      return d * std::log(context / (rotations * 2 * M_PI)) / (2 * std::log(theta));
    };
    double low = pair_of(s.beta_fast), high = pair_of(s.beta_slow);
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, d - 1);
    if (low == high) high += 0.001;
    const at::Tensor ramp = ((at::arange(dim / 2, at::kDouble) - low) / (high - low)).clamp(0, 1);
    const at::Tensor kept = (1 - ramp) * s.extrapolation_factor;
    const double magnitude =
        s.apply_yarn_scaling && s.factor > 1 ? 0.1 * std::log(s.factor) + 1 : 1.0;
    return {inv / s.factor * (1 - kept) + inv * kept, magnitude * s.attn_factor};
  }
  needs("low_freq_factor", s.low_freq_factor);
  needs("high_freq_factor", s.high_freq_factor);
  const at::Tensor wavelen = 2 * M_PI / inv;
  const at::Tensor smooth =
      s.high_freq_factor == s.low_freq_factor
          ? at::zeros_like(inv)
          : (context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return {at::where(wavelen < context / s.high_freq_factor, inv,
                    at::where(wavelen > context / s.low_freq_factor, inv / s.factor,
                              (1 - smooth) * inv / s.factor + smooth * inv))};
}

// The rope of a head of `dim` rotary dims, on interleaved pairs where asked
// (ModelConfig::rope_interleaved). longrope on such pairs is refused: vLLM's
// Phi3LongRoPEScaledRotaryEmbedding refuses GPT-J's pairs (GLM-4) or turns
// halves whatever the model asks (ERNIE 4.5).
Rope rope_of(double theta, const RopeScaling& s, std::int64_t dim, bool interleaved) {
  if (interleaved && s.type == "longrope")
    raise<ModelError>("forward: rope_type 'longrope' (", s.source, " ", s.json,
                      ") on interleaved pairs is not computed here, as vLLM computes it on "
                      "halves only; reloading the weights is not affected");
  Rope r = scaled_rope(theta, s, dim);
  r.interleaved = interleaved;
  return r;
}

// The dimensions of a head that rotary turns: head_dim x partial_rotary_factor,
// truncated (vLLM's get_rope). Throws ModelError for none or an odd count.
std::int64_t rotary_dims(const ModelConfig& c) {
  const auto dims = static_cast<std::int64_t>(c.head_dim * c.partial_rotary_factor);
  if (dims <= 0 || dims % 2 != 0)
    raise<ModelError>("forward: partial_rotary_factor ", c.partial_rotary_factor, " of head_dim ",
                      c.head_dim, " turns ", dims,
                      " dimensions; rotary needs a positive even count");
  return dims;
}

// The rotary embedding on [tokens, heads, head_dim], over the first 2 x
// inv_freq's length dimensions of each head (the rest pass through: partial
// rotary): pair i is dimensions (i, i + half) (Hugging Face's rotate-half), or
// (2i, 2i + 1) where the rope is interleaved.
at::Tensor apply_rope(const at::Tensor& x, const Rope& rope) {
  const std::int64_t tokens = x.size(0), half = rope.inv_freq.size(0);
  const at::Tensor freqs = at::outer(at::arange(tokens, at::kDouble), rope.inv_freq);
  at::Tensor turned;
  if (rope.interleaved) {
    const at::Tensor cos = (freqs.cos() * rope.scale).to(at::kFloat).unsqueeze(1);
    const at::Tensor sin = (freqs.sin() * rope.scale).to(at::kFloat).unsqueeze(1);
    const at::Tensor pairs = x.narrow(2, 0, 2 * half).reshape({tokens, x.size(1), half, 2});
    const at::Tensor even = pairs.select(3, 0), odd = pairs.select(3, 1);
    turned = at::stack({even * cos - odd * sin, odd * cos + even * sin}, 3)
                 .reshape({tokens, x.size(1), 2 * half});
  } else {
    const at::Tensor emb = at::cat({freqs, freqs}, -1);
    const at::Tensor cos = (emb.cos() * rope.scale).to(at::kFloat).unsqueeze(1);
    const at::Tensor sin = (emb.sin() * rope.scale).to(at::kFloat).unsqueeze(1);
    const at::Tensor x1 = x.narrow(2, 0, half), x2 = x.narrow(2, half, half);
    turned = x.narrow(2, 0, 2 * half) * cos + at::cat({-x2, x1}, -1) * sin;
  }
  if (2 * half == x.size(2)) return turned;
  return at::cat({turned, x.narrow(2, 2 * half, x.size(2) - 2 * half)}, -1);
}

// cap x tanh(x / cap); x itself when cap is 0 (Gemma 2's soft-capping).
at::Tensor soft_cap(const at::Tensor& x, double cap) {
  return cap > 0 ? at::tanh(x / cap) * cap : x;
}

// Causal attention of layer `layer` on [tokens, heads, head_dim]: scores scaled
// by attention_multiplier (Granite's), else query_pre_attn_scalar^-1/2 (or head_dim's),
// soft-capped, and (sliding layers) limited to the sliding_window latest positions.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const ModelConfig& c, std::int64_t layer) {
  const std::int64_t tokens = q.size(0);
  const double scale =
      c.attention_multiplier > 0
          ? c.attention_multiplier  // (Granite's)
          : 1 / std::sqrt(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar
                                                      : static_cast<double>(q.size(2)));
  at::Tensor scores = at::einsum("thd,shd->hts", {q, k}) * scale;
  scores = soft_cap(scores, c.attn_logit_softcapping);
  at::Tensor mask = at::ones({tokens, tokens}, at::kBool).triu(1);  // (later positions)
  if (c.sliding_layer(layer))  // and those sliding_window or more before
    mask = mask | at::ones({tokens, tokens}, at::kBool).tril(-c.sliding_window);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  return at::einsum("hts,shd->thd", {at::softmax(scores, -1), v});
}

// The forward pass over one model's parameters (read where they live: a
// parameter in device memory is copied to the host as it is used).
class Forward {
 public:
  explicit Forward(const TensorParallelModel& model) : model_(model) {}
  at::Tensor run(const std::vector<std::int64_t>& tokens, Communicator& comm) const;

 private:
  const ModelConfig& config() const { return model_.config(); }
  const ShardingRules& rules() const { return model_.rules(); }
  int tp_rank() const { return model_.options().tp_rank; }
  at::Tensor host_param(const std::string& name) const;
  at::Tensor weight_f32(const std::string& module) const;
  at::Tensor param_f32(const std::string& name) const;
  at::Tensor linear(const at::Tensor& x, const std::string& module, bool add_bias = true) const;
  at::Tensor dense_mlp(const at::Tensor& y, const std::string& prefix,
                       const char* gate_up = "gate_up_proj", const char* down = "down_proj") const;
  at::Tensor experts(const at::Tensor& y, const std::string& prefix) const;
  // GLM-4.5's routing weights and chosen experts [tokens, num_experts_per_tok]
  // from router logits, for the sparse block under `block` ("....mlp.").
  std::pair<at::Tensor, at::Tensor> sigmoid_group_routing(const at::Tensor& logits,
                                                          const std::string& block) const;
  // DeepSeek's rope (its yarn magnitude) and attention scale, from `rope`.
  std::pair<Rope, double> mla_rope(Rope rope) const;
  // The rank's heads of multi-head latent attention of layer prefix `p`, before
  // o_proj's sum over the group.
  at::Tensor mla_attention(const at::Tensor& x, const std::string& p, const Rope& rope,
                           double scale) const;

  const TensorParallelModel& model_;
  const ShardingRules& rules_ = model_.rules();
  const ModelOptions& options_ = model_.options();
};

// A parameter on the host (a copy for parameters in CUDA memory); undefined if absent.
at::Tensor Forward::host_param(const std::string& name) const {
  const at::Tensor t = model_.parameter_for_reload(name);
  return !t.defined() || t.device().is_cpu() ? t : t.to(at::kCPU);
}

at::Tensor Forward::weight_f32(const std::string& module) const {
  return param_f32(module + ".weight");
}

// A weight's values in float32: int8 times its per-row weight_scale; FP8 codes
// decoded (fp8::from_e4m3fn) times their scales: a block grid (weight_scale_inv,
// each scale over its block of rows and columns), one scale per expert, or one
// for the tensor (weight_scale: 0-dim, [1]); anything else converted.
at::Tensor Forward::param_f32(const std::string& name) const {
  const at::Tensor w = host_param(name);
  const ParamSpec* spec = rules().find_param(name);
  if (!spec || !dtype_is_float8(spec->dtype)) {
    if (w.scalar_type() != at::kChar) return w.to(at::kFloat);
    return w.to(at::kFloat) * host_param(name + "_scale").unsqueeze(1);
  }
  if (spec->dtype != DType::kFloat8E4M3)
    raise<ModelError>("the forward pass decodes float8_e4m3fn weights, not ",
                      dtype_name(spec->dtype), " ('", name, "')");
  static const at::Tensor table = [] {
    std::vector<float> v(256);
    for (int c = 0; c < 256; ++c) v[c] = fp8::from_e4m3fn(static_cast<std::uint8_t>(c));
    return at::tensor(v);
  }();
  const at::Tensor values =
      table.index({w.contiguous().view(at::kByte).to(at::kLong)}).view(w.sizes());
  if (const at::Tensor grid = host_param(name + "_scale_inv"); grid.defined()) {
    const std::int64_t n = w.size(-2), k = w.size(-1), d = w.dim();
    // (a checkpoint's blocks, or online fp8-block's)
    const bool ckpt = config().fp8.blocks();
    const std::int64_t online = online_fp8_block(options_.quantization);
    const at::Tensor full = grid.to(at::kFloat)
                                .repeat_interleave(ckpt ? config().fp8.block_n : online, d - 2)
                                .repeat_interleave(ckpt ? config().fp8.block_k : online, d - 1)
                                .narrow(d - 2, 0, n)
                                .narrow(d - 1, 0, k);
    return values * full;
  }
  const at::Tensor scale = host_param(name + "_scale");
  if (!scale.defined())
    raise<ModelError>("FP8 weight '", name, "' has no weight_scale or weight_scale_inv");
  if (w.dim() == 3 && scale.numel() == w.size(0))  // (one per expert)
    return values * scale.to(at::kFloat).view({w.size(0), 1, 1});
  return values * scale.to(at::kFloat).reshape({});
}

at::Tensor Forward::linear(const at::Tensor& x, const std::string& module, bool add_bias) const {
  at::Tensor y = at::matmul(x, weight_f32(module).t());
  const at::Tensor bias = host_param(module + ".bias");
  if (bias.defined() && add_bias) y = y + bias.to(at::kFloat);
  const at::Tensor a = host_param(module + ".lora_a");
  if (a.defined()) y = y + at::matmul(at::matmul(x, a.t()), host_param(module + ".lora_b").t());
  return y;
}

// The rank's share of a SwiGLU MLP under `p` ("model.layers.<l>.mlp.",
// Qwen2-MoE's "....mlp.shared_expert.", or Granite's "....shared_mlp." with
// input_linear and output_linear): column-parallel `gate_up` (gate rows, then
// up rows), row-parallel `down`; the sum over ranks is the MLP's output.
at::Tensor Forward::dense_mlp(const at::Tensor& y, const std::string& p, const char* gate_up_name,
                              const char* down) const {
  const at::Tensor gate_up = linear(y, p + gate_up_name);
  const std::int64_t inter = gate_up.size(1) / 2;
  // Row-parallel: down's (replicated) bias is added once, by tp rank 0.
  return linear(
      activate(gate_up.narrow(1, 0, inter), config().activation) * gate_up.narrow(1, inter, inter),
      p + down, /*add_bias=*/tp_rank() == 0);
}

// The rank's share of a sparse MoE block (Qwen2-MoE, Qwen3-MoE, Mixtral): the
// replicated router picks the top-k experts per token from a softmax
// (renormalised with norm_topk_prob); every local expert runs on the tokens
// routed to it, its SiLU-gated output weighted by the routing weight. With
// tensor-parallel experts the rank holds a slice of every expert's intermediate
// size; with expert parallelism whole experts. Qwen2-MoE adds its shared
// expert (tensor-parallel like a dense MLP) scaled by sigmoid of the replicated
// shared_expert_gate. Either way the sum over ranks is the block's output.
at::Tensor Forward::experts(const at::Tensor& y, const std::string& p) const {
  const ModelConfig& c = config();
  const std::string block = p + moe_names(c).module + ".";
  const at::Tensor logits = at::matmul(y, weight_f32(block + "gate").t());
  at::Tensor weights, chosen;
  if (c.sigmoid_routing) {
    std::tie(weights, chosen) = sigmoid_group_routing(logits, block);
  } else {
    at::Tensor probs = at::softmax(logits, -1);
    if (c.n_group > 1) {  // (DeepSeek-V2's group_limited_greedy: groups rated by their best)
      const std::int64_t tokens = probs.size(0), per_group = c.num_experts / c.n_group;
      const at::Tensor best = std::get<0>(probs.view({tokens, c.n_group, per_group}).max(-1));
      const at::Tensor kept = at::zeros({tokens, c.n_group}, at::kBool)
                                  .scatter_(1, std::get<1>(at::topk(best, c.topk_group, -1)), true)
                                  .unsqueeze(-1)
                                  .expand({tokens, c.n_group, per_group})
                                  .reshape({tokens, c.num_experts});
      probs = probs.masked_fill(kept.logical_not(), 0);
    }
    std::tie(weights, chosen) = at::topk(probs, c.num_experts_per_tok, -1);
    if (c.norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
    weights = weights * c.routed_scaling_factor;  // (DeepSeek-V2's; 1 for the others)
  }
  const at::Tensor w13 = param_f32(block + "experts.w13_weight");
  const at::Tensor w2 = param_f32(block + "experts.w2_weight");
  const std::int64_t local = w13.size(0), inter = w13.size(1) / 2;
  const std::int64_t first = options_.expert_parallel ? options_.tp_rank * local : 0;
  at::Tensor out = at::zeros({y.size(0), c.hidden_size}, at::kFloat);
  for (std::int64_t e = 0; e < local; ++e) {
    // Weight of expert first + e for each token (0 where it was not chosen).
    const at::Tensor token_weight = (weights * (chosen == first + e).to(at::kFloat)).sum(-1);
    const at::Tensor rows = token_weight.nonzero().squeeze(1);
    if (rows.numel() == 0) continue;
    const at::Tensor x = y.index_select(0, rows);
    const at::Tensor gate_up = at::matmul(x, w13[e].t());
    const at::Tensor act =
        activate(gate_up.narrow(1, 0, inter), c.activation) * gate_up.narrow(1, inter, inter);
    const at::Tensor expert_out =
        at::matmul(act, w2[e].t()) * token_weight.index_select(0, rows).unsqueeze(1);
    out.index_add_(0, rows, expert_out);
  }
  if (c.shared_expert_intermediate_size > 0)
    out += at::sigmoid(at::matmul(y, weight_f32(p + "mlp.shared_expert_gate").t())) *
           dense_mlp(y, p + "mlp.shared_expert.");
  if (c.shared_experts_intermediate_size > 0) out += dense_mlp(y, p + "mlp.shared_experts.");
  return out;
}

// GLM-4.5's routing (vLLM's grouped_topk with e_score_correction_bias and
// sigmoid scoring): scores sigmoid(logits); the experts split into n_group
// groups, each group rated by the sum of its two best scores plus the
// correction; the topk_group best groups kept; of their experts the
// num_experts_per_tok best by score plus correction chosen; each weighted by its
// score alone, renormalised with norm_topk_prob, times routed_scaling_factor.
std::pair<at::Tensor, at::Tensor> Forward::sigmoid_group_routing(const at::Tensor& logits,
                                                                 const std::string& block) const {
  const ModelConfig& c = config();
  const std::int64_t tokens = logits.size(0), per_group = c.num_experts / c.n_group;
  const at::Tensor scores = at::sigmoid(logits);
  const at::Tensor biased =
      scores + host_param(block + "gate.e_score_correction_bias").to(at::kFloat).unsqueeze(0);
  const at::Tensor group_rating = std::get<0>(at::topk(biased.view({tokens, c.n_group, per_group}),
                                                       std::min<std::int64_t>(2, per_group), -1))
                                      .sum(-1);
  const at::Tensor kept_groups = std::get<1>(at::topk(group_rating, c.topk_group, -1));
  const at::Tensor kept = at::zeros({tokens, c.n_group}, at::kBool)
                              .scatter_(1, kept_groups, true)
                              .unsqueeze(-1)
                              .expand({tokens, c.n_group, per_group})
                              .reshape({tokens, c.num_experts});
  const at::Tensor chosen = std::get<1>(
      at::topk(biased.masked_fill(kept.logical_not(), -INFINITY), c.num_experts_per_tok, -1));
  at::Tensor weights = scores.gather(1, chosen);
  if (c.norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  return {weights * c.routed_scaling_factor, chosen};
}

// vLLM's DeepseekScalingRotaryEmbedding (which deepseek_v2.py takes for
// "yarn"): yarn's frequencies, cos and sin times m(mscale) / m(mscale_all_dim)
// x attn_factor rather than yarn's own magnitude; the scores scaled by
// (qk_nope + qk_rope)^-1/2 x m(mscale_all_dim)^2, m(x) = 0.1 x ln(factor) + 1.
std::pair<Rope, double> Forward::mla_rope(Rope rope) const {
  const ModelConfig& c = config();
  const RopeScaling& s = c.rope_scaling;
  double scale = 1 / std::sqrt(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim));
  if (s.type != "yarn") return {rope, scale};
  auto m = [&](double x) { return s.factor <= 1 ? 1.0 : 0.1 * x * std::log(s.factor) + 1; };
  rope.scale = m(s.mscale) / m(s.mscale_all_dim) * s.attn_factor;
  return {rope, scale * m(s.mscale_all_dim) * m(s.mscale_all_dim)};
}

// As vLLM's MLA decode computes it: q's rotary-free part taken into the latent
// space through W_UK_T (the derived parameter), scored against the normed
// latent c_kv, and q's rotary part against the one rotary key every head
// shares; the weighted latents brought out through W_UV; o_proj's columns of
// the rank's heads.
at::Tensor Forward::mla_attention(const at::Tensor& x, const std::string& p, const Rope& rope,
                                  double scale) const {
  const ModelConfig& c = config();
  const std::int64_t n = x.size(0), heads = c.num_attention_heads / options_.tp_size;
  const std::int64_t nope = c.qk_nope_head_dim, pe = c.qk_rope_head_dim, lora = c.kv_lora_rank;
  const std::string a = p + "self_attn.", m = a + "mla_attn.mla_attn.";
  at::Tensor q, kv_a;
  if (c.q_lora_rank > 0) {
    const at::Tensor fused = linear(x, a + "fused_qkv_a_proj");
    q = linear(
        rms_norm(fused.narrow(1, 0, c.q_lora_rank), host_param(a + "q_a_layernorm.weight"), c),
        a + "q_b_proj");
    kv_a = fused.narrow(1, c.q_lora_rank, lora + pe);
  } else {
    q = linear(x, a + "q_proj");
    kv_a = linear(x, a + "kv_a_proj_with_mqa");
  }
  q = q.reshape({n, heads, nope + pe});
  const at::Tensor latent =
      rms_norm(kv_a.narrow(1, 0, lora), host_param(a + "kv_a_layernorm.weight"), c);
  const at::Tensor k_pe = apply_rope(kv_a.narrow(1, lora, pe).reshape({n, 1, pe}), rope).squeeze(1);
  const at::Tensor q_pe = apply_rope(q.narrow(2, nope, pe), rope);
  const at::Tensor q_latent =
      at::einsum("thp,hpl->thl", {q.narrow(2, 0, nope), param_f32(m + "W_UK_T")});
  at::Tensor scores =
      (at::einsum("thl,sl->hts", {q_latent, latent}) + at::einsum("thr,sr->hts", {q_pe, k_pe})) *
      scale;
  const at::Tensor later = at::ones({n, n}, at::kBool).triu(1);
  scores = scores.masked_fill(later, -std::numeric_limits<float>::infinity());
  const at::Tensor out_latent = at::einsum("hts,sl->thl", {at::softmax(scores, -1), latent});
  const at::Tensor out = at::einsum("thl,hlv->thv", {out_latent, param_f32(m + "W_UV")});
  return linear(out.reshape({n, heads * c.v_head_dim}), a + "o_proj", /*add_bias=*/false);
}

at::Tensor Forward::run(const std::vector<std::int64_t>& tokens, Communicator& comm) const {
  if (comm.size() != options_.tp_size || comm.rank() != options_.tp_rank)
    raise<UsageError>("forward: communicator is rank ", comm.rank(), "/", comm.size(),
                      " but the model is tp rank ", options_.tp_rank, "/", options_.tp_size);
  const ModelConfig& c = config();
  // (before any collective) Gemma 3's and OLMo 3's sliding layers turn apart;
  // MLA turns qk_rope_head_dim of each head (mla_rope).
  if (c.sigmoid_routing && !c.score_correction)
    raise<ModelError>("forward: ", c.architecture,
                      "'s sigmoid routing without "
                      "e_score_correction_bias (scoring_func sigmoid, topk_method other than "
                      "noaux_tc) is not computed here; reloading its weights is not affected");
  const bool mla = c.kv_lora_rank > 0;
  const std::int64_t rotary = mla ? c.qk_rope_head_dim : rotary_dims(c);
  const Rope rope = rope_of(c.rope_theta, c.rope_scaling, rotary, c.rope_interleaved);
  const Rope sliding_rope =
      c.sliding_rope_theta > 0
          ? rope_of(c.sliding_rope_theta, c.sliding_rope_scaling, rotary, c.rope_interleaved)
          : rope;
  const auto [mla_turn, mla_scale] = mla ? mla_rope(rope) : std::pair<Rope, double>{rope, 1.0};
  const int tp = options_.tp_size, rank = options_.tp_rank;
  const std::int64_t per_vocab = rules_.padded_vocab() / tp, vocab_start = rank * per_vocab;
  const at::Tensor ids = at::tensor(tokens, at::kLong);
  for (auto t : tokens)
    if (t < 0 || t >= c.vocab_size)
      raise<UsageError>("forward: token ", t, " is outside the vocabulary [0, ", c.vocab_size, ")");

  // Vocab-parallel embedding: each rank looks up the tokens in its row range.
  const at::Tensor in_range = (ids >= vocab_start) & (ids < vocab_start + per_vocab);
  const at::Tensor local_ids = (ids - vocab_start).clamp(0, per_vocab - 1);
  at::Tensor h = weight_f32("model.embed_tokens").index_select(0, local_ids) *
                 in_range.unsqueeze(1).to(at::kFloat);
  allreduce_sum(h, comm);
  h = h * c.embedding_multiplier;  // (Granite's; 1 for the others)
  if (c.gemma_normalization)       // (vLLM's normalizer: sqrt(hidden_size) in the model's dtype)
    h = h * at::scalar_tensor(std::sqrt(static_cast<double>(c.hidden_size)),
                              at::TensorOptions().dtype(dtype_to_torch(c.dtype)))
                .item<double>();

  const std::int64_t q_heads = c.num_attention_heads / tp, kv_heads = rules_.kv_heads_per_rank();
  const std::int64_t hd = c.head_dim, group = c.num_attention_heads / c.num_key_value_heads;
  // Local KV head for each local query head (grouped-query attention).
  std::vector<std::int64_t> kv_of_q(q_heads);
  for (std::int64_t i = 0; i < q_heads; ++i)
    kv_of_q[i] = (rank * q_heads + i) / group - rules_.kv_head_start(rank);
  const at::Tensor kv_index = at::tensor(kv_of_q, at::kLong);

  const LayerNorms norms = layer_norms(c);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    // Each norm layer_norms() names: OLMo's norm no input, the Gemmas' and
    // GLM-4's the attention's and the MLP's inputs and outputs, Cohere's the
    // layer's input alone.
    const auto norm = [&](const at::Tensor& x, const std::string& name) {
      return name.empty() ? x : rms_norm(x, host_param(p + name + ".weight"), c);
    };
    const at::Tensor x = norm(h, norms.attention_in);
    const std::int64_t n = static_cast<std::int64_t>(tokens.size());
    at::Tensor attn;
    if (mla) {
      attn = mla_attention(x, p, mla_turn, mla_scale);
    } else {
      const at::Tensor qkv = linear(x, p + "self_attn.qkv_proj");
      at::Tensor q = qkv.narrow(1, 0, q_heads * hd), k = qkv.narrow(1, q_heads * hd, kv_heads * hd);
      if (c.qk_norm == QkNorm::kWhole) {  // OLMo: over all heads of q and of k, across the group
        q = rms_norm_split(q, host_param(p + "self_attn.q_norm.weight"), rank * q_heads * hd,
                           c.num_attention_heads * hd, 1, c, comm);
        k = rms_norm_split(k, host_param(p + "self_attn.k_norm.weight"),
                           rules_.kv_head_start(rank) * hd, c.num_key_value_heads * hd,
                           tp * kv_heads / c.num_key_value_heads, c, comm);
      }
      q = q.reshape({n, q_heads, hd});
      k = k.reshape({n, kv_heads, hd});
      at::Tensor v =
          qkv.narrow(1, (q_heads + kv_heads) * hd, kv_heads * hd).reshape({n, kv_heads, hd});
      // Over each head, before rotary: by one weight (Qwen3, Gemma 3, EXAONE 4) or
      // by each head's own, the rank's heads' rows (Command R+'s LayerNorm)
      if (c.qk_norm == QkNorm::kShared || c.qk_norm == QkNorm::kPerHead) {
        q = rms_norm(q, host_param(p + "self_attn.q_norm.weight"), c);
        k = rms_norm(k, host_param(p + "self_attn.k_norm.weight"), c);
      }
      const Rope& turn = c.sliding_type(l) ? sliding_rope : rope;
      if (!c.nope_full_layers || c.sliding_type(l)) {  // (Cohere 2's full layers: no rotary)
        q = apply_rope(q, turn);
        k = apply_rope(k, turn);
      }
      k = k.index_select(1, kv_index);
      v = v.index_select(1, kv_index);
      // Row-parallel: partial products are summed over the group, then the
      // (replicated) bias is added once.
      attn = linear(causal_attention(q, k, v, c, l).reshape({n, q_heads * hd}),
                    p + "self_attn.o_proj", /*add_bias=*/false);
    }
    allreduce_sum(attn, comm);
    const at::Tensor o_bias = host_param(p + "self_attn.o_proj.bias");
    if (o_bias.defined()) attn = attn + o_bias.to(at::kFloat);
    attn = norm(attn, norms.attention_out);
    h = h + attn * c.residual_multiplier;  // (Granite's; 1 for the others)
    // (Cohere: the MLP takes the attention's normed input, in parallel)
    const at::Tensor y = c.norm_layout == NormLayout::kParallel ? x : norm(h, norms.mlp_in);
    // (Granite's shared MLP: beside the experts, or the layer's whole MLP)
    const bool shared = c.shared_mlp_intermediate_size > 0;
    at::Tensor mlp = c.sparse_layer(l) ? experts(y, p)
                     : shared          ? at::zeros({n, c.hidden_size}, at::kFloat)
                                       : dense_mlp(y, p + "mlp.");
    if (shared) mlp = mlp + dense_mlp(y, p + "shared_mlp.", "input_linear", "output_linear");
    allreduce_sum(mlp, comm);
    mlp = norm(mlp, norms.mlp_out);
    h = h + mlp * c.residual_multiplier;
  }
  h = rms_norm(h, host_param("model.norm.weight"), c);
  const std::string head = c.tie_word_embeddings ? "model.embed_tokens" : "lm_head";
  const at::Tensor local_logits = at::matmul(h, weight_f32(head).t());
  at::Tensor logits = at::zeros({h.size(0), rules_.padded_vocab()}, at::kFloat);
  logits.narrow(1, vocab_start, per_vocab).copy_(local_logits);
  allreduce_sum(logits, comm);
  // (Granite divides by logits_scaling, Cohere multiplies by logit_scale)
  return soft_cap(logits.narrow(1, 0, c.vocab_size) / c.logits_scaling * c.logit_scale,
                  c.final_logit_softcapping)
      .contiguous();
}

}  // namespace

at::Tensor reference_forward(const TensorParallelModel& model,
                             const std::vector<std::int64_t>& tokens, Communicator& tp_comm) {
  return Forward(model).run(tokens, tp_comm);
}

}  // namespace tpreload
