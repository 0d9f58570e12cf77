// Block-scaled FP8 checkpoints (quantization_config fp8, weight_block_size
// [128, 128]) loaded as vLLM's Fp8LinearMethod and Fp8MoEMethod load them: FP8
// weights sliced as the weight loaders slice weights, float32 scale grids sliced
// in units of 128-row and 128-column blocks beside them. The checkpoint's names,
// shapes and dtypes are written here from the Hugging Face modules (not from the
// rules under test), and every expected shard is cut here with its own
// arithmetic: q/k/v rows (a KV head replicated where tp exceeds them), gate/up
// rows, row-parallel columns, experts split by tp or held whole.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "fp8_checkpoints.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/data_transport.h"
#include "tpreload/core/error.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/reload.h"

namespace tpreload {
namespace {

// The blocks: 128 rows; 128 columns (as released checkpoints have it), or 64 in
// a test that tells rows from columns (the block size of the config under test).
constexpr std::int64_t kN = 128;
std::int64_t kK = 128;
constexpr std::int64_t kH = 320;  // hidden: not whole blocks (grids round up)
constexpr std::int64_t kHeads = 4, kKv = 2, kHd = 128, kInter = 512, kVocab = 128;
constexpr std::int64_t kExperts = 4, kMoeInter = 256;

std::int64_t blocks_n(std::int64_t n) {
  return (n + kN - 1) / kN;
}
std::int64_t blocks_k(std::int64_t n) {
  return (n + kK - 1) / kK;
}
// The grid columns of `n` weight columns out of `total`: all of the grid's
// (which rounds up) where they are all, else whole blocks.
std::int64_t grid_cols(std::int64_t n, std::int64_t total) {
  return n == total ? blocks_k(total) : n / kK;
}

const char* kDense = R"({"architectures":["LlamaForCausalLM"],"hidden_size":320,
  "intermediate_size":512,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
  "head_dim":128,"vocab_size":128,"torch_dtype":"bfloat16","tie_word_embeddings":false,
  "quantization_config":{"quant_method":"fp8","activation_scheme":"dynamic",
    "weight_block_size":[128,128],"ignored_layers":["model.layers.1.self_attn.o_proj"]}})";

const char* kMoe = R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":320,
  "intermediate_size":512,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,
  "head_dim":128,"vocab_size":128,"num_experts":4,"num_experts_per_tok":2,
  "moe_intermediate_size":256,"norm_topk_prob":true,"torch_dtype":"bfloat16",
  "tie_word_embeddings":false,"quantization_config":{"quant_method":"fp8",
  "activation_scheme":"dynamic","weight_block_size":[128,128],
  "modules_to_not_convert":["lm_head","model.layers.0.mlp.gate"]}})";

using Checkpoint = testdata::Fp8TestCheckpoint;
using testdata::cut;
using testdata::expect_shards;

constexpr testdata::Fp8Sizes kSizes{kH, kHeads, kKv, kHd, kInter, kVocab, kExperts, kMoeInter};

// An FP8 weight and its scale grid.
void add_fp8(Checkpoint& c, const std::string& module, std::int64_t rows, std::int64_t cols) {
  c.codes(module + ".weight", rows, cols);
  c.tensors[module + ".weight_scale_inv"] = at::rand({blocks_n(rows), blocks_k(cols)}) + 0.01;
  c.dtypes[module + ".weight_scale_inv"] = DType::kFloat32;
}

Checkpoint dense_checkpoint() {
  return testdata::fp8_dense_checkpoint(kSizes, add_fp8);
}

Checkpoint moe_checkpoint() {
  return testdata::fp8_moe_checkpoint(kSizes, add_fp8);
}

// What rank `r` of `tp` holds of the attention of layer prefix `p`, weights and
// grids: q's rows of the rank, then the rows of its KV head group (replicated
// where tp exceeds the KV heads), in 128-row blocks for the grids.
void expect_attention(std::map<std::string, at::Tensor>& want, const Checkpoint& c,
                      const std::string& p, int tp, int r, bool o_quantized) {
  const auto& t = c.tensors;
  const auto [q_at, q_rows, kv_at, kv_rows] = testdata::attention_rows(kSizes, tp, r);
  const std::string a = p + "self_attn.";
  for (const char* leaf : {"weight", "weight_scale_inv"}) {
    const bool grid = std::string(leaf) != "weight";
    const std::int64_t unit = grid ? kN : 1, cols = grid ? blocks_k(kH) : kH;
    want[a + "qkv_proj." + leaf] =
        at::cat({cut(t.at(a + "q_proj." + leaf), q_at / unit, q_rows / unit, 0, cols),
                 cut(t.at(a + "k_proj." + leaf), kv_at / unit, kv_rows / unit, 0, cols),
                 cut(t.at(a + "v_proj." + leaf), kv_at / unit, kv_rows / unit, 0, cols)});
  }
  const std::int64_t o_cols = kHeads * kHd / tp;
  want[a + "o_proj.weight"] = cut(t.at(a + "o_proj.weight"), 0, kH, r * o_cols, o_cols);
  if (o_quantized)
    want[a + "o_proj.weight_scale_inv"] = cut(t.at(a + "o_proj.weight_scale_inv"), 0, blocks_n(kH),
                                              r * o_cols / kK, grid_cols(o_cols, kHeads * kHd));
}

std::map<std::string, at::Tensor> expected_dense(const Checkpoint& c, int tp, int r) {
  std::map<std::string, at::Tensor> want;
  const auto& t = c.tensors;
  const std::int64_t rows = kInter / tp;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    expect_attention(want, c, p, tp, r, l == 0);
    const std::string m = p + "mlp.";
    want[m + "gate_up_proj.weight"] =
        at::cat({cut(t.at(m + "gate_proj.weight"), r * rows, rows, 0, kH),
                 cut(t.at(m + "up_proj.weight"), r * rows, rows, 0, kH)});
    want[m + "gate_up_proj.weight_scale_inv"] = at::cat(
        {cut(t.at(m + "gate_proj.weight_scale_inv"), r * rows / kN, rows / kN, 0, blocks_k(kH)),
         cut(t.at(m + "up_proj.weight_scale_inv"), r * rows / kN, rows / kN, 0, blocks_k(kH))});
    want[m + "down_proj.weight"] = cut(t.at(m + "down_proj.weight"), 0, kH, r * rows, rows);
    want[m + "down_proj.weight_scale_inv"] =
        cut(t.at(m + "down_proj.weight_scale_inv"), 0, blocks_n(kH), r * rows / kK,
            grid_cols(rows, kInter));
  }
  return want;
}

// FusedMoE: w13 [E_local, 2 I_local, H] (each expert's gate rows, then up rows),
// w2 [E_local, H, I_local]; their grids in blocks. Tensor-parallel experts: every
// expert, the rank's rows (gate/up) and columns (down); expert parallelism: the
// rank's experts whole.
std::map<std::string, at::Tensor> expected_moe(const Checkpoint& c, int tp, int r, bool ep) {
  std::map<std::string, at::Tensor> want;
  expect_attention(want, c, "model.layers.0.", tp, r, true);
  testdata::expect_block_experts(want, c.tensors, "model.layers.0.mlp.experts.", kExperts,
                                 kMoeInter, kH, kN, kK, tp, r, ep);
  return want;
}

ModelOptions rank(int tp, int r, bool ep = false) {
  return testdata::tp_rank_options(tp, r, ep);
}

TEST(Fp8Block, DenseWeightsAndGridsAreSlicedAsVllmSlicesThem) {
  // (96: column grids that round up, where a row-parallel layer is whole at tp 1)
  struct Reset {
    ~Reset() { kK = 128; }
  } reset;
  for (const std::int64_t block_k : {128, 64, 96}) {
    kK = block_k;
    std::string text = kDense;
    text.replace(text.find("[128,128]"), 9, "[128," + std::to_string(block_k) + "]");
    const ModelConfig config = parse_model_config(text, "the test's config");
    const Checkpoint ckpt = dense_checkpoint();
    for (int tp : block_k == 96 ? std::vector<int>{1} : std::vector<int>{1, 2, 4}) {
      for (int r = 0; r < tp; ++r) {
        TensorParallelModel model(config, rank(tp, r));
        auto source = ckpt.source();
        const std::set<std::string> loaded = model.load_weights(*source);
        const std::string what = "blocks [128, " + std::to_string(kK) + "], tp " +
                                 std::to_string(tp) + " rank " + std::to_string(r);
        expect_shards(model, expected_dense(ckpt, tp, r), what);
        EXPECT_EQ(model.rules().find_param("model.layers.1.self_attn.o_proj.weight")->dtype,
                  DType::kBFloat16)
            << what << ": an ignored module stays in the model's dtype";
        EXPECT_EQ(model.rules().find_param("model.layers.1.self_attn.o_proj.weight_scale_inv"),
                  nullptr)
            << what;
        EXPECT_EQ(model.rules().find_param("model.layers.0.self_attn.qkv_proj.weight")->dtype,
                  DType::kFloat8E4M3)
            << what;
        EXPECT_EQ(loaded.count("model.layers.0.mlp.gate_up_proj.weight_scale_inv"), 1u) << what;
      }
    }
  }
  kK = 128;
}

TEST(Fp8Block, ExpertsTensorAndExpertParallelSliceTheirGrids) {
  const ModelConfig config = parse_model_config(kMoe, "the test's config");
  const Checkpoint ckpt = moe_checkpoint();
  for (const auto& [tp, ep] :
       std::vector<std::pair<int, bool>>{{1, false}, {2, false}, {2, true}, {4, true}}) {
    for (int r = 0; r < tp; ++r) {
      TensorParallelModel model(config, rank(tp, r, ep));
      auto source = ckpt.source();
      model.load_weights(*source);
      const std::string what = "tp " + std::to_string(tp) + (ep ? " (experts whole)" : "") +
                               " rank " + std::to_string(r);
      expect_shards(model, expected_moe(ckpt, tp, r, ep), what);
      EXPECT_EQ(model.rules().find_param("model.layers.0.mlp.gate.weight")->dtype, DType::kBFloat16)
          << what << ": the router is not quantized";
    }
  }
}

// Through the reload engine (one rank), every parameter expected (the grids too)
// arrives, and a second FP8 checkpoint replaces the first in place.
TEST(Fp8Block, AReloadLoadsEveryWeightAndGridInPlace) {
  struct Reset {
    ~Reset() { kK = 128; }
  } reset;
  for (const std::int64_t block_k : {128, 96}) {  // (96: grids whose columns round up)
    kK = block_k;
    std::string text = kDense;
    text.replace(text.find("[128,128]"), 9, "[128," + std::to_string(block_k) + "]");
    TensorParallelModel model(parse_model_config(text, "the test's config"), rank(1, 0));
    auto control = make_local_communicator();
    const Checkpoint v1 = dense_checkpoint();
    Checkpoint v2 = dense_checkpoint();
    for (auto& [name, t] : v2.tensors) t = t.flip({0}).contiguous();  // other bytes, same shapes
    for (const Distribution d : {Distribution::kBroadcast, Distribution::kScatter}) {
      ReloadOptions o;
      o.distribution = d;
      auto s1 = v1.source();
      reload_weights(model, *control, s1.get(), o);
      const void* before =
          model.parameter_for_reload("model.layers.0.self_attn.qkv_proj.weight").data_ptr();
      auto s2 = v2.source();
      const ReloadResult result = reload_weights(model, *control, s2.get(), o);
      const std::string what =
          "blocks [128, " + std::to_string(block_k) + "], " + std::string(distribution_name(d));
      EXPECT_TRUE(result.complete()) << what;
      expect_shards(model, expected_dense(v2, 1, 0), what);
      EXPECT_EQ(model.parameter_for_reload("model.layers.0.self_attn.qkv_proj.weight").data_ptr(),
                before)
          << what;
    }
  }
}

// A rank's share that is not whole blocks is refused when the model is built,
// naming the tensor and the sizes (vLLM refuses these too).
TEST(Fp8Block, ASplitThatIsNotWholeBlocksIsRefused) {
  const ModelConfig moe = parse_model_config(kMoe, "the test's config");
  try {
    TensorParallelModel model(moe, rank(4, 0));  // 256 / 4 = 64 rows of each expert
    FAIL() << "experts split into 64-row shares of 128-row blocks";
  } catch (const ModelError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot load the FP8 checkpoint with tp 4: the "), std::string::npos)
        << what;
    EXPECT_NE(what.find(" per rank of 'model.layers.0.mlp.experts."), std::string::npos) << what;
    EXPECT_NE(what.find(" 64 is not a multiple of the block 128"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(TensorParallelModel(moe, rank(4, 0, true))) << "whole experts are whole blocks";
  ModelConfig narrow = parse_model_config(kDense, "the test's config");
  narrow.head_dim = 64;  // a KV head of 64 rows
  narrow.num_attention_heads = 8;
  try {
    TensorParallelModel model(narrow, rank(2, 0));
    FAIL() << "64 KV rows per rank of 128-row blocks";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("the rows per rank of "
                                         "'model.layers.0.self_attn.k_proj.weight' 64 is not a "
                                         "multiple of the block 128"),
              std::string::npos)
        << e.what();
  }
  // A fused layer quantized in part (q_proj ignored, k_proj and v_proj not).
  std::string part = kDense;
  part.replace(part.find("model.layers.1.self_attn.o_proj"), 31, "model.layers.1.self_attn.q_proj");
  try {
    parse_model_config(part, "config.json");
    TensorParallelModel model(parse_model_config(part, "config.json"), rank(1, 0));
    FAIL() << "q_proj unquantized beside quantized k_proj and v_proj";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("quantizes 'model.layers.1.self_attn.k_proj.weight' but "
                                         "not 'model.layers.1.self_attn.q_proj.weight', which vLLM "
                                         "fuses into 'model.layers.1.self_attn.qkv_proj.weight'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Fp8Block, QuantizationConfigsVllmRefusesAreRefused) {
  auto error = [](const std::string& quantization_config) {
    std::string text = kDense;
    text = text.substr(0, text.find("\"quantization_config\"")) +
           "\"quantization_config\":" + quantization_config + "}";
    try {
      parse_model_config(text, "config.json");
    } catch (const ModelError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error(R"({"quant_method":"fp8","activation_scheme":"static",
                      "weight_block_size":[128,128]})")
                .find("activation_scheme \"static\" with weight_block_size is refused"),
            std::string::npos);
  EXPECT_NE(error(R"({"quant_method":"awq"})").find("quant_method 'awq' is not supported"),
            std::string::npos);
  EXPECT_NE(error(R"({"quant_method":"fp8","weight_block_size":[128]})")
                .find("weight_block_size must be two positive integers, got [128]"),
            std::string::npos);
  EXPECT_EQ(error("null"), "accepted");
}

}  // namespace
}  // namespace tpreload
