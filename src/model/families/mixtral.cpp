// Mixtral (MixtralConfig's defaults; vLLM's mixtral.py): every layer sparse,
// num_local_experts experts of intermediate_size under block_sparse_moe, the
// top-k weights renormalised; no biases.
#include "family.h"
#include "keys.h"

namespace tpreload::families {

const Family& mixtral() {
  static const Family f = [] {
    Family f;
    f.architecture = "MixtralForCausalLM";
    f.name = "Mixtral";
    f.vllm_model = "mixtral.py";
    f.kv_heads = 8;
    f.rope_theta = 1e6;
    f.rms_norm_eps = 1e-5;
    f.experts = Experts::kMixtral;
    f.parse = [](const Keys& k, ModelConfig& c) {
      parse_experts(k.j, k.origin, Experts::kMixtral, c);
    };
    f.write = [](const ModelConfig& c, json& j) { write_experts(Experts::kMixtral, c, j); };
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
