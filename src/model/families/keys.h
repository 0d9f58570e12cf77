// The config.json keys more than one family reads, and how they read: the
// checks every family applies to its numbers and flags, rotary, attention
// windows, biases and experts. Internal to the families (family.h).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "family.h"

namespace tpreload::families {

// A true/false field; absent or null is false.
bool flag(const json& j, const char* key, const std::string& origin);

std::int64_t positive_int(const json& j, const char* key, const std::string& origin);

// A positive number at `key` of `j`, or `fallback` where it is absent or null.
double positive_number(const json& j, const char* key, double fallback, const std::string& origin,
                       const char* within = "");

// rope_theta or partial_rotary_factor (`key`): at the top level (transformers
// 4), or in rope_parameters (transformers 5 and vLLM move both there; `params`
// names that object, as it is keyed in `j`); both, they must agree; `fallback`
// without either.
double rope_number(const json& j, const char* key, const std::string& origin, double fallback,
                   const std::string& params = "rope_parameters");

// rope_scaling where it is set, else rope_parameters (as transformers 5 and
// vLLM read them; `params` as rope_number() takes it). Fields the forward pass
// needs are checked there, not here: a reload does not depend on them.
RopeScaling rope_scaling_of(const json& j, const std::string& origin,
                            const std::string& params = "rope_parameters");

// A positive number at `key`, or `fallback` (its config class's default)
// where the key is absent; null is refused, where positive_number() takes it
// for absent (a setting its config class cannot leave unset).
double positive_number_or(const json& j, const char* key, double fallback,
                          const std::string& origin);

// A positive integer at `key`, or `fallback` (its config class's default)
// where the key is absent.
std::int64_t positive_int_or(const json& j, const char* key, std::int64_t fallback,
                             const std::string& origin);

// `hidden_act` silu or absent, for the families whose MLP vLLM computes
// with SiLU only (GraniteMLP; GLM-4's and ERNIE 4.5's LlamaMLP, which refuses
// any other).
void silu_only(const json& j, const std::string& origin, const ModelConfig& c);

// Refuses each of `keys` set true, where Hugging Face's model and vLLM's would
// not compute the same from it: "<key> true is refused for <architecture>
// (<why>)".
void refuse_true(const json& j, const std::string& origin, const ModelConfig& c,
                 std::initializer_list<const char*> keys, const char* why);

// head_dim as hidden_size / num_attention_heads, for the families whose vLLM
// model (`model_file`) reads no head_dim key: a config whose head_dim differs
// is refused.
void head_dim_from_heads(const ModelConfig& c, const std::string& origin, const char* model_file);

// A non-negative integer at `key`, which must be present: for settings
// whose defaults are not certain enough to assume.
std::int64_t required_count(const json& j, const char* key, const std::string& origin,
                            const char* why);

// The attention windows: sliding_window (4096 when absent, null for none) and
// the layers of the sliding type, whether or not a window is set (Gemma 3's
// and OLMo 3's turn at their own rotary either way; Hugging Face's and vLLM's
// choose the rotary by type and the mask by the window): those `layer_types`
// marks "sliding_attention", else all but every `pattern`-th layer.
void parse_windows(const json& j, const std::string& origin, std::int64_t pattern, ModelConfig& c);

// transformers 5 writes Gemma 3's and OLMo 3's rope_parameters per attention type,
// {"full_attention": {...}, "sliding_attention": {...}}; null where the
// config's rope_parameters is flat (or absent). Each entry must be an object.
json rope_per_attention_type(const json& j, const std::string& origin);

// The rotary of the layers of the sliding type, for the families that turn
// them apart from the full ones: Gemma 3's at rope_local_base_freq (10000
// when absent), OLMo 3's at rope_theta (`local_key` null), each with the
// default scaling (transformers 4; vLLM's Gemma3Attention and
// Olmo2Attention), or rope_parameters.sliding_attention from `per_type`
// (transformers 5; a base given both ways must agree). No
// partial_rotary_factor but 1 is taken.
void parse_sliding_rope(const json& j, const json& per_type, const std::string& origin,
                        const char* local_key, double local_default, ModelConfig& c);

// The number of experts: `num_experts` or `num_local_experts` (transformers 5
// maps the one onto the other), the same where both are given; `fallback`
// without either.
std::int64_t expert_count(const json& j, std::int64_t fallback, const std::string& origin);

// The expert keys of `kind` (Family::experts; vLLM's MixtralMoE renormalises:
// renormalize=True).
void parse_experts(const json& j, const std::string& origin, Experts kind, ModelConfig& c);

// logit_scale, 1 when absent: the multiplier of the logits vLLM's
// LlamaForCausalLM applies where the config has one (Llama, Mistral, Phi-3,
// ERNIE 4.5: the families it serves).
void read_logit_scale(const Keys& keys, ModelConfig& c);

// The biases of `kind` read from the config into c.attention_bias,
// c.o_proj_bias and c.mlp_bias, as vLLM's model classes take them (Biases).
void read_biases(const json& j, const std::string& origin, Biases kind, ModelConfig& c);
// The keys read_biases() reads, written so that it reads `c`'s biases back.
void write_biases(Biases kind, const ModelConfig& c, json& j);

// The keys parse_experts() reads for `kind` (kQwen, kQwenShared, kMixtral).
void write_experts(Experts kind, const ModelConfig& c, json& j);

// sliding_window (null for none) and layer_types, as parse_windows() reads them.
void write_windows(const ModelConfig& c, json& j);

// The sliding layers' own rotary as parse_sliding_rope() reads it: in
// `local_key` (Gemma 3's rope_local_base_freq) where it is the base alone and
// `local_key` is given, nothing where it is the full layers' (OLMo 3's),
// else transformers 5's rope_parameters per attention type.
void write_sliding_rope(const ModelConfig& c, const char* local_key, json& j);

}  // namespace tpreload::families
