// OLMo 2 and OLMo 3 (vLLM's olmo2.py serves both; no biases whatever the config says).
#include "family.h"
#include "keys.h"
#include "tpreload/core/error.h"

namespace tpreload::families {
namespace {

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

void write_olmo(const ModelConfig& c, json& j) {
  if (c.sliding_rope_theta <= 0) return;  // (no sliding layers)
  write_sliding_rope(c, nullptr, j);
  write_windows(c, j);
}

}  // namespace

const Family& olmo2() {
  static const Family f = [] {
    Family f;
    f.architecture = "Olmo2ForCausalLM";
    f.name = "OLMo 2";
    f.vllm_model = "olmo2.py";
    f.rms_norm_eps = 1e-5;
    f.rope_per_attention_type = true;
    f.qk_norm = QkNorm::kWhole;
    f.parse = [](const Keys& k, ModelConfig& c) {
      parse_olmo(k.j, k.per_type, k.origin, false, c);
    };
    f.write = write_olmo;
    return f;
  }();
  return f;
}

const Family& olmo3() {
  static const Family f = [] {
    Family f = olmo2();  // and its sliding windows
    f.architecture = "Olmo3ForCausalLM";
    f.name = "OLMo 3";
    f.parse = [](const Keys& k, ModelConfig& c) { parse_olmo(k.j, k.per_type, k.origin, true, c); };
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
