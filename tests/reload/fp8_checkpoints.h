// Checkpoints of the FP8 tests (fp8_block_test.cpp, fp8_tensor_test.cpp),
// written from the Hugging Face modules: a two-layer Llama (layer 1's o_proj
// left in bfloat16, as an ignored layer) and a one-layer Qwen3-MoE. Each test
// adds its scheme's FP8 weights and scales (add_fp8) and cuts its expected
// shards itself.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../support/emulated_device.h"
#include "../support/tiny_models.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/reload.h"

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
  // Views of the tensors, in name order (this checkpoint must outlive them).
  std::vector<InMemoryTensor> in_memory() const {
    std::vector<InMemoryTensor> out;
    for (const auto& [name, t] : tensors)
      out.push_back({name, dtypes.at(name),
                     std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end()),
                     ConstBytes(static_cast<const std::byte*>(t.data_ptr()),
                                static_cast<std::uint64_t>(t.numel() * t.element_size())),
                     nullptr});
    return out;
  }
  std::unique_ptr<WeightSource> source() const { return make_in_memory_source(in_memory()); }
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

// The tests' own e4m3fn arithmetic, from the format's definition.

// The value of a finite code: (-1)^s 2^(e - 7) (1 + m / 8), or m / 8 2^-6.
inline float value_of(std::uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  const float mag = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (c & 0x80) ? -mag : mag;
}

// The code nearest to x after clamping to +-448 (a NaN: +448), ties to the
// code whose last mantissa bit is 0, found in the sorted table of magnitudes.
inline std::uint8_t nearest_code(float x) {
  static const std::vector<float> magnitudes = [] {
    std::vector<float> v;
    for (int c = 0; c < 0x7F; ++c) v.push_back(value_of(static_cast<std::uint8_t>(c)));
    return v;
  }();
  if (std::isnan(x)) x = 448.0f;
  x = std::min(448.0f, std::max(-448.0f, x));
  const float a = std::fabs(x);
  const auto hi = std::lower_bound(magnitudes.begin(), magnitudes.end(), a);
  int code = static_cast<int>(hi - magnitudes.begin());
  if (code > 0 && (code == 0x7F || *hi != a)) {
    const float below = magnitudes[code - 1], above = code < 0x7F ? magnitudes[code] : INFINITY;
    if (a - below < above - a || (a - below == above - a && (code - 1) % 2 == 0)) --code;
  }
  return static_cast<std::uint8_t>(code | (std::signbit(x) ? 0x80 : 0));
}

// Rows [a, a + n) and columns [b, b + m) of a 2-D tensor.
inline at::Tensor cut(const at::Tensor& t, std::int64_t a, std::int64_t n, std::int64_t b,
                      std::int64_t m) {
  return t.slice(0, a, a + n).slice(1, b, b + m);
}

// FusedMoE's experts under `x` ("...mlp.experts.") on rank r of tp, with
// their block grids (blocks of block_n rows and block_k columns): w13
// [E_local, 2 I_local, hidden] (each expert's gate rows, then up rows), w2
// [E_local, hidden, I_local]. Tensor-parallel experts: every expert, the rank's
// rows (gate/up) and columns (down); expert parallelism: the rank's experts whole.
inline void expect_block_experts(std::map<std::string, at::Tensor>& want,
                                 const std::map<std::string, at::Tensor>& t, const std::string& x,
                                 std::int64_t experts, std::int64_t moe_inter, std::int64_t hidden,
                                 std::int64_t block_n, std::int64_t block_k, int tp, int r,
                                 bool ep) {
  const std::int64_t local = ep ? experts / tp : experts, inter = ep ? moe_inter : moe_inter / tp;
  const std::int64_t first = ep ? r * local : 0, at_row = ep ? 0 : r * inter;
  const std::int64_t hidden_blocks = (hidden + block_k - 1) / block_k,
                     hidden_rows = (hidden + block_n - 1) / block_n;
  std::vector<at::Tensor> w13, w13s, w2, w2s;
  for (std::int64_t e = first; e < first + local; ++e) {
    const std::string n = x + std::to_string(e) + ".";
    w13.push_back(at::cat({cut(t.at(n + "gate_proj.weight"), at_row, inter, 0, hidden),
                           cut(t.at(n + "up_proj.weight"), at_row, inter, 0, hidden)}));
    w13s.push_back(at::cat({cut(t.at(n + "gate_proj.weight_scale_inv"), at_row / block_n,
                                inter / block_n, 0, hidden_blocks),
                            cut(t.at(n + "up_proj.weight_scale_inv"), at_row / block_n,
                                inter / block_n, 0, hidden_blocks)}));
    w2.push_back(cut(t.at(n + "down_proj.weight"), 0, hidden, at_row, inter));
    w2s.push_back(cut(t.at(n + "down_proj.weight_scale_inv"), 0, hidden_rows, at_row / block_k,
                      inter / block_k));
  }
  want[x + "w13_weight"] = at::stack(w13);
  want[x + "w13_weight_scale_inv"] = at::stack(w13s);
  want[x + "w2_weight"] = at::stack(w2);
  want[x + "w2_weight_scale_inv"] = at::stack(w2s);
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

// The rows tp rank r of tp holds of q ([q_at, q_at + q_rows)) and of its KV
// head group ([kv_at, kv_at + kv_rows) of k and of v; a KV head replicated
// where tp exceeds them).
struct AttentionRows {
  std::int64_t q_at, q_rows, kv_at, kv_rows;
};
inline AttentionRows attention_rows(const Fp8Sizes& s, int tp, int r) {
  const std::int64_t q_rows = s.heads * s.head_dim / tp;
  const std::int64_t kv_heads = std::max<std::int64_t>(1, s.kv_heads / tp);
  const std::int64_t kv_first = tp >= s.kv_heads ? r / (tp / s.kv_heads) : r * kv_heads;
  return {r * q_rows, q_rows, kv_first * s.head_dim, kv_heads * s.head_dim};
}

// Reloads `v1`, then each of `v2s`, into one model of `config` (tp 1) in every
// mode: parameters in host or (emulated) device memory, broadcast or scatter,
// atomic or not, every rank reading its own slices, buckets small enough to
// cut a layer. After each of `v2s` the
// model holds `want`, complete, and `param` has not moved.
inline void reload_in_every_mode(const ModelConfig& config, ModelOptions options,
                                 const Fp8TestCheckpoint& v1,
                                 const std::vector<const Fp8TestCheckpoint*>& v2s,
                                 const std::map<std::string, at::Tensor>& want,
                                 const std::string& param) {
  for (const bool device : {false, true}) {
    auto dev = device ? std::make_shared<testing::EmulatedDevice>() : nullptr;
    options.device = dev;
    TensorParallelModel model(config, options);
    auto control = make_local_communicator();
    for (const Distribution d : {Distribution::kBroadcast, Distribution::kScatter}) {
      for (const int mode : {0, 1, 2}) {  // plain, atomic, every rank reading (direct writes)
        const bool atomic = mode == 1;
        ReloadOptions o;
        o.distribution = d;
        o.atomic = atomic;
        if (mode == 2) o.readers = Readers::kAll;
        o.bucket_bytes = 3000;
        auto data = make_communicator_transport(*control);
        if (device) data = testing::make_emulated_device_transport(std::move(data), *dev);
        auto s1 = v1.source();
        reload_weights(model, *control, *data, s1.get(), o);
        const void* before = model.parameter_for_reload(param).data_ptr();
        const std::string what = std::string(device ? "device, " : "host, ") +
                                 std::string(distribution_name(d)) +
                                 (atomic      ? ", atomic"
                                  : mode == 2 ? ", readers all"
                                              : "");
        for (std::size_t i = 0; i < v2s.size(); ++i) {
          auto s2 = v2s[i]->source();
          const ReloadResult result = reload_weights(model, *control, *data, s2.get(), o);
          EXPECT_TRUE(result.complete()) << what;
          expect_shards(model, want, what + ", version 2 source " + std::to_string(i));
        }
        EXPECT_EQ(model.parameter_for_reload(param).data_ptr(), before) << what;
      }
    }
  }
}

}  // namespace tpreload::testdata
