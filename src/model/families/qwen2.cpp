// Qwen2 (Qwen2Config's defaults; vLLM's qwen2.py): q/k/v biases always.
#include "family.h"

namespace tpreload::families {

const Family& qwen2() {
  static const Family f = [] {
    Family f;
    f.architecture = "Qwen2ForCausalLM";
    f.name = "Qwen2";
    f.vllm_model = "qwen2.py";
    f.kv_heads = 32;
    f.biases = Biases::kQkv;
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
