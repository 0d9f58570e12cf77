// Qwen2-MoE (Qwen2MoeConfig's defaults; vLLM's qwen2_moe.py): Qwen2's
// attention, experts with a shared expert gated by shared_expert_gate.
#include "family.h"
#include "keys.h"

namespace tpreload::families {

const Family& qwen2_moe() {
  static const Family f = [] {
    Family f;
    f.architecture = "Qwen2MoeForCausalLM";
    f.name = "Qwen2-MoE";
    f.vllm_model = "qwen2_moe.py";
    f.kv_heads = 16;
    f.biases = Biases::kQkv;
    f.experts = Experts::kQwenShared;
    f.parse = [](const Keys& k, ModelConfig& c) {
      parse_experts(k.j, k.origin, Experts::kQwenShared, c);
    };
    f.write = [](const ModelConfig& c, json& j) { write_experts(Experts::kQwenShared, c, j); };
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
