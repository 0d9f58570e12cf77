// BorrowedTarget: a caller's tensors (pointers, shapes, strides, dtypes, devices)
// reloaded in place by the engine, and every way they can fail to fit, listed
// before any write. The caller's memory here is at::Tensors; the expected bytes
// come from the independent slicing of tests/support.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "../support/emulated_device.h"
#include "../support/tiny_models.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/model/borrowed.h"
#include "tpreload/model/torch_dtype.h"
#include "tpreload/reload/reload.h"

namespace tpreload {
namespace {

BorrowedOptions on_rank(int tp_size, int tp_rank) {
  BorrowedOptions o;
  o.tp_size = tp_size;
  o.tp_rank = tp_rank;
  return o;
}

BorrowedTensor borrow(const std::string& name, const at::Tensor& t, std::string device = "cpu") {
  BorrowedTensor b;
  b.name = name;
  b.data = static_cast<std::byte*>(t.data_ptr());
  b.shape = t.sizes().vec();
  b.strides = t.strides().vec();
  b.dtype = dtype_from_torch(t.scalar_type());
  b.device = std::move(device);
  return b;
}

// Zeros shaped like what tp rank `rank` must hold, by the independent slicing.
std::map<std::string, at::Tensor> zero_shards(const ModelConfig& c, int tp, int rank) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] :
       testdata::expected_shards(c, testdata::random_checkpoint(c, 0), tp, rank))
    out[name] = at::zeros_like(t);
  return out;
}

std::vector<BorrowedTensor> borrow_all(const std::map<std::string, at::Tensor>& tensors) {
  std::vector<BorrowedTensor> out;
  for (const auto& [name, t] : tensors) out.push_back(borrow(name, t));
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

// One process is one rank of tp 1 (the Python tests run tp 2 and 4 under MPI).
TEST(Borrowed, EveryFamilyIsReloadedInPlaceFromTheCheckpoint) {
  auto control = make_local_communicator();
  for (const char* family : testdata::kTinyConfigs) {
    const ModelConfig config = testdata::tiny_config(family);
    const auto ckpt = testdata::random_checkpoint(config, 51);
    auto params = zero_shards(config, 1, 0);
    std::map<std::string, void*> before;
    for (const auto& [n, t] : params) before[n] = t.data_ptr();
    BorrowedTarget target(config, on_rank(1, 0), borrow_all(params));
    EXPECT_EQ(target.device_name(), "cpu");
    target.attach(nullptr);
    auto source = testdata::memory_source(ckpt);
    ReloadOptions o;
    o.bucket_bytes = 3000;
    EXPECT_TRUE(reload_weights(target, *control, source.get(), o).complete()) << family;
    for (const auto& [name, want] : testdata::expected_shards(config, ckpt, 1, 0)) {
      EXPECT_TRUE(testdata::same_bytes(params.at(name), want)) << family << " " << name;
      EXPECT_EQ(params.at(name).data_ptr(), before.at(name)) << name;
    }
  }
}

TEST(Borrowed, LoraNamesResolveToTheBaseLayerAndAdaptersAreLeftAlone) {
  const ModelConfig config = testdata::tiny_config("qwen2_tied");
  const auto ckpt = testdata::random_checkpoint(config, 52);
  auto params = zero_shards(config, 1, 0);
  std::map<std::string, at::Tensor> named;
  for (const auto& [name, t] : params) {
    const bool linear = name.find("_proj.") != std::string::npos;
    named[linear ? name.substr(0, name.rfind('.')) + ".base_layer" + name.substr(name.rfind('.'))
                 : name] = t;
  }
  const at::Tensor adapter = at::zeros({4, 8}, at::kFloat);
  named["model.layers.0.self_attn.qkv_proj.lora_A.weight"] = adapter;
  BorrowedOptions o = on_rank(1, 0);
  o.lora = true;
  BorrowedTarget target(config, o, borrow_all(named));
  target.attach(nullptr);
  auto control = make_local_communicator();
  auto source = testdata::memory_source(ckpt);
  EXPECT_TRUE(reload_weights(target, *control, source.get(), ReloadOptions{}).complete());
  for (const auto& [name, want] : testdata::expected_shards(config, ckpt, 1, 0))
    EXPECT_TRUE(testdata::same_bytes(params.at(name), want)) << name;
  EXPECT_TRUE(at::equal(adapter, at::zeros_like(adapter)));
}

// Newer vLLM nests FusedMoE's parameters under experts.routed_experts (its
// RoutedExperts layout): the experts given under those names are found and
// reloaded in place, in every family with experts.
TEST(Borrowed, ExpertsUnderRoutedExpertsResolveToTheFusedMoeParameters) {
  auto control = make_local_communicator();
  for (const char* family : {"qwen3_moe", "qwen2_moe", "mixtral", "granite_moe_shared"}) {
    const ModelConfig config = testdata::tiny_config(family);
    const auto ckpt = testdata::random_checkpoint(config, 53);
    auto params = zero_shards(config, 1, 0);
    std::map<std::string, at::Tensor> named;
    int routed = 0;
    for (const auto& [name, t] : params) {
      const auto at = name.rfind(".experts.w");  // (w13_weight, w2_weight)
      const bool expert = at != std::string::npos;
      routed += expert;
      named[expert ? name.substr(0, at) + ".experts.routed_experts." + name.substr(at + 9) : name] =
          t;
    }
    ASSERT_GT(routed, 0) << family;  // (w13 and w2 of each layer with experts)
    BorrowedTarget target(config, on_rank(1, 0), borrow_all(named));
    target.attach(nullptr);
    auto source = testdata::memory_source(ckpt);
    EXPECT_TRUE(reload_weights(target, *control, source.get(), ReloadOptions{}).complete())
        << family;
    for (const auto& [name, want] : testdata::expected_shards(config, ckpt, 1, 0))
      EXPECT_TRUE(testdata::same_bytes(params.at(name), want)) << family << " " << name;
  }
}

TEST(Borrowed, EveryProblemIsListedAndNothingIsBuilt) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  auto params = zero_shards(config, 2, 1);
  const std::string norm = "model.norm.weight", o_proj = "model.layers.0.self_attn.o_proj.weight",
                    down = "model.layers.1.mlp.down_proj.weight",
                    up = "model.layers.0.mlp.gate_up_proj.weight",
                    embed = "model.embed_tokens.weight";
  const at::Tensor transposed = at::zeros_like(params.at(up)).t().contiguous().t();  // column-major
  std::vector<BorrowedTensor> given;
  for (const auto& [name, t] : params) {
    if (name == norm) continue;  // missing
    if (name == o_proj)
      given.push_back(borrow(name, t.to(at::kFloat)));  // wrong dtype
    else if (name == down)
      given.push_back(borrow(name, at::zeros({3, 5}, t.options())));
    else if (name == up)
      given.push_back(borrow(name, transposed));
    else if (name == embed)
      given.push_back(borrow(name, t, "cuda:0"));  // the others are on cpu
    else
      given.push_back(borrow(name, t));
  }
  BorrowedTensor unknown = borrow("model.layers.0.input_layernorm.weight",
                                  params.at("model.layers.0.input_layernorm.weight"));
  unknown.unknown_dtype = "int16";
  given.push_back(unknown);  // given twice, and of a dtype tpreload does not know
  const auto& lm = params.at("lm_head.weight");
  given.push_back(borrow("lm_head.weight", lm, "meta"));  // replaces the good one below
  given.erase(std::find_if(given.begin(), given.end(), [](const BorrowedTensor& b) {
    return b.name == "lm_head.weight" && b.device == "cpu";
  }));
  const ShardingRules rules(config, 2);
  const std::string text = joined(borrowed_problems(rules, on_rank(2, 1), given));
  const auto& shape_of = [&](const std::string& n) { return params.at(n).sizes().vec(); };
  EXPECT_NE(text.find("missing parameter 'model.norm.weight' ([" +
                      std::to_string(shape_of(norm)[0]) + "] bfloat16)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("parameter '" + o_proj + "': expected"), std::string::npos) << text;
  EXPECT_NE(text.find("got [" + std::to_string(shape_of(o_proj)[0]) + ", " +
                      std::to_string(shape_of(o_proj)[1]) + "] float32"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("parameter '" + down + "': expected"), std::string::npos) << text;
  EXPECT_NE(text.find("got [3, 5] bfloat16"), std::string::npos) << text;
  EXPECT_NE(text.find("parameter '" + up + "' is not contiguous"), std::string::npos) << text;
  EXPECT_NE(text.find("parameter 'model.layers.0.input_layernorm.weight' is given twice"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("parameter 'lm_head.weight' is on meta; tpreload writes host (cpu) and cuda"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("the parameters are on several devices: cpu ("), std::string::npos) << text;
  EXPECT_NE(text.find("cuda:0 ('model.embed_tokens.weight')"), std::string::npos) << text;
  try {
    BorrowedTarget target(config, on_rank(2, 1), given);
    FAIL() << "built a target over mismatched tensors";
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("problems with the parameters of tp rank 1/2:"),
              std::string::npos)
        << e.what();
  }
}

TEST(Borrowed, EntriesThatAreNotParametersAreIgnoredWhateverTheyAre) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  auto params = zero_shards(config, 1, 0);
  auto given = borrow_all(params);
  BorrowedTensor odd;
  odd.name = "model.rotary_emb.inv_freq";
  odd.unknown_dtype = "complex64";
  odd.device = "meta";
  odd.shape = {4, 4};
  odd.strides = {1, 4};
  given.push_back(odd);
  given.push_back(odd);  // even twice
  EXPECT_EQ(joined(borrowed_problems(ShardingRules(config, 1), on_rank(1, 0), given)), "");
}

TEST(Borrowed, AttachRefusesADeviceOtherThanTheParameters) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  auto params = zero_shards(config, 1, 0);
  {  // host tensors, a device plane
    BorrowedTarget target(config, on_rank(1, 0), borrow_all(params));
    auto device = std::make_shared<testing::EmulatedDevice>();
    try {
      target.attach(device);
      FAIL() << "attached a device to host parameters";
    } catch (const ValidationError& e) {
      EXPECT_NE(std::string(e.what()).find("are on cpu but the data plane writes cuda:0"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(target.sink(), UsageError);
    EXPECT_THROW(target.stored_parameters(), UsageError);  // (no sink to read it from yet)
  }
  {  // tensors said to be on cuda:1, a host plane
    std::vector<BorrowedTensor> given;
    for (const auto& [name, t] : params) given.push_back(borrow(name, t, "cuda:1"));
    BorrowedTarget target(config, on_rank(1, 0), given);
    EXPECT_EQ(target.device_name(), "cuda:1");
    EXPECT_THROW(target.attach(nullptr), ValidationError);
  }
}

bool is_mla_derived(const std::string& name) {
  return name.find("mla_attn.W_U") != std::string::npos;
}

// vLLM's DeepSeek holds W_UK_T and W_UV as views of a bfloat16 kv_b_proj:
// with derived_views they are not given, the reload writes kv_b_proj and the
// views follow.
TEST(Borrowed, DerivedViewsLeaveTheDerivedParametersToTheModel) {
  const ModelConfig config = testdata::tiny_config("deepseek_v3");
  const int tp = 1, rank = 0;
  const auto ckpt = testdata::random_checkpoint(config, 52);
  auto params = zero_shards(config, tp, rank);
  std::map<std::string, at::Tensor> given;
  for (const auto& [name, t] : params)
    if (!is_mla_derived(name)) given[name] = t;
  ASSERT_LT(given.size(), params.size());
  const std::string a = "model.layers.0.self_attn.";
  try {  // (not without saying so: a model whose copies would go stale)
    BorrowedTarget refused(config, on_rank(tp, rank), borrow_all(given));
    FAIL() << "built a DeepSeek target without its derived parameters";
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("missing parameter '" + a + "mla_attn.mla_attn.W_UK_T'"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("set derived_views"), std::string::npos) << e.what();
  }
  BorrowedOptions views = on_rank(tp, rank);
  views.derived_views = true;
  BorrowedTarget target(config, views, borrow_all(given));
  EXPECT_FALSE(target.rules().holds_derived());
  EXPECT_TRUE(target.rules().derived_steps().empty());
  for (const ParamSpec& p : target.rules().params()) EXPECT_FALSE(is_mla_derived(p.name)) << p.name;
  target.attach(nullptr);
  auto source = testdata::memory_source(ckpt);
  auto control = make_local_communicator();
  ReloadOptions o;
  o.bucket_bytes = 3000;
  const ReloadResult r = reload_weights(target, *control, source.get(), o);
  EXPECT_TRUE(r.complete());
  const auto want = testdata::expected_shards(config, ckpt, tp, rank);
  // (W_UK_T and W_UV are views of kv_b_proj, which is among `given`: nothing
  // of theirs to check apart from it)
  for (const auto& [name, t] : given) EXPECT_TRUE(testdata::same_bytes(t, want.at(name))) << name;
  for (const auto& s : target.stored_parameters()) EXPECT_FALSE(is_mla_derived(s.name)) << s.name;
  // Kernel format (this rank's shards, W_UK_T and W_UV among them): those two
  // have no parameter here and are skipped; the rest is copied.
  for (auto& [name, t] : given) t.zero_();
  auto tagged = testdata::in_memory(want);
  for (InMemoryTensor& t : tagged) t.tp_rank = rank;
  auto kernel =
      make_in_memory_source(std::move(tagged), KernelFormatInfo{tp, config.dtype, "", config.json});
  o.format = WeightFormat::kKernel;
  const ReloadResult k = reload_weights(target, *control, kernel.get(), o);
  EXPECT_TRUE(k.complete());
  std::vector<std::string> skipped = k.skipped;
  std::sort(skipped.begin(), skipped.end());
  std::vector<std::string> derived_names;
  for (const auto& [name, t] : want)
    if (is_mla_derived(name)) derived_names.push_back(name);
  EXPECT_EQ(skipped, derived_names);
  for (const auto& [name, t] : given) EXPECT_TRUE(testdata::same_bytes(t, want.at(name))) << name;
}

TEST(Borrowed, DerivedParametersAreGivenContiguousOrLeftAsViewsOfAnUnquantizedWeight) {
  const ModelConfig config = testdata::tiny_config("deepseek_v3");
  const std::string uk_t = "model.layers.1.self_attn.mla_attn.mla_attn.W_UK_T",
                    uv = "model.layers.1.self_attn.mla_attn.mla_attn.W_UV",
                    kv_b = "model.layers.1.self_attn.kv_b_proj.weight";
  auto problems = [&](const BorrowedOptions& o, const std::map<std::string, at::Tensor>& given) {
    const ShardingRules rules(config, o.tp_size, o.quantization, false, !o.derived_views);
    return joined(borrowed_problems(rules, o, borrow_all(given)));
  };
  BorrowedOptions views = on_rank(1, 0);
  views.derived_views = true;
  {  // one of them left out
    auto params = zero_shards(config, 1, 0);
    params.erase(uv);
    const std::string text = problems(on_rank(1, 0), params);
    EXPECT_NE(text.find("missing parameter '" + uv + "' ("), std::string::npos) << text;
    EXPECT_NE(text.find("it is computed from '" + kv_b +
                        "' after each reload: give it, contiguous, or, where the model holds every "
                        "such parameter as a view of its weight (which the reload writes), set "
                        "derived_views"),
              std::string::npos)
        << text;
    EXPECT_EQ(text.find("'" + uk_t + "'"), std::string::npos) << text;
    EXPECT_THROW(BorrowedTarget(config, on_rank(1, 0), borrow_all(params)), ValidationError);
    // with derived_views, the one given is refused
    const std::string viewed = problems(views, params);
    EXPECT_NE(viewed.find("parameter '" + uk_t +
                          "' is given, but derived_views leaves it to the "
                          "model"),
              std::string::npos)
        << viewed;
    EXPECT_EQ(viewed.find("'" + uv + "'"), std::string::npos) << viewed;
  }
  {  // given, but as a view: not contiguous
    auto params = zero_shards(config, 1, 0);
    params[uk_t] = at::zeros_like(params.at(uk_t)).transpose(1, 2).contiguous().transpose(1, 2);
    const std::string text = problems(on_rank(1, 0), params);
    EXPECT_NE(text.find("parameter '" + uk_t + "' is not contiguous"), std::string::npos) << text;
    EXPECT_NE(text.find("set derived_views"), std::string::npos) << text;
  }
  {  // int8 kv_b_proj: the model's W_UK_T and W_UV are tensors of their own
    const ShardingRules rules(config, 1, "int8");
    std::map<std::string, at::Tensor> params;
    for (const ParamSpec& p : rules.params())
      if (!is_mla_derived(p.name))
        params[p.name] = at::zeros(p.shape, at::TensorOptions().dtype(dtype_to_torch(p.dtype)));
    BorrowedOptions int8 = on_rank(1, 0);
    int8.quantization = "int8";
    const std::string text = problems(int8, params);
    EXPECT_NE(text.find("missing parameter '" + uk_t + "' ("), std::string::npos) << text;
    EXPECT_NE(text.find("it is computed from the quantized '" + kv_b +
                        "' after each reload, into a tensor of its own"),
              std::string::npos)
        << text;
    EXPECT_EQ(text.find("derived_views"), std::string::npos) << text;
    int8.derived_views = true;
    const std::string viewed = problems(int8, params);
    // (one line for every layer's two, W_UK_T and W_UV, naming layer 0's first
    // and kv_b_proj's dtype)
    const std::string layer0 = "model.layers.0.self_attn.";
    EXPECT_NE(viewed.find("derived_views: " + std::to_string(2 * config.num_hidden_layers) +
                          " derived parameters ('" + layer0 +
                          "mla_attn.mla_attn.W_UK_T', ...) are computed from the quantized '" +
                          layer0 + "kv_b_proj.weight' (int8) into a tensor of the model's own"),
              std::string::npos)
        << viewed;
    EXPECT_EQ(viewed.find("'" + uk_t + "'"), std::string::npos) << viewed;
    EXPECT_THROW(BorrowedTarget(config, int8, borrow_all(params)), ValidationError);
  }
}

TEST(Borrowed, ContiguityIgnoresTheStridesOfSizeOneDimensions) {
  BorrowedTensor t;
  t.shape = {1, 3, 1, 2};
  t.strides = {99, 2, 7, 1};
  EXPECT_TRUE(is_contiguous(t));
  t.strides = {99, 3, 7, 1};
  EXPECT_FALSE(is_contiguous(t));
  t.shape = {};
  t.strides = {};
  EXPECT_TRUE(is_contiguous(t));  // a scalar
  t.shape = {4};
  t.strides = {0};
  EXPECT_FALSE(is_contiguous(t));  // an expanded view
}

}  // namespace
}  // namespace tpreload
