// Gemma, Gemma 2 and Gemma 3 (the text model): tied head (required), GeLU,
// Gemma's normalization (RMSNorm by 1 + weight, embeddings times
// sqrt(hidden_size)); Gemma 2: and its sandwich norms, attention scaling,
// soft-capping, windows; Gemma 3: and its sliding layers' own rotary. vLLM's
// Gemma has no biases whatever the config says; its Gemma 2 and 3 read
// attention_bias for q/k/v and o_proj.
#include "family.h"
#include "keys.h"
#include "tpreload/core/error.h"

namespace tpreload::families {
namespace {

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

// A soft-capping value: absent, `fallback`; null, 0 (not capped); else positive.
double softcap(const json& j, const char* key, double fallback, const std::string& origin) {
  if (j.contains(key) && j[key].is_null()) return 0;
  return positive_number(j, key, fallback, origin);
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

// What the three read alike: the tie, and Gemma's normalization.
void parse_gemma_common(const Keys& k, ModelConfig& c) {
  if (!c.tie_word_embeddings)
    raise<ModelError>(k.origin, ": ", c.architecture,
                      " ties its LM head to the embeddings (vLLM asserts "
                      "tie_word_embeddings), but the config sets it false");
  c.gemma_normalization = true;
}

// Gemma 2's and 3's keys written back (null for a cap of 0, as their configs
// take "none").
void write_gemma_sandwich(const ModelConfig& c, json& j) {
  auto or_null = [](double v) { return v > 0 ? json(v) : json(nullptr); };
  j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
  j["attn_logit_softcapping"] = or_null(c.attn_logit_softcapping);
  j["final_logit_softcapping"] = or_null(c.final_logit_softcapping);
  write_windows(c, j);
}

}  // namespace

const Family& gemma() {
  static const Family f = [] {
    Family f;
    f.architecture = "GemmaForCausalLM";
    f.name = "Gemma";
    f.vllm_model = "gemma.py";
    f.kv_heads = 16;
    f.head_dim = 256;
    f.tied = true;
    f.parse = [](const Keys& k, ModelConfig& c) {
      parse_gemma_common(k, c);
      c.activation = gemma_activation(k.j, k.origin);
    };
    return f;
  }();
  return f;
}

const Family& gemma2() {
  static const Family f = [] {
    Family f;
    f.architecture = "Gemma2ForCausalLM";
    f.name = "Gemma 2";
    f.vllm_model = "gemma2.py";
    f.kv_heads = 4;
    f.head_dim = 256;
    f.tied = true;
    f.biases = Biases::kQkvAndO;
    f.parse = [](const Keys& k, ModelConfig& c) {
      parse_gemma_common(k, c);
      parse_gemma_sandwich(k.j, k.origin, false, c);
    };
    f.write = write_gemma_sandwich;
    return f;
  }();
  return f;
}

const Family& gemma3() {
  static const Family f = [] {
    Family f;
    f.architecture = "Gemma3ForCausalLM";
    f.name = "Gemma 3";
    f.vllm_model = "gemma3.py";
    f.kv_heads = 4;
    f.head_dim = 256;
    f.rope_theta = 1e6;
    f.tied = true;
    f.rope_per_attention_type = true;
    f.biases = Biases::kQkvAndO;
    f.qk_norm = QkNorm::kShared;
    f.parse = [](const Keys& k, ModelConfig& c) {
      parse_gemma_common(k, c);
      parse_gemma_sandwich(k.j, k.origin, true, c);
      parse_sliding_rope(k.j, k.per_type, k.origin, "rope_local_base_freq", 1e4, c);
    };
    f.write = [](const ModelConfig& c, json& j) {
      write_gemma_sandwich(c, j);
      write_sliding_rope(c, "rope_local_base_freq", j);
    };
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
