// A Hugging Face config.json for the model families tpreload knows
// (model_families(); each one a file under src/model/families/), and the
// tensors a checkpoint for it holds. No torch here: the checkpoint tool and
// the checkpoint layer's tests use it too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpreload/checkpoint/row_split.h"
#include "tpreload/core/dtype.h"
#include "tpreload/model/fp8_checkpoint.h"

namespace tpreload {

// Rotary scaling, as vLLM's get_rope reads it: `rope_scaling` (transformers 4)
// or, where that is not set, `rope_parameters` (transformers 5, beside
// rope_theta); its kind in `rope_type` (or the older `type`). The weights do not
// depend on it: a config is refused only for a malformed value. The forward
// pass computes "default", "linear" (which needs `factor`), "llama3" (which
// also needs `low_freq_factor`, `high_freq_factor` and
// `original_max_position_embeddings`), "yarn" (`factor` and
// `original_max_position_embeddings`, with the optional settings below),
// "dynamic" (`factor`: vLLM's DynamicNTKScalingRotaryEmbedding, whose base is
// scaled for the whole extended context at every length; or `alpha`, which
// vLLM reads first: its DynamicNTKAlphaRotaryEmbedding) and "longrope" (or
// "su"; Phi-3's: `short_factor` and `long_factor`, one per rotary pair,
// `original_max_position_embeddings` and `max_position_embeddings`, read at
// the top level of the config or in the settings; given both ways, they must
// agree) and refuses the rest. llama3 and yarn read
// `original_max_position_embeddings` the same way. A number not given is 0
// unless a default is written here.
struct RopeScaling {
  std::string type = "default";
  std::string source = "rope_scaling";  // the config key it came from (messages)
  double factor = 0;
  double low_freq_factor = 0;
  double high_freq_factor = 0;
  double original_max_position_embeddings = 0;
  // yarn's settings, with vLLM's defaults (YaRNScalingRotaryEmbedding): the
  // rotation counts that bound the blend between kept and interpolated
  // frequencies, the share of the kept ones, and the magnitude scale of cos and
  // sin (0.1 ln(factor) + 1, times attn_factor, unless apply_yarn_scaling is
  // false); truncate rounds the blend's bounds to whole pairs.
  double beta_fast = 32;
  double beta_slow = 1;
  double extrapolation_factor = 1;
  double attn_factor = 1;
  bool apply_yarn_scaling = true;
  bool truncate = true;
  // longrope's: the divisors of each pair's frequency within the original
  // context and beyond it, the extended context, and the magnitudes of cos and
  // sin (0: sqrt(1 + ln(max / original) / ln(original)), 1 when max <=
  // original; vLLM's Phi3LongRoPEScaledRotaryEmbedding).
  std::vector<double> short_factor, long_factor;
  double max_position_embeddings = 0;
  double short_mscale = 0, long_mscale = 0;
  double alpha = 0;  // dynamic's alternative to factor
  // DeepSeek's yarn (vLLM's DeepseekScalingRotaryEmbedding, which the MLA
  // families take for "yarn"): cos and sin times m(mscale) / m(mscale_all_dim)
  // x attn_factor, the attention scores times m(mscale_all_dim)^2, where m(x) =
  // 0.1 x ln(factor) + 1 (1 for a factor up to 1); vLLM's defaults.
  double mscale = 1, mscale_all_dim = 0;
  // Every setting but rope_theta (keys sorted, numbers as doubles, `type` as
  // `rope_type`): what ranks and kernel-format shards compare; "" for none.
  std::string json;
};

// The activation of an MLP's gate rows (times its up rows): SiLU (SwiGLU) for
// every family but the Gemmas: Gemma's GeLU is tanh-approximated unless the config's
// `hidden_activation` is "gelu" (vLLM's _get_gemma_act_fn), Gemma 2's always
// tanh-approximated.
enum class Activation : std::uint8_t { kSilu, kGeluTanh, kGelu };

// Where a decoder layer norms, each layout's norms named by layer_norms():
// kPre (most families): the attention's input and the MLP's; kSandwich (Gemma
// 2 and 3): and both outputs; kGlm (GLM-4): the same four under GLM's names;
// kPost (OLMo 2 and 3): both outputs alone; kParallel (Cohere): the layer's
// input alone, which attention and MLP both take, their sum joining the
// residual.
enum class NormLayout : std::uint8_t { kPre, kSandwich, kGlm, kPost, kParallel };
// How q and k are normed before rotary, by self_attn.q_norm.weight and
// k_norm.weight (the model's norm: RMSNorm, or Cohere's LayerNorm):
//  - kShared: each head by one weight of [head_dim] (Qwen3, Gemma 3, EXAONE 4),
//    replicated;
//  - kWhole: q and k each over its whole projection, all heads together (OLMo
//    2 and 3, vLLM's olmo2.py): q_norm [heads x head_dim], k_norm [KV heads x
//    head_dim], replicated (the forward pass sums the squares over the group);
//  - kPerHead: each head by its own weights (Command R+'s use_qk_norm, vLLM's
//    commandr.py): q_norm [heads, head_dim], k_norm [KV heads, head_dim], split
//    by head as q's and k's rows are (ShardKind::kHeads).
enum class QkNorm : std::uint8_t { kNone, kShared, kWhole, kPerHead };
// "silu", "gelu_pytorch_tanh", "gelu".
const char* activation_name(Activation activation);

struct ModelConfig {
  std::string architecture;  // one of supported_architectures()
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;  // dense MLP layers
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  std::int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  std::int64_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // The share of each head's dimensions that rotary turns (the first
  // head_dim x factor of them, truncated; vLLM's get_rope):
  // `partial_rotary_factor` at the top level or in rope_parameters (where
  // transformers 5 and vLLM move it; both, they must agree), at most 1; 1 when
  // absent (GLM-4: 0.5, Glm4Config's).
  double partial_rotary_factor = 1;
  // Rotary on pairs of neighbouring dimensions (2i, 2i + 1) of the turned
  // ones, as GPT-J, GLM-4, ERNIE 4.5 and Cohere turn them (vLLM's
  // is_neox_style=False), instead of Llama's halves (i, i + dims / 2).
  bool rope_interleaved = false;
  // absent: true for the Gemmas, ERNIE 4.5 and Cohere, false for the others
  bool tie_word_embeddings = false;
  Activation activation = Activation::kSilu;
  // Gemma (vLLM's GemmaRMSNorm and GemmaModel): RMSNorm scales by 1 + weight,
  // and the embeddings are multiplied by sqrt(hidden_size) rounded to the
  // model's dtype.
  bool gemma_normalization = false;
  // Gemma 2 (Gemma2Config's defaults; vLLM's gemma2.py), and Gemma 3 below:
  // the attention output normed (post_attention_layernorm) before the
  // residual, and the MLP between pre_ and post_feedforward_layernorm;
  // attention scaled by query_pre_attn_scalar^-1/2 instead of head_dim^-1/2
  // (0: head_dim); attention scores and the final logits soft-capped,
  // cap x tanh(x / cap) (0: not capped); decoder layers of the sliding type,
  // sliding_layers (those `layer_types` marks "sliding_attention", else the
  // even layers), attend to the sliding_window latest positions only (0:
  // none is set, every layer attends to all).
  // Gemma 3 (Gemma3TextConfig's defaults; vLLM's gemma3.py) reads the same
  // keys with its own defaults: no soft-capping (vLLM's Gemma3Attention takes
  // none whatever attn_logit_softcapping says), windows on the layers
  // `layer_types` marks, else on all but every sliding_window_pattern-th.
  NormLayout norm_layout = NormLayout::kPre;
  double query_pre_attn_scalar = 0;
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  std::int64_t sliding_window = 0;
  std::vector<std::int64_t> sliding_layers;
  // Gemma 3 and OLMo 3: the sliding layers' own rotary embedding (Gemma 3's
  // at rope_local_base_freq, 10000 when absent, OLMo 3's at rope_theta) with
  // the default scaling, or transformers 5's rope_parameters.sliding_attention;
  // the other layers take rope_theta and rope_scaling
  // (rope_parameters.full_attention). 0: every layer takes rope_theta and
  // rope_scaling.
  double sliding_rope_theta = 0;
  RopeScaling sliding_rope_scaling;
  // Granite (GraniteConfig's keys, 1 when absent; vLLM's granite.py): the
  // embeddings multiplied by embedding_multiplier, attention scores by
  // attention_multiplier (parsing sets it for Granite; 0, the others' value,
  // leaves the scale to query_pre_attn_scalar^-1/2 or head_dim^-1/2), each
  // attention and MLP output by residual_multiplier before the residual, and
  // the logits divided by logits_scaling. (vLLM's Granite also multiplies the
  // logits by a `logit_scale`, which is no GraniteConfig key and not read.)
  double embedding_multiplier = 1;
  double attention_multiplier = 0;
  double residual_multiplier = 1;
  double logits_scaling = 1;
  // Cohere (CohereConfig; vLLM's commandr.py): the logits multiplied by
  // logit_scale (0.0625 when absent; for the families vLLM serves with its
  // LlamaForCausalLM, the config's where it has one, else 1; 1 for the others); every norm a
  // LayerNorm without bias (layer_norm: x minus its mean, normed by its variance; the epsilon is
  // layer_norm_eps, held in rms_norm_eps); its layers NormLayout::kParallel.
  double logit_scale = 1;
  bool layer_norm = false;
  // Cohere 2: the layers not of the sliding type turn no rotary (NoPE).
  bool nope_full_layers = false;
  // Biases, as vLLM's model classes take them from the config: q/k/v always
  // for Qwen2, `attention_bias` for Qwen3; for Llama and Mistral `attention_bias`
  // or `bias`, which give o_proj's too, while `qkv_bias`, when present, decides
  // q/k/v's; `mlp_bias` gives gate/up/down's (Llama, Mistral, Phi-3);
  // `attention_bias` gives q/k/v's and o_proj's for Gemma 2 and 3, and so does
  // `attention_bias` or `bias` for Granite, with `mlp_bias` the MLP's.
  bool attention_bias = false;  // q/k/v
  bool o_proj_bias = false;
  bool mlp_bias = false;
  // How q and k are normed before rotary (QkNorm).
  QkNorm qk_norm = QkNorm::kNone;
  // Mixture of experts (Qwen2MoeForCausalLM, Qwen3MoeForCausalLM;
  // MixtralForCausalLM, whose intermediate_size is the experts', every layer
  // sparse, top-k weights renormalised); num_experts 0 for dense models. The
  // count is num_experts or num_local_experts in every family; absent keys
  // take the config classes' defaults.
  std::int64_t num_experts = 0;
  std::int64_t num_experts_per_tok = 0;
  std::int64_t moe_intermediate_size = 0;
  std::int64_t decoder_sparse_step = 1;
  std::vector<std::int64_t> mlp_only_layers;
  bool norm_topk_prob = false;  // renormalise the top-k routing weights
  // Qwen2-MoE: every sparse layer also has a shared expert, a dense MLP of this
  // intermediate size whose output is scaled by sigmoid(shared_expert_gate);
  // 0 for none.
  std::int64_t shared_expert_intermediate_size = 0;
  // Granite's shared MLP (GraniteMoeShared and GraniteMoeHybrid:
  // `shared_intermediate_size`; vLLM's GraniteMoeSharedMLP): every layer's
  // shared_mlp, a SwiGLU MLP whose input_linear [2 x this, hidden] stacks its
  // gate rows then its up rows and whose output_linear is [hidden, this],
  // added to the experts' output where the layer has experts, the layer's
  // whole MLP where it has none; 0 for none.
  std::int64_t shared_mlp_intermediate_size = 0;
  // GLM-4.5 (Glm4MoeForCausalLM; vLLM's glm4_moe.py): the layers before
  // first_k_dense_replace are dense. Its router (sigmoid_routing) scores every
  // expert by the sigmoid of its logit, keeps the topk_group of n_group groups
  // whose two best scores plus e_score_correction_bias sum highest, picks the
  // num_experts_per_tok best there by score plus bias, and weights them by
  // their scores alone (renormalised with norm_topk_prob) times
  // routed_scaling_factor. Its router weight is a float32 parameter whatever
  // the model's dtype (float32_router: vLLM's nn.Linear of float32), beside a
  // float32 e_score_correction_bias (score_correction; DeepSeek-V3's with
  // topk_method noaux_tc, whose router weight is in the model's dtype). Every
  // sparse layer also has shared experts (mlp.shared_experts, a SwiGLU MLP of
  // n_shared_experts x moe_intermediate_size, no gate): this size, 0 for none.
  std::int64_t first_k_dense_replace = 0;
  bool float32_router = false;
  bool score_correction = false;
  bool sigmoid_routing = false;
  std::int64_t n_group = 1;
  std::int64_t topk_group = 1;
  double routed_scaling_factor = 1;
  std::int64_t shared_experts_intermediate_size = 0;
  // Multi-head latent attention (DeepSeek-V2 and V3; vLLM's deepseek_v2.py),
  // where kv_lora_rank > 0: q from the hidden state through q_proj (q_lora_rank
  // 0) or through q_a_proj, q_a_layernorm and q_b_proj (q_lora_rank rows), each
  // head's qk_nope_head_dim + qk_rope_head_dim; kv_a_proj_with_mqa's
  // kv_lora_rank + qk_rope_head_dim rows, kv_a_layernorm over the first
  // kv_lora_rank, kv_b_proj [heads x (qk_nope_head_dim + v_head_dim),
  // kv_lora_rank] and o_proj [hidden, heads x v_head_dim]. head_dim is
  // qk_nope_head_dim + qk_rope_head_dim and num_key_value_heads the heads.
  std::int64_t q_lora_rank = 0;
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_head_dim = 0;
  std::int64_t qk_rope_head_dim = 0;
  std::int64_t v_head_dim = 0;
  DType dtype = DType::kFloat32;  // `torch_dtype` (or `dtype`)
  // A block-scaled FP8 checkpoint (`quantization_config`; fp8_checkpoint.h):
  // its quantized weights are float8_e4m3fn beside float32 scales, loaded into
  // FP8 parameters as they are. Not quantized where absent.
  Fp8Checkpoint fp8;
  std::string json;  // the original text, for kernel_format.json

  // Whether decoder layer `layer` is of the sliding attention type (in
  // sliding_layers), whether or not a window is set: Gemma 3's such layers
  // turn at sliding_rope_theta either way.
  bool sliding_type(std::int64_t layer) const;
  // Whether decoder layer `layer` attends to a sliding window: a window is set
  // and the layer is of the sliding type (Gemma 2 and 3).
  bool sliding_layer(std::int64_t layer) const;

  // Whether decoder layer `layer` has experts: num_experts > 0, the layer is not
  // in mlp_only_layers nor before first_k_dense_replace, and
  // (layer + 1) % decoder_sparse_step == 0.
  bool sparse_layer(std::int64_t layer) const;
};

// A model family: config.json's architecture ("LlamaForCausalLM"), its name
// as people write it ("Llama"), and the vLLM model file whose loading it
// follows ("llama.py").
struct ModelFamily {
  std::string architecture, name, vllm_model;
};
// Every family, in the registry's order (src/model/families/registry.cpp).
const std::vector<ModelFamily>& model_families();
// Their names as a sentence: "Cohere, Cohere 2, ..., Qwen3 and Qwen3-MoE".
std::string model_family_names();
// Their architectures: "CohereForCausalLM", ..., "Qwen3MoeForCausalLM".
const std::vector<std::string>& supported_architectures();

// The norms of a decoder layer, as the checkpoint names them after
// "model.layers.<l>." (without ".weight"): of the attention's input and
// output, and of the MLP's input and output; "" where the layer has none.
// kPre: input_layernorm and post_attention_layernorm (the MLP's input);
// kSandwich: input_layernorm, post_attention_layernorm (the attention's
// output), pre_feedforward_layernorm, post_feedforward_layernorm; kGlm:
// input_layernorm, post_self_attn_layernorm, post_attention_layernorm (the
// MLP's input), post_mlp_layernorm; kPost: post_attention_layernorm and
// post_feedforward_layernorm, on the outputs; kParallel: input_layernorm.
struct LayerNorms {
  std::string attention_in, attention_out, mlp_in, mlp_out;
};
LayerNorms layer_norms(const ModelConfig& config);

// How a sparse layer's tensors are named in the checkpoint, after
// "model.layers.<l>.": `module`.gate.weight (the router) and
// `module`.experts.<e>.{`gate`,`up`,`down`}.weight. Qwen3-MoE: mlp and
// gate_proj, up_proj, down_proj; Mixtral: block_sparse_moe and w1, w3, w2. vLLM's
// parameters are `module`.gate.weight and `module`.experts.{w13,w2}_weight.
struct MoeNames {
  std::string module, gate, up, down;
};
MoeNames moe_names(const ModelConfig& config);

// Parse config.json text; `origin` names it in errors. Throws ModelError for an
// unknown architecture, a missing or non-positive field, or heads that do not
// divide evenly.
ModelConfig parse_model_config(const std::string& text, const std::string& origin);

// Read `path`, a config.json file or a directory holding one.
ModelConfig load_model_config(const std::string& path);

// The directory of the model whose config `path` names as load_model_config
// takes it: `path` itself where it is a directory, else the one holding it.
std::string model_directory(const std::string& path);

// Serialise to config.json text (the fields above, Hugging Face spelling).
std::string model_config_to_json(const ModelConfig& config);

// One field of a ModelConfig: its name (config.json's key where it has one),
// its value as text ("'LlamaForCausalLM'", "true", "2048", "1e-05", "[0,2]", a
// rope scaling's canonical text or "none", a dtype's name), and whether it
// shapes the weights: a difference changes which parameters there are, their
// shapes or dtypes, or the bytes a checkpoint puts in them (false: only a
// forward pass reads it: norm epsilons, rotary, scaling, soft caps, windows,
// routing).
struct ConfigField {
  std::string name;
  std::string value;
  bool weights = true;
};

// Every field of `config` but its json, in a fixed order: the one list that
// config_differences and the ranks' agreement before a reload both compare, so
// that a field added to ModelConfig is compared everywhere once it is added
// there (config.cpp).
std::vector<ConfigField> config_fields(const ModelConfig& config);

// Every field of config_fields (kWeights: those that shape the weights) in
// which `a` and `b` differ, as "hidden_size 2048 vs 1024" (a's value first);
// empty when they describe the same model. The text of the configs (names,
// paths, fields tpreload does not read) does not count. A reload compares the
// weights' fields only (the ranks' agreement, a kernel-format source's
// config): a rotary or scaling setting changes no byte it writes.
enum class ConfigFields { kAll, kWeights };
std::vector<std::string> config_differences(const ModelConfig& a, const ModelConfig& b,
                                            ConfigFields which = ConfigFields::kAll);

// How a parameter is split over the tensor-parallel ranks (vLLM's layers):
// kReplicated whole on every rank; kColumn by rows (ColumnParallelLinear and
// its merged forms); kRow by columns (RowParallelLinear); kVocab by rows of the
// padded vocabulary (VocabParallelEmbedding, ParallelLMHead); kExpertGateUp and
// kExpertDown a FusedMoE's w13 and w2 (each expert's rows or columns, or whole
// experts with expert parallelism); kHeads a per-head norm's weights ([heads,
// head_dim], QkNorm::kPerHead) along dim 0 by head as q's and k's rows are:
// q_norm's heads evenly, k_norm's the KV heads the rank's k holds (one
// replicated head when tp exceeds them).
enum class ShardKind { kReplicated, kColumn, kRow, kVocab, kExpertGateUp, kExpertDown, kHeads };

// Which logical shard of its fused parameter a checkpoint tensor is: the
// whole of it, q, k or v of qkv_proj (or of a per-head q/k norm), gate or up
// of gate_up_proj (an expert's of w13), an expert's down of w2.
enum class ShardRole : std::uint8_t { kWhole, kQ, kK, kV, kGate, kUp, kDown };

// A tensor a Hugging Face checkpoint for the config holds, and what it feeds
// (its role: as the weight loaders take it, loader_tensor_specs(); a stacked
// tensor's own entry in checkpoint_tensor_specs() has none, its parts do).
struct CheckpointTensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  // The dtype of the parameter it loads into, where that is not the model's
  // (GLM-4.5's router and score correction: float32, vLLM's nn.Linear of
  // float32, whatever the checkpoint holds; converted on load).
  std::optional<DType> param_dtype{};
  // The checkpoint's dtype, where it is not the model's (an FP8 checkpoint's
  // float8_e4m3fn weights and float32 scales, which load into parameters of
  // their own dtype).
  std::optional<DType> dtype{};
  // The parameter it loads into ("": its own name; "...qkv_proj.weight",
  // "...gate_up_proj.bias", "...experts.w13_weight", Granite's
  // "...shared_mlp.input_linear.weight"), which shard of it, how that
  // parameter is split, and an expert's number (-1: no expert).
  std::string param{};
  ShardRole role = ShardRole::kWhole;
  ShardKind kind = ShardKind::kReplicated;
  std::int64_t expert = -1;
};

// Every tensor of a checkpoint for `config`, in Hugging Face naming and order:
// model.embed_tokens.weight, then per layer the attention's input norm
// (layer_norms()), self_attn.{q,k,v,o}_proj
// (Phi-3: self_attn.qkv_proj and o_proj; see stacked_checkpoint_tensors())
// (q/k/v biases when attention_bias, o_proj's when o_proj_bias),
// self_attn.{q,k}_norm (qk_norm), the other norms of layer_norms(), then
// mlp.{gate,up,down}_proj (dense layers; with biases when mlp_bias; Phi-3 and
// GLM-4: mlp.gate_up_proj and down_proj) or the
// router and every expert's three projections as moe_names() spells them
// (sparse layers; GraniteMoE: block_sparse_moe.input_linear, output_linear and
// router.layer, every expert in each; then Qwen2-MoE's
// mlp.shared_expert.{gate,up,down}_proj and mlp.shared_expert_gate), Granite's
// shared_mlp.input_linear and output_linear beside them or alone
// (shared_mlp_intermediate_size); then model.norm.weight and lm_head.weight
// (untied only).
std::vector<CheckpointTensorSpec> checkpoint_tensor_specs(const ModelConfig& config);

// The tensors a checkpoint for `config` stacks by rows (RowSplit): Phi-3's
// self_attn.qkv_proj.weight ([q; k; v]: num_attention_heads x head_dim rows of
// q_proj, then num_key_value_heads x head_dim of k_proj and of v_proj) and
// mlp.gate_up_proj.weight (intermediate_size rows of gate_proj, then of
// up_proj) in every layer, and their biases where the config has them;
// GLM-4's mlp.gate_up_proj.weight alone; GraniteMoE's experts, by rows of their
// last dimension (RowSplit::flat): block_sparse_moe.input_linear.weight [E, 2 x
// I, hidden] as each expert's w1 (gate) then w3 (up), output_linear.weight [E,
// hidden, I] as each expert's w2, and router.layer.weight [E, hidden] as the
// router, block_sparse_moe.gate.weight; Granite's shared MLP's
// shared_mlp.input_linear.weight [2 x S, hidden] as shared_mlp.gate_proj then
// shared_mlp.up_proj (names of the view alone); none for the other families.
std::vector<RowSplit> stacked_checkpoint_tensors(const ModelConfig& config);

// What the weight loaders take: checkpoint_tensor_specs() with every stacked
// tensor replaced by its parts (Hugging Face's q/k/v_proj and gate/up_proj;
// Mixtral's experts and router for GraniteMoE).
std::vector<CheckpointTensorSpec> loader_tensor_specs(const ModelConfig& config);

}  // namespace tpreload
