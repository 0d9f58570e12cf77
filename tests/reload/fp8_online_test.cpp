// Online FP8 (quantization "fp8", vLLM's --quantization fp8 of a bfloat16
// checkpoint): every decoder linear weight and expert is float8_e4m3fn with one
// float32 scale, amax / 448 over the rank's fused weight (each expert's w13
// and w2 apart), as vLLM's Fp8LinearMethod and Fp8MoEMethod quantize a
// checkpoint that is not FP8. The expected codes come from the test's own
// arithmetic: the slices cut and concatenated here, the amax and scale in float,
// the nearest representable value searched in a table (fp8_checkpoints.h).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "../support/emulated_device.h"
#include "fp8_checkpoints.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/reload/reload.h"

namespace tpreload {
namespace {

using testdata::cut;
using testdata::expect_shards;
using Checkpoint = testdata::Fp8TestCheckpoint;

constexpr std::int64_t kH = 64, kHeads = 4, kKv = 2, kHd = 16, kInter = 96, kVocab = 128;
constexpr std::int64_t kExperts = 4, kMoeInter = 32;
constexpr testdata::Fp8Sizes kSizes{kH, kHeads, kKv, kHd, kInter, kVocab, kExperts, kMoeInter};

const char* kDense = R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
  "intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
  "head_dim":16,"vocab_size":128,"torch_dtype":"bfloat16","tie_word_embeddings":false})";

const char* kMoe = R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,
  "intermediate_size":96,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,
  "head_dim":16,"vocab_size":128,"num_experts":4,"num_experts_per_tok":2,
  "moe_intermediate_size":32,"norm_topk_prob":true,"torch_dtype":"bfloat16",
  "tie_word_embeddings":false})";

// A bfloat16 checkpoint: the "FP8" modules of the builders are plain weights.
void add_bf16(Checkpoint& c, const std::string& module, std::int64_t rows, std::int64_t cols) {
  c.bf16(module + ".weight", {rows, cols});
}

Checkpoint dense_checkpoint() {
  Checkpoint c = testdata::fp8_dense_checkpoint(kSizes, add_bf16);
  // (the builder leaves layer 1's o_proj in bfloat16 as an "ignored" one: the
  // same here, quantized all the same)
  return c;
}

// The test's quantization of a float tensor: scale = amax / 448 in float, each
// value times 1.0f / scale, nearest code. Returns the codes and the scale.
std::pair<at::Tensor, float> quantized(const at::Tensor& t) {
  const at::Tensor x = t.to(at::kFloat).contiguous();
  const float* p = x.data_ptr<float>();
  float amax = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) amax = std::max(amax, std::fabs(p[i]));
  const float scale = amax / 448.0f, inverse = 1.0f / scale;
  at::Tensor codes = at::empty(x.sizes(), at::kByte);
  auto* q = codes.data_ptr<std::uint8_t>();
  for (std::int64_t i = 0; i < x.numel(); ++i) q[i] = testdata::nearest_code(p[i] * inverse);
  return {codes, scale};
}

void expect_linear(std::map<std::string, at::Tensor>& want, const std::string& module,
                   const at::Tensor& local) {
  const auto [codes, scale] = quantized(local);
  want[module + ".weight"] = codes;
  want[module + ".weight_scale"] = at::full({1}, scale, at::kFloat);
}

void expect_attention(std::map<std::string, at::Tensor>& want, const Checkpoint& c,
                      const std::string& p, int tp, int r) {
  const auto& t = c.tensors;
  const auto [q_at, q_rows, kv_at, kv_rows] = testdata::attention_rows(kSizes, tp, r);
  const std::string a = p + "self_attn.";
  expect_linear(want, a + "qkv_proj",
                at::cat({cut(t.at(a + "q_proj.weight"), q_at, q_rows, 0, kH),
                         cut(t.at(a + "k_proj.weight"), kv_at, kv_rows, 0, kH),
                         cut(t.at(a + "v_proj.weight"), kv_at, kv_rows, 0, kH)}));
  const std::int64_t o_cols = kHeads * kHd / tp;
  expect_linear(want, a + "o_proj", cut(t.at(a + "o_proj.weight"), 0, kH, r * o_cols, o_cols));
}

std::map<std::string, at::Tensor> expected_dense(const Checkpoint& c, int tp, int r) {
  std::map<std::string, at::Tensor> want;
  const auto& t = c.tensors;
  const std::int64_t rows = kInter / tp;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    expect_attention(want, c, p, tp, r);
    const std::string m = p + "mlp.";
    expect_linear(want, m + "gate_up_proj",
                  at::cat({cut(t.at(m + "gate_proj.weight"), r * rows, rows, 0, kH),
                           cut(t.at(m + "up_proj.weight"), r * rows, rows, 0, kH)}));
    expect_linear(want, m + "down_proj", cut(t.at(m + "down_proj.weight"), 0, kH, r * rows, rows));
  }
  return want;
}

// Each local expert's w13 (its gate rows, then its up rows) and w2 quantized
// apart, a scale each.
std::map<std::string, at::Tensor> expected_moe(const Checkpoint& c, int tp, int r, bool ep) {
  std::map<std::string, at::Tensor> want;
  expect_attention(want, c, "model.layers.0.", tp, r);
  const auto& t = c.tensors;
  const std::string x = "model.layers.0.mlp.experts.";
  const std::int64_t local = ep ? kExperts / tp : kExperts, inter = ep ? kMoeInter : kMoeInter / tp;
  const std::int64_t first = ep ? r * local : 0, at_row = ep ? 0 : r * inter;
  std::vector<at::Tensor> w13, w2;
  std::vector<float> w13_scale, w2_scale;
  for (std::int64_t e = first; e < first + local; ++e) {
    const std::string n = x + std::to_string(e) + ".";
    const auto [gate_up, s13] =
        quantized(at::cat({cut(t.at(n + "gate_proj.weight"), at_row, inter, 0, kH),
                           cut(t.at(n + "up_proj.weight"), at_row, inter, 0, kH)}));
    const auto [down, s2] = quantized(cut(t.at(n + "down_proj.weight"), 0, kH, at_row, inter));
    w13.push_back(gate_up);
    w2.push_back(down);
    w13_scale.push_back(s13);
    w2_scale.push_back(s2);
  }
  want[x + "w13_weight"] = at::stack(w13);
  want[x + "w13_weight_scale"] = at::tensor(w13_scale);
  want[x + "w2_weight"] = at::stack(w2);
  want[x + "w2_weight_scale"] = at::tensor(w2_scale);
  return want;
}

ModelOptions fp8(int tp, int r, bool ep = false, std::shared_ptr<Device> device = nullptr) {
  ModelOptions o = testdata::tp_rank_options(tp, r, ep, std::move(device));
  o.quantization = "fp8";
  return o;
}

ModelConfig config(const char* text) {
  return parse_model_config(text, "the test's config");
}

TEST(Fp8Online, DenseWeightsAreQuantizedWholeWithOneScaleEach) {
  const Checkpoint c = dense_checkpoint();
  for (const int tp : {1, 2}) {
    for (int r = 0; r < tp; ++r) {
      TensorParallelModel model(config(kDense), fp8(tp, r));
      auto source = c.source();
      model.load_weights(*source);
      expect_shards(model, expected_dense(c, tp, r),
                    "tp " + std::to_string(tp) + " rank " + std::to_string(r));
    }
  }
  // The norms and embeddings keep the model's dtype.
  TensorParallelModel model(config(kDense), fp8(1, 0));
  EXPECT_EQ(model.parameter_for_reload("model.layers.0.input_layernorm.weight").scalar_type(),
            at::kBFloat16);
  EXPECT_EQ(model.parameter_for_reload("model.embed_tokens.weight").scalar_type(), at::kBFloat16);
}

TEST(Fp8Online, ExpertsAreQuantizedOneByOne) {
  const Checkpoint c = testdata::fp8_moe_checkpoint(kSizes, add_bf16);
  for (const bool ep : {false, true}) {
    for (int r = 0; r < 2; ++r) {
      TensorParallelModel model(config(kMoe), fp8(2, r, ep));
      auto source = c.source();
      model.load_weights(*source);
      expect_shards(model, expected_moe(c, 2, r, ep),
                    std::string(ep ? "expert" : "tensor") + " parallel, rank " + std::to_string(r));
    }
  }
}

// Through the engine, twice, broadcast and scatter, atomic or not, host and
// (emulated) device memory; a float32 source too (the scale is computed from
// the values as they arrive, whatever their dtype).
TEST(Fp8Online, AReloadQuantizesEveryLayerInPlace) {
  const Checkpoint v1 = testdata::fp8_moe_checkpoint(kSizes, add_bf16);
  Checkpoint v2 = testdata::fp8_moe_checkpoint(kSizes, add_bf16);
  for (auto& [name, t] : v2.tensors) t = (t.flip({0}) * 3).contiguous();
  Checkpoint v2_f32 = v2;
  for (auto& [name, t] : v2_f32.tensors) {
    t = t.to(at::kFloat);
    v2_f32.dtypes[name] = DType::kFloat32;
  }
  testdata::reload_in_every_mode(config(kMoe), fp8(1, 0), v1, {&v2, &v2_f32},
                                 expected_moe(v2, 1, 0, false),
                                 "model.layers.0.mlp.experts.w13_weight");
}

// A reload that brings part of a weight (q_proj without k_proj and v_proj) is
// refused before any write: the scale is the amax over the whole fused weight.
TEST(Fp8Online, AWeightBroughtInPartIsRefusedBeforeAnyWrite) {
  const Checkpoint whole = dense_checkpoint();
  Checkpoint part = whole;
  part.tensors.erase("model.layers.1.self_attn.k_proj.weight");
  part.tensors.erase("model.layers.1.self_attn.v_proj.weight");
  TensorParallelModel model(config(kDense), fp8(1, 0));
  auto control = make_local_communicator();
  auto first = whole.source();
  reload_weights(model, *control, first.get(), ReloadOptions{});
  auto source = part.source();
  try {
    reload_weights(model, *control, source.get(), ReloadOptions{});
    FAIL() << "q_proj alone was taken";
  } catch (const ValidationError& e) {
    EXPECT_NE(
        std::string(e.what()).find("online FP8 layer 1 on tp rank 0: this load brings only part of "
                                   "'model.layers.1.self_attn.qkv_proj.weight'"),
        std::string::npos)
        << e.what();
  }
  expect_shards(model, expected_dense(whole, 1, 0), "after the refused reload");
}

}  // namespace
}  // namespace tpreload
