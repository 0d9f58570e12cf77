// Every model family tpreload knows: one row each, in the order help texts list them.
// Adding one: its file here (a function returning its Family), its row below.
#include "family.h"
#include "tpreload/core/error.h"

#define TPRELOAD_FAMILIES(X) \
  X(cohere)                  \
  X(cohere2)                 \
  X(deepseek_v2)             \
  X(deepseek_v3)             \
  X(ernie45)                 \
  X(exaone4)                 \
  X(gemma)                   \
  X(gemma2)                  \
  X(gemma3)                  \
  X(glm4)                    \
  X(glm4_moe)                \
  X(granite)                 \
  X(granite_moe)             \
  X(granite_moe_hybrid)      \
  X(granite_moe_shared)      \
  X(llama)                   \
  X(mistral)                 \
  X(mixtral)                 \
  X(olmo2)                   \
  X(olmo3)                   \
  X(phi3)                    \
  X(qwen2)                   \
  X(qwen2_moe)               \
  X(qwen3)                   \
  X(qwen3_moe)

namespace tpreload::families {

#define TPRELOAD_DECLARE(f) const Family& f();
TPRELOAD_FAMILIES(TPRELOAD_DECLARE)
#undef TPRELOAD_DECLARE

const std::vector<const Family*>& registry() {
#define TPRELOAD_ROW(f) &f(),
  static const std::vector<const Family*> all = {TPRELOAD_FAMILIES(TPRELOAD_ROW)};
#undef TPRELOAD_ROW
  return all;
}

const Family* find(const std::string& architecture) {
  for (const Family* f : registry())
    if (architecture == f->architecture) return f;
  return nullptr;
}

const Family& of(const ModelConfig& c) {
  const Family* f = find(c.architecture);
  if (!f) raise<ModelError>("architecture '", c.architecture, "' is not supported");
  return *f;
}

}  // namespace tpreload::families
