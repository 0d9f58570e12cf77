// The distributed reload end to end: every source kind, both formats, every
// reader mode, tiny and huge buckets, int8 and LoRA models, tp = world and
// tp = world / 2 (every combination on three configurations, each mode and
// source once on every other: run_checkpoint_matrix). After each reload every
// rank's parameters equal the expected slices byte for byte and no parameter
// moved.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "../src/reload/pipeline.h"
#include "../tests/support/emulated_device.h"
#include "../tests/support/faults.h"
#include "../tests/support/streams.h"
#include "../tests/support/tiny_models.h"
#include "mpi_test_main.h"
#include "tpreload/checkpoint/kernel_format.h"
#include "tpreload/checkpoint/writers.h"
#include "tpreload/comm/mpi_communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/model/kernel_shards.h"
#include "tpreload/model/model.h"
#include "tpreload/model/torch_dtype.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/report.h"
#include "tpreload/reload/sharded_source.h"

namespace tpreload {
namespace {

TPRELOAD_TINY_MODEL_WORLD_SIZES();

using mpitest::world;
using testing::FaultySource;
namespace fs = std::filesystem;

using mpitest::SharedDir;

struct Variant {
  int tp;
  std::string quantization;
  bool lora;
  bool expert_parallel = false;
};

ModelOptions options_for(const Variant& s) {
  ModelOptions o;
  o.tp_size = s.tp;
  o.tp_rank = world().rank() % s.tp;
  o.quantization = s.quantization;
  o.lora = s.lora;
  o.expert_parallel = s.expert_parallel;
  return o;
}

// What this rank must hold after loading `ckpt`: the independent slices, or (int8)
// a local load through the loaders, which the unit tests check independently.
std::map<std::string, at::Tensor> expected_params(const ModelConfig& config, const Variant& s,
                                                  const std::map<std::string, at::Tensor>& ckpt) {
  if (s.quantization.empty())
    return testdata::expected_shards(config, ckpt, s.tp, world().rank() % s.tp, s.expert_parallel);
  TensorParallelModel local(config, options_for(s));
  auto source = testdata::memory_source(ckpt);
  local.load_weights(*source);
  std::map<std::string, at::Tensor> out;
  for (const auto& name : local.expected_names(WeightFormat::kKernel))
    out[name] = local.parameter_for_reload(name);
  return out;
}

struct Layout {
  void* data;
  std::vector<std::int64_t> sizes, strides;
};

std::map<std::string, Layout> layout_of(const TensorParallelModel& model) {
  std::map<std::string, Layout> out;
  for (const auto& [name, t] : model.named_parameters())
    out[name] = {t.data_ptr(), t.sizes().vec(), t.strides().vec()};
  return out;
}

void expect_params(const TensorParallelModel& model, const std::map<std::string, at::Tensor>& want,
                   const std::string& what) {
  ASSERT_FALSE(want.empty()) << what << ": nothing to check";
  std::size_t wrong = 0;
  for (const auto& [name, t] : want) {
    const at::Tensor got = model.parameter_for_reload(name);
    if (!got.defined() || !testdata::same_bytes(got, t)) {
      if (++wrong <= 3) ADD_FAILURE() << what << ": parameter " << name << " differs";
    }
  }
  EXPECT_EQ(wrong, 0u) << what;
}

void expect_same_layout(const TensorParallelModel& model,
                        const std::map<std::string, Layout>& before) {
  for (const auto& [name, t] : model.named_parameters()) {
    const Layout& b = before.at(name);
    EXPECT_EQ(t.data_ptr(), b.data) << name;
    EXPECT_EQ(t.sizes().vec(), b.sizes) << name;
    EXPECT_EQ(t.strides().vec(), b.strides) << name;
  }
}

// Every source kind for one checkpoint, written by rank 0 into `dir`.
struct Sources {
  std::string single, sharded, hdf5;
};

Sources write_sources(const std::map<std::string, at::Tensor>& ckpt, const std::string& dir) {
  Sources s{dir + "/single/model.safetensors", dir + "/sharded", dir + "/model.h5"};
  if (world().rank() == 0) {
    fs::create_directories(dir + "/single");
    const auto tensors = testdata::in_memory(ckpt);
    write_safetensors(s.single, tensors);
    write_safetensors_sharded(s.sharded, tensors, 3);
    write_hdf5(s.hdf5, tensors);
  }
  world().barrier();
  return s;
}

ReloadResult reload_from(TensorParallelModel& model, const std::string& path,
                         const std::map<std::string, at::Tensor>* memory, const ReloadOptions& o) {
  std::unique_ptr<WeightSource> source;
  if (world().rank() == o.reader_rank || o.readers != Readers::kOne)
    source = memory ? testdata::memory_source(*memory) : open_weight_source(path);
  return reload_weights(model, world(), source.get(), o);
}

// Every way of reading: the reader rank with each distribution, every rank
// reading its own slices (laid out as scatter whatever the distribution), and a
// reader per "node", nodes being blocks of world ranks: two halves of the world
// (at 2 ranks a node per rank), or all ranks but the last and the last alone
// (a node holding replicas and a node without a tp rank of its own).
struct ReadMode {
  Readers readers;
  Distribution distribution;
  enum Nodes { kHalves, kAllButLast } nodes = kHalves;
  // Scatter: small replicated tensors travel scattered (the default) or every
  // replicated tensor is broadcast (0).
  std::uint64_t scatter_replicated_bytes = PlanOptions::kScatterReplicatedBytes;
  bool rotate = false;  // kNode: the node readers take the broadcast buckets in turn

  int ranks_per_node() const {
    const int n = world().size();
    return std::max(1, nodes == kHalves ? n / 2 : n - 1);
  }
  void apply(ReloadOptions& o) const {
    o.readers = readers;
    o.distribution = distribution;
    o.scatter_replicated_bytes = scatter_replicated_bytes;
    if (readers == Readers::kNode) o.ranks_per_node = ranks_per_node();
    o.rotate_broadcast_roots = rotate;
  }
};
const std::vector<ReadMode> kReadModes = {
    {Readers::kOne, Distribution::kBroadcast},
    {Readers::kOne, Distribution::kScatter},
    {Readers::kOne, Distribution::kScatter, ReadMode::kHalves, 0},
    {Readers::kAll, Distribution::kBroadcast},
    {Readers::kAll, Distribution::kBroadcast, ReadMode::kHalves, 0},
    {Readers::kNode, Distribution::kScatter, ReadMode::kHalves, 0},
    {Readers::kNode, Distribution::kScatter, ReadMode::kAllButLast},
    {Readers::kNode, Distribution::kBroadcast, ReadMode::kAllButLast},
    {Readers::kNode, Distribution::kBroadcast, ReadMode::kHalves, 0, true},
    {Readers::kNode, Distribution::kScatter, ReadMode::kAllButLast, 0, true}};

std::string mode_name(const ReadMode& m) {
  return std::string(distribution_name(m.distribution)) +
         (m.scatter_replicated_bytes == 0 ? " (replicated broadcast)" : "") + " readers " +
         std::string(readers_name(m.readers)) +
         (m.readers == Readers::kNode ? " of " + std::to_string(m.ranks_per_node()) + " ranks"
                                      : "") +
         (m.rotate ? " rotated broadcast roots" : "");
}

const std::vector<std::string> kSourceKinds = {"memory", "single", "sharded", "hdf5"};
const std::vector<std::uint64_t> kBucketBytes = {1900, std::uint64_t{1} << 30};

// One reload: version 1 from memory, then version 2 from `kind` read in `mode`
// with `bucket`-byte buckets; every parameter must then hold its expected
// slice, where it was before.
void reload_cell(const std::string& config_name, const Variant& setup, const ModelConfig& config,
                 const std::map<std::string, at::Tensor>& v1,
                 const std::map<std::string, at::Tensor>& v2, const Sources& files,
                 const std::map<std::string, at::Tensor>& want, const std::string& kind,
                 const ReadMode& mode, std::uint64_t bucket) {
  const std::string what = config_name + " tp " + std::to_string(setup.tp) +
                           (setup.expert_parallel ? " ep " : " ") + setup.quantization +
                           (setup.lora ? " lora " : " ") + kind + " " + mode_name(mode) +
                           " bucket " + std::to_string(bucket);
  TensorParallelModel model(config, options_for(setup));
  ReloadOptions o;
  mode.apply(o);
  o.bucket_bytes = bucket;
  o.zero_copy = bucket > 1900;  // both ways of filling a broadcast bucket
  o.reader_rank = world().size() - 1;
  reload_from(model, "", &v1, o);  // the live weights: version 1
  const auto before = layout_of(model);
  const std::string path = kind == "single"    ? files.single
                           : kind == "sharded" ? files.sharded
                                               : files.hdf5;
  const ReloadResult r = reload_from(model, path, kind == "memory" ? &v2 : nullptr, o);
  EXPECT_TRUE(r.complete()) << what;
  EXPECT_TRUE(r.skipped.empty()) << what;
  if (mode.readers == Readers::kAll) {  // nothing moved between ranks
    EXPECT_EQ(r.bytes_transferred, 0u) << what;
    EXPECT_EQ(r.distribution, Distribution::kScatter) << what;
    // Host parameters: every write read straight into its parameter, no
    // staging and no pipeline, whatever the source.
    EXPECT_EQ(r.peak_staging_bytes, 0u) << what;
    EXPECT_EQ(r.pipeline_depth, 0) << what;
  } else {
    EXPECT_GE(r.pipeline_depth, 1) << what;
  }
  expect_params(model, want, what);
  expect_same_layout(model, before);
}

// kFull: every source kind x reader mode x bucket size (80 reloads), for the
// configurations whose layouts differ most: dense GQA, experts stacked in 3-D
// tensors, a float32 router. kEachOnce, for every other configuration and
// variant: each reader mode once, the source kinds taken in turn (each kind two
// or three times) and each kind with both bucket sizes (10 reloads).
enum class Cells { kFull, kEachOnce };

void run_checkpoint_matrix(const std::string& config_name, const Variant& setup,
                           Cells cells = Cells::kEachOnce) {
  SharedDir dir;
  const ModelConfig config = testdata::tiny_config(config_name);
  const auto v1 = testdata::random_checkpoint(config, 100),
             v2 = testdata::random_checkpoint(config, 200);
  const Sources files = write_sources(v2, dir.path());
  const auto want = expected_params(config, setup, v2);
  if (cells == Cells::kFull) {
    for (const std::string& kind : kSourceKinds)
      for (const ReadMode& mode : kReadModes)
        for (std::uint64_t bucket : kBucketBytes)
          reload_cell(config_name, setup, config, v1, v2, files, want, kind, mode, bucket);
    return;
  }
  const std::size_t kinds = kSourceKinds.size();
  for (std::size_t i = 0; i < kReadModes.size(); ++i)
    reload_cell(config_name, setup, config, v1, v2, files, want, kSourceKinds[i % kinds],
                kReadModes[i], kBucketBytes[(i / kinds) % kBucketBytes.size()]);
}

TPRELOAD_RANKS_TEST(Reload, CheckpointFormatEverySourceAndDistribution) {
  run_checkpoint_matrix("llama_gqa", {world().size(), "", false}, Cells::kFull);
}

TPRELOAD_RANKS_TEST(Reload, TwoReplicasOfHalfTheWorld) {
  TPRELOAD_REQUIRE_RANKS(2);
  run_checkpoint_matrix("qwen2_tied", {world().size() / 2, "", false});
}

TPRELOAD_RANKS_TEST(Reload, Int8AndLoraModels) {
  run_checkpoint_matrix("mistral_mqa", {world().size(), "int8", true});
}

// Qwen3 (q/k norms, head_dim from the config) and Qwen3-MoE with tensor-parallel
// experts and with expert parallelism, over every source kind.
TPRELOAD_RANKS_TEST(Reload, Qwen3DenseAndMoe) {
  run_checkpoint_matrix("qwen3_dense", {world().size(), "", false});
  run_checkpoint_matrix("qwen3_moe", {world().size(), "", false});
  run_checkpoint_matrix("qwen3_moe", {world().size(), "", false, true});
}

// Mixtral (the experts under block_sparse_moe, as w1/w3/w2, in every layer) and
// Qwen2-MoE (a tensor-parallel shared expert beside them).
TPRELOAD_RANKS_TEST(Reload, MixtralAndQwen2MoeWithTensorParallelExpertsAndExpertParallelism) {
  run_checkpoint_matrix("mixtral", {world().size(), "", false});
  run_checkpoint_matrix("mixtral", {world().size(), "int8", false, true});
  run_checkpoint_matrix("qwen2_moe", {world().size(), "", false});
  run_checkpoint_matrix("qwen2_moe", {world().size(), "int8", false, true});
}

TPRELOAD_RANKS_TEST(Reload, MoeExpertParallelInTwoReplicas) {
  TPRELOAD_REQUIRE_RANKS(2);
  run_checkpoint_matrix("qwen3_moe", {world().size() / 2, "", false, true});
  run_checkpoint_matrix("qwen2_moe", {world().size() / 2, "", false, true});
  run_checkpoint_matrix("mixtral", {world().size() / 2, "", false, true});
  run_checkpoint_matrix("granite_moe", {world().size() / 2, "", false, true});
}

// GraniteMoE: Mixtral's experts, which its checkpoint stacks in three 3-D
// tensors a layer (input_linear, output_linear, router.layer), taken apart by
// rows of their last dimension from every source, by every reader mode.
TPRELOAD_RANKS_TEST(Reload, GraniteMoeFromItsStackedExperts) {
  run_checkpoint_matrix("granite_moe", {world().size(), "", false}, Cells::kFull);
  run_checkpoint_matrix("granite_moe", {world().size(), "int8", false, true});
}

// Granite's shared MLP (shared_mlp.input_linear: gate rows, then up rows, cut
// apart as the source is listed, each split by rows; output_linear by
// columns): beside GraniteMoE's experts (GraniteMoeShared; GraniteMoeHybrid
// without rotary) and alone (GraniteMoeHybrid as granite-4.0-micro, with
// attention biases); plain, int8 (the shared MLP's two weights quantized, the
// experts not) and with expert parallelism.
TPRELOAD_RANKS_TEST(Reload, GraniteSharedMlpBesideExpertsAndAlone) {
  run_checkpoint_matrix("granite_moe_shared", {world().size(), "", false});
  run_checkpoint_matrix("granite_moe_shared", {world().size(), "int8", false, true});
  run_checkpoint_matrix("granite_hybrid", {world().size(), "", false});
  run_checkpoint_matrix("granite_hybrid", {world().size(), "int8", false});
  run_checkpoint_matrix("granite_hybrid_moe", {world().size(), "", false, true});
}

// GLM-4.5: a dense layer, then sparse ones whose router and score correction
// are float32 parameters filled from the bfloat16 checkpoint, with shared
// experts; plain, and int8 with expert parallelism.
TPRELOAD_RANKS_TEST(Reload, Glm4MoeFloat32RouterAndSharedExperts) {
  run_checkpoint_matrix("glm4_moe", {world().size(), "", false}, Cells::kFull);
  run_checkpoint_matrix("glm4_moe", {world().size(), "int8", false, true});
  // The next-token-prediction layer GLM-4.5 checkpoints carry (layer
  // num_hidden_layers) is reported unused, as vLLM's glm4_moe.py skips it; the
  // score corrections in float32, as released checkpoints store them.
  const ModelConfig config = testdata::tiny_config("glm4_moe");
  auto with_mtp = testdata::random_checkpoint(config, 300);
  int float32_corrections = 0;
  for (auto& [name, t] : with_mtp)
    if (name.find("e_score_correction_bias") != std::string::npos) {
      t = (t.to(at::kFloat) + 1e-3f).contiguous();  // (bits a bfloat16 lacks)
      ++float32_corrections;
    }
  EXPECT_EQ(float32_corrections, config.num_hidden_layers - 1) << "one per sparse layer";
  const std::string mtp = "model.layers." + std::to_string(config.num_hidden_layers) + ".";
  with_mtp[mtp + "eh_proj.weight"] = at::ones({config.hidden_size, 2 * config.hidden_size});
  with_mtp[mtp + "mlp.gate.weight"] = at::ones({config.num_experts, config.hidden_size});
  const Variant setup{world().size(), "", false};
  TensorParallelModel model(config, options_for(setup));
  const ReloadResult r = reload_from(model, "", &with_mtp, ReloadOptions{});
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.skipped, (std::vector<std::string>{mtp + "eh_proj.weight", mtp + "mlp.gate.weight"}));
  with_mtp.erase(mtp + "eh_proj.weight");
  with_mtp.erase(mtp + "mlp.gate.weight");
  expect_params(model, expected_params(config, setup, with_mtp), "with the MTP layer");
}

// DeepSeek-V3 (q_a_proj and kv_a_proj_with_mqa merged into the replicated
// fused_qkv_a_proj, q_b_proj and kv_b_proj split by heads, a dense layer, then
// routed experts, shared ones and a float32 score correction) tensor- and
// expert-parallel; DeepSeek-V2-Lite (q_proj, kv_a_proj_with_mqa replicated
// alone, experts every second layer) in int8. The MTP layer a V3
// checkpoint carries is reported skipped.
TPRELOAD_RANKS_TEST(Reload, DeepSeekMultiHeadLatentAttentionAndExperts) {
  run_checkpoint_matrix("deepseek_v3", {world().size(), "", false});
  run_checkpoint_matrix("deepseek_v3", {world().size(), "", false, true});
  run_checkpoint_matrix("deepseek_v2_lite", {world().size(), "int8", false});
  const ModelConfig config = testdata::tiny_config("deepseek_v3");
  auto with_mtp = testdata::random_checkpoint(config, 301);
  const std::string mtp = "model.layers." + std::to_string(config.num_hidden_layers) + ".";
  with_mtp[mtp + "eh_proj.weight"] = at::ones({config.hidden_size, 2 * config.hidden_size});
  with_mtp[mtp + "self_attn.kv_b_proj.weight"] = at::ones({4, 4});
  const Variant setup{world().size(), "", false};
  TensorParallelModel model(config, options_for(setup));
  const ReloadResult r = reload_from(model, "", &with_mtp, ReloadOptions{});
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.skipped,
            (std::vector<std::string>{mtp + "eh_proj.weight", mtp + "self_attn.kv_b_proj.weight"}));
  with_mtp.erase(mtp + "eh_proj.weight");
  with_mtp.erase(mtp + "self_attn.kv_b_proj.weight");
  expect_params(model, expected_params(config, setup, with_mtp), "with the MTP layer");
}

// Phi-3: q/k/v stacked in self_attn.qkv_proj and gate/up in mlp.gate_up_proj in
// every source kind, cut into the parts the loaders take as the source is
// listed; plain, and int8 with LoRA.
TPRELOAD_RANKS_TEST(Reload, Phi3StackedTensorsFromEverySourceAndDistribution) {
  run_checkpoint_matrix("phi3", {world().size(), "", false});
  run_checkpoint_matrix("phi3", {world().size(), "int8", true});
}

// A stacked tensor with rows its config does not give is refused on every rank
// alike, naming the file, the tensor and the parts, before any write; the same
// weights as separate tensors load as the stacked ones do.
TPRELOAD_RANKS_TEST(Reload, Phi3StackedTensorWithOtherRowsIsRefusedAndSeparateTensorsLoad) {
  SharedDir dir;
  const ModelConfig config = testdata::tiny_config("phi3");
  const auto v1 = testdata::random_checkpoint(config, 100),
             v2 = testdata::random_checkpoint(config, 200);
  const Variant setup{world().size(), "", false};
  auto bad = v2;
  const std::string qkv = "model.layers.1.self_attn.qkv_proj.weight";
  const std::int64_t q = config.num_attention_heads * config.head_dim,
                     kv = config.num_key_value_heads * config.head_dim;
  bad[qkv] = at::cat({bad[qkv], bad[qkv].narrow(0, 0, 8)}).contiguous();
  const std::string path = dir.path() + "/bad.safetensors";
  if (world().rank() == 0) write_safetensors(path, testdata::in_memory(bad));
  world().barrier();
  for (const ReadMode& mode : kReadModes) {
    const std::string what = mode_name(mode);
    TensorParallelModel model(config, options_for(setup));
    ReloadOptions o;
    mode.apply(o);
    reload_from(model, "", &v1, o);
    std::string error;
    try {
      reload_from(model, path, nullptr, o);
    } catch (const CheckpointError& e) {
      error = e.what();
    }
    EXPECT_NE(
        error.find(path + ": tensor '" + qkv + "' has shape [" + std::to_string(q + 2 * kv + 8) +
                   ", " + std::to_string(config.hidden_size) + "]"),
        std::string::npos)
        << what << ": " << error;
    const std::string p = "model.layers.1.self_attn.";
    EXPECT_NE(error.find("Phi3ForCausalLM's config stacks " + std::to_string(q + 2 * kv) +
                         " rows (" + p + "q_proj.weight " + std::to_string(q) + " + " + p +
                         "k_proj.weight " + std::to_string(kv) + " + " + p + "v_proj.weight " +
                         std::to_string(kv) + ") in it"),
              std::string::npos)
        << what << ": " << error;
    EXPECT_TRUE(mpitest::same_on_every_rank(error)) << what << ": " << error;
    expect_params(model, expected_params(config, setup, v1), what + ": refused, unchanged");
    const auto separate = testdata::unstacked(config, v2);  // (q/k/v, gate/up apart)
    for (const auto& [name, t] : separate)
      ASSERT_TRUE(name.find("qkv_proj") == std::string::npos &&
                  name.find("gate_up_proj") == std::string::npos)
          << name << " is still stacked: the test would prove nothing";
    const ReloadResult r = reload_from(model, "", &separate, o);
    EXPECT_TRUE(r.complete()) << what;
    expect_params(model, expected_params(config, setup, v2), what + ": separate tensors");
  }
}

TPRELOAD_RANKS_TEST(Reload, KernelFormatFromShardsMadeByTheLoaders) {
  SharedDir dir;
  for (const auto& [name, setup] : std::vector<std::pair<std::string, Variant>>{
           {"llama_gqa", {world().size(), "", false}},
           {"llama_gqa", {world().size(), "int8", false}},
           {"qwen3_moe", {world().size(), "", false}},
           {"qwen3_moe", {world().size(), "", false, true}},
           {"mixtral", {world().size(), "", false, true}},
           {"qwen2_moe", {world().size(), "", false, true}},
           {"granite_moe", {world().size(), "", false}},
           {"granite_moe_shared", {world().size(), "", false, true}},
           {"granite_hybrid", {world().size(), "int8", false}},
           {"phi3", {world().size(), "int8", false}}}) {
    const ModelConfig config = testdata::tiny_config(name);
    const auto ckpt = testdata::random_checkpoint(config, 300);
    const std::string kdir =
        dir.path() + "/kernel-" + name + setup.quantization + (setup.expert_parallel ? "-ep" : "");
    if (world().rank() == 0) {  // exactly what `reload_ckpt shard` writes
      auto source = testdata::memory_source(ckpt);
      write_kernel_shards(config, *source, kdir,
                          {setup.tp, setup.quantization, setup.expert_parallel});
    }
    world().barrier();
    const auto want = expected_params(config, setup, ckpt);
    for (const ReadMode& mode : kReadModes) {
      TensorParallelModel model(config, options_for(setup));
      const auto before = layout_of(model);
      ReloadOptions o;
      o.format = WeightFormat::kKernel;
      mode.apply(o);
      o.bucket_bytes = 1000;
      const ReloadResult r = reload_from(model, kdir, nullptr, o);
      EXPECT_TRUE(r.complete());
      expect_params(model, want,
                    "kernel " + name + " " + setup.quantization +
                        (setup.expert_parallel ? " ep " : " ") + mode_name(mode));
      expect_same_layout(model, before);
    }
  }
}

TPRELOAD_RANKS_TEST(Reload, NotLoadedNamesAreExactlyTheMissingOnes) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  auto ckpt = testdata::random_checkpoint(config, 400);
  ckpt.erase("model.layers.1.self_attn.v_proj.weight");
  ckpt.erase("model.norm.weight");
  ckpt["model.layers.0.self_attn.rotary_emb.inv_freq"] = at::ones({4});
  ckpt["extra.unused.weight"] = at::ones({2, 2}, at::kBFloat16);
  TensorParallelModel model(config, options_for({world().size(), "", false}));
  ReloadOptions o;
  const ReloadResult r = reload_from(model, "", &ckpt, o);
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(
      r.not_loaded_on_all_ranks,
      (std::vector<std::string>{"model.layers.1.self_attn.qkv_proj.weight", "model.norm.weight"}));
  EXPECT_TRUE(r.not_loaded_on_some_ranks.empty());
  EXPECT_EQ(r.skipped, (std::vector<std::string>{"extra.unused.weight",
                                                 "model.layers.0.self_attn.rotary_emb.inv_freq"}));
}

TPRELOAD_RANKS_TEST(Reload, BadShapeFailsPreflightOnEveryRankAndWritesNothing) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  auto good = testdata::random_checkpoint(config, 500),
       bad = testdata::random_checkpoint(config, 501);
  bad["model.layers.1.mlp.up_proj.weight"] = at::zeros({96, 63}, at::kBFloat16);
  const Variant setup{world().size(), "", false};
  TensorParallelModel model(config, options_for(setup));
  ReloadOptions o;
  reload_from(model, "", &good, o);
  try {
    reload_from(model, "", &bad, o);
    FAIL() << "a wrong shape passed preflight";
  } catch (const ValidationError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("preflight (nothing was reloaded) failed on rank 0/"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("'model.layers.1.mlp.up_proj.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected [96, 64] bfloat16, got [96, 63] bfloat16"), std::string::npos)
        << msg;
  }
  expect_params(model, expected_params(config, setup, good), "after a refused reload");
}

// The workspace keeps the plan for the next reload of the same listing: new bytes
// under the same names, shapes and offsets load through it; anything that changes
// the listing or the options plans afresh; a plan refused by preflight is not kept.
TPRELOAD_RANKS_TEST(Reload, WorkspaceReusesThePlanOnlyForTheSameListingAndOptions) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto v1 = testdata::random_checkpoint(config, 510),
             v2 = testdata::random_checkpoint(config, 511);
  const Variant setup{world().size(), "", false};
  TensorParallelModel model(config, options_for(setup));
  ReloadWorkspace workspace;
  ReloadOptions o;
  o.distribution = Distribution::kScatter;
  o.bucket_bytes = 4096;
  auto reload = [&](const std::map<std::string, at::Tensor>& ckpt, const ReloadOptions& opts) {
    auto source = world().rank() == 0 ? testdata::memory_source(ckpt) : nullptr;
    return reload_weights(model, world(), source.get(), opts, &workspace);
  };
  ASSERT_TRUE(reload(v1, o).complete());
  const auto* first = workspace.cached_plan();
  ASSERT_NE(first, nullptr);
  const std::uint64_t first_key = workspace.cached_plan_key();
  ASSERT_TRUE(reload(v2, o).complete());
  EXPECT_EQ(workspace.cached_plan(), first) << "same listing, same options: the plan is reused";
  expect_params(model, expected_params(config, setup, v2), "v2 through the kept plan");

  ReloadOptions other = o;
  other.bucket_bytes = 1 << 20;
  ASSERT_TRUE(reload(v1, other).complete());
  EXPECT_NE(workspace.cached_plan_key(), first_key) << "new options: a new plan";
  expect_params(model, expected_params(config, setup, v1), "v1 with other options");

  auto fewer = v2;  // a different listing under the same options
  fewer.erase("model.norm.weight");
  const ReloadResult partial = reload(fewer, other);
  EXPECT_EQ(partial.not_loaded_on_all_ranks, std::vector<std::string>{"model.norm.weight"});

  auto bad = v2;
  bad["model.layers.0.mlp.down_proj.weight"] = at::zeros({64, 95}, at::kBFloat16);
  EXPECT_THROW(reload(bad, other), ValidationError);
  EXPECT_EQ(workspace.cached_plan(), nullptr) << "a refused plan is not kept";
  ASSERT_TRUE(reload(v2, other).complete());
  expect_params(model, expected_params(config, setup, v2), "v2 after a refused reload");
}

// A ReloadableModel's reload of unchanged files takes the listing its
// workspace kept, on every rank that opens them (no header parsed again); new
// bytes under the same headers load through it; files whose headers changed
// are listed again.
TPRELOAD_RANKS_TEST(Reload, ReopenedFilesTakeTheKeptListingWhileTheirHeadersAreUnchanged) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto v1 = testdata::random_checkpoint(config, 520),
             v2 = testdata::random_checkpoint(config, 521);
  const Variant setup{world().size(), "", false};
  for (const Readers readers : {Readers::kOne, Readers::kAll}) {
    const std::string mode(readers_name(readers));
    SharedDir dir;
    const Sources files = write_sources(v1, dir.path());
    TensorParallelModel model(config, options_for(setup));
    ReloadableModel served(model, {files.sharded, "", ""});
    ReloadOptions o;
    o.readers = readers;
    o.bucket_bytes = 8192;
    const bool opens = opens_source(o, world().rank());
    ASSERT_TRUE(served.reload(world(), o).complete()) << mode;
    const auto known = served.workspace().known_listing();
    EXPECT_EQ(known != nullptr, opens) << mode;
    ASSERT_TRUE(served.reload(world(), o).complete()) << mode;
    EXPECT_EQ(served.workspace().known_listing(), known) << mode << ": unchanged files";
    write_sources(v2, dir.path());
    ASSERT_TRUE(served.reload(world(), o).complete()) << mode;
    EXPECT_EQ(served.workspace().known_listing(), known) << mode << ": new bytes, same headers";
    expect_params(model, expected_params(config, setup, v2),
                  mode + ": v2 through the kept listing");
    auto fewer = v1;
    fewer.erase("model.norm.weight");
    write_sources(fewer, dir.path());
    const ReloadResult partial = served.reload(world(), o);
    EXPECT_EQ(partial.not_loaded_on_all_ranks, std::vector<std::string>{"model.norm.weight"})
        << mode;
    if (opens) {
      EXPECT_NE(served.workspace().known_listing(), known) << mode << ": headers changed";
    }
    auto want = expected_params(config, setup, v1);
    want.at("model.norm.weight") = expected_params(config, setup, v2).at("model.norm.weight");
    expect_params(model, want, mode + ": v1 without model.norm.weight");
  }
}

// Every rank's host name, gathered rank by rank (not through node_leader()).
std::vector<std::string> host_names() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::vector<std::string> names;
  for (int r = 0; r < world().size(); ++r) {
    std::string name = r == world().rank() ? std::string(host) : std::string();
    std::int64_t n = static_cast<std::int64_t>(name.size());
    world().broadcast(MutableBytes(&n, sizeof n), r);
    name.resize(static_cast<std::size_t>(n));
    world().broadcast(MutableBytes(name.data(), name.size()), r);
    names.push_back(name);
  }
  return names;
}

// Forwards every collective to the world but keeps Communicator's own
// node_leader() (ranks grouped by host name).
class ByHostName final : public Communicator {
 public:
  int rank() const override { return world().rank(); }
  int size() const override { return world().size(); }
  std::string backend() const override { return world().backend(); }
  void broadcast(MutableBytes b, int root) override { world().broadcast(b, root); }
  void scatterv(ConstBytes send, const std::vector<ByteRange>& ranges, MutableBytes recv,
                int root) override {
    world().scatterv(send, ranges, recv, root);
  }
  void allreduce_bits(std::uint64_t* w, std::size_t n, BitOp op) override {
    world().allreduce_bits(w, n, op);
  }
  void allreduce_ints(std::int64_t* v, std::size_t n, IntOp op) override {
    world().allreduce_ints(v, n, op);
  }
  void allreduce_floats(float* v, std::size_t n) override { world().allreduce_floats(v, n); }
  void barrier() override { world().barrier(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return world().split(color, key);
  }
  [[noreturn]] void abort(int code) noexcept override {
    world().abort(code);
    std::abort();  // (never reached)
  }
};

// (MPI's own grouping of a host's ranks: UnderMpi, so not as threads)
// A reader per node: the ranks of one host form a node (MPI's shared-memory
// domains and the host-name default agree with the host names gathered here),
// the reader rank first on its node; ranks_per_node makes blocks of world ranks
// instead. The node planes are kept for the next reload with the same grouping
// and made again for another. Across the hosts of mpi_tests/multihost.sh the
// nodes are the hosts.
TEST(UnderMpi, ReadersNodeGroupsTheRanksOfAHost) {
  const std::vector<std::string> hosts = host_names();
  // (the library's gathering, for messages: one collective, the same names)
  EXPECT_EQ(tpreload::host_names(world()), hosts);
  const int me = world().rank(), n = world().size(), reader = n - 1;
  int first = 0;
  while (hosts[first] != hosts[me]) ++first;
  EXPECT_EQ(mpitest::mpi_world().node_leader(), first);
  ByHostName by_name;
  EXPECT_EQ(by_name.node_leader(), first);

  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 520);
  const Variant setup{n, "", false};
  TensorParallelModel model(config, options_for(setup));
  ReloadWorkspace workspace;
  ReloadOptions o;
  o.readers = Readers::kNode;
  o.reader_rank = reader;
  o.bucket_bytes = 4096;
  auto reload = [&](const ReloadOptions& opts) {
    auto source = testdata::memory_source(ckpt);
    return reload_weights(model, world(), source.get(), opts, &workspace);
  };
  auto expect_node = [&](const std::vector<int>& node, const std::string& what) {
    std::vector<int> want;  // the reader rank first, then the others in world order
    if (std::find(node.begin(), node.end(), reader) != node.end()) want.push_back(reader);
    for (int r : node)
      if (r != reader) want.push_back(r);
    ASSERT_NE(workspace.node_planes(), nullptr) << what;
    EXPECT_EQ(workspace.node_planes()->members, want) << what;
    expect_params(model, expected_params(config, setup, ckpt), what);
  };
  std::vector<int> same_host;
  for (int r = 0; r < n; ++r)
    if (hosts[r] == hosts[me]) same_host.push_back(r);
  ASSERT_TRUE(reload(o).complete());
  expect_node(same_host, "nodes by host");
  const std::uint64_t kept = workspace.node_planes()->serial;
  ASSERT_TRUE(reload(o).complete());
  EXPECT_EQ(workspace.node_planes()->serial, kept) << "the same grouping: the planes are kept";

  o.ranks_per_node = 2;
  ASSERT_TRUE(reload(o).complete());
  EXPECT_NE(workspace.node_planes()->serial, kept) << "another grouping: new planes";
  std::vector<int> block;
  for (int r = me / 2 * 2; r < std::min(n, me / 2 * 2 + 2); ++r) block.push_back(r);
  expect_node(block, "nodes of 2 ranks");
}

TPRELOAD_RANKS_TEST(Reload, UnopenablePathIsTheSameErrorOnEveryRank) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  TensorParallelModel model(config, options_for({world().size(), "", false}));
  ReloadableModel served(model, {"/nonexistent/tpreload/model", "", ""});
  std::string error;
  try {
    served.reload(world(), ReloadOptions{});
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("'/nonexistent/tpreload/model'"), std::string::npos) << error;
  EXPECT_TRUE(mpitest::same_on_every_rank(error))
      << "rank " << world().rank() << " raised: " << error;
}

// Only the rank that opens the weights needs a path: the others may be given
// none (and keep their location). A reader with neither a path nor a location
// is the same CheckpointError on every rank, naming it.
TPRELOAD_RANKS_TEST(Reload, OnlyTheRanksThatOpenTheWeightsNeedAPath) {
  SharedDir dir;
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 610);
  const Sources files = write_sources(ckpt, dir.path());
  const Variant setup{world().size(), "", false};
  TensorParallelModel model(config, options_for(setup));
  ReloadableModel served(model, {"", "", ""});
  const bool reader = world().rank() == 0;
  ASSERT_TRUE(served.reload(world(), ReloadOptions{}, reader ? files.sharded : "").complete());
  expect_params(model, expected_params(config, setup, ckpt), "the path on the reader only");
  EXPECT_EQ(served.location().path, reader ? files.sharded : "");

  ReloadableModel nowhere(model, {"", "", ""});
  ReloadOptions o;
  o.reader_rank = world().size() - 1;
  std::string error;
  try {
    nowhere.reload(world(), o);
    ADD_FAILURE() << "a reader without weights went unnoticed";
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("rank " + std::to_string(o.reader_rank) +
                       " opens the weights but has none: no path was given and the model has "
                       "no location"),
            std::string::npos)
      << error;
  EXPECT_TRUE(mpitest::same_on_every_rank(error)) << error;
  expect_params(model, expected_params(config, setup, ckpt), "after the failed reload");
}

// A reader per node, two nodes, the second node's reader failing at its first
// read: the first node's ranks applied every bucket, the second node's other
// ranks received nothing. The error is agreed, so the invalidation callbacks run
// on every rank (a callback may itself be collective), each told its own
// parameters that may have changed: none on those ranks.
TPRELOAD_RANKS_TEST(Reload, AfterAnAgreedFailureTheCallbacksRunOnEveryRankWhenAnyRankWrote) {
  TPRELOAD_REQUIRE_RANKS(4);
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 620);
  const int n = world().size(), per_node = n / 2, failing = per_node;  // its first rank
  TensorParallelModel model(config, options_for({n, "", false}));
  ReloadableModel served(model, {"(in memory)", "", ""});
  std::vector<ReloadResult> told;
  served.on_reloaded([&](const ReloadResult& r) { told.push_back(r); });
  ReloadOptions o;
  o.readers = Readers::kNode;
  o.ranks_per_node = per_node;
  o.bucket_bytes = 4096;
  std::unique_ptr<WeightSource> source = testdata::memory_source(ckpt);
  if (world().rank() == failing)
    source = std::make_unique<FaultySource>(std::move(source), 0, FaultySource::Fault::kFail);
  std::string error;
  try {
    served.reload_from(world(), o, source.get());
    ADD_FAILURE() << "the failed read went unnoticed";
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  EXPECT_TRUE(mpitest::same_on_every_rank(error)) << error;
  ASSERT_EQ(told.size(), 1u) << "rank " << world().rank() << ": the callbacks did not run once";
  EXPECT_EQ(told[0].error, error);
  if (world().rank() < per_node) {
    EXPECT_EQ(told[0].possibly_mixed.size(), model.named_parameters().size())
        << "a rank of the first node, which applied every bucket";
  } else if (world().rank() != failing) {
    EXPECT_TRUE(told[0].possibly_mixed.empty()) << "a rank that received nothing";
  }
}

TPRELOAD_RANKS_TEST(Reload, ReloadFromANewPathMovesTheModelThereAndRunsCallbacks) {
  SharedDir dir;
  const ModelConfig config = testdata::tiny_config("qwen2_tied");
  const auto ckpt = testdata::random_checkpoint(config, 600);
  const Sources files = write_sources(ckpt, dir.path());
  const Variant setup{world().size(), "", false};
  TensorParallelModel model(config, options_for(setup));
  ReloadableModel served(model, {files.hdf5, "rev-abc", "s3://bucket/old"});
  int calls = 0;
  served.on_reloaded([&](const ReloadResult& r) { calls += r.complete() ? 1 : 100; });
  served.reload(world(), ReloadOptions{});  // from its own path
  EXPECT_EQ(served.location().revision, "rev-abc");
  served.reload(world(), ReloadOptions{}, files.sharded);
  EXPECT_EQ(served.location().path, files.sharded);
  EXPECT_EQ(served.location().revision, "");
  EXPECT_EQ(served.location().remote_uri, "");
  EXPECT_EQ(calls, 2);
  ReloadOptions kernel;
  kernel.format = WeightFormat::kKernel;
  EXPECT_THROW(served.reload(world(), kernel), ValidationError);  // a checkpoint dir
  expect_params(model, expected_params(config, setup, ckpt), "after path reloads");
}

// Extra memory per rank is O(bucket), not O(model): a model ~100x the bucket.
TPRELOAD_RANKS_TEST(Reload, StagingStaysBoundedByTheBucketNotTheModel) {
  const ModelConfig config = parse_model_config(R"({"architectures":["LlamaForCausalLM"],
    "hidden_size":256,"intermediate_size":1024,"num_hidden_layers":16,"num_attention_heads":8,
    "num_key_value_heads":8,"vocab_size":2000,"torch_dtype":"bfloat16"})",
                                                "staging test");
  const auto ckpt = testdata::random_checkpoint(config, 900);
  std::uint64_t model_bytes = 0;
  for (const auto& [name, t] : ckpt) model_bytes += t.numel() * t.element_size();
  const std::uint64_t bucket = 64 << 10, row = 1024 * 2;  // largest row: down_proj, 1024 bf16
  for (const std::string quant : {"", "int8"}) {
    for (Distribution dist : {Distribution::kBroadcast, Distribution::kScatter}) {
      TensorParallelModel model(config, options_for({world().size(), quant, false}));
      ReloadOptions o;
      o.distribution = dist;
      o.bucket_bytes = bucket;
      const ReloadResult r = reload_from(model, "", &ckpt, o);
      ASSERT_TRUE(r.complete());
      // Per slot: a send and a receive buffer of at most one bucket (or one row);
      // int8 rows are quantized on arrival, so int8 adds nothing.
      // (the default depth is chosen per rank: the deepest bounds the peak over ranks)
      std::int64_t depth = r.pipeline_depth;
      world().allreduce_ints(&depth, 1, IntOp::kMax);
      ASSERT_GE(depth, 1);
      const std::uint64_t bound = static_cast<std::uint64_t>(depth) * 2 * (bucket + row);
      EXPECT_LE(r.peak_staging_bytes, bound) << quant << " " << distribution_name(dist);
      EXPECT_LT(r.peak_staging_bytes * 4, model_bytes) << quant << " " << distribution_name(dist);
    }
  }
}

// The default pipeline depth is chosen per rank: 2 where the rank may run on two
// cores and its host has two cores for each of its ranks, else 1 (worked out
// here from the test's own gathering of host names and the rank's affinity).
// Every depth gives the same bytes, and ranks with different explicit depths
// reload together (ranks that differ on whether the depth is chosen:
// Integrity.RanksThatDisagreeOnOptionsOrConfigsAreToldWhichBeforeAnyTransfer).
TPRELOAD_RANKS_TEST(Reload, PipelineDepthIsChosenPerRankAndNeverChangesTheBytes) {
  const std::vector<std::string> hosts = host_names();
  const auto on_host = static_cast<long>(
      std::count(hosts.begin(), hosts.end(), hosts[static_cast<std::size_t>(world().rank())]));
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const int want = CPU_COUNT(&set) >= 2 && cores >= 2 * on_host ? 2 : 1;

  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 610);
  const Variant setup{world().size(), "", false};
  const auto expected = expected_params(config, setup, ckpt);
  for (Distribution dist : {Distribution::kBroadcast, Distribution::kScatter}) {
    const std::string what(distribution_name(dist));
    TensorParallelModel model(config, options_for(setup));
    ReloadOptions o;
    o.distribution = dist;
    o.bucket_bytes = 2048;  // many buckets: the pipeline turns over
    const ReloadResult chosen = reload_from(model, "", &ckpt, o);
    ASSERT_TRUE(chosen.complete()) << what;
    EXPECT_EQ(chosen.pipeline_depth, want)
        << what << ": " << CPU_COUNT(&set) << " usable cores, " << cores << " on the host, "
        << on_host << " ranks there";
    expect_params(model, expected, what + ", depth chosen");
    // Explicit depths, different on every other rank.
    for (int depth : {1, 2, 3}) {
      TensorParallelModel other(config, options_for(setup));
      o.pipeline_depth = world().rank() % 2 ? depth : 4 - depth;
      const ReloadResult r = reload_from(other, "", &ckpt, o);
      ASSERT_TRUE(r.complete()) << what;
      EXPECT_EQ(r.pipeline_depth, o.pipeline_depth) << what;
      expect_params(other, expected, what + ", depth " + std::to_string(o.pipeline_depth));
    }
  }
}

// A source whose reads of one tensor fail, as a disk error would.
class FailingSource final : public WeightSource {
 public:
  // `views`: hand out views as the inner source does (a reload may then read
  // through them), or none (every byte goes through read()).
  FailingSource(std::unique_ptr<WeightSource> inner, std::string bad, bool views = true)
      : inner_(std::move(inner)), bad_(std::move(bad)), views_(views) {}
  // The same description as the good source: with Readers::kAll the ranks'
  // listings (descriptions included) must match.
  std::string describe() const override { return inner_->describe(); }
  const std::vector<TensorInfo>& tensors() const override { return inner_->tensors(); }
  std::optional<ConstBytes> view(std::size_t i, ByteRange r) override {
    if (!views_) return std::nullopt;
    check(i);
    return inner_->view(i, r);
  }
  void read(std::size_t i, ByteRange r, MutableBytes dst) override {
    check(i);
    inner_->read(i, r, dst);
  }
  std::uint64_t bytes_read() const override { return inner_->bytes_read(); }
  const std::map<std::string, std::string>& metadata() const override { return inner_->metadata(); }

 private:
  void check(std::size_t i) const {  // `bad_` "*": every tensor fails
    const std::string& name = inner_->tensors()[i].name;
    if (bad_ == "*" || name == bad_) throw CheckpointError("I/O error reading '" + name + "'");
  }
  std::unique_ptr<WeightSource> inner_;
  std::string bad_;
  bool views_;
};

TPRELOAD_RANKS_TEST(Reload, FailedReadRaisesTheSameErrorOnEveryRank) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 700);
  const int last = world().size() - 1;
  struct Case {
    ReadMode mode;
    bool views;   // whether the failing source has views
    bool atomic;  // then every parameter must be as it was
  };
  std::vector<Case> cases;
  // (A broadcast bucket with rotated roots is read by whichever reader's turn
  // it is: RotatedBroadcastRootsShareTheReadsAndAgreeOnAFailure.)
  for (const ReadMode& mode : kReadModes)
    if (!mode.rotate || mode.distribution == Distribution::kScatter)
      cases.push_back({mode, true, false});
  for (bool views : {false, true})
    cases.push_back({ReadMode{Readers::kAll, Distribution::kScatter}, views, true});
  cases.push_back({ReadMode{Readers::kAll, Distribution::kScatter}, false, false});
  for (const auto& [mode, views, atomic] : cases) {
    TensorParallelModel model(config, options_for({world().size(), "", false}));
    std::map<std::string, at::Tensor> before;
    for (const auto& [name, t] : model.named_parameters()) before[name] = t.clone();
    ReloadOptions o;
    mode.apply(o);
    o.atomic = atomic;
    o.bucket_bytes = 4096;
    // One reader: rank 0 fails. Every rank reading: only the last rank's source
    // fails. A reader per node: the last node's reader (its first rank).
    const bool all = mode.readers == Readers::kAll, node = mode.readers == Readers::kNode;
    const int failing = all    ? last
                        : node ? (last / mode.ranks_per_node()) * mode.ranks_per_node()
                               : 0;
    std::unique_ptr<WeightSource> source;
    if (world().rank() == failing)
      source = std::make_unique<FailingSource>(testdata::memory_source(ckpt),
                                               "model.layers.1.mlp.down_proj.weight", views);
    else if (all || node)
      source = testdata::memory_source(ckpt);
    // What was applied before the failure (in atomic mode: to the second copy,
    // so the error says only that nothing changed).
    const std::string state =
        atomic ? "; atomic reload: every parameter is as it was before the reload"
        : all  ? "; every rank had applied the buckets it read before this failure (the others "
                 "all of theirs)"
        : node ? "; the ranks of that node had applied the buckets before it, the ranks of every "
                 "other node all of theirs"
               : "; weights of earlier buckets were already replaced";
    const std::string expected =
        (all ? "failed on rank " + std::to_string(last) +
                   " (--readers all: each rank reads its own slices)"
         : node ? "failed on reader rank " + std::to_string(failing) +
                      " (--readers node: each node's reader reads for the ranks of its node)"
                : std::string("failed on reader rank 0")) +
        ": I/O error reading 'model.layers.1.mlp.down_proj.weight'" + state;
    try {
      reload_weights(model, world(), source.get(), o);
      FAIL() << "a failed read went unnoticed: " << mode_name(mode);
    } catch (const CheckpointError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(expected), std::string::npos) << mode_name(mode) << ": " << msg;
    }
    if (atomic) {
      for (const auto& [name, t] : model.named_parameters()) {
        EXPECT_TRUE(testdata::same_bytes(t, before.at(name)))
            << mode_name(mode) << (views ? " views" : "") << " atomic: " << name << " changed";
      }
    }
    // The other nodes' readers read on: their ranks hold every new weight.
    if (node && world().rank() / mode.ranks_per_node() != failing / mode.ranks_per_node())
      expect_params(model, expected_params(config, {world().size(), "", false}, ckpt),
                    mode_name(mode) + ": a node whose reader did not fail");
    world().barrier();  // every rank is out of the reload and in step again
  }
}

// --readers node with rotated broadcast roots: the node readers take the
// broadcast buckets in turn, so that together they read what the one reader
// reads, each a part of it, and every rank ends with the same weights; a read
// that fails on whichever reader's turn it was is the same error on every rank.
TPRELOAD_RANKS_TEST(Reload, RotatedBroadcastRootsShareTheReadsAndAgreeOnAFailure) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 720);
  const Variant setup{world().size(), "", false};
  const int n = world().size(), per_node = std::max(1, n / 2),
            nodes = (n + per_node - 1) / per_node;
  // Every rank's bytes read from its source, in rank order.
  auto bytes_read_by = [&](const ReloadOptions& o, const std::string& what) {
    TensorParallelModel model(config, options_for(setup));
    auto source = opens_source(o, world().rank()) ? testdata::memory_source(ckpt) : nullptr;
    EXPECT_TRUE(reload_weights(model, world(), source.get(), o).complete()) << what;
    expect_params(model, expected_params(config, setup, ckpt), what);
    std::vector<std::int64_t> bytes(static_cast<std::size_t>(n), 0);
    bytes[static_cast<std::size_t>(world().rank())] =
        source ? static_cast<std::int64_t>(source->bytes_read()) : 0;
    allreduce_ints(world(), bytes, IntOp::kSum);
    return bytes;
  };
  std::int64_t everything = 0;  // every tensor of the checkpoint, once
  for (const auto& [name, t] : ckpt)
    everything += static_cast<std::int64_t>(t.numel() * t.element_size());
  ReloadOptions one;
  one.distribution = Distribution::kBroadcast;
  one.bucket_bytes = 4096;
  ASSERT_EQ(bytes_read_by(one, "one reader")[0], everything);
  ReloadOptions node = one;
  node.readers = Readers::kNode;
  node.ranks_per_node = per_node;
  const auto by_node = bytes_read_by(node, "a reader per node");
  ReloadOptions rotated = node;
  rotated.rotate_broadcast_roots = true;
  const auto by_rotated = bytes_read_by(rotated, "rotated broadcast roots");
  std::int64_t together = 0;
  for (int r = 0; r < n; ++r) {
    const bool reader = r % per_node == 0;
    EXPECT_EQ(by_node[r], reader ? everything : 0) << "rank " << r << ", not rotated";
    together += by_rotated[r];
    if (!reader) {
      EXPECT_EQ(by_rotated[r], 0) << "rank " << r;
    } else if (nodes > 1) {
      EXPECT_GT(by_rotated[r], 0) << "rank " << r << " had no turn";
      EXPECT_LT(by_rotated[r], everything) << "rank " << r << " read every bucket";
    }
  }
  EXPECT_EQ(together, everything) << "the readers' turns read every byte once";

  // Every reader's source fails on one tensor: only the reader whose turn its
  // bucket is reads it.
  TensorParallelModel model(config, options_for(setup));
  auto source = std::make_unique<FailingSource>(testdata::memory_source(ckpt),
                                                "model.layers.1.mlp.down_proj.weight", true);
  std::string msg = "no error";
  try {
    reload_weights(model, world(), source.get(), rotated);
  } catch (const CheckpointError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("(--readers node, rotated broadcast roots: its turn to read a broadcast "
                     "bucket for every rank): I/O error reading "
                     "'model.layers.1.mlp.down_proj.weight'; every rank stopped at this bucket"),
            std::string::npos)
      << msg;
  const std::size_t at = msg.find("failed on reader rank ");
  ASSERT_NE(at, std::string::npos) << msg;
  const int failed_on = std::atoi(msg.c_str() + at + 22);
  EXPECT_EQ(failed_on % per_node, 0) << "not a node reader: " << msg;
  EXPECT_TRUE(mpitest::same_on_every_rank(msg)) << msg;
  world().barrier();
}

// A reader per node where one node cannot read the files (its ranks have no
// source): the last of two nodes, the first of two with the reader rank on the
// last, or the first of single-rank nodes (from 3 ranks) with the reader rank
// last, served by the next node in turn, not the reader rank's. Its ranks join
// the group of the serving node's reader (after that node's ranks), which reads
// their slices too, and every rank ends with the new weights; the served ranks
// read nothing. When the reader rank's own node cannot read, the reload fails on
// every rank, as without node readers.
// A source that cannot list, as ReloadableModel::reload passes for a path that
// did not open (the runner's and Python's way of reporting it).
class UnopenedSource final : public WeightSource {
 public:
  std::string describe() const override { throw CheckpointError("cannot open '/nowhere'"); }
  const std::vector<TensorInfo>& tensors() const override {
    throw CheckpointError("cannot open '/nowhere'");
  }
  std::optional<ConstBytes> view(std::size_t, ByteRange) override {
    throw CheckpointError("cannot open '/nowhere'");
  }
  void read(std::size_t, ByteRange, MutableBytes) override {
    throw CheckpointError("cannot open '/nowhere'");
  }
  std::uint64_t bytes_read() const override { return 0; }
  const std::map<std::string, std::string>& metadata() const override {
    throw CheckpointError("cannot open '/nowhere'");
  }
};

TPRELOAD_RANKS_TEST(Reload, ANodeThatCannotReadIsServedByAnotherNodesReader) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 730);
  const Variant setup{world().size(), "", false};
  const int n = world().size(), half = std::max(1, n / 2);
  struct Case {
    const char* name;
    int per_node, reader;
    int served_first, served_end;  // the world ranks that cannot read: [first, end)
  };
  std::vector<Case> cases = {{"last of two nodes served", half, 0, (n - 1) / half * half, n},
                             {"first of two nodes served", half, (n - 1) / half * half, 0, half}};
  if (n >= 3) cases.push_back({"first of single-rank nodes served", 1, n - 1, 0, 1});
  for (const Case& c : cases)
    for (Distribution d : {Distribution::kScatter, Distribution::kBroadcast}) {
      for (bool rotate : {false, true}) {
        if (rotate && d == Distribution::kScatter) continue;
        const std::string what = std::string(c.name) + ", " + std::string(distribution_name(d)) +
                                 (rotate ? ", rotated" : "");
        ReloadOptions o;
        o.distribution = d;
        o.bucket_bytes = 4096;
        o.reader_rank = c.reader;
        // What a single reader reads for this plan: a serving reader of one of
        // two nodes must read as much (every rank's slices).
        TensorParallelModel one_model(config, options_for(setup));
        auto one_source = world().rank() == o.reader_rank ? testdata::memory_source(ckpt) : nullptr;
        ASSERT_TRUE(reload_weights(one_model, world(), one_source.get(), o).complete()) << what;
        std::int64_t one_read =
            one_source ? static_cast<std::int64_t>(one_source->bytes_read()) : 0;
        world().allreduce_ints(&one_read, 1, IntOp::kSum);

        o.readers = Readers::kNode;
        o.ranks_per_node = c.per_node;
        o.rotate_broadcast_roots = rotate;
        TensorParallelModel model(config, options_for(setup));
        const int rank = world().rank();
        auto served = [&](int k) { return n > 1 && k >= c.served_first && k < c.served_end; };
        // Served ranks: no source in the first case, a source that cannot list in the others.
        std::unique_ptr<WeightSource> source;
        if (!served(rank))
          source = testdata::memory_source(ckpt);
        else if (&c != &cases.front())
          source = std::make_unique<UnopenedSource>();
        if (n == 1) {  // the reader rank's node cannot read: an error, as before
          EXPECT_THROW(reload_weights(model, world(), nullptr, o), CheckpointError) << what;
          continue;
        }
        const ReloadResult r = reload_weights(model, world(), source.get(), o);
        EXPECT_TRUE(r.complete()) << what;
        EXPECT_EQ(r.nodes_served, 1) << what;
        EXPECT_NE(summary_text(r).find("1 node(s) that cannot read served by another's"),
                  std::string::npos)
            << summary_text(r);
        expect_params(model, expected_params(config, setup, ckpt), what);
        std::vector<std::int64_t> bytes(static_cast<std::size_t>(n), 0);
        bytes[static_cast<std::size_t>(rank)] =
            source ? static_cast<std::int64_t>(source->bytes_read()) : 0;
        allreduce_ints(world(), bytes, IntOp::kSum);
        for (int k = 0; k < n; ++k) {
          if (served(k)) {
            EXPECT_EQ(bytes[static_cast<std::size_t>(k)], 0) << what << ": served rank " << k;
          }
        }
        if (c.per_node == half && n / half == 2 && !rotate) {  // two nodes: one reads for both
          EXPECT_EQ(bytes[static_cast<std::size_t>(o.reader_rank)], one_read) << what;
        }
        // The reader rank's node cannot read: the same error as before, on every rank.
        TensorParallelModel failing(config, options_for(setup));
        const bool reader_node = rank / c.per_node == o.reader_rank / c.per_node;
        auto none = reader_node ? nullptr : testdata::memory_source(ckpt);
        std::string msg = "no error";
        try {
          reload_weights(failing, world(), none.get(), o);
        } catch (const CheckpointError& e) {
          msg = e.what();
        }
        EXPECT_NE(msg.find("no weight source was given to rank " + std::to_string(o.reader_rank)),
                  std::string::npos)
            << what << ": " << msg;
        // ... naming the first rank of the lowest node that can read.
        const int can_read = o.reader_rank / c.per_node == 0 ? c.per_node : 0;
        EXPECT_NE(msg.find("the node of rank " + std::to_string(can_read) +
                           " can: make it the reader rank (--reader-rank " +
                           std::to_string(can_read) + ")"),
                  std::string::npos)
            << what << ": " << msg;
        EXPECT_TRUE(mpitest::same_on_every_rank(msg)) << msg;
        world().barrier();
      }
    }
}

// Every rank reading, a source whose every read fails, through views too (the
// first view a reload takes, to choose its path, fails as well): the same error
// on every rank, naming the failing rank.
TPRELOAD_RANKS_TEST(Reload, ReadersAllWithASourceThatFailsFromItsFirstByte) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 705);
  const int last = world().size() - 1;
  TensorParallelModel model(config, options_for({world().size(), "", false}));
  ReloadOptions o;
  o.readers = Readers::kAll;
  std::unique_ptr<WeightSource> source = testdata::memory_source(ckpt);
  if (world().rank() == last) source = std::make_unique<FailingSource>(std::move(source), "*");
  try {
    reload_weights(model, world(), source.get(), o);
    FAIL() << "failing reads went unnoticed";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("failed on rank " + std::to_string(last) +
                       " (--readers all: each rank reads its own slices): I/O error reading '"),
              std::string::npos)
        << msg;
    EXPECT_TRUE(mpitest::same_on_every_rank(msg)) << msg;
  }
}

// Every rank reading: a rank whose checkpoint lists differently (here one tensor
// fewer) stops every rank before anything is read, naming the rank.
TPRELOAD_RANKS_TEST(Reload, ReadersAllRefusesARankThatSeesOtherFiles) {
  TPRELOAD_REQUIRE_RANKS(2);
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 710);
  auto fewer = ckpt;
  fewer.erase("model.norm.weight");
  const int last = world().size() - 1;
  TensorParallelModel model(config, options_for({world().size(), "", false}));
  const auto before = model.parameter_for_reload("model.layers.0.mlp.down_proj.weight").clone();
  ReloadOptions o;
  o.readers = Readers::kAll;
  auto source = testdata::memory_source(world().rank() == last ? fewer : ckpt);
  try {
    reload_weights(model, world(), source.get(), o);
    FAIL() << "ranks reading different checkpoints went unnoticed";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank " + std::to_string(last) + " opened "), std::string::npos) << msg;
    EXPECT_NE(msg.find("(" + std::to_string(fewer.size()) +
                       " tensors), which lists differently from reader rank 0's (" +
                       std::to_string(ckpt.size()) + " tensors)"),
              std::string::npos)
        << msg;
  }
  EXPECT_TRUE(testdata::same_bytes(
      model.parameter_for_reload("model.layers.0.mlp.down_proj.weight"), before));
  // A rank given no source at all is named too.
  std::unique_ptr<WeightSource> none =
      world().rank() == last ? nullptr : testdata::memory_source(ckpt);
  try {
    reload_weights(model, world(), none.get(), o);
    FAIL() << "a rank without a source went unnoticed";
  } catch (const CheckpointError& e) {
    EXPECT_NE(
        std::string(e.what()).find("no weight source was given to rank " + std::to_string(last) +
                                   " (--readers all: every rank opens the checkpoint)"),
        std::string::npos)
        << e.what();
  }
  // A path the last rank cannot open (as the runner passes it): the error says
  // which modes serve ranks that cannot read, but only when some rank could.
  const std::string hint =
      "; with --readers all every rank opens the weights: where only some "
      "ranks can, use --readers node";
  for (const bool every_rank : {false, true}) {
    std::unique_ptr<WeightSource> unopened;
    if (every_rank || world().rank() == last)
      unopened = std::make_unique<UnopenedSource>();
    else
      unopened = testdata::memory_source(ckpt);
    std::string msg = "no error";
    try {
      reload_weights(model, world(), unopened.get(), o);
    } catch (const CheckpointError& e) {
      msg = e.what();
    }
    const std::string first = every_rank ? "0" : std::to_string(last);
    EXPECT_NE(msg.find("opening the weight source failed on rank " + first + "/" +
                       std::to_string(world().size()) + ": cannot open '/nowhere'"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find(hint) != std::string::npos, !every_rank) << msg;
    EXPECT_TRUE(mpitest::same_on_every_rank(msg)) << msg;
  }
}

// ------------------------------------------------------------ sharded sources

// How the ranks hold the checkpoint: each tensor in world-size row slices
// (FSDP), column slices (Megatron's row-parallel cut; 1-D tensors by rows), or
// whole on two ranks in turn (replicas: tensor i on ranks i and i + 1).
enum class Holding { kRows, kColumns, kWholeTwice };

// Rank `rank`'s boxes of `ckpt` under `how`, cut here by the test's own
// arithmetic (near-equal parts, the first ones an element longer) with
// at::narrow, each box's bytes a contiguous copy kept alive by its entry.
std::vector<HeldTensor> holding(const std::map<std::string, at::Tensor>& ckpt, Holding how,
                                int rank, int ranks) {
  std::vector<HeldTensor> out;
  int i = 0;
  for (const auto& [name, t] : ckpt) {
    const int tensor = i++;
    at::Tensor part = t;
    std::vector<std::int64_t> offset(static_cast<std::size_t>(t.dim()), 0), size = t.sizes().vec();
    if (how == Holding::kWholeTwice) {
      if (rank != tensor % ranks && rank != (tensor + 1) % ranks) continue;
    } else if (t.dim() == 0) {
      if (rank != 0) continue;
    } else {
      const std::int64_t d = how == Holding::kColumns && t.dim() >= 2 ? 1 : 0;
      const std::int64_t n = t.size(d), base = n / ranks, extra = n % ranks;
      const std::int64_t begin = rank * base + std::min<std::int64_t>(rank, extra);
      const std::int64_t length = base + (rank < extra ? 1 : 0);
      part = t.narrow(d, begin, length);
      offset[static_cast<std::size_t>(d)] = begin;
      size[static_cast<std::size_t>(d)] = length;
    }
    auto kept = std::make_shared<at::Tensor>(part.contiguous());
    out.push_back({name, dtype_from_torch(t.scalar_type()), t.sizes().vec(), Box{offset, size},
                   ConstBytes(kept->data_ptr(), kept->nbytes()), kept});
  }
  return out;
}

const char* holding_name(Holding how) {
  return how == Holding::kRows ? "rows" : how == Holding::kColumns ? "columns" : "whole twice";
}

// The data plane sharded reloads exchange over: under mpirun, MPI's
// point-to-point exchange; as threads, scatters over the threads communicator.
std::unique_ptr<DataTransport> point_to_point() {
  if (mpitest::ranks_are_threads()) return make_communicator_transport(world());
  return mpitest::mpi_world().make_data_transport();
}

// Every rank holds part of version 2 (rows, columns, replicas) and a model
// loaded with version 1; after the sharded reload every parameter holds its
// expected slice (the tests' own slicing), where it was before. A second
// reload of version 3 with the same boxes reuses the kept plan. Columns go
// in one atomic reload, replicas without checksums.
TPRELOAD_RANKS_TEST(Sharded, RowsColumnsAndReplicasLoadEveryShard) {
  const int n = world().size();
  const std::unique_ptr<DataTransport> data = point_to_point();
  for (const std::string config_name : {"llama_gqa", "qwen3_moe"}) {
    const ModelConfig config = testdata::tiny_config(config_name);
    const auto v1 = testdata::random_checkpoint(config, 100),
               v2 = testdata::random_checkpoint(config, 200),
               v3 = testdata::random_checkpoint(config, 300);
    // tp = world, and (from 2 ranks) tp = world / 2: two replicas.
    for (const int tp : n >= 2 ? std::vector<int>{n, n / 2} : std::vector<int>{1}) {
      const Variant setup{tp, "", false};
      const auto want2 = expected_params(config, setup, v2);
      for (Holding how : {Holding::kRows, Holding::kColumns, Holding::kWholeTwice}) {
        const std::string what =
            config_name + " tp " + std::to_string(tp) + " " + holding_name(how);
        TensorParallelModel model(config, options_for(setup));
        ReloadOptions o;
        o.bucket_bytes = how == Holding::kColumns ? std::uint64_t{1} << 30 : 1900;
        o.atomic = how == Holding::kColumns;        // into the second copy, then committed
        o.checksums = how != Holding::kWholeTwice;  // messages without their CRC-32C
        reload_from(model, "", &v1, o);
        const auto before = layout_of(model);
        ReloadWorkspace workspace;
        const ShardedSource held(holding(v2, how, world().rank(), n));
        const ReloadResult r = reload_weights(model, world(), *data, held, o, &workspace);
        EXPECT_TRUE(r.complete()) << what;
        EXPECT_TRUE(r.skipped.empty()) << what;
        // (At 2 ranks each holds every tensor whole twice over: nothing moves.)
        if (n > 2 || (n == 2 && how != Holding::kWholeTwice)) {
          EXPECT_GT(r.bytes_transferred, 0u) << what;
        } else {
          EXPECT_EQ(r.bytes_transferred, 0u) << what;
        }
        expect_params(model, want2, what);
        expect_same_layout(model, before);
        if (how != Holding::kRows) continue;
        // Progress on the reader rank: a call per bucket, then the finished one.
        std::vector<ReloadProgress> calls;
        ReloadOptions reported = o;
        reported.progress = [&](const ReloadProgress& p) { calls.push_back(p); };
        const detail::CachedPlan* kept = workspace.cached_plan();
        const ShardedSource next(holding(v3, how, world().rank(), n));
        const ReloadResult again =
            reload_weights(model, world(), *data, next, reported, &workspace);
        EXPECT_TRUE(again.complete()) << what;
        EXPECT_EQ(workspace.cached_plan(), kept) << what << ": the plan was made again";
        if (world().rank() == reported.reader_rank) {
          ASSERT_EQ(calls.size(), again.buckets + 1) << what;
          EXPECT_TRUE(calls.back().finished && calls.back().buckets_done == again.buckets) << what;
          EXPECT_EQ(calls.back().bytes_done, calls.back().bytes_total) << what;
        } else {
          EXPECT_TRUE(calls.empty()) << what;
        }
        expect_params(model, expected_params(config, setup, v3), what + " (version 3)");
      }
    }
  }
}

// Online FP8 from row slices: each layer is quantized once its shards are
// complete, as a reload from files does (the expected bytes: a local load of
// the same checkpoint through the model's loaders, checked on its own by the
// unit tests).
TPRELOAD_RANKS_TEST(Sharded, OnlineFp8QuantizesWhatTheSlicesBring) {
  const int n = world().size();
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto v2 = testdata::random_checkpoint(config, 200);
  for (const std::string quantization : {"fp8", "fp8-block"}) {
    const Variant setup{n, quantization, false};
    TensorParallelModel model(config, options_for(setup));
    ReloadOptions o;
    o.bucket_bytes = 1900;
    const ShardedSource held(holding(v2, Holding::kRows, world().rank(), n));
    EXPECT_TRUE(reload_weights(model, world(), held, o).complete()) << quantization;
    expect_params(model, expected_params(config, setup, v2), "sharded " + quantization);
  }
}

// A trainer's ranks in the serving job's world (ReloadOptions::serving_ranks):
// the first half of the world serves (tp = the serving ranks, and from 4
// ranks two replicas of half of them), the second half holds FSDP row slices
// of each version and nothing else (push_shards); the serving ranks hold
// nothing. Two steps (versions 2 and 3, the same boxes: the plan is kept):
// every serving parameter holds its expected slice (the tests' own slicing;
// online FP8 too), no byte reaches a trainer rank, and only trainer ranks send.
TPRELOAD_RANKS_TEST(Sharded, RanksThatServeNothingSendWhatTheyHold) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "a trainer rank beside a serving one needs two ranks";
  const int serving = n / 2, trainers = n - serving, me = world().rank();
  const bool serves = me < serving;
  const std::unique_ptr<DataTransport> data = point_to_point();
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto v1 = testdata::random_checkpoint(config, 100);
  const std::vector<std::map<std::string, at::Tensor>> steps = {
      testdata::random_checkpoint(config, 200), testdata::random_checkpoint(config, 300)};
  for (const int tp : serving >= 2 ? std::vector<int>{serving, serving / 2} : std::vector<int>{1}) {
    for (const std::string quantization : {"", "fp8"}) {
      const std::string what = "tp " + std::to_string(tp) + " of " + std::to_string(serving) +
                               " serving, " + std::to_string(trainers) + " trainer ranks " +
                               quantization;
      const Variant setup{tp, quantization, false};
      ReloadOptions o;
      o.bucket_bytes = 1900;
      o.serving_ranks = serving;
      ReloadWorkspace workspace;
      std::unique_ptr<TensorParallelModel> model;
      const ShardingRules rules(config, tp, quantization);
      if (serves) {
        model = std::make_unique<TensorParallelModel>(config, options_for(setup));
        model->load_weights(*testdata::memory_source(v1));  // (local: the trainers serve nothing)
      }
      const detail::CachedPlan* kept = nullptr;
      for (std::size_t step = 0; step < steps.size(); ++step) {
        const ShardedSource held(
            serves ? std::vector<HeldTensor>{}
                   : holding(steps[step], Holding::kRows, me - serving, trainers));
        const ReloadResult r = serves ? reload_weights(*model, world(), *data, held, o, &workspace)
                                      : push_shards(world(), *data, held, rules, o, &workspace);
        EXPECT_TRUE(r.complete()) << what;
        ASSERT_EQ(r.bytes_sent_by_rank.size(), static_cast<std::size_t>(n)) << what;
        for (int w = 0; w < n; ++w) {
          const auto at = static_cast<std::size_t>(w);
          if (w < serving) {
            EXPECT_EQ(r.bytes_sent_by_rank[at], 0u) << what << ": serving rank " << w << " sent";
            EXPECT_GT(r.bytes_received_by_rank[at], 0u) << what << ": rank " << w;
          } else {
            EXPECT_GT(r.bytes_sent_by_rank[at], 0u) << what << ": trainer rank " << w;
            EXPECT_EQ(r.bytes_received_by_rank[at], 0u) << what << ": trainer rank " << w;
          }
        }
        if (step == 1) {
          EXPECT_EQ(workspace.cached_plan(), kept) << what << ": the plan was made again";
        }
        kept = workspace.cached_plan();
        if (serves) {
          expect_params(*model, expected_params(config, setup, steps[step]),
                        what + " step " + std::to_string(step));
        } else {
          EXPECT_TRUE(r.loaded.empty()) << what;
        }
      }
    }
  }
}

// Ranks that serve nothing are checked with the serving ones, and every rank
// raises the same error before any write: trainer ranks whose layout differs
// from the serving model's, a rank past the serving ranks given a model, and
// a range of a tensor no trainer rank holds.
TPRELOAD_RANKS_TEST(Sharded, RanksThatServeNothingAreCheckedAlike) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "a trainer rank beside a serving one needs two ranks";
  const int serving = n / 2, trainers = n - serving, me = world().rank();
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto v1 = testdata::random_checkpoint(config, 100),
             v2 = testdata::random_checkpoint(config, 200);
  const Variant setup{serving, "", false};
  ReloadOptions o;
  o.serving_ranks = serving;
  TensorParallelModel model(config, options_for(setup));
  model.load_weights(*testdata::memory_source(v1));
  const auto want1 = expected_params(config, setup, v1);
  const auto data = make_communicator_transport(world());
  // (each trainer rank's rows; `last_holds`: whether the last trainer rank holds its own)
  auto run = [&](const ShardingRules& rules, bool last_holds, bool last_has_model) {
    const bool holds = me >= serving && (last_holds || me != n - 1);
    const ShardedSource held(holds ? holding(v2, Holding::kRows, me - serving, trainers)
                                   : std::vector<HeldTensor>{});
    std::string msg = "no error";
    try {
      if (me < serving || (last_has_model && me == n - 1))
        reload_weights(model, world(), *data, held, o);
      else
        push_shards(world(), *data, held, rules, o);
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_TRUE(mpitest::same_on_every_rank(msg)) << msg;
    EXPECT_NE(msg.find("nothing was reloaded"), std::string::npos) << msg;
    if (me < serving) expect_params(model, want1, "after: " + msg);
    return msg;
  };
  std::string msg = run(ShardingRules(config, serving, "int8"), true, false);
  EXPECT_NE(msg.find("ranks disagree on the quantization"), std::string::npos) << msg;
  msg = run(ShardingRules(config, serving), true, true);
  EXPECT_NE(msg.find("rank " + std::to_string(n - 1) + " is past the " + std::to_string(serving) +
                     " serving ranks"),
            std::string::npos)
      << msg;
  if (trainers >= 2) {  // (with one, nothing at all is held: nothing is listed)
    msg = run(ShardingRules(config, serving), false, false);
    EXPECT_NE(msg.find("no rank holds"), std::string::npos) << msg;
  }
}

// Parameters on a device (emulated), the messages in host memory (each rank's
// view assembled in pinned memory and copied to the device) and then moved in
// device memory (a transport that moves it, as NCCL does: packed and unpacked
// in pinned memory): every parameter in place with the version's slices,
// online FP8 too. The host side of every copy must be pinned.
TPRELOAD_RANKS_TEST(Sharded, DeviceParametersOverHostAndDeviceTransports) {
  const int n = world().size();
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto v1 = testdata::random_checkpoint(config, 100),
             v2 = testdata::random_checkpoint(config, 200),
             v3 = testdata::random_checkpoint(config, 300);
  for (const std::string quantization : {"", "fp8"}) {
    const Variant setup{n, quantization, false};
    auto device = std::make_shared<testing::EmulatedDevice>();
    ModelOptions mo = options_for(setup);
    mo.device = device;
    TensorParallelModel model(config, mo);
    model.load_weights(*testdata::memory_source(v1));
    const auto before = layout_of(model);
    device->require_pinned_host(true);
    ReloadOptions o;
    o.bucket_bytes = 1900;
    const ShardedSource held(holding(v2, Holding::kRows, world().rank(), n));
    const ReloadResult r = reload_weights(model, world(), held, o);
    EXPECT_TRUE(r.complete()) << quantization;
    EXPECT_GT(r.staging.device, 0u) << quantization;
    expect_params(model, expected_params(config, setup, v2), "device parameters " + quantization);
    expect_same_layout(model, before);
    auto moving =
        testing::make_emulated_device_transport(make_communicator_transport(world()), *device);
    const ShardedSource next(holding(v3, Holding::kRows, world().rank(), n));
    const ReloadResult d = reload_weights(model, world(), *moving, next, o);
    EXPECT_TRUE(d.complete()) << quantization;
    if (n > 1) {
      EXPECT_GT(d.bytes_transferred, 0u) << quantization;
    }
    expect_params(model, expected_params(config, setup, v3),
                  "device parameters, device transport " + quantization);
    expect_same_layout(model, before);
  }
}

// A range no rank holds is named (tensor, range, rank) on every rank before
// any write: the parameters keep version 1.
TPRELOAD_RANKS_TEST(Sharded, AMissingRangeIsNamedBeforeAnyWrite) {
  const int n = world().size();
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto v1 = testdata::random_checkpoint(config, 100),
             v2 = testdata::random_checkpoint(config, 200);
  const Variant setup{n, "", false};
  TensorParallelModel model(config, options_for(setup));
  reload_from(model, "", &v1, ReloadOptions{});
  // The last rank holds its row slice of one tensor but the last row.
  const std::string dropped = "model.layers.1.mlp.down_proj.weight";
  const at::Tensor& t = v2.at(dropped);
  std::vector<HeldTensor> mine = holding(v2, Holding::kRows, world().rank(), n);
  if (world().rank() == n - 1)
    for (HeldTensor& h : mine)
      if (h.name == dropped) {
        h.box.size[0] -= 1;
        auto shorter =
            std::make_shared<at::Tensor>(t.narrow(0, h.box.offset[0], h.box.size[0]).contiguous());
        h.bytes = ConstBytes(shorter->data_ptr(), shorter->nbytes());
        h.keep_alive = shorter;
      }
  std::string error;
  try {
    reload_weights(model, world(), ShardedSource(std::move(mine)), ReloadOptions{});
  } catch (const ValidationError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("'" + dropped + "'"), std::string::npos) << error;
  EXPECT_NE(error.find("which no rank holds"), std::string::npos) << error;
  const std::string last_row =
      "[" + std::to_string(t.size(0) - 1) + ":" + std::to_string(t.size(0)) + ", ";
  EXPECT_NE(error.find(last_row), std::string::npos) << error;
  EXPECT_TRUE(mpitest::same_on_every_rank(error)) << error;
  expect_params(model, expected_params(config, setup, v1), "after the refused reload");
}

// Ranks that hold the same range with different bytes are refused (tensor,
// range, ranks) before any write; boxes of one rank that disagree are refused
// when its source is made.
TPRELOAD_RANKS_TEST(Sharded, OverlapsThatDisagreeAreRefused) {
  const int n = world().size();
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto v1 = testdata::random_checkpoint(config, 100),
             v2 = testdata::random_checkpoint(config, 200);
  std::vector<HeldTensor> mine = holding(v2, Holding::kWholeTwice, world().rank(), std::max(n, 2));
  if (n == 1) {  // one rank: a tensor whole and its first row changed
    const auto& [name, t] = *v2.begin();
    auto whole = std::make_shared<at::Tensor>(t.contiguous());
    auto row = std::make_shared<at::Tensor>(t.narrow(0, 0, 1).clone());
    row->view(-1)[0].add_(1);
    std::vector<std::int64_t> one_row = t.sizes().vec();
    one_row[0] = 1;
    const DType dtype = dtype_from_torch(t.scalar_type());
    std::vector<HeldTensor> two = {
        {name, dtype, t.sizes().vec(), Box::whole(t.sizes().vec()),
         ConstBytes(whole->data_ptr(), whole->nbytes()), whole},
        {name, dtype, t.sizes().vec(),
         Box{std::vector<std::int64_t>(static_cast<std::size_t>(t.dim()), 0), one_row},
         ConstBytes(row->data_ptr(), row->nbytes()), row}};
    std::string error;
    try {
      ShardedSource bad(std::move(two));
    } catch (const CheckpointError& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("hold different bytes"), std::string::npos) << error;
    EXPECT_NE(error.find("'" + name + "'"), std::string::npos) << error;
    return;
  }
  const Variant setup{n, "", false};
  TensorParallelModel model(config, options_for(setup));
  reload_from(model, "", &v1, ReloadOptions{});
  // The second holder of the first tensor (rank 1) holds a changed copy.
  const std::string name = v2.begin()->first;
  if (world().rank() == 1)
    for (HeldTensor& h : mine)
      if (h.name == name) {
        auto changed = std::make_shared<at::Tensor>(v2.at(name).clone());
        changed->view(-1)[0].add_(1);
        h.bytes = ConstBytes(changed->data_ptr(), changed->nbytes());
        h.keep_alive = changed;
      }
  std::string error;
  try {
    reload_weights(model, world(), ShardedSource(std::move(mine)), ReloadOptions{});
  } catch (const ValidationError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("hold different bytes"), std::string::npos) << error;
  EXPECT_NE(error.find("'" + name + "' held by ranks 0, 1"), std::string::npos) << error;
  EXPECT_TRUE(mpitest::same_on_every_rank(error)) << error;
  expect_params(model, expected_params(config, setup, v1), "after the refused reload");
}

// Checkpoints that stack tensors (Phi-3's qkv_proj and gate_up_proj, the
// GraniteMoE experts [E, 2I, H] by rows of their last dimension) are held as
// the trainer holds them, stacked; the reload cuts each box as the weight
// loaders cut the tensor. A box that cuts an expert's rows (column slices of
// [E, 2I, H]) is refused by name before anything moves, as is kernel format.
TPRELOAD_RANKS_TEST(Sharded, StackedTensorsAreCutAsTheLoadersCutThem) {
  const int n = world().size();
  for (const std::string config_name : {"phi3", "granite_moe"})
    for (Holding how : {Holding::kRows, Holding::kColumns}) {
      const std::string what = config_name + " " + holding_name(how);
      const ModelConfig config = testdata::tiny_config(config_name);
      const auto v2 = testdata::random_checkpoint(config, 200);
      const Variant setup{n, "", false};
      TensorParallelModel model(config, options_for(setup));
      ReloadOptions o;
      o.bucket_bytes = 1900;
      const ShardedSource held(holding(v2, how, world().rank(), n));
      const bool cuts_experts = config_name == "granite_moe" && how == Holding::kColumns && n > 1;
      std::string error;
      try {
        EXPECT_TRUE(reload_weights(model, world(), held, o).complete()) << what;
      } catch (const UsageError& e) {
        error = e.what();
      }
      if (!cuts_experts) {
        EXPECT_EQ(error, "") << what;
        expect_params(model, expected_params(config, setup, v2), what);
        continue;
      }
      EXPECT_NE(error.find("block_sparse_moe.input_linear.weight' box"), std::string::npos)
          << error;
      EXPECT_NE(error.find("cuts dimension 1"), std::string::npos) << error;
      EXPECT_TRUE(mpitest::same_on_every_rank(error)) << error;
    }
  const ModelConfig phi3 = testdata::tiny_config("phi3");
  TensorParallelModel model(phi3, options_for({n, "", false}));
  const ShardedSource held(
      holding(testdata::random_checkpoint(phi3, 1), Holding::kRows, world().rank(), n));
  ReloadOptions kernel;
  kernel.format = WeightFormat::kKernel;
  EXPECT_THROW(reload_weights(model, world(), held, kernel), UsageError);
}

// ------------------------------------------------------------ weight streams

// A model loaded with version 1 takes version 2 from a stream on the reader
// rank (the last), segment by segment (1900-byte buckets, depth 2: segments
// of 4 x 3800 bytes), at tp = world and world / 2, dense and MoE, in checkpoint
// format, online FP8 (llama_gqa), and kernel format (each rank's slices of
// version 3, tagged with their tp ranks): every parameter holds its expected
// slice (the tests' own slicing; FP8: a local load), where it was before, and
// the reader held at most one segment and the tensor that crossed it.
TPRELOAD_RANKS_TEST(Stream, EveryRankGetsItsShardsSegmentBySegment) {
  const int n = world().size(), reader = n - 1;
  for (const std::string config_name : {"llama_gqa", "qwen3_moe"}) {
    const ModelConfig config = testdata::tiny_config(config_name);
    const auto v1 = testdata::random_checkpoint(config, 100),
               v2 = testdata::random_checkpoint(config, 200),
               v3 = testdata::random_checkpoint(config, 300);
    std::uint64_t largest = 0;
    for (const auto& [name, t] : v2) largest = std::max<std::uint64_t>(largest, t.nbytes());
    for (const int tp : n >= 2 ? std::vector<int>{n, n / 2} : std::vector<int>{1}) {
      for (const std::string quantization : {"", "fp8"}) {
        if (!quantization.empty() && config_name != "llama_gqa") continue;
        const Variant setup{tp, quantization, false};
        const std::string what = config_name + " tp " + std::to_string(tp) + " " + quantization;
        TensorParallelModel model(config, options_for(setup));
        ReloadOptions o;
        o.bucket_bytes = 1900;
        // (explicit depths may differ by rank: the reader's sets the segments'
        // size, which every rank reports)
        o.pipeline_depth = world().rank() == reader ? 2 : 1;
        o.reader_rank = reader;
        reload_from(model, "", &v1, o);
        const auto before = layout_of(model);
        auto counts = std::make_shared<testing::StreamCounts>();
        auto stream = world().rank() == reader
                          ? testing::counting_stream(testdata::in_memory(v2), counts)
                          : nullptr;
        const ReloadResult r = reload_from_stream(model, world(), stream.get(), o);
        EXPECT_TRUE(r.complete()) << what;
        EXPECT_TRUE(r.skipped.empty()) << what;
        EXPECT_NE(r.source.find(std::to_string(v2.size()) + " tensors in "), std::string::npos)
            << r.source;
        EXPECT_NE(r.source.find(" segments of at most 15200 bytes"), std::string::npos) << r.source;
        expect_params(model, expected_params(config, setup, v2), what);
        expect_same_layout(model, before);
        if (world().rank() == reader) {
          EXPECT_EQ(counts->yielded, v2.size()) << what;
          EXPECT_EQ(counts->live, 0u) << what << ": the reload kept tensors of the stream";
          EXPECT_GT(counts->most, 0u) << what;
          EXPECT_LE(counts->most, 15200 + largest) << what;
        }
        if (!quantization.empty()) continue;
        // Kernel format: every tp rank's slices of version 3, from the stream.
        std::vector<InMemoryTensor> slices;
        if (world().rank() == reader)
          for (int t = 0; t < tp; ++t)
            for (InMemoryTensor& m :
                 testdata::in_memory(testdata::expected_shards(config, v3, tp, t))) {
              m.tp_rank = t;
              slices.push_back(std::move(m));
            }
        const KernelFormatInfo info{tp, config.dtype, "", config.json, false};
        auto kernel = world().rank() == reader
                          ? testing::counting_stream(std::move(slices), counts, info)
                          : nullptr;
        ReloadOptions k = o;
        k.format = WeightFormat::kKernel;
        EXPECT_TRUE(reload_from_stream(model, world(), kernel.get(), k).complete()) << what;
        expect_params(model, testdata::expected_shards(config, v3, tp, world().rank() % tp),
                      what + " kernel format");
        expect_same_layout(model, before);
      }
    }
  }
}

// Ranks that call different reloads (a stream on the reader, a weight source
// elsewhere) are refused alike on every rank before anything moves, as is a
// stream with --readers all.
TPRELOAD_RANKS_TEST(Stream, EveryRankMustReloadFromTheStream) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const int n = world().size();
  const auto v1 = testdata::random_checkpoint(config, 100),
             v2 = testdata::random_checkpoint(config, 200);
  const Variant setup{n, "", false};
  TensorParallelModel model(config, options_for(setup));
  reload_from(model, "", &v1, ReloadOptions{});
  auto counts = std::make_shared<testing::StreamCounts>();
  if (n > 1) {  // (one rank cannot disagree with itself)
    std::string msg = "no error";
    try {
      if (world().rank() == 0) {
        auto stream = testing::counting_stream(testdata::in_memory(v2), counts);
        reload_from_stream(model, world(), stream.get(), ReloadOptions{});
      } else {
        reload_weights(model, world(), nullptr, ReloadOptions{});
      }
    } catch (const UsageError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("the ranks reload from different kinds of source"), std::string::npos)
        << msg;
    EXPECT_TRUE(mpitest::same_on_every_rank(msg)) << msg;
  }
  ReloadOptions all;
  all.readers = Readers::kAll;
  auto stream =
      world().rank() == 0 ? testing::counting_stream(testdata::in_memory(v2), counts) : nullptr;
  try {
    reload_from_stream(model, world(), stream.get(), all);
    FAIL() << "a stream with --readers all";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("a weight stream is taken by the reader rank alone: "
                                         "--readers all is for checkpoint files"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(counts->yielded, 0u) << "the stream was taken from";
  expect_params(model, expected_params(config, setup, v1), "after the refused reloads");
}

// The CheckpointError a reload from `stream` raises ("no error" if none).
std::string stream_error(TensorParallelModel& model, WeightStream* stream, const ReloadOptions& o) {
  try {
    reload_from_stream(model, world(), stream, o);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "no error";
}

// A stream that fails once segments have been written (it throws; it yields a
// tensor a second time) is the same CheckpointError on every rank, naming the
// stream's error and, unless the reload is atomic, the parameters that may
// hold a mix; an atomic reload leaves every parameter as it was.
TPRELOAD_RANKS_TEST(Stream, AFailingStreamIsTheSameErrorOnEveryRank) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const int n = world().size();
  const auto v1 = testdata::random_checkpoint(config, 100),
             v2 = testdata::random_checkpoint(config, 200);
  const Variant setup{n, "", false};
  const auto want1 = expected_params(config, setup, v1);
  const std::string third = std::next(v2.begin(), 3)->first;
  const std::size_t half = v2.size() / 2;  // (segments of 1900 bytes were written before it)
  for (const bool atomic : {false, true}) {
    for (const bool throws : {true, false}) {
      TensorParallelModel model(config, options_for(setup));
      ReloadOptions o;
      o.bucket_bytes = 1900;
      o.pipeline_depth = 1;
      o.atomic = atomic;
      reload_from(model, "", &v1, o);
      testing::StreamFaults faults;
      if (throws)
        faults.fail_at = half;
      else
        faults.again = 3;
      auto counts = std::make_shared<testing::StreamCounts>();
      auto stream = world().rank() == 0 ? testing::counting_stream(testdata::in_memory(v2), counts,
                                                                   std::nullopt, faults)
                                        : nullptr;
      const std::string msg = stream_error(model, stream.get(), o);
      const std::string what =
          std::string(atomic ? "atomic, " : "") + (throws ? "throws" : "again");
      EXPECT_NE(msg.find("taking the weight stream's next tensors failed on rank 0/"),
                std::string::npos)
          << what << ": " << msg;
      EXPECT_NE(
          msg.find(throws ? "test stream: the trainer failed at tensor " + std::to_string(half)
                          : "test stream: tensor '" + third + "' comes a second time"),
          std::string::npos)
          << what << ": " << msg;
      EXPECT_TRUE(mpitest::same_on_every_rank(msg)) << what << ": " << msg;
      if (atomic) {
        EXPECT_NE(msg.find("every parameter is as it was before the reload"), std::string::npos)
            << msg;
        expect_params(model, want1, what);
      } else {
        EXPECT_NE(msg.find("may hold a mix of old and new weights"), std::string::npos) << msg;
      }
      if (world().rank() == 0) {
        EXPECT_EQ(counts->live, 0u) << what;
      }
    }
  }
}

// A parameter a stream gives again in a later segment, under another spelling
// that resolves to it (RoutedExperts here), is refused before the later
// segment writes, on every rank, naming both tensors; an atomic reload leaves
// every parameter as it was.
TPRELOAD_RANKS_TEST(Stream, AParameterGivenAgainInALaterSegmentIsRefused) {
  const ModelConfig config = testdata::tiny_config("qwen3_moe");
  const int tp = world().size(), last = tp - 1;
  const std::string w2 = "model.layers.2.mlp.experts.w2_weight";
  const std::string w2_routed = "model.layers.2.mlp.experts.routed_experts.w2_weight";
  const auto v1 = testdata::random_checkpoint(config, 1420),
             v2 = testdata::random_checkpoint(config, 1421);
  // Every tp rank's shards of v2, the last rank's w2 first and again, under
  // its other name, last: more than a segment (4 x 1900 bytes) between them.
  std::vector<at::Tensor> keep;
  std::vector<InMemoryTensor> tensors(1);
  std::uint64_t between = 0;
  for (int r = 0; r < tp; ++r)
    for (const auto& [name, t] : testdata::expected_shards(config, v2, tp, r)) {
      keep.push_back(t.contiguous());
      InMemoryTensor m{name, DType::kBFloat16, t.sizes().vec(), tensor_bytes(keep.back()), nullptr};
      m.tp_rank = r;
      if (r == last && name == w2) {
        tensors.front() = m;
      } else {
        tensors.push_back(m);
        between += m.bytes.size;
      }
    }
  tensors.push_back(tensors.front());
  tensors.back().name = w2_routed;
  ASSERT_EQ(tensors.front().name, w2);
  ASSERT_GT(between, 4u * 1900u) << "the two spellings must come in different segments";
  TensorParallelModel model(config, options_for({tp, "", false}));
  ReloadOptions o;
  o.format = WeightFormat::kKernel;
  o.bucket_bytes = 1900;
  o.pipeline_depth = 1;
  o.atomic = true;
  reload_from(model, "", &v1, ReloadOptions{});
  const auto want1 = testdata::expected_shards(config, v1, tp, world().rank());
  std::size_t at = 0;
  const KernelFormatInfo info{tp, config.dtype, "", config.json, false};
  auto stream = world().rank() == 0 ? make_weight_stream(
                                          [&]() -> std::optional<InMemoryTensor> {
                                            if (at == tensors.size()) return std::nullopt;
                                            return tensors[at++];
                                          },
                                          info)
                                    : nullptr;
  const std::string msg = stream_error(model, stream.get(), o);
  // (a kernel-format tensor fills the whole parameter: no shard is named)
  EXPECT_NE(msg.find(detail::concat(
                "checking the weight stream's next tensors failed on rank ", last, "/", tp,
                ": parameter '", w2, "' of tp rank ", last, " is given twice: as '", w2,
                "' in an earlier segment of the stream and as '", w2_routed, "'")),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("every parameter is as it was before the reload"), std::string::npos) << msg;
  EXPECT_TRUE(mpitest::same_on_every_rank(msg)) << msg;
  expect_params(model, want1, "after the refused stream");
}

// (run under mpirun by ctest)
// Run on its own by ctest: rank 1 never joins; the others must time out.
TEST(UnderMpi, DISABLED_RankOneNeverJoins) {
  TPRELOAD_REQUIRE_RANKS(2);
  if (world().rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return;
  }
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  TensorParallelModel model(config, options_for({world().size(), "", false}));
  const auto ckpt = testdata::random_checkpoint(config, 800);
  auto source = world().rank() == 0 ? testdata::memory_source(ckpt) : nullptr;
  reload_weights(model, world(), source.get(), ReloadOptions{});
}

}  // namespace
}  // namespace tpreload

namespace tpreload {
namespace {

// The experts' spelling in newer vLLM's RoutedExperts layout, written out here:
// "<p>.experts.w13_weight" -> "<p>.experts.routed_experts.w13_weight".
std::string routed_spelling(const std::string& name) {
  const std::string experts = ".experts.";
  const auto at = name.find(experts + "w");
  return at == std::string::npos
             ? name
             : name.substr(0, at) + experts + "routed_experts." + name.substr(at + experts.size());
}

// vLLM's RL call: reload_weights(weights_iterator=..., is_checkpoint_format=False).
// The reader rank holds every rank's tensors in the serving layout (some spelled
// with ".base_layer.", as a LoRA-wrapped trainer names them, and the experts of
// layer 2 as newer vLLM's RoutedExperts nests them), in float32 where the
// model is bfloat16; every rank gets its own, converted, by name.
TPRELOAD_RANKS_TEST(Reload, KernelFormatTensorsFromMemory) {
  for (bool expert_parallel : {false, true}) {
    const ModelConfig config = testdata::tiny_config("qwen3_moe");
    const int tp = world().size();
    const auto ckpt = testdata::random_checkpoint(config, 1400);
    std::vector<InMemoryTensor> tensors;
    std::vector<at::Tensor> keep;
    int routed_tensors = 0;
    if (world().rank() == 0) {
      for (int r = 0; r < tp; ++r) {
        for (const auto& [name, t] :
             testdata::expected_shards(config, ckpt, tp, r, expert_parallel)) {
          keep.push_back(t.to(at::kFloat).contiguous());
          const bool wrapped = name.find("qkv_proj") != std::string::npos;
          const bool routed = name.find("layers.2.mlp.experts.") != std::string::npos;
          EXPECT_TRUE(!routed || routed_spelling(name) != name) << name;
          routed_tensors += routed;
          InMemoryTensor m{wrapped  ? with_base_layer(name)
                           : routed ? routed_spelling(name)
                                    : name,
                           DType::kFloat32, t.sizes().vec(), tensor_bytes(keep.back()), nullptr};
          m.tp_rank = r;
          tensors.push_back(m);
        }
      }
    }
    if (world().rank() == 0) {
      EXPECT_EQ(routed_tensors, 2 * tp) << "w13 and w2 of every tp rank";
    }
    KernelFormatInfo info{tp, config.dtype, "", config.json, expert_parallel};
    auto source = world().rank() == 0 ? make_in_memory_source(std::move(tensors), info) : nullptr;
    TensorParallelModel model(config, options_for({tp, "", false, expert_parallel}));
    ReloadOptions o;
    o.format = WeightFormat::kKernel;
    o.bucket_bytes = 2000;
    const ReloadResult r = reload_weights(model, world(), source.get(), o);
    EXPECT_TRUE(r.complete());
    EXPECT_TRUE(r.skipped.empty());
    // float32 -> bfloat16 by torch, then the rank's independent slices.
    std::map<std::string, at::Tensor> converted;
    for (const auto& [name, t] : ckpt) converted[name] = t.to(at::kFloat).to(at::kBFloat16);
    expect_params(model,
                  testdata::expected_shards(config, converted, tp, world().rank(), expert_parallel),
                  expert_parallel ? "kernel tensors from memory, expert parallel"
                                  : "kernel tensors from memory");
  }
}

// A kernel-format parameter given twice for one tp rank, under its own name and
// under another spelling that resolves to it (RoutedExperts here), is refused in
// preflight on every rank, naming both; the model keeps the last reload's bytes.
TPRELOAD_RANKS_TEST(Reload, AKernelParameterGivenTwiceIsRefusedBeforeAnyWrite) {
  const ModelConfig config = testdata::tiny_config("qwen3_moe");
  const int tp = world().size(), last = tp - 1;
  const std::string w2 = "model.layers.2.mlp.experts.w2_weight";
  const std::string w2_routed = "model.layers.2.mlp.experts.routed_experts.w2_weight";
  // Every tp rank's shards from `ckpt`, bfloat16, held by the reader; with
  // `twice`, the last tp rank's w2 a second time under its RoutedExperts name.
  std::vector<at::Tensor> keep;
  auto source_of = [&](const std::map<std::string, at::Tensor>& ckpt, bool twice) {
    std::vector<InMemoryTensor> tensors;
    if (world().rank() == 0)
      for (int r = 0; r < tp; ++r)
        for (const auto& [name, t] : testdata::expected_shards(config, ckpt, tp, r)) {
          keep.push_back(t.contiguous());
          InMemoryTensor m{name, DType::kBFloat16, t.sizes().vec(), tensor_bytes(keep.back()),
                           nullptr};
          m.tp_rank = r;
          tensors.push_back(m);
          if (twice && r == last && name == w2) {
            m.name = w2_routed;
            tensors.push_back(m);
          }
        }
    KernelFormatInfo info{tp, config.dtype, "", config.json, false};
    return world().rank() == 0 ? make_in_memory_source(std::move(tensors), info) : nullptr;
  };
  const auto v1 = testdata::random_checkpoint(config, 1410),
             v2 = testdata::random_checkpoint(config, 1411);
  TensorParallelModel model(config, options_for({tp, "", false}));
  ReloadOptions o;
  o.format = WeightFormat::kKernel;
  auto first = source_of(v1, false);
  ASSERT_TRUE(reload_weights(model, world(), first.get(), o).complete());
  auto second = source_of(v2, true);
  try {
    reload_weights(model, world(), second.get(), o);
    ADD_FAILURE() << "a parameter given twice passed preflight";
  } catch (const ValidationError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(detail::concat("preflight (nothing was reloaded) failed on rank ", last, "/",
                                      tp, ": parameter '", w2, "' of tp rank ", last,
                                      " is given twice: as '")),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("as '" + w2 + "' (in "), std::string::npos) << msg;
    EXPECT_NE(msg.find("as '" + w2_routed + "'"), std::string::npos) << msg;
  }
  expect_params(model, testdata::expected_shards(config, v1, tp, world().rank()),
                "after a refused reload");
}

// A float32 checkpoint into a bfloat16 model lands with the bytes of
// Tensor.to(bfloat16); an integer tensor is refused in preflight, on every rank.
TPRELOAD_RANKS_TEST(Reload, FloatingCheckpointsAreConvertedAndIntegersRefused) {
  const ModelConfig config = testdata::tiny_config("qwen3_dense");
  std::map<std::string, at::Tensor> f32, want;
  for (const auto& [name, t] : testdata::random_checkpoint(config, 1500)) {
    f32[name] = (t.to(at::kFloat) * 1.3f).contiguous();
    want[name] = f32[name].to(at::kBFloat16);
  }
  for (Distribution dist : {Distribution::kBroadcast, Distribution::kScatter}) {
    TensorParallelModel model(config, options_for({world().size(), "", false}));
    ReloadOptions o;
    o.distribution = dist;
    o.bucket_bytes = 3000;
    EXPECT_TRUE(reload_from(model, "", &f32, o).complete());
    expect_params(model, testdata::expected_shards(config, want, world().size(), world().rank()),
                  std::string("float32 into bfloat16, ") + std::string(distribution_name(dist)));
  }
  auto bad = f32;
  bad["model.layers.1.self_attn.k_norm.weight"] = at::ones({config.head_dim}, at::kInt);
  TensorParallelModel model(config, options_for({world().size(), "", false}));
  try {
    reload_from(model, "", &bad, ReloadOptions{});
    FAIL() << "an int32 tensor was accepted";
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.layers.1.self_attn.k_norm.weight'"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("int32 values are not converted to bfloat16"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tpreload
