#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

#include "../support/tiny_models.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/model/model.h"
#include "tpreload/model/row_writes.h"
#include "tpreload/reference/forward.h"

namespace tpreload {
namespace {

using testdata::expected_shards;
using testdata::memory_source;
using testdata::random_checkpoint;
using testdata::same_bytes;
using testdata::tiny_config;

ModelOptions opts(int tp, int rank, std::string quantization = "") {
  ModelOptions o;
  o.tp_size = tp;
  o.tp_rank = rank;
  o.quantization = std::move(quantization);
  return o;
}

TEST(ModelLoad, EveryRankHoldsExactlyTheIndependentSlices) {
  for (const char* name : testdata::kTinyConfigs) {
    const ModelConfig config = tiny_config(name);
    const auto ckpt = random_checkpoint(config, 7);
    for (int tp : {1, 2, 4, 8}) {
      for (int rank = 0; rank < tp; ++rank) {
        TensorParallelModel model(config, opts(tp, rank));
        auto source = memory_source(ckpt);
        const auto loaded = model.load_weights(*source);
        const auto expected = expected_shards(config, ckpt, tp, rank);
        ASSERT_EQ(model.named_parameters().size(), expected.size()) << name << " tp " << tp;
        for (const auto& [param, want] : expected) {
          const at::Tensor got = model.parameter_for_reload(param);
          ASSERT_TRUE(got.defined()) << param;
          EXPECT_TRUE(same_bytes(got, want))
              << name << " tp " << tp << " rank " << rank << " param " << param;
          // (a derived parameter is computed, not loaded: DeepSeek's W_UK_T)
          EXPECT_EQ(loaded.count(param), model.rules().find_param(param)->from_checkpoint ? 1u : 0u)
              << param;
        }
      }
    }
  }
}

TEST(ModelLoad, ParametersStayInPlace) {
  const ModelConfig config = tiny_config("llama_gqa");
  TensorParallelModel model(config, opts(2, 1));
  struct Layout {
    void* data;
    std::vector<std::int64_t> sizes, strides;
    at::ScalarType dtype;
  };
  std::map<std::string, Layout> before;
  for (const auto& [name, t] : model.named_parameters())
    before[name] = {t.data_ptr(), t.sizes().vec(), t.strides().vec(), t.scalar_type()};
  for (std::uint64_t seed : {1, 2}) {
    auto source = memory_source(random_checkpoint(config, seed));
    model.load_weights(*source);
  }
  for (const auto& [name, t] : model.named_parameters()) {
    EXPECT_EQ(t.data_ptr(), before[name].data) << name;
    EXPECT_EQ(t.sizes().vec(), before[name].sizes) << name;
    EXPECT_EQ(t.strides().vec(), before[name].strides) << name;
    EXPECT_EQ(t.scalar_type(), before[name].dtype) << name;
  }
}

TEST(ModelLoad, TiedHeadSharesTheEmbeddingAndSkipsLmHead) {
  const ModelConfig config = tiny_config("qwen2_tied");
  auto ckpt = random_checkpoint(config, 3);
  ckpt["lm_head.weight"] = ckpt.at("model.embed_tokens.weight").clone();
  ckpt["model.layers.0.self_attn.rotary_emb.inv_freq"] = at::ones({4});
  TensorParallelModel model(config, opts(2, 0));
  std::set<std::string> skipped;
  auto source = memory_source(ckpt);
  model.load_weights(*source, &skipped);
  EXPECT_EQ(skipped, (std::set<std::string>{"lm_head.weight",
                                            "model.layers.0.self_attn.rotary_emb.inv_freq"}));
  EXPECT_FALSE(model.parameter_for_reload("lm_head.weight").defined());
}

TEST(ModelLoad, StackedParameterCountsOnlyWhenEveryShardLoaded) {
  const ModelConfig config = tiny_config("llama_gqa");
  auto ckpt = random_checkpoint(config, 4);
  ckpt.erase("model.layers.0.self_attn.k_proj.weight");
  ckpt.erase("model.layers.1.mlp.up_proj.weight");
  TensorParallelModel model(config, opts(2, 0));
  auto source = memory_source(ckpt);
  const auto loaded = model.load_weights(*source);
  EXPECT_EQ(loaded.count("model.layers.0.self_attn.qkv_proj.weight"), 0u);
  EXPECT_EQ(loaded.count("model.layers.1.mlp.gate_up_proj.weight"), 0u);
  EXPECT_EQ(loaded.count("model.layers.1.self_attn.qkv_proj.weight"), 1u);
  EXPECT_EQ(loaded.size(), model.expected_names(WeightFormat::kCheckpoint).size() - 2);
}

TEST(ModelLoad, WrongShapeOrDtypeIsRejectedWithNames) {
  const ModelConfig config = tiny_config("llama_gqa");
  TensorParallelModel model(config, opts(4, 3));
  const auto pl = model.rules().place("model.layers.1.mlp.down_proj.weight", 3);
  ASSERT_TRUE(pl.has_value());
  try {
    model.load_checkpoint_tensor(*pl, at::zeros({64, 95}, at::kBFloat16), false);
    FAIL() << "accepted a wrong shape";
  } catch (const ModelError& e) {
    EXPECT_STREQ(e.what(),
                 "tensor 'model.layers.1.mlp.down_proj.weight' for parameter "
                 "'model.layers.1.mlp.down_proj.weight' on tp rank 3/4: expected [64, 96] "
                 "bfloat16, got [64, 95] bfloat16");
  }
  // Floating dtypes are converted on load; integer ones are refused, naming both.
  EXPECT_EQ(model.check_checkpoint_tensor(*pl, {64, 96}, DType::kFloat32, false), "");
  EXPECT_EQ(
      model.check_checkpoint_tensor(*pl, {64, 96}, DType::kInt32, false),
      "tensor 'model.layers.1.mlp.down_proj.weight' for parameter "
      "'model.layers.1.mlp.down_proj.weight' on tp rank 3/4: int32 values are not converted "
      "to bfloat16 (only floating dtypes are converted; integer and other dtypes must match)");
  EXPECT_EQ(model.check_checkpoint_tensor(*pl, {64, 24}, DType::kBFloat16, true), "");
}

TEST(ShardingRules, IndivisibleSplitsAreModelErrors) {
  try {
    ShardingRules rules(tiny_config("llama_gqa"), 3);
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_STREQ(e.what(),
                 "cannot split the model 3 ways: num_attention_heads 8 is not "
                 "divisible by 3");
  }
  EXPECT_THROW(ShardingRules(tiny_config("llama_gqa"), 16), ModelError);
  EXPECT_THROW(TensorParallelModel(tiny_config("llama_gqa"), opts(2, 2)), ModelError);
}

TEST(Lora, BaseLayerResolvesWithoutChangingTheTree) {
  const ModelConfig config = tiny_config("qwen2_tied");
  const auto ckpt = random_checkpoint(config, 5);
  ModelOptions options = opts(2, 1);
  options.lora = true;
  TensorParallelModel model(config, options);
  const auto& params = model.named_parameters();
  EXPECT_EQ(params.count("model.layers.0.self_attn.qkv_proj.base_layer.weight"), 1u);
  EXPECT_EQ(params.count("model.layers.0.self_attn.qkv_proj.base_layer.bias"), 1u);
  EXPECT_EQ(params.count("model.layers.0.self_attn.qkv_proj.lora_a"), 1u);
  EXPECT_EQ(params.count("model.layers.0.self_attn.qkv_proj.weight"), 0u);
  EXPECT_EQ(params.count("model.layers.0.input_layernorm.weight"), 1u);
  const at::Tensor base = model.parameter_for_reload("model.layers.0.self_attn.qkv_proj.weight");
  EXPECT_TRUE(base.is_same(params.at("model.layers.0.self_attn.qkv_proj.base_layer.weight")));
  for (const auto& name : model.expected_names(WeightFormat::kCheckpoint)) {
    EXPECT_EQ(name.find("base_layer"), std::string::npos) << name;
    EXPECT_EQ(name.find("lora"), std::string::npos) << name;
  }
  auto source = memory_source(ckpt);
  const auto loaded = model.load_weights(*source);
  EXPECT_EQ(loaded.size(), model.expected_names(WeightFormat::kCheckpoint).size());
  for (const auto& [param, want] : expected_shards(config, ckpt, 2, 1))
    EXPECT_TRUE(same_bytes(model.parameter_for_reload(param), want)) << param;
}

// Which parameters are int8, decided by the tests from their names
// (testdata::int8_linear), and their bytes from testdata::quantize_reference
// of the independent shards, for every tiny model, tp size and rank.
TEST(Int8, CheckpointFormatQuantizesEachRankShardPerRow) {
  for (const char* family : testdata::kTinyConfigs) {
    const ModelConfig config = tiny_config(family);
    const auto ckpt = random_checkpoint(config, 6);
    for (int tp : {1, 2, 4}) {
      for (int rank = 0; rank < tp; ++rank) {
        const std::string what =
            std::string(family) + " tp " + std::to_string(tp) + " rank " + std::to_string(rank);
        TensorParallelModel model(config, opts(tp, rank, "int8"));
        const at::Tensor o = model.parameter_for_reload("model.layers.0.self_attn.o_proj.weight");
        void* storage = o.data_ptr();
        auto source = memory_source(ckpt);
        const auto loaded = model.load_weights(*source);
        EXPECT_EQ(loaded.size(), model.expected_names(WeightFormat::kCheckpoint).size()) << what;
        EXPECT_EQ(o.data_ptr(), storage) << what;
        std::size_t quantized = 0;
        const auto want = expected_shards(config, ckpt, tp, rank);
        // (what the rest derive from the int8 weights: DeepSeek's absorbed matrices)
        const auto int8_want = testdata::expected_int8_shards(config, ckpt, tp, rank);
        ASSERT_FALSE(want.empty());
        for (const auto& [param, shard] : want) {
          const at::Tensor got = model.parameter_for_reload(param);
          ASSERT_TRUE(got.defined()) << what << ": " << param;
          if (!testdata::int8_linear(param)) {
            EXPECT_TRUE(same_bytes(got, int8_want.at(param))) << what << ": " << param;
            continue;
          }
          ++quantized;
          ASSERT_EQ(got.scalar_type(), at::kChar) << what << ": " << param << " is not int8";
          at::Tensor q, scale;
          testdata::quantize_reference(shard, q, scale);
          EXPECT_TRUE(same_bytes(got, q)) << what << ": " << param;
          EXPECT_TRUE(same_bytes(model.parameter_for_reload(param + "_scale"), scale))
              << what << ": " << param;
        }
        EXPECT_GT(quantized, 0u) << what;
      }
    }
  }
}

TEST(Int8, KernelFormatCopiesWeightsAndScalesStraight) {
  const ModelConfig config = tiny_config("llama_gqa");
  ModelOptions options = opts(2, 1, "int8");
  TensorParallelModel loaded(config, options), copy(config, options);
  auto source = memory_source(random_checkpoint(config, 8));
  loaded.load_weights(*source);
  copy.begin_load();
  for (const auto& name : copy.expected_names(WeightFormat::kKernel))
    copy.load_kernel_tensor(name, loaded.parameter_for_reload(name));
  EXPECT_EQ(copy.loaded_names(WeightFormat::kKernel).size(),
            copy.expected_names(WeightFormat::kKernel).size());
  for (const auto& [name, t] : loaded.named_parameters())
    EXPECT_TRUE(same_bytes(copy.named_parameters().at(name), t)) << name;
  EXPECT_NE(
      copy.check_kernel_tensor("model.layers.0.mlp.down_proj.weight", {64, 48}, DType::kBFloat16),
      "");
}

// A kernel-format block must be whole rows of its parameter, inside it: a
// narrower block would have been read past its end at the parameter's pitch.
// An int8 block for a parameter that is not int8 names both dtypes.
TEST(KernelRows, ABlockMustBeWholeRowsInsideTheParameter) {
  const ModelConfig config = tiny_config("llama_gqa");
  TensorParallelModel model(config, opts(2, 0));
  const std::string down = "model.layers.0.mlp.down_proj.weight";
  const at::Tensor param = model.parameter_for_reload(down);
  const std::int64_t rows = param.size(0), cols = param.size(1);
  auto error = [&](const at::Tensor& block, std::int64_t row0) {
    try {
      model.load_kernel_rows(down, block, row0, false);
    } catch (const ModelError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto dtype = param.options();
  EXPECT_EQ(error(at::zeros({2, cols}, dtype), rows - 2), "no error");
  for (const auto& [block, row0] : {std::pair{at::zeros({2, cols - 1}, dtype), std::int64_t{0}},
                                    std::pair{at::zeros({2, cols + 1}, dtype), std::int64_t{0}},
                                    std::pair{at::zeros({2, cols}, dtype), rows - 1},
                                    std::pair{at::zeros({2, cols}, dtype), std::int64_t{-1}}})
    EXPECT_NE(
        error(block, row0)
            .find("kernel-format tensor '" + down + "' on tp rank 0/2: block [2, " +
                  std::to_string(block.size(1)) + "] bfloat16 at row " + std::to_string(row0) +
                  " does not fit the parameter ([" + std::to_string(rows) + ", " +
                  std::to_string(cols) + "] bfloat16: whole rows inside it)"),
        std::string::npos)
        << error(block, row0);
  EXPECT_EQ(
      model.check_kernel_tensor(down, {rows, cols}, DType::kInt8),
      "kernel-format tensor '" + down + "' on tp rank 0/2: expected bfloat16 weights, got int8");
}

// write_source_end: a write reads its source only before it (bytes after it, and
// between rows, may be anything), and it does read the byte just before it. The
// ends are worked out here from the shapes: hidden 64, intermediate 96, tp 4.
TEST(RowWrites, ASinkWriteReadsItsSourceUpToWriteSourceEndAndNoFurther) {
  const ModelConfig config = parse_model_config(
      R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":96,
      "num_hidden_layers":1,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":100,
      "torch_dtype":"bfloat16"})",
      "test");
  struct Case {
    const char* tensor;
    DType src;
    std::string quantization;
    std::uint64_t end;
    const char* what;
  };
  // up_proj [96, 64] on tp rank 2: rows 48-71 are its; written: rows [48, 53)
  // of a source whose row 0 is at byte 64, 128-byte rows (256 in float32).
  const std::uint64_t row = 64 * 2;
  for (const Case& c : {
           Case{"model.layers.0.mlp.up_proj.weight", DType::kBFloat16, "", 64 + 53 * row,
                "column-parallel rows copied"},
           Case{"model.layers.0.mlp.up_proj.weight", DType::kFloat32, "", 64 + 53 * 2 * row,
                "column-parallel rows converted from float32"},
           Case{"model.layers.0.mlp.up_proj.weight", DType::kBFloat16, "int8", 64 + 53 * row,
                "column-parallel rows quantized"},
           // down_proj [64, 96]: columns [48, 72) of each 192-byte row, rows 8-12.
           Case{"model.layers.0.mlp.down_proj.weight", DType::kBFloat16, "", 64 + 12 * 192 + 72 * 2,
                "a row-parallel window of each row"},
       }) {
    ModelOptions mo;
    mo.tp_size = 4;
    mo.tp_rank = 2;
    mo.quantization = c.quantization;
    TensorParallelModel model(config, mo);
    const Placement pl = *model.rules().place(c.tensor, 2);
    const bool column = std::string(c.tensor).find("up_proj") != std::string::npos;
    // Rows [row0, row0 + 5) of a source whose row 0 is at byte 64: row row0 at
    // 64 + row0 x the source row's bytes.
    const std::int64_t row0 = column ? 48 : 8;
    const std::uint64_t src_row = column ? (c.src == DType::kFloat32 ? 2 * row : row) : 192;
    const auto w = checkpoint_row_write(model.rules(), pl, c.src, row0, 5, false,
                                        64 + static_cast<std::uint64_t>(row0) * src_row);
    ASSERT_TRUE(w) << c.what;
    const ParamSpec& param = model.rules().params().at(w->slot);
    ASSERT_EQ(write_source_end(*w, param), c.end) << c.what;
    // Finite values of any of the source dtypes: small exponents.
    std::vector<std::byte> clean(c.end + 512);
    for (std::size_t i = 0; i < clean.size(); ++i)
      clean[i] = static_cast<std::byte>((i * 37 + 11) % 61);
    auto written = [&](const std::vector<std::byte>& src) {
      model.sink().write(*w, src.data());
      std::vector<at::Tensor> out;
      for (const auto& [name, t] : model.named_parameters()) out.push_back(t.clone());
      return out;
    };
    auto same = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
      for (std::size_t i = 0; i < a.size(); ++i)
        if (!testdata::same_bytes(a[i], b[i])) return false;
      return true;
    };
    const auto want = written(clean);
    std::vector<std::byte> after = clean;  // everything from the end on: other values
    for (std::size_t i = c.end; i < after.size(); ++i) after[i] = std::byte{0x3c};
    EXPECT_TRUE(same(written(after), want)) << c.what << ": read a byte at or after its end";
    std::vector<std::byte> last = clean;  // its last byte: another value
    last[c.end - 1] = std::byte{0x3c};
    EXPECT_FALSE(same(written(last), want)) << c.what << ": its last byte was not read";
  }
}

// A plain copy of contiguous rows is handed out as the parameter's own bytes
// (a caller reads them straight from a file); anything else is not. Handing
// them out, or counting a write placed earlier, names the parameter among
// those a failed reload may have mixed.
TEST(RowWrites, HostRowsArePlainCopiesOnlyAndEveryPlacedWriteIsNamed) {
  const ModelConfig config = tiny_config("llama_gqa");
  TensorParallelModel model(config, opts(1, 0));
  ParameterSink& sink = model.sink();
  auto write_into = [&](const std::string& name, std::int64_t dest_row, std::int64_t rows) {
    const at::Tensor t = model.parameter_for_reload(name);
    RowWrite w;
    w.slot = model.rules().find_slot(name);
    w.src_dtype = sink.rules().params().at(w.slot).dtype;
    w.src_pitch = static_cast<std::uint64_t>(t.size(1) * t.element_size());
    w.dest_row = dest_row;
    w.rows = rows;
    return std::make_pair(w, t);
  };
  sink.begin_load();
  const std::string down = "model.layers.0.mlp.down_proj.weight";
  auto [w, t] = write_into(down, 1, 2);
  const auto rows = sink.host_rows(w);
  ASSERT_TRUE(rows);
  EXPECT_EQ(rows->data, static_cast<std::byte*>(t.data_ptr()) + w.src_pitch);
  EXPECT_EQ(rows->size, 2 * w.src_pitch);
  RowWrite window = w;  // rows of a wider source: a window, not a plain copy
  window.src_pitch *= 2;
  EXPECT_FALSE(sink.host_rows(window));
  RowWrite converted = w;
  converted.kind = WriteKind::kQuantizeInt8;
  EXPECT_FALSE(sink.host_rows(converted));
  EXPECT_EQ(sink.touched_names(), std::vector<std::string>{down});

  const std::string up = "model.layers.1.mlp.gate_up_proj.weight";
  auto [placed, up_tensor] = write_into(up, 0, 1);
  sink.count_placed(placed);
  EXPECT_EQ(sink.touched_names(), (std::vector<std::string>{down, up}));
  placed.dest_row = up_tensor.size(0);  // one row past the parameter's end
  try {
    sink.count_placed(placed);
    FAIL() << "a write past the parameter's rows was counted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("into parameter '" + up + "' of " +
                                         std::to_string(up_tensor.size(0)) + " rows"),
              std::string::npos)
        << e.what();
  }
  sink.begin_load();
  EXPECT_TRUE(sink.touched_names().empty());
}

TEST(Forward, SingleRankMatchesTheReference) {
  const std::vector<std::int64_t> tokens = {1, 17, 99, 3, 42, 0, 64};
  auto comm = make_local_communicator();
  for (const char* name : testdata::kTinyConfigs) {
    const ModelConfig config = tiny_config(name);
    const auto ckpt = random_checkpoint(config, 9);
    TensorParallelModel model(config, opts(1, 0));
    auto source = memory_source(ckpt);
    model.load_weights(*source);
    const at::Tensor got = reference_forward(model, tokens, *comm);
    const at::Tensor want = testdata::reference_logits(config, ckpt, tokens);
    ASSERT_EQ(got.sizes(), want.sizes()) << name;
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-4))
        << name << " max diff " << (got - want).abs().max().item<float>();
  }
}

// The tokens the rope tests run: 9 positions.
const std::vector<std::int64_t> kRopeTokens = {1, 17, 99, 3, 42, 0, 64, 5, 8};

// llama_gqa's config (head_dim 8) with `fields` added at its end, and
// `replace` (when given) replaced by `with`.
ModelConfig llama_gqa_with(const std::string& fields, const std::string& replace = "",
                           const std::string& with = "") {
  std::string text = tiny_config("llama_gqa").json;
  if (!replace.empty()) text.replace(text.find(replace), replace.size(), with);
  text.insert(text.rfind('}'), fields);
  return parse_model_config(text, "config.json");
}

// The logits of a 1-rank model of `config` loaded with `ckpt`, for kRopeTokens,
// and the reference's.
std::pair<at::Tensor, at::Tensor> logits_and_reference(
    const ModelConfig& config, const std::map<std::string, at::Tensor>& ckpt) {
  auto comm = make_local_communicator();
  TensorParallelModel model(config, opts(1, 0));
  auto source = memory_source(ckpt);
  model.load_weights(*source);
  return {reference_forward(model, kRopeTokens, *comm),
          testdata::reference_logits(config, ckpt, kRopeTokens)};
}

// The ModelError a 1-rank model of `config` throws from its forward pass
// over kRopeTokens (its weights left as built), or "" where it runs.
std::string forward_error(const ModelConfig& config) {
  auto comm = make_local_communicator();
  TensorParallelModel model(config, opts(1, 0));
  try {
    reference_forward(model, kRopeTokens, *comm);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

// Rope scaling changes the logits as the reference's own formula says: llama3
// (with theta 100 and a context of 32, head_dim 8's four frequencies fall in
// each of its three bands: kept, blended, divided), linear, and yarn (its bands
// and its scale of cos and sin). A scaling the forward pass does not compute,
// or one missing a field it needs, is refused, naming it.
TEST(Forward, RopeScalingAsTheConfigSaysIt) {
  const std::vector<std::int64_t>& tokens = kRopeTokens;
  auto comm = make_local_communicator();
  const ModelConfig plain = tiny_config("llama_gqa");
  ASSERT_EQ(plain.head_dim, 8);
  // The config with rope_theta 100 and `fields` added.
  auto with = [&](const std::string& fields) {
    return llama_gqa_with(fields, R"("rope_theta":10000.0)", R"("rope_theta":100.0)");
  };
  const auto ckpt = random_checkpoint(plain, 19);
  const ModelConfig unscaled = with("");
  const at::Tensor unscaled_logits = testdata::reference_logits(unscaled, ckpt, tokens);
  for (const std::string scaling :
       {R"({"rope_type":"llama3","factor":4,"low_freq_factor":1,"high_freq_factor":4,)"
        R"("original_max_position_embeddings":32})",
        R"({"type":"linear","factor":2.0})",
        // yarn with vLLM's defaults: pair 0 kept, pair 1 blended, 2 and 3
        // interpolated; then bounds between pairs (no truncation) and the
        // optional settings.
        R"({"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32})",
        R"({"rope_type":"yarn","factor":8,"original_max_position_embeddings":64,"beta_fast":8,)"
        R"("beta_slow":2,"truncate":false,"attn_factor":0.9})",
        R"({"type":"yarn","factor":4,"original_max_position_embeddings":32,)"
        R"("apply_yarn_scaling":false,"extrapolation_factor":0.5})",
        R"({"rope_type":"dynamic","factor":4.0})", R"({"rope_type":"dynamic","alpha":8.0})",
        // longrope, as vLLM picks the factors: the long ones where the model's
        // context (64) exceeds the original one, at any length (the magnitude
        // derived, then given; "su" is its older name), the short ones where
        // it does not (the magnitude given).
        R"({"rope_type":"longrope","short_factor":[1.0,1.5,2.5,4.0],)"
        R"("long_factor":[1.0,3.0,6.0,12.0],"original_max_position_embeddings":4,)"
        R"("max_position_embeddings":64})",
        R"({"type":"su","short_factor":[1.0,1.5,2.5,4.0],"long_factor":[1,3,6,12],)"
        R"("original_max_position_embeddings":16,"max_position_embeddings":64,)"
        R"("short_mscale":1.3,"long_mscale":2.0})",
        R"({"rope_type":"longrope","short_factor":[1.0,1.5,2.5,4.0],"long_factor":[1,3,6,12],)"
        R"("original_max_position_embeddings":16,"max_position_embeddings":16,)"
        R"("short_mscale":1.3,"long_mscale":2.0})"}) {
    const auto [got, want] = logits_and_reference(with(R"(,"rope_scaling":)" + scaling), ckpt);
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-4))
        << scaling << ": max diff " << (got - want).abs().max().item<float>();
    EXPECT_GT((want - unscaled_logits).abs().max().item<float>(), 1e-3)
        << scaling << " does not change the reference's logits: the test proves nothing";
  }
  // Refused, naming what is missing: a kind not computed here, a field absent.
  for (const auto& [scaling, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"rope_type":"mrope","mrope_section":[2,1,1]})", "rope_type 'mrope' (rope_scaling "},
           {R"({"rope_type":"longrope","short_factor":[1,2,3,4],"long_factor":[1,2,3],)"
            R"("original_max_position_embeddings":16,"max_position_embeddings":16})",
            "rope_type 'longrope' needs 4 positive 'rope_scaling.long_factor' values (one per "
            "rotary pair), got 3"},
           {R"({"rope_type":"longrope","short_factor":[1,2,3,4],"long_factor":[1,2,3,4]})",
            "rope_type 'longrope' needs a positive "
            "'rope_scaling.original_max_position_embeddings'"},
           {R"({"rope_type":"yarn","factor":4.0})",
            "rope_type 'yarn' needs a positive 'rope_scaling.original_max_position_embeddings'"},
           {R"({"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32,)"
            R"("beta_slow":0})",
            "rope_type 'yarn' needs a positive 'rope_scaling.beta_slow'"},
           {R"({"rope_type":"llama3","factor":4,"low_freq_factor":1,"high_freq_factor":4})",
            "rope_type 'llama3' needs a positive 'rope_scaling.original_max_position_embeddings'"},
           {R"({"type":"linear","factor":-2})",
            "rope_type 'linear' needs a positive 'rope_scaling.factor'"}}) {
    TensorParallelModel model(with(R"(,"rope_scaling":)" + scaling), opts(1, 0));
    try {
      reference_forward(model, tokens, *comm);
      ADD_FAILURE() << scaling << ": the forward pass ran";
    } catch (const ModelError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

// partial_rotary_factor (vLLM's Llama attention, as Phi-4-mini's config sets
// it): rotary turns the first head_dim x factor dimensions of each head, its
// frequencies counted over those, alone and with yarn; the reference's logits
// differ from full rotary's. A factor that leaves no even count is refused.
TEST(Forward, PartialRotaryTurnsTheFirstDimensionsOfEachHead) {
  const ModelConfig plain = tiny_config("llama_gqa");
  ASSERT_EQ(plain.head_dim, 8);
  const auto ckpt = random_checkpoint(plain, 23);
  for (const std::string fields :
       {R"(,"partial_rotary_factor":0.5)",
        R"(,"partial_rotary_factor":0.75,"rope_scaling":{"rope_type":"yarn","factor":4.0,)"
        R"("original_max_position_embeddings":32})",
        // (dynamic's exponent d / (d - 2) counts the rotary dimensions, 6)
        R"(,"partial_rotary_factor":0.75,"rope_scaling":{"rope_type":"dynamic","factor":4.0})"}) {
    const ModelConfig config = llama_gqa_with(fields);
    const auto [got, want] = logits_and_reference(config, ckpt);
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-4))
        << fields << ": max diff " << (got - want).abs().max().item<float>();
    nlohmann::json whole = nlohmann::json::parse(config.json);
    whole["partial_rotary_factor"] = 1.0;
    const ModelConfig full = parse_model_config(whole.dump(), "config.json");
    EXPECT_GT(
        (want - testdata::reference_logits(full, ckpt, kRopeTokens)).abs().max().item<float>(),
        1e-3)
        << fields << " does not change the reference's logits: the test proves nothing";
  }
  // Phi-4-mini's shape: longrope over 0.75 of each head, one factor per
  // rotary pair (3 here), against the same partial rotary unscaled.
  const ModelConfig phi4 = llama_gqa_with(
      R"(,"partial_rotary_factor":0.75,"rope_scaling":{"rope_type":"longrope",)"
      R"("short_factor":[1,2,3],"long_factor":[1.5,4,9],"original_max_position_embeddings":4,)"
      R"("max_position_embeddings":32})");
  const auto [got, want] = logits_and_reference(phi4, ckpt);
  EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-4))
      << "longrope: max diff " << (got - want).abs().max().item<float>();
  EXPECT_GT((want - testdata::reference_logits(llama_gqa_with(R"(,"partial_rotary_factor":0.75)"),
                                               ckpt, kRopeTokens))
                .abs()
                .max()
                .item<float>(),
            1e-3)
      << "longrope does not change the reference's logits: the test proves nothing";
  const std::string odd = forward_error(llama_gqa_with(R"(,"partial_rotary_factor":0.2)"));
  EXPECT_NE(odd.find("turns 1 dimensions; rotary needs a positive even count"), std::string::npos)
      << "rotary over 1 dimension: " << odd;
}

// GLM-4's rotary on interleaved pairs over whole heads (its factor set to 1)
// and with yarn, against the reference, whose logits each setting changes;
// longrope, which vLLM computes on halves only (its
// Phi3LongRoPEScaledRotaryEmbedding refuses GPT-J's pairs), is refused.
TEST(Forward, Glm4RotaryOnInterleavedPairs) {
  const ModelConfig glm = tiny_config("glm4");
  const auto ckpt = random_checkpoint(glm, 37);
  auto with = [&](const std::string& fields) {
    std::string text = glm.json;
    text.insert(text.rfind('}'), fields);
    return parse_model_config(text, "config.json");
  };
  for (
      const std::string fields :
      {R"(,"partial_rotary_factor":1.0)",
       R"(,"rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":4})"}) {
    const auto [got, want] = logits_and_reference(with(fields), ckpt);
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-4))
        << fields << ": max diff " << (got - want).abs().max().item<float>();
    EXPECT_GT((want - testdata::reference_logits(glm, ckpt, kRopeTokens)).abs().max().item<float>(),
              1e-3)
        << fields << " does not change the reference's logits: the test proves nothing";
  }
  const std::string error =
      forward_error(with(R"(,"rope_scaling":{"rope_type":"longrope","short_factor":[1,2,3,4],)"
                         R"("long_factor":[1,2,3,4],"original_max_position_embeddings":4,)"
                         R"("max_position_embeddings":32})"));
  EXPECT_NE(error.find("forward: rope_type 'longrope' (rope_scaling {"), std::string::npos)
      << error;
  EXPECT_NE(error.find(") on interleaved pairs is not computed here"), std::string::npos) << error;
}

// Gemma's MLP activation as its config says: exact GeLU with hidden_activation
// "gelu", the tanh approximation otherwise; the reference's logits differ
// between the two (the tiny gemma config, whose tanh GeLU every walk of the
// tiny models checks, proves the rest: its norms and scaled embeddings).
TEST(Forward, GemmaActivationsAsTheConfigSaysThem) {
  const ModelConfig tanh = tiny_config("gemma");
  ASSERT_EQ(tanh.activation, Activation::kGeluTanh);
  std::string text = tanh.json;
  text.insert(text.rfind('}'), R"(,"hidden_activation":"gelu")");
  const ModelConfig exact = parse_model_config(text, "config.json");
  const auto ckpt = random_checkpoint(exact, 29);
  const auto [got, want] = logits_and_reference(exact, ckpt);
  EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-4))
      << "max diff " << (got - want).abs().max().item<float>();
  EXPECT_GT((want - testdata::reference_logits(tanh, ckpt, kRopeTokens)).abs().max().item<float>(),
            1e-4)
      << "the two GeLUs give the reference the same logits: the test proves nothing";
}

// Gemma 3 chooses each layer's rotary by its type: with or without a window,
// and whether the config spells the rotary as transformers 4 does or per
// attention type as transformers 5 does (the sliding entry scaled too).
TEST(Forward, Gemma3RotaryGoesByLayerTypeInEitherSpelling) {
  const ModelConfig four = tiny_config("gemma3");
  const auto ckpt = random_checkpoint(four, 31);
  auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(four.json);
    edit(j);
    return parse_model_config(j.dump(), "config.json");
  };
  const auto [windowed, windowed_want] = logits_and_reference(four, ckpt);
  const auto [unwindowed, unwindowed_want] =
      logits_and_reference(edited([](nlohmann::json& j) { j["sliding_window"] = nullptr; }), ckpt);
  EXPECT_TRUE(at::allclose(unwindowed, unwindowed_want, 1e-4, 1e-4))
      << "max diff " << (unwindowed - unwindowed_want).abs().max().item<float>();
  EXPECT_GT((unwindowed_want - windowed_want).abs().max().item<float>(), 1e-4)
      << "the window changes nothing in the reference: the test proves nothing";
  // transformers 5's spelling of the same model, then with the sliding layers'
  // rotary scaled.
  auto five = [&](double local_factor) {
    return edited([&](nlohmann::json& j) {
      j["rope_parameters"] = {
          {"full_attention",
           {{"rope_type", "linear"},
            {"factor", j["rope_scaling"]["factor"]},
            {"rope_theta", j["rope_theta"]}}},
          {"sliding_attention",
           local_factor == 1
               ? nlohmann::json{{"rope_type", "default"}, {"rope_theta", j["rope_local_base_freq"]}}
               : nlohmann::json{{"rope_type", "linear"},
                                {"factor", local_factor},
                                {"rope_theta", j["rope_local_base_freq"]}}}};
      for (const char* key : {"rope_theta", "rope_local_base_freq", "rope_scaling"}) j.erase(key);
    });
  };
  const auto [same, same_want] = logits_and_reference(five(1), ckpt);
  EXPECT_TRUE(at::equal(same, windowed)) << "the two spellings of one model differ";
  EXPECT_TRUE(at::allclose(same_want, windowed_want, 1e-9, 1e-9));
  const auto [scaled, scaled_want] = logits_and_reference(five(2), ckpt);
  EXPECT_TRUE(at::allclose(scaled, scaled_want, 1e-4, 1e-4))
      << "max diff " << (scaled - scaled_want).abs().max().item<float>();
  EXPECT_GT((scaled_want - windowed_want).abs().max().item<float>(), 1e-4)
      << "scaling the sliding rotary changes nothing in the reference: the test proves nothing";
}

}  // namespace
}  // namespace tpreload
