// EXAONE 4 (Exaone4ForCausalLM: EXAONE-4.0-32B and 1.2B). Hugging Face's
// Exaone4Attention and Exaone4MLP take no biases; vLLM's would take them from
// attention_bias, bias and mlp_bias: refused. Its rope_theta when absent
// differs between the two: required.
#include "family.h"
#include "keys.h"
#include "tpreload/core/error.h"

namespace tpreload::families {
namespace {

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

}  // namespace

const Family& exaone4() {
  static const Family f = [] {
    Family f;
    f.architecture = "Exaone4ForCausalLM";
    f.name = "EXAONE 4";
    f.vllm_model = "exaone4.py";
    f.kv_heads = 32;
    f.rope_theta = 0;
    f.rms_norm_eps = 1e-5;
    f.qk_norm = QkNorm::kShared;
    f.parse = [](const Keys& k, ModelConfig& c) { parse_exaone4(k.j, k.origin, c); };
    f.write = write_windows;
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
