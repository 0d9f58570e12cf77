// Llama (LlamaConfig's defaults; vLLM's llama.py).
#include "family.h"
#include "keys.h"

namespace tpreload::families {

const Family& llama() {
  static const Family f = [] {
    Family f;
    f.architecture = "LlamaForCausalLM";
    f.name = "Llama";
    f.vllm_model = "llama.py";
    f.biases = Biases::kLlama;
    f.parse = read_logit_scale;
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
