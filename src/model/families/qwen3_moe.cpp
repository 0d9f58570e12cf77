// Qwen3-MoE (Qwen3MoeConfig's defaults; vLLM's qwen3_moe.py): Qwen3's
// attention, experts.
#include "family.h"
#include "keys.h"

namespace tpreload::families {

const Family& qwen3_moe() {
  static const Family f = [] {
    Family f;
    f.architecture = "Qwen3MoeForCausalLM";
    f.name = "Qwen3-MoE";
    f.vllm_model = "qwen3_moe.py";
    f.kv_heads = 4;
    f.biases = Biases::kQkvOptional;
    f.qk_norm = QkNorm::kShared;
    f.experts = Experts::kQwen;
    f.parse = [](const Keys& k, ModelConfig& c) {
      parse_experts(k.j, k.origin, Experts::kQwen, c);
    };
    f.write = [](const ModelConfig& c, json& j) { write_experts(Experts::kQwen, c, j); };
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
