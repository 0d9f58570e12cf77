// Cohere and Cohere 2 (vLLM's commandr.py serves both).
#include "family.h"
#include "keys.h"
#include "tpreload/core/error.h"

namespace tpreload::families {
namespace {

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

void write_cohere(const ModelConfig& c, json& j) {
  j["logit_scale"] = c.logit_scale;
  if (c.qk_norm == QkNorm::kPerHead) j["use_qk_norm"] = true;
}

}  // namespace

const Family& cohere() {
  static const Family f = [] {
    Family f;
    f.architecture = "CohereForCausalLM";
    f.name = "Cohere";
    f.vllm_model = "commandr.py";
    f.rms_norm_eps = 1e-5;
    f.tied = true;
    f.layer_norm_eps = true;
    f.parse = [](const Keys& k, ModelConfig& c) { parse_cohere(k.j, k.origin, false, c); };
    f.write = write_cohere;
    return f;
  }();
  return f;
}

const Family& cohere2() {
  static const Family f = [] {
    Family f = cohere();  // and its sliding windows
    f.architecture = "Cohere2ForCausalLM";
    f.name = "Cohere 2";
    f.parse = [](const Keys& k, ModelConfig& c) { parse_cohere(k.j, k.origin, true, c); };
    f.write = [](const ModelConfig& c, json& j) {
      write_cohere(c, j);
      write_windows(c, j);
    };
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
