// Qwen3 (Qwen3Config's defaults; vLLM's qwen3.py): q/k/v biases as
// attention_bias says, q and k normed per head by one weight each.
#include "family.h"

namespace tpreload::families {

const Family& qwen3() {
  static const Family f = [] {
    Family f;
    f.architecture = "Qwen3ForCausalLM";
    f.name = "Qwen3";
    f.vllm_model = "qwen3.py";
    f.kv_heads = 32;
    f.head_dim = 128;
    f.biases = Biases::kQkvOptional;
    f.qk_norm = QkNorm::kShared;
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
