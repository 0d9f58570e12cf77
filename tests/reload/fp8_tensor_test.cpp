// Per-tensor FP8 checkpoints (quantization_config fp8 without
// weight_block_size): each quantized linear's weight F8_E4M3 with a scalar
// float32 weight_scale (and, with static activations, input_scale), loaded and
// processed as vLLM's Fp8LinearMethod and Fp8MoEMethod process them: a fused
// layer's parts requantized to the largest of their scales, each expert's gate
// and up to the larger of theirs, the down projections left as they are.
//
// The expected bytes are computed here with the test's own arithmetic: codes
// decoded from the e4m3fn definition, float16 rounding by LibTorch's Half,
// and encoding by a search for the nearest representable value (ties to the
// even code) over a table the test builds; shards cut with the test's own
// slicing.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "../support/emulated_device.h"
#include "../support/streams.h"
#include "fp8_checkpoints.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/core/float8.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/reload.h"

namespace tpreload {
namespace {

constexpr std::int64_t kH = 64, kHeads = 4, kKv = 2, kHd = 16, kInter = 96, kVocab = 128;
constexpr std::int64_t kExperts = 4, kMoeInter = 32;

const char* kDense = R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
  "intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
  "head_dim":16,"vocab_size":128,"torch_dtype":"bfloat16","tie_word_embeddings":false,
  "quantization_config":{"quant_method":"fp8","activation_scheme":"static",
    "ignored_layers":["model.layers.1.self_attn.o_proj"]}})";

const char* kMoe = R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,
  "intermediate_size":96,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,
  "head_dim":16,"vocab_size":128,"num_experts":4,"num_experts_per_tok":2,
  "moe_intermediate_size":32,"norm_topk_prob":true,"torch_dtype":"bfloat16",
  "tie_word_embeddings":false,"quantization_config":{"quant_method":"fp8",
  "activation_scheme":"static"}})";

using testdata::nearest_code;
using testdata::value_of;

float to_half_and_back(float v) {
  return at::scalar_tensor(v, at::kFloat).to(at::kHalf).to(at::kFloat).item<float>();
}

// vLLM's requantize_with_max_scale of the codes `w` (a uint8 tensor) from
// scale `from` to scale `to`: per_tensor_dequantize in float16 (the code and
// the 0-dim float32 scale both as float16, their product rounded to float16),
// then scaled_fp8_quant (times 1.0f / to, clamped, nearest even).
at::Tensor requantized(const at::Tensor& w, float from, float to) {
  at::Tensor codes = w.contiguous();
  std::vector<float> values(static_cast<std::size_t>(codes.numel()));
  const auto* p = codes.data_ptr<std::uint8_t>();
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = value_of(p[i]);
  const at::Tensor half = at::from_blob(values.data(), codes.sizes(), at::kFloat).to(at::kHalf);
  const float from_half = to_half_and_back(from);
  const at::Tensor dq = (half.to(at::kFloat) * from_half).to(at::kHalf).to(at::kFloat).contiguous();
  const float inverse = 1.0f / to;
  at::Tensor out = at::empty_like(codes);
  auto* q = out.data_ptr<std::uint8_t>();
  const auto* d = dq.data_ptr<float>();
  for (std::int64_t i = 0; i < codes.numel(); ++i) q[i] = nearest_code(d[i] * inverse);
  return out;
}

// --- checkpoints -------------------------------------------------------------

using Checkpoint = testdata::Fp8TestCheckpoint;
using testdata::cut;
using testdata::expect_shards;

constexpr testdata::Fp8Sizes kSizes{kH, kHeads, kKv, kHd, kInter, kVocab, kExperts, kMoeInter};

// An FP8 weight, its scale and its input scale: scales of [0.002, 0.05),
// different for every module.
void add_fp8(Checkpoint& c, const std::string& module, std::int64_t rows, std::int64_t cols) {
  c.codes(module + ".weight", rows, cols);
  for (const char* leaf : {".weight_scale", ".input_scale"}) {
    c.tensors[module + leaf] = at::rand({}) * 0.048 + 0.002;
    c.dtypes[module + leaf] = DType::kFloat32;
  }
}

float scalar_of(const Checkpoint& c, const std::string& name) {
  return c.tensors.at(name).item<float>();
}

Checkpoint dense_checkpoint() {
  return testdata::fp8_dense_checkpoint(kSizes, add_fp8);
}

Checkpoint moe_checkpoint() {
  return testdata::fp8_moe_checkpoint(kSizes, add_fp8);
}

at::Tensor scalar(float v) {
  return at::scalar_tensor(v, at::kFloat);
}

// A fused linear of `parts` (checkpoint modules and the rows/columns this rank
// takes of each): the parts' codes requantized to the largest of their scales.
void expect_fused(std::map<std::string, at::Tensor>& want, const Checkpoint& c,
                  const std::string& param_module,
                  const std::vector<std::pair<std::string, at::Tensor>>& parts) {
  float largest = 0, largest_input = 0;
  for (const auto& [module, slice] : parts) {
    largest = std::max(largest, scalar_of(c, module + ".weight_scale"));
    largest_input = std::max(largest_input, scalar_of(c, module + ".input_scale"));
  }
  std::vector<at::Tensor> rows;
  for (const auto& [module, slice] : parts)
    rows.push_back(requantized(slice, scalar_of(c, module + ".weight_scale"), largest));
  want[param_module + ".weight"] = at::cat(rows);
  want[param_module + ".weight_scale"] = scalar(largest);
  want[param_module + ".input_scale"] = scalar(largest_input);
}

void expect_attention(std::map<std::string, at::Tensor>& want, const Checkpoint& c,
                      const std::string& p, int tp, int r, bool o_quantized) {
  const auto& t = c.tensors;
  const auto [q_at, q_rows, kv_at, kv_rows] = testdata::attention_rows(kSizes, tp, r);
  const std::string a = p + "self_attn.";
  expect_fused(want, c, a + "qkv_proj",
               {{a + "q_proj", cut(t.at(a + "q_proj.weight"), q_at, q_rows, 0, kH)},
                {a + "k_proj", cut(t.at(a + "k_proj.weight"), kv_at, kv_rows, 0, kH)},
                {a + "v_proj", cut(t.at(a + "v_proj.weight"), kv_at, kv_rows, 0, kH)}});
  const std::int64_t o_cols = kHeads * kHd / tp;
  const at::Tensor o = cut(t.at(a + "o_proj.weight"), 0, kH, r * o_cols, o_cols);
  if (o_quantized)
    expect_fused(want, c, a + "o_proj", {{a + "o_proj", o}});
  else
    want[a + "o_proj.weight"] = o;
}

std::map<std::string, at::Tensor> expected_dense(const Checkpoint& c, int tp, int r) {
  std::map<std::string, at::Tensor> want;
  const auto& t = c.tensors;
  const std::int64_t rows = kInter / tp;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    expect_attention(want, c, p, tp, r, l == 0);
    const std::string m = p + "mlp.";
    expect_fused(want, c, m + "gate_up_proj",
                 {{m + "gate_proj", cut(t.at(m + "gate_proj.weight"), r * rows, rows, 0, kH)},
                  {m + "up_proj", cut(t.at(m + "up_proj.weight"), r * rows, rows, 0, kH)}});
    expect_fused(want, c, m + "down_proj",
                 {{m + "down_proj", cut(t.at(m + "down_proj.weight"), 0, kH, r * rows, rows)}});
  }
  return want;
}

// Fp8MoEMethod: w13 per expert requantized to the larger of gate's and up's
// scales (w13_weight_scale [E_local]); w2 as it is with its scales; the input
// scales the largest of the rank's experts'.
std::map<std::string, at::Tensor> expected_moe(const Checkpoint& c, int tp, int r, bool ep) {
  std::map<std::string, at::Tensor> want;
  expect_attention(want, c, "model.layers.0.", tp, r, true);
  const auto& t = c.tensors;
  const std::string x = "model.layers.0.mlp.experts.";
  const std::int64_t local = ep ? kExperts / tp : kExperts, inter = ep ? kMoeInter : kMoeInter / tp;
  const std::int64_t first = ep ? r * local : 0, at_row = ep ? 0 : r * inter;
  std::vector<at::Tensor> w13, w2;
  std::vector<float> w13_scale, w2_scale;
  float w13_input = 0, w2_input = 0;
  for (std::int64_t e = first; e < first + local; ++e) {
    const std::string n = x + std::to_string(e) + ".";
    const float g = scalar_of(c, n + "gate_proj.weight_scale"),
                u = scalar_of(c, n + "up_proj.weight_scale");
    const float larger = std::max(g, u);
    w13.push_back(
        at::cat({requantized(cut(t.at(n + "gate_proj.weight"), at_row, inter, 0, kH), g, larger),
                 requantized(cut(t.at(n + "up_proj.weight"), at_row, inter, 0, kH), u, larger)}));
    w13_scale.push_back(larger);
    w2.push_back(cut(t.at(n + "down_proj.weight"), 0, kH, at_row, inter));
    w2_scale.push_back(scalar_of(c, n + "down_proj.weight_scale"));
    w13_input = std::max({w13_input, scalar_of(c, n + "gate_proj.input_scale"),
                          scalar_of(c, n + "up_proj.input_scale")});
    w2_input = std::max(w2_input, scalar_of(c, n + "down_proj.input_scale"));
  }
  want[x + "w13_weight"] = at::stack(w13);
  want[x + "w13_weight_scale"] = at::tensor(w13_scale);
  want[x + "w2_weight"] = at::stack(w2);
  want[x + "w2_weight_scale"] = at::tensor(w2_scale);
  want[x + "w13_input_scale"] = scalar(w13_input);
  want[x + "w2_input_scale"] = scalar(w2_input);
  return want;
}

ModelOptions rank(int tp, int r, bool ep = false, std::shared_ptr<Device> device = nullptr) {
  return testdata::tp_rank_options(tp, r, ep, std::move(device));
}

ModelConfig config(const char* text) {
  return parse_model_config(text, "the test's config");
}

TEST(Fp8Tensor, TheConfigSaysPerTensorAndItsActivationScheme) {
  EXPECT_EQ(config(kDense).fp8.text(),
            "fp8, per tensor, activation_scheme static, ignored [model.layers.1.self_attn.o_proj]");
  std::string dynamic = kDense;
  dynamic.replace(dynamic.find("\"static\""), 8, "\"dynamic\"");
  const ModelConfig d = config(dynamic.c_str());
  EXPECT_EQ(
      d.fp8.text(),
      "fp8, per tensor, activation_scheme dynamic, ignored [model.layers.1.self_attn.o_proj]");
  // Dynamic activations: no input scales among the parameters.
  TensorParallelModel model(d, rank(1, 0));
  EXPECT_TRUE(
      model.parameter_for_reload("model.layers.0.self_attn.qkv_proj.weight_scale").defined());
  EXPECT_FALSE(
      model.parameter_for_reload("model.layers.0.self_attn.qkv_proj.input_scale").defined());
  std::string odd = kDense;
  odd.replace(odd.find("\"static\""), 8, "\"sometimes\"");
  try {
    config(odd.c_str());
    FAIL() << "an activation scheme that is neither static nor dynamic";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("activation_scheme \"sometimes\" is not \"static\" or "
                                         "\"dynamic\""),
              std::string::npos)
        << e.what();
  }
}

TEST(Fp8Tensor, DenseLayersAreRequantizedToTheLargestScaleOfTheirParts) {
  const Checkpoint c = dense_checkpoint();
  for (const int tp : {1, 2, 4}) {
    for (int r = 0; r < tp; ++r) {
      TensorParallelModel model(config(kDense), rank(tp, r));
      auto source = c.source();
      model.load_weights(*source);
      const auto want = expected_dense(c, tp, r);
      expect_shards(model, want, "tp " + std::to_string(tp) + " rank " + std::to_string(r));
      EXPECT_EQ(model.parameter_for_reload("model.layers.0.self_attn.qkv_proj.weight_scale").dim(),
                0)
          << "vLLM's weight_scale after processing is 0-dim";
    }
  }
}

TEST(Fp8Tensor, ExpertsAreRequantizedPerExpertWithTensorAndExpertParallelism) {
  const Checkpoint c = moe_checkpoint();
  for (const bool ep : {false, true}) {
    for (int r = 0; r < 2; ++r) {
      TensorParallelModel model(config(kMoe), rank(2, r, ep));
      auto source = c.source();
      model.load_weights(*source);
      expect_shards(model, expected_moe(c, 2, r, ep),
                    std::string(ep ? "expert" : "tensor") + " parallel, rank " + std::to_string(r));
    }
  }
}

// Through the engine, twice (the second reload must process the new scales,
// not the first's), broadcast and scatter, atomic or not, with parameters in
// host or (emulated) device memory: the same bytes as the test's, in place.
TEST(Fp8Tensor, AReloadProcessesEveryLayerInPlace) {
  const Checkpoint v1 = moe_checkpoint();
  Checkpoint v2 = moe_checkpoint();
  for (auto& [name, t] : v2.tensors)
    t = t.dim() == 0 ? t * 1.5 : t.flip({0}).contiguous();  // other bytes and scales
  testdata::reload_in_every_mode(config(kMoe), rank(1, 0), v1, {&v2}, expected_moe(v2, 1, 0, false),
                                 "model.layers.0.mlp.experts.w13_weight");
}

// The dequantization rounds the scale to float16 before the product (PyTorch's
// float16 tensor times a 0-dim float32 one): for code 119,
// scale 0.013269647 requantized to 0.029480478 that gives code 109, where the
// float32 scale would give 110. The host step and the test's arithmetic agree.
TEST(Fp8Tensor, TheScaleIsRoundedToFloat16BeforeTheProduct) {
  const float from = 0.013269647024571896f, to = 0.029480477795004845f;
  const at::Tensor codes = at::full({1}, 119, at::kByte);
  const std::uint8_t want = requantized(codes, from, to).item<std::uint8_t>();
  const float unrounded = (at::scalar_tensor(value_of(119) * from, at::kFloat).to(at::kHalf))
                              .to(at::kFloat)
                              .item<float>();
  ASSERT_NE(want, nearest_code(unrounded * (1.0f / to))) << "a case where the rounding matters";
  std::uint8_t got = 119;
  const float staged[2] = {from, to};
  float largest = 0;
  fp8::requantize_step(&got, 1, staged, 0, 0, 2, &largest);
  EXPECT_EQ(got, want);
  EXPECT_EQ(largest, to);
}

// A load that brings part of a fused layer (k_proj's weight without its
// scale) is refused naming it: the requantization needs every part's scale.
// The engine refuses it before any write.
TEST(Fp8Tensor, ALayerBroughtInPartIsRefusedNamingIt) {
  const std::string what =
      "per-tensor FP8 layer 0 on tp rank 0: this load brings only part of "
      "'model.layers.0.self_attn.qkv_proj.weight_scale', beside "
      "'model.layers.0.self_attn.qkv_proj.weight'";
  const Checkpoint whole = dense_checkpoint();
  Checkpoint c = whole;
  c.tensors.erase("model.layers.0.self_attn.k_proj.weight_scale");
  {
    TensorParallelModel model(config(kDense), rank(1, 0));
    auto control = make_local_communicator();
    auto first = whole.source();
    reload_weights(model, *control, first.get(), ReloadOptions{});
    auto part = c.source();
    try {
      reload_weights(model, *control, part.get(), ReloadOptions{});
      FAIL() << "the engine took k_proj's weight without its scale";
    } catch (const ValidationError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("nothing was reloaded"), std::string::npos) << e.what();
    }
    expect_shards(model, expected_dense(whole, 1, 0), "after the refused reload");
  }
  TensorParallelModel model(config(kDense), rank(1, 0));
  auto source = c.source();
  try {
    model.load_weights(*source);
    FAIL() << "k_proj's weight without its scale";
  } catch (const ModelError& e) {
    EXPECT_NE(
        std::string(e.what()).find("per-tensor FP8 layer 0 on tp rank 0: this load brings only "
                                   "part of 'model.layers.0.self_attn.qkv_proj.weight_scale', "
                                   "beside 'model.layers.0.self_attn.qkv_proj.weight'"),
        std::string::npos)
        << e.what();
  }
}

// From a stream, in reverse name order and in segments of 1 KiB (layer 1
// before layer 0, a layer's scales before its weights, each layer over
// several segments): each layer is requantized once it has every part, as
// from a file. A stream that lacks k_proj's scale fails on every rank naming
// the layer, once the stream has ended.
TEST(Fp8Tensor, AStreamProcessesEachLayerOnceItHasAllOfIt) {
  const Checkpoint v1 = dense_checkpoint();
  Checkpoint v2 = dense_checkpoint();
  for (auto& [name, t] : v2.tensors) t = t.dim() == 0 ? t * 1.5 : t.flip({0}).contiguous();
  auto control = make_local_communicator();
  ReloadOptions o;
  o.bucket_bytes = 128;  // (segments of 4 x 128 x 2 bytes)
  o.pipeline_depth = 2;
  TensorParallelModel model(config(kDense), rank(1, 0));
  auto first = v1.source();
  reload_weights(model, *control, first.get(), o);
  std::vector<InMemoryTensor> reversed = v2.in_memory();
  std::reverse(reversed.begin(), reversed.end());
  auto counts = std::make_shared<testing::StreamCounts>();
  auto stream = testing::counting_stream(reversed, counts);
  const ReloadResult r = reload_from_stream(model, *control, stream.get(), o);
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(counts->yielded, v2.tensors.size());
  expect_shards(model, expected_dense(v2, 1, 0), "from a reversed stream");

  reversed.erase(std::find_if(reversed.begin(), reversed.end(), [](const InMemoryTensor& t) {
    return t.name == "model.layers.0.self_attn.k_proj.weight_scale";
  }));
  auto part = testing::counting_stream(reversed, counts);
  try {
    reload_from_stream(model, *control, part.get(), o);
    FAIL() << "the stream brought k_proj's weight without its scale";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "processing the layers the stream brought in part failed on rank 0/1: "
                  "per-tensor FP8 layer 0 on tp rank 0: this load brings only part of "
                  "'model.layers.0.self_attn.qkv_proj.weight_scale'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tpreload
