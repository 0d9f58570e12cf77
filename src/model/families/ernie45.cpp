// ERNIE 4.5 (Ernie4_5Config's defaults; vLLM's ernie45.py, its Llama without
// o_proj's bias; no Ernie4_5Config key gives it any other): rotary on
// interleaved pairs over whole heads, tied by default, no biases.
#include "family.h"
#include "keys.h"
#include "tpreload/core/error.h"

namespace tpreload::families {

const Family& ernie45() {
  static const Family f = [] {
    Family f;
    f.architecture = "Ernie4_5ForCausalLM";
    f.name = "ERNIE 4.5";
    f.vllm_model = "ernie45.py";
    f.kv_heads = 2;
    f.head_dim = 128;
    f.rope_theta = 5e5;
    f.rms_norm_eps = 1e-5;
    f.tied = true;
    f.parse = [](const Keys& k, ModelConfig& c) {
      read_logit_scale(k, c);
      silu_only(k.j, k.origin, c);
      c.rope_interleaved = true;
      // (Hugging Face's Ernie4_5 gives every projection a bias with use_bias;
      // vLLM's takes none, and would skip them without a word: other logits)
      refuse_true(k.j, k.origin, c, {"use_bias"},
                  "vLLM's model takes no biases; no released ERNIE 4.5 sets it");
    };
    return f;
  }();
  return f;
}

}  // namespace tpreload::families
