// Mistral (MistralConfig's defaults; vLLM serves it with its llama.py).
#include "family.h"
#include "keys.h"

namespace tpreload::families {

const Family& mistral() {
  static const Family f = [] {
    Family f;
    f.architecture = "MistralForCausalLM";
    f.name = "Mistral";
    f.vllm_model = "llama.py";
    f.kv_heads = 8;
    f.biases = Biases::kLlama;
    f.parse = read_logit_scale;
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
