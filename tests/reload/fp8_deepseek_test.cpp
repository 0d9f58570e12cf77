// DeepSeek-V3's block-scaled FP8 checkpoints (as DeepSeek-V3, R1 and Kimi-K2
// ship them), loaded as vLLM's deepseek_v2.py and Fp8LinearMethod load them:
// q_a_proj and kv_a_proj_with_mqa merged into the replicated fused_qkv_a_proj
// with their grids stacked (kv_a_proj_with_mqa's from q_a_proj's block rows on),
// q_b_proj and kv_b_proj split by rows of heads, o_proj by columns, routed
// experts by tp or whole, shared experts as a dense MLP, the router and its
// score correction unquantized. Names, shapes and every expected shard are
// written and cut here.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "fp8_checkpoints.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/reload.h"

namespace tpreload {
namespace {

constexpr std::int64_t kB = 128;  // the block, rows and columns
constexpr std::int64_t kH = 320, kHeads = 8, kQLora = 128, kKvLora = 128, kNope = 64, kRope = 64,
                       kV = 64, kInter = 512, kVocab = 128, kExperts = 4, kMoeInter = 512;

const char* kConfig = R"({"architectures":["DeepseekV3ForCausalLM"],"hidden_size":320,
  "intermediate_size":512,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":8,
  "vocab_size":128,"q_lora_rank":128,"kv_lora_rank":128,"qk_nope_head_dim":64,
  "qk_rope_head_dim":64,"v_head_dim":64,"n_routed_experts":4,"num_experts_per_tok":2,
  "moe_intermediate_size":512,"n_shared_experts":1,"first_k_dense_replace":1,"moe_layer_freq":1,
  "n_group":1,"topk_group":1,"topk_method":"noaux_tc","scoring_func":"sigmoid",
  "routed_scaling_factor":2.5,"norm_topk_prob":true,"rms_norm_eps":1e-06,"rope_theta":10000,
  "tie_word_embeddings":false,"torch_dtype":"bfloat16","quantization_config":{
  "quant_method":"fp8","activation_scheme":"dynamic","weight_block_size":[128,128]}})";

std::int64_t blocks(std::int64_t n) {
  return (n + kB - 1) / kB;
}

using Checkpoint = testdata::Fp8TestCheckpoint;
using testdata::cut;

Checkpoint checkpoint(int seed_base) {
  Checkpoint c;
  c.next_seed = seed_base;
  c.add_fp8 = [](Checkpoint& c, const std::string& module, std::int64_t rows, std::int64_t cols) {
    c.codes(module + ".weight", rows, cols);
    c.tensors[module + ".weight_scale_inv"] = at::rand({blocks(rows), blocks(cols)}) + 0.01;
    c.dtypes[module + ".weight_scale_inv"] = DType::kFloat32;
  };
  c.bf16("model.embed_tokens.weight", {kVocab, kH});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.";
    c.bf16(p + "input_layernorm.weight", {kH});
    c.fp8(a + "q_a_proj", kQLora, kH);
    c.bf16(a + "q_a_layernorm.weight", {kQLora});
    c.fp8(a + "q_b_proj", kHeads * (kNope + kRope), kQLora);
    c.fp8(a + "kv_a_proj_with_mqa", kKvLora + kRope, kH);
    c.bf16(a + "kv_a_layernorm.weight", {kKvLora});
    c.fp8(a + "kv_b_proj", kHeads * (kNope + kV), kKvLora);
    c.fp8(a + "o_proj", kH, kHeads * kV);
    c.bf16(p + "post_attention_layernorm.weight", {kH});
    const std::string m = p + "mlp.";
    if (l == 0) {
      c.fp8(m + "gate_proj", kInter, kH);
      c.fp8(m + "up_proj", kInter, kH);
      c.fp8(m + "down_proj", kH, kInter);
      continue;
    }
    c.bf16(m + "gate.weight", {kExperts, kH});
    at::manual_seed(c.next_seed++);
    c.tensors[m + "gate.e_score_correction_bias"] = at::randn({kExperts});
    c.dtypes[m + "gate.e_score_correction_bias"] = DType::kFloat32;
    for (int e = 0; e < kExperts; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      c.fp8(x + "gate_proj", kMoeInter, kH);
      c.fp8(x + "up_proj", kMoeInter, kH);
      c.fp8(x + "down_proj", kH, kMoeInter);
    }
    c.fp8(m + "shared_experts.gate_proj", kMoeInter, kH);
    c.fp8(m + "shared_experts.up_proj", kMoeInter, kH);
    c.fp8(m + "shared_experts.down_proj", kH, kMoeInter);
  }
  c.bf16("model.norm.weight", {kH});
  c.bf16("lm_head.weight", {kVocab, kH});
  // The next-token-prediction layer the released checkpoints carry.
  c.bf16("model.layers.2.eh_proj.weight", {kH, 2 * kH});
  return c;
}

// A gate/up/down MLP under `m` of `inter` rows on rank r: gate's and up's rows
// r of tp stacked, down's columns; their grids in blocks.
void expect_mlp(std::map<std::string, at::Tensor>& want, const Checkpoint& c, const std::string& m,
                std::int64_t inter, int tp, int r) {
  const auto& t = c.tensors;
  const std::int64_t rows = inter / tp;
  want[m + "gate_up_proj.weight"] =
      at::cat({cut(t.at(m + "gate_proj.weight"), r * rows, rows, 0, kH),
               cut(t.at(m + "up_proj.weight"), r * rows, rows, 0, kH)});
  want[m + "gate_up_proj.weight_scale_inv"] =
      at::cat({cut(t.at(m + "gate_proj.weight_scale_inv"), r * rows / kB, rows / kB, 0, blocks(kH)),
               cut(t.at(m + "up_proj.weight_scale_inv"), r * rows / kB, rows / kB, 0, blocks(kH))});
  want[m + "down_proj.weight"] = cut(t.at(m + "down_proj.weight"), 0, kH, r * rows, rows);
  want[m + "down_proj.weight_scale_inv"] =
      cut(t.at(m + "down_proj.weight_scale_inv"), 0, blocks(kH), r * rows / kB, rows / kB);
}

// FP8 codes as float32 (the tests' own decoding) times each one's block scale.
at::Tensor dequantized(const at::Tensor& codes, const at::Tensor& grid) {
  std::vector<float> table;
  for (int code = 0; code < 256; ++code)
    table.push_back(testdata::value_of(static_cast<std::uint8_t>(code)));
  const at::Tensor values = at::tensor(table).index_select(0, codes.reshape({-1}).to(at::kLong));
  const at::Tensor scales = grid.repeat_interleave(kB, 0).repeat_interleave(kB, 1);
  return values.reshape(codes.sizes()) *
         scales.slice(0, 0, codes.size(0)).slice(1, 0, codes.size(1));
}

std::map<std::string, at::Tensor> expected(const Checkpoint& c, int tp, int r, bool ep) {
  std::map<std::string, at::Tensor> want;
  const ModelConfig config = parse_model_config(kConfig, "the test's config");
  const auto& t = c.tensors;
  const std::int64_t heads = kHeads / tp;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.";
    // q_a_proj's 128 rows then kv_a_proj_with_mqa's 192, whole; the grid: one
    // block row of q_a_proj's, then kv_a_proj_with_mqa's two.
    want[a + "fused_qkv_a_proj.weight"] =
        at::cat({t.at(a + "q_a_proj.weight"), t.at(a + "kv_a_proj_with_mqa.weight")});
    want[a + "fused_qkv_a_proj.weight_scale_inv"] = at::cat(
        {t.at(a + "q_a_proj.weight_scale_inv"), t.at(a + "kv_a_proj_with_mqa.weight_scale_inv")});
    const std::int64_t q_rows = heads * (kNope + kRope), kv_rows = heads * (kNope + kV),
                       o_cols = heads * kV;
    want[a + "q_b_proj.weight"] = cut(t.at(a + "q_b_proj.weight"), r * q_rows, q_rows, 0, kQLora);
    want[a + "q_b_proj.weight_scale_inv"] =
        cut(t.at(a + "q_b_proj.weight_scale_inv"), r * q_rows / kB, q_rows / kB, 0, 1);
    want[a + "kv_b_proj.weight"] =
        cut(t.at(a + "kv_b_proj.weight"), r * kv_rows, kv_rows, 0, kKvLora);
    want[a + "kv_b_proj.weight_scale_inv"] =
        cut(t.at(a + "kv_b_proj.weight_scale_inv"), r * kv_rows / kB, kv_rows / kB, 0, 1);
    // W_UK_T and W_UV from the rank's kv_b_proj, dequantized in float32 (vLLM's
    // scaled_dequantize), rounded to bfloat16.
    testdata::mla_absorbed(
        config, dequantized(want[a + "kv_b_proj.weight"], want[a + "kv_b_proj.weight_scale_inv"]),
        a, tp, want);
    want[a + "o_proj.weight"] = cut(t.at(a + "o_proj.weight"), 0, kH, r * o_cols, o_cols);
    want[a + "o_proj.weight_scale_inv"] =
        cut(t.at(a + "o_proj.weight_scale_inv"), 0, blocks(kH), r * o_cols / kB, blocks(o_cols));
    for (const char* norm : {"q_a_layernorm.weight", "kv_a_layernorm.weight"})
      want[a + norm] = t.at(a + norm);
    const std::string m = p + "mlp.";
    if (l == 0) {
      expect_mlp(want, c, m, kInter, tp, r);
      continue;
    }
    want[m + "gate.weight"] = t.at(m + "gate.weight");
    want[m + "gate.e_score_correction_bias"] = t.at(m + "gate.e_score_correction_bias");
    expect_mlp(want, c, m + "shared_experts.", kMoeInter, tp, r);
    testdata::expect_block_experts(want, t, m + "experts.", kExperts, kMoeInter, kH, kB, kB, tp, r,
                                   ep);
  }
  return want;
}

TEST(Fp8DeepSeek, MlaAndExpertsLoadAsVllmLoadsThem) {
  const ModelConfig config = parse_model_config(kConfig, "the test's config");
  const Checkpoint ckpt = checkpoint(1);
  for (const auto& [tp, ep] : std::vector<std::pair<int, bool>>{
           {1, false}, {2, false}, {4, false}, {2, true}, {4, true}}) {
    for (int r = 0; r < tp; ++r) {
      TensorParallelModel model(config, testdata::tp_rank_options(tp, r, ep));
      auto source = ckpt.source();
      model.load_weights(*source);
      const std::string what = "tp " + std::to_string(tp) + (ep ? " (experts whole)" : "") +
                               " rank " + std::to_string(r);
      testdata::expect_shards(model, expected(ckpt, tp, r, ep), what);
      EXPECT_EQ(model.rules().find_param("model.layers.0.self_attn.fused_qkv_a_proj.weight")->dtype,
                DType::kFloat8E4M3)
          << what;
      EXPECT_EQ(model.rules().find_param("model.layers.1.mlp.gate.weight")->dtype, DType::kBFloat16)
          << what << ": the router is not quantized";
    }
  }
}

// Through the reload engine in every mode (tp 1): the next checkpoint replaces
// the first in place, and the MTP layer is reported skipped.
TEST(Fp8DeepSeek, AReloadReplacesEveryWeightAndGridInPlace) {
  const ModelConfig config = parse_model_config(kConfig, "the test's config");
  const Checkpoint v1 = checkpoint(1), v2 = checkpoint(500);
  testdata::reload_in_every_mode(config, testdata::tp_rank_options(1, 0), v1, {&v2},
                                 expected(v2, 1, 0, false),
                                 "model.layers.0.self_attn.fused_qkv_a_proj.weight");
  TensorParallelModel model(config, testdata::tp_rank_options(1, 0));
  auto control = make_local_communicator();
  auto source = v1.source();
  const ReloadResult r = reload_weights(model, *control, source.get(), ReloadOptions{});
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.skipped, std::vector<std::string>{"model.layers.2.eh_proj.weight"});
}

// A load that brings kv_b_proj without its scale grid cannot derive W_UK_T and
// W_UV from it: refused, naming both.
TEST(Fp8DeepSeek, AWeightWithoutItsGridDerivesNothing) {
  const ModelConfig config = parse_model_config(kConfig, "the test's config");
  Checkpoint part = checkpoint(1);
  const std::string kv_b = "model.layers.0.self_attn.kv_b_proj.";
  for (auto it = part.tensors.begin(); it != part.tensors.end();)
    it = it->first == kv_b + "weight" ? std::next(it) : part.tensors.erase(it);
  TensorParallelModel model(config, testdata::tp_rank_options(1, 0));
  auto source = part.source();
  try {
    model.load_weights(*source);
    ADD_FAILURE() << "a weight without its grid was processed";
  } catch (const ModelError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("all of '" + kv_b + "weight' and none of '" + kv_b + "weight_scale_inv'"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("W_UK_T' is computed from all of them"), std::string::npos) << what;
  }
}

// Online FP8 (a bfloat16 checkpoint into an FP8 model, per tensor and in
// blocks): W_UK_T and W_UV come from kv_b_proj as quantized on the rank, its
// codes times their scale, not from the checkpoint's bfloat16 values.
TEST(Fp8DeepSeek, OnlineFp8DerivesFromTheQuantizedWeights) {
  const ModelConfig config = testdata::tiny_config("deepseek_v3");
  const auto ckpt = testdata::random_checkpoint(config, 17);
  for (const char* scheme : {"fp8", "fp8-block"}) {
    ModelOptions o = testdata::tp_rank_options(2, 1);
    o.quantization = scheme;
    TensorParallelModel model(config, o);
    auto source = testdata::memory_source(ckpt);
    model.load_weights(*source);
    const std::string a = "model.layers.1.self_attn.";
    const at::Tensor codes = model.parameter_for_reload(a + "kv_b_proj.weight").view(at::kByte);
    const at::Tensor scale = std::string(scheme) == "fp8"
                                 ? model.parameter_for_reload(a + "kv_b_proj.weight_scale")
                                       .reshape({1, 1})
                                       .expand({blocks(codes.size(0)), blocks(codes.size(1))})
                                 : model.parameter_for_reload(a + "kv_b_proj.weight_scale_inv");
    std::map<std::string, at::Tensor> want;
    testdata::mla_absorbed(config, dequantized(codes, scale), a, 2, want);
    ASSERT_EQ(want.size(), 2u);
    testdata::expect_shards(model, want, scheme);
    EXPECT_FALSE(
        testdata::same_bytes(want.begin()->second,
                             testdata::expected_shards(config, ckpt, 2, 1).at(want.begin()->first)))
        << scheme << ": quantization must show in the derived matrices";
  }
}

}  // namespace
}  // namespace tpreload
