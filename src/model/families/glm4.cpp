// GLM-4 (Glm4Config's defaults; vLLM's glm4.py): sandwich norms under its own
// names, rotary on interleaved pairs over partial_rotary_factor of each head
// (0.5 when absent), q/k/v biases as attention_bias says (true when absent),
// Llama's MLP without biases; the checkpoint stacks gate/up in
// mlp.gate_up_proj.
#include "family.h"
#include "keys.h"
#include "tpreload/core/error.h"

namespace tpreload::families {

const Family& glm4() {
  static const Family f = [] {
    Family f;
    f.architecture = "Glm4ForCausalLM";
    f.name = "GLM-4";
    f.vllm_model = "glm4.py";
    f.kv_heads = 2;
    f.head_dim = 128;
    f.rms_norm_eps = 1.5625e-7;
    f.partial_rotary_factor = 0.5;
    f.biases = Biases::kQkvUnlessOff;
    f.stacked = Stacked::kGateUp;
    f.parse = [](const Keys& k, ModelConfig& c) {
      silu_only(k.j, k.origin, c);
      c.rope_interleaved = true;
      c.norm_layout = NormLayout::kGlm;
    };
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
