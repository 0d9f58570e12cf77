// Checkpoints of the FP8 tests (fp8_block_test.cpp, fp8_tensor_test.cpp),
// written from the Hugging Face modules: a two-layer Llama (layer 1's o_proj
// left in bfloat16, as an ignored layer) and a one-layer Qwen3-MoE. Each test
// adds its scheme's FP8 weights and scales (add_fp8) and cuts its expected
// shards itself.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../support/tiny_models.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/model/model.h"

namespace tpreload::testdata {

struct Fp8Sizes {
  std::int64_t hidden, heads, kv_heads, head_dim, intermediate, vocab, experts, moe_intermediate;
};

// Each tensor with its dtype (FP8 held as uint8 bytes), seeded by its position.
struct Fp8TestCheckpoint {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, DType> dtypes;
  int next_seed = 1;
  // The scheme's FP8 weight of a module (rows x cols) and its scales.
  std::function<void(Fp8TestCheckpoint&, const std::string& module, std::int64_t rows,
                     std::int64_t cols)>
      add_fp8;

  void bf16(const std::string& name, std::vector<std::int64_t> shape) {
    at::manual_seed(next_seed++);
    tensors[name] = at::randn(shape).to(at::kBFloat16);
    dtypes[name] = DType::kBFloat16;
  }
  // FP8 codes 0..254 but the two NaNs, seeded.
  void codes(const std::string& name, std::int64_t rows, std::int64_t cols) {
    at::manual_seed(next_seed++);
    at::Tensor codes = at::randint(0, 254, {rows, cols}, at::kByte);
    codes.masked_fill_(codes == 0x7F, 0x7E);
    tensors[name] = codes;
    dtypes[name] = DType::kFloat8E4M3;
  }
  void fp8(const std::string& module, std::int64_t rows, std::int64_t cols) {
    add_fp8(*this, module, rows, cols);
  }
  std::unique_ptr<WeightSource> source() const {
    std::vector<InMemoryTensor> out;
    for (const auto& [name, t] : tensors)
      out.push_back({name, dtypes.at(name),
                     std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end()),
                     ConstBytes(static_cast<const std::byte*>(t.data_ptr()),
                                static_cast<std::uint64_t>(t.numel() * t.element_size())),
                     nullptr});
    return make_in_memory_source(std::move(out));
  }
};

inline void fp8_attention(Fp8TestCheckpoint& c, const Fp8Sizes& s, const std::string& p,
                          bool o_quantized) {
  c.bf16(p + "input_layernorm.weight", {s.hidden});
  c.fp8(p + "self_attn.q_proj", s.heads * s.head_dim, s.hidden);
  c.fp8(p + "self_attn.k_proj", s.kv_heads * s.head_dim, s.hidden);
  c.fp8(p + "self_attn.v_proj", s.kv_heads * s.head_dim, s.hidden);
  if (o_quantized)
    c.fp8(p + "self_attn.o_proj", s.hidden, s.heads * s.head_dim);
  else
    c.bf16(p + "self_attn.o_proj.weight", {s.hidden, s.heads * s.head_dim});
  c.bf16(p + "post_attention_layernorm.weight", {s.hidden});
}

inline Fp8TestCheckpoint fp8_dense_checkpoint(const Fp8Sizes& s,
                                              decltype(Fp8TestCheckpoint::add_fp8) add_fp8) {
  Fp8TestCheckpoint c;
  c.add_fp8 = std::move(add_fp8);
  c.bf16("model.embed_tokens.weight", {s.vocab, s.hidden});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    fp8_attention(c, s, p, l == 0);  // (layer 1's o_proj is in ignored_layers)
    c.fp8(p + "mlp.gate_proj", s.intermediate, s.hidden);
    c.fp8(p + "mlp.up_proj", s.intermediate, s.hidden);
    c.fp8(p + "mlp.down_proj", s.hidden, s.intermediate);
  }
  c.bf16("model.norm.weight", {s.hidden});
  c.bf16("lm_head.weight", {s.vocab, s.hidden});
  return c;
}

inline Fp8TestCheckpoint fp8_moe_checkpoint(const Fp8Sizes& s,
                                            decltype(Fp8TestCheckpoint::add_fp8) add_fp8) {
  Fp8TestCheckpoint c;
  c.add_fp8 = std::move(add_fp8);
  c.bf16("model.embed_tokens.weight", {s.vocab, s.hidden});
  const std::string p = "model.layers.0.";
  fp8_attention(c, s, p, true);
  c.bf16(p + "self_attn.q_norm.weight", {s.head_dim});
  c.bf16(p + "self_attn.k_norm.weight", {s.head_dim});
  c.bf16(p + "mlp.gate.weight", {s.experts, s.hidden});  // (the router: not quantized)
  for (int e = 0; e < s.experts; ++e) {
    const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
    c.fp8(x + "gate_proj", s.moe_intermediate, s.hidden);
    c.fp8(x + "up_proj", s.moe_intermediate, s.hidden);
    c.fp8(x + "down_proj", s.hidden, s.moe_intermediate);
  }
  c.bf16("model.norm.weight", {s.hidden});
  c.bf16("lm_head.weight", {s.vocab, s.hidden});
  return c;
}

// Rows [a, a + n) and columns [b, b + m) of a 2-D tensor.
inline at::Tensor cut(const at::Tensor& t, std::int64_t a, std::int64_t n, std::int64_t b,
                      std::int64_t m) {
  return t.slice(0, a, a + n).slice(1, b, b + m);
}

inline ModelOptions tp_rank_options(int tp, int r, bool ep = false,
                                    std::shared_ptr<Device> device = nullptr) {
  ModelOptions o;
  o.tp_size = tp;
  o.tp_rank = r;
  o.expert_parallel = ep;
  o.device = std::move(device);
  return o;
}

// Every parameter of `want` holds its bytes (same shape and element size).
inline void expect_shards(const TensorParallelModel& model,
                          const std::map<std::string, at::Tensor>& want, const std::string& what) {
  for (const auto& [name, t] : want) {
    const at::Tensor got = model.parameter_for_reload(name);
    ASSERT_TRUE(got.defined()) << what << ": no parameter " << name;
    EXPECT_TRUE(got.sizes() == t.sizes() && got.element_size() == t.element_size() &&
                same_bytes(got.contiguous().reshape({-1}).view(at::kByte),
                           t.contiguous().reshape({-1}).view(at::kByte)))
        << what << ": " << name << " " << got.sizes() << " vs the test's " << t.sizes();
  }
}

}  // namespace tpreload::testdata
