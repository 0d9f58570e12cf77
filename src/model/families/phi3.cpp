// Phi-3 (Phi3Config's defaults; vLLM's phi3.py, its Llama: biases as Llama's
// keys say, which no Phi-3 config sets). The checkpoint stacks q/k/v in
// self_attn.qkv_proj and gate/up in mlp.gate_up_proj.
#include "family.h"
#include "keys.h"

namespace tpreload::families {

const Family& phi3() {
  static const Family f = [] {
    Family f;
    f.architecture = "Phi3ForCausalLM";
    f.name = "Phi-3";
    f.vllm_model = "phi3.py";
    f.rms_norm_eps = 1e-5;
    f.biases = Biases::kLlama;
    f.stacked = Stacked::kQkvAndGateUp;
    f.parse = read_logit_scale;
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
