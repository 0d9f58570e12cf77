// Integrity across ranks: a bit flipped in transit on one rank is caught there
// before any of its bucket is written, the error is the same on every rank, and
// the parameters hold only old or new bytes (atomic: only old ones). With the
// checksums off, the same flip lands silently, which is what they are for.
// Replicas that end up different, ranks that disagree on options and a file cut
// short during the reload are each the same error on every rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>

#include "../tests/support/faults.h"
#include "../tests/support/tiny_models.h"
#include "mpi_test_main.h"
#include "tpreload/checkpoint/writers.h"
#include "tpreload/core/error.h"
#include "tpreload/model/model.h"
#include "tpreload/model/sharding.h"
#include "tpreload/reload/plan.h"
#include "tpreload/reload/reload.h"

namespace tpreload {
namespace {

TPRELOAD_TINY_MODEL_WORLD_SIZES();

using mpitest::same_on_every_rank;
using mpitest::world;
using testing::FaultyTransport;

struct Versions {
  ModelConfig config = testdata::tiny_config("llama_gqa");
  std::map<std::string, at::Tensor> v1 = testdata::random_checkpoint(config, 801);
  std::map<std::string, at::Tensor> v2 = testdata::random_checkpoint(config, 802);
};

ModelOptions on_this_rank() {
  ModelOptions o;
  o.tp_size = world().size();
  o.tp_rank = world().rank();
  return o;
}

// Parameters with a row (along dim 0: an element of a 1-D tensor) that is
// neither version's. A reload that fails part-way may leave a parameter whose
// first rows are version 2's (applied from earlier buckets) and the rest version
// 1's; a flipped bit makes a row that is neither.
std::vector<std::string> neither(const TensorParallelModel& m, const Versions& v) {
  const int tp = world().size(), r = world().rank();
  const auto a = testdata::expected_shards(v.config, v.v1, tp, r);
  const auto b = testdata::expected_shards(v.config, v.v2, tp, r);
  std::vector<std::string> out;
  for (const auto& [name, t] : a) {
    const at::Tensor got = m.parameter_for_reload(name);
    for (std::int64_t i = 0; i < got.size(0); ++i)
      if (!testdata::same_bytes(got[i], t[i]) && !testdata::same_bytes(got[i], b.at(name)[i])) {
        out.push_back(name);
        break;
      }
  }
  return out;
}

// Parameters that are not `version`'s slices for this rank.
std::vector<std::string> not_version(const TensorParallelModel& m, const ModelConfig& config,
                                     const std::map<std::string, at::Tensor>& version) {
  std::vector<std::string> out;
  for (const auto& [name, t] :
       testdata::expected_shards(config, version, world().size(), world().rank()))
    if (!testdata::same_bytes(m.parameter_for_reload(name), t)) out.push_back(name);
  return out;
}

std::vector<std::string> not_v1(const TensorParallelModel& m, const Versions& v) {
  return not_version(m, v.config, v.v1);
}

// The rank whose bytes are flipped: not the reader (rank 0), and one that holds
// rows of every sliced tensor (the last rank's share of a padded vocabulary can
// be empty in a bucket, and a transfer of nothing has no bit to flip).
constexpr int kVictim = 1;

// Reload `to` over `from` with bit `bit` of transfer `nth` flipped on rank
// kVictim.
std::string reload_with_a_flip(TensorParallelModel& model,
                               const std::map<std::string, at::Tensor>& from,
                               const std::map<std::string, at::Tensor>& to, ReloadOptions o,
                               int nth, std::uint64_t bit = 12345) {
  auto source = testdata::memory_source(from);
  reload_weights(model, world(), world().rank() == 0 ? source.get() : nullptr, ReloadOptions{});
  auto inner = make_communicator_transport(world());
  std::unique_ptr<DataTransport> data = std::move(inner);
  if (world().rank() == kVictim)
    data = std::make_unique<FaultyTransport>(std::move(data), nth, FaultyTransport::Fault::kFlipBit,
                                             std::chrono::seconds(5), bit);
  source = testdata::memory_source(to);
  try {
    reload_weights(model, world(), *data, world().rank() == 0 ? source.get() : nullptr, o);
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

// Scatter: the flip in bucket 2 lands in what the victim receives, all of which
// it applies. Broadcast: the victim verifies only the bytes its writes read, so
// a flip in a bucket it takes nothing from changes nothing; the flips go into
// bucket after bucket until one is caught, and each one before must have left
// every parameter exactly version 2.
TEST(Integrity, AFlippedBitIsCaughtWhereItLandedAndNeverWritten) {
  TPRELOAD_REQUIRE_RANKS(2);
  const Versions v;
  for (Distribution d : {Distribution::kScatter, Distribution::kBroadcast}) {
    for (bool atomic : {false, true}) {
      TensorParallelModel model(v.config, on_this_rank());
      ReloadOptions o;
      o.distribution = d;
      o.bucket_bytes = 3000;
      o.atomic = atomic;
      const std::string where = std::string(distribution_name(d)) + (atomic ? ", atomic" : "");
      int nth = 2;
      std::string error = reload_with_a_flip(model, v.v1, v.v2, o, nth);
      for (; error.empty() && d == Distribution::kBroadcast && nth < 12;
           error = reload_with_a_flip(model, v.v1, v.v2, o, ++nth)) {
        const auto wrong = not_version(model, v.config, v.v2);
        EXPECT_TRUE(wrong.empty()) << where << ": a flip in bucket " << nth
                                   << " went unnoticed and landed in " << wrong.front();
      }
      ASSERT_FALSE(error.empty()) << where << ": the flipped bit went unnoticed";
      EXPECT_TRUE(same_on_every_rank(error)) << where << ": " << error;
      EXPECT_NE(error.find("verifying the transferred bytes failed on rank " +
                           std::to_string(kVictim) + "/" + std::to_string(world().size()) +
                           ": bucket " + std::to_string(nth) + " of "),
                std::string::npos)
          << error;
      EXPECT_NE(error.find("arrived corrupted on rank " + std::to_string(kVictim)),
                std::string::npos)
          << error;
      EXPECT_NE(error.find("; none of it was applied"), std::string::npos) << error;
      EXPECT_TRUE(neither(model, v).empty())
          << where << ": a corrupted parameter was written: " << neither(model, v).front();
      if (atomic) {
        EXPECT_TRUE(not_v1(model, v).empty()) << where << ": " << not_v1(model, v).front();
      }
      world().barrier();
    }
  }
}

// Broadcast buckets of many tensors: flips spread over a bucket every 64 KiB
// are caught where the victim reads the bytes and change nothing elsewhere.
// Both must happen (a rank reads its own rows of the column-parallel tensors,
// not the others').
TEST(Integrity, ABroadcastReceiverVerifiesTheBytesItReadsAndNoOthers) {
  TPRELOAD_REQUIRE_RANKS(2);
  const ModelConfig config = testdata::tiny_config("llama_wide");
  const Versions v{config, testdata::random_checkpoint(config, 811),
                   testdata::random_checkpoint(config, 812)};
  ReloadOptions o;
  o.distribution = Distribution::kBroadcast;
  o.bucket_bytes = 1 << 20;
  int caught = 0, harmless = 0;
  for (int nth : {2, 3}) {
    for (std::uint64_t j = 0; j < 16; ++j) {
      TensorParallelModel model(config, on_this_rank());
      const std::uint64_t bit = j * (std::uint64_t{64} << 13) + 8 * 777 + 3;  // every 64 KiB
      const std::string error = reload_with_a_flip(model, v.v1, v.v2, o, nth, bit);
      const std::string where = "transfer " + std::to_string(nth) + ", bit " + std::to_string(bit);
      ASSERT_TRUE(same_on_every_rank(error)) << where << ": " << error;
      if (error.empty()) {
        ++harmless;
        const auto wrong = not_version(model, config, v.v2);
        EXPECT_TRUE(wrong.empty()) << where << ": unnoticed, and landed in " << wrong.front();
        continue;
      }
      ++caught;
      EXPECT_NE(error.find("arrived corrupted on rank " + std::to_string(kVictim) + "/" +
                           std::to_string(world().size()) + " in the "),
                std::string::npos)
          << where << ": " << error;
      EXPECT_TRUE(neither(model, v).empty())
          << where << ": a corrupted parameter was written: " << neither(model, v).front();
    }
  }
  EXPECT_GT(caught, 0) << "no flip landed in bytes the victim reads: the test proves nothing";
  EXPECT_GT(harmless, 0) << "every flip was caught: the victim verifies bytes it does not read";
}

// A broadcast receiver checks exactly the bytes it reads of a row-parallel
// tensor: its own column window of each row. A flip there is caught, naming
// its bytes; a flip in another rank's window of the same row (which that rank,
// receiving clean bytes, applies) changes nothing on the victim. Where each
// window lies is worked out here: tp rank r takes columns [r c / tp, (r + 1) c
// / tp) of every row of c columns; the plan only says where the tensor's rows
// start in their bucket.
TEST(Integrity, ABroadcastReceiverChecksItsOwnWindowOfEachRowAndNoOther) {
  TPRELOAD_REQUIRE_RANKS(2);
  const ModelConfig config = testdata::tiny_config("llama_wide");
  const Versions v{config, testdata::random_checkpoint(config, 821),
                   testdata::random_checkpoint(config, 822)};
  const int tp = world().size();
  ReloadOptions o;
  o.distribution = Distribution::kBroadcast;
  o.bucket_bytes = 1 << 20;
  auto source = testdata::memory_source(v.v2);
  const SourceMetadata md{source->describe(), source->tensors(), source->kernel_format()};
  const Plan plan =
      make_plan(md, ShardingRules(config, tp),
                {WeightFormat::kCheckpoint, Distribution::kBroadcast, o.bucket_bytes, tp, tp});
  for (const std::string name :
       {"model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight"}) {
    const at::Tensor& t = v.v2.at(name);
    const std::uint64_t row_bytes = t.size(1) * t.element_size(), window = row_bytes / tp;
    // The bucket and bucket byte where the tensor's second row in it starts.
    std::size_t bucket = 0;
    std::uint64_t row_at = 0;
    bool found = false;
    for (std::size_t k = 0; k < plan.buckets.size() && !found; ++k)
      for (const Piece& p : plan.buckets[k].pieces)
        if (md.tensors[plan.tensors[p.planned].index].name == name && p.row_end - p.row_begin > 1) {
          bucket = k;
          row_at = p.offset + row_bytes;
          found = true;
          break;
        }
    ASSERT_TRUE(found) << name << " is in no broadcast bucket with two of its rows";
    for (int r = 0; r < tp; ++r) {
      TensorParallelModel model(config, on_this_rank());
      const std::uint64_t byte = row_at + static_cast<std::uint64_t>(r) * window + window / 2;
      const std::string where =
          name + ", a flip in tp rank " + std::to_string(r) + "'s window of a row";
      const std::string error =
          reload_with_a_flip(model, v.v1, v.v2, o, static_cast<int>(bucket) + 1, byte * 8 + 3);
      ASSERT_TRUE(same_on_every_rank(error)) << where << ": " << error;
      if (r == kVictim) {
        EXPECT_NE(error.find("bucket " + std::to_string(bucket + 1) + " of "), std::string::npos)
            << where << ": " << error;
        EXPECT_NE(error.find("arrived corrupted on rank " + std::to_string(kVictim) + "/" +
                             std::to_string(tp) + " in the "),
                  std::string::npos)
            << where << ": " << error;
        EXPECT_NE(error.find(" bytes that tensor-parallel rank " + std::to_string(kVictim) +
                             " reads: CRC-32C "),
                  std::string::npos)
            << where << ": " << error;
        EXPECT_TRUE(neither(model, v).empty())
            << where << ": a corrupted parameter was written: " << neither(model, v).front();
      } else {
        EXPECT_EQ(error, "") << where << ": the victim checked bytes it does not read";
        const auto wrong = not_version(model, config, v.v2);
        EXPECT_TRUE(wrong.empty()) << where << ": " << wrong.front() << " is not version 2's";
      }
      world().barrier();
    }
  }
}

TEST(Integrity, WithoutChecksumsTheSameFlipLandsSilently) {
  TPRELOAD_REQUIRE_RANKS(2);
  const Versions v;
  TensorParallelModel model(v.config, on_this_rank());
  ReloadOptions o;
  o.bucket_bytes = 3000;
  o.checksums = false;
  const std::string error = reload_with_a_flip(model, v.v1, v.v2, o, 2);
  EXPECT_EQ(error, "");
  std::int64_t corrupted = neither(model, v).size();
  world().allreduce_ints(&corrupted, 1, IntOp::kSum);
  EXPECT_EQ(corrupted, 1) << "one parameter on rank " << kVictim << " holds the flipped bit";
}

// Two replicas of a tp group of half the world; a bit flipped on the last rank
// with checksums off lands in one parameter of replica 1 only.
TEST(Integrity, ReplicasThatDifferAfterAReloadFailItOnEveryRank) {
  TPRELOAD_REQUIRE_RANKS(2);
  ASSERT_EQ(world().size() % 2, 0);
  const Versions v;
  const int n = world().size(), tp = n / 2, last = n - 1;
  for (bool compare : {true, false}) {
    ModelOptions mo;
    mo.tp_size = tp;
    mo.tp_rank = world().rank() % tp;
    TensorParallelModel model(v.config, mo);
    auto source = testdata::memory_source(v.v2);
    std::unique_ptr<DataTransport> data = make_communicator_transport(world());
    if (world().rank() == last)
      data =
          std::make_unique<FaultyTransport>(std::move(data), 2, FaultyTransport::Fault::kFlipBit);
    ReloadOptions o;
    o.bucket_bytes = 3000;
    o.checksums = false;
    o.compare_replicas = compare;
    std::string error;
    try {
      reload_weights(model, world(), *data, world().rank() == 0 ? source.get() : nullptr, o);
    } catch (const ValidationError& e) {
      error = e.what();
    }
    // The parameter the flip landed in, found by the test's own slicing.
    std::string flipped;
    if (world().rank() == last)
      for (const auto& [name, t] : testdata::expected_shards(v.config, v.v2, tp, tp - 1))
        if (!testdata::same_bytes(model.parameter_for_reload(name), t)) flipped = name;
    std::int64_t length = flipped.size();
    world().broadcast(MutableBytes(&length, sizeof length), last);
    flipped.resize(length);
    world().broadcast(MutableBytes(flipped.data(), flipped.size()), last);
    ASSERT_FALSE(flipped.empty()) << "the flip did not land: the test proves nothing";
    if (!compare) {
      EXPECT_EQ(error, "") << "compare_replicas off";
      continue;
    }
    EXPECT_TRUE(same_on_every_rank(error)) << error;
    // Named: the parameter, its tp rank, and the two groups of world ranks by value.
    EXPECT_EQ(error.find("replicas differ after the reload: 1 parameter(s) hold different bytes on "
                         "replicas of the same tp rank: '" +
                         flipped + "' (tp rank " + std::to_string(tp - 1) + ": CRC-32C "),
              0u)
        << error;
    for (int w : {tp - 1, last})  // the two replicas of that tp rank, each with its own value
      EXPECT_NE(error.find(" on world ranks " + std::to_string(w)), std::string::npos) << error;
    EXPECT_NE(error.find(" may hold a mix of old and new weights"), std::string::npos)
        << "the parameters written are named: " << error;
    world().barrier();
  }
}

// Ranks whose options or configs differ are told which before any transfer.
// Every field of the config that shapes the weights is compared on its own,
// and the error names those that differ, with which ranks hold which value:
// one that changes no parameter's shape (the family), and one that does (whose
// layout then differs too, and is shown by its first parameter that differs).
// A field only a forward pass reads is not compared (Reliability/Matrix).
TEST(Integrity, RanksThatDisagreeOnOptionsOrConfigsAreToldWhichBeforeAnyTransfer) {
  TPRELOAD_REQUIRE_RANKS(2);
  const Versions v;
  struct Case {
    std::function<void(ReloadOptions&)> options_on_last_rank;
    std::function<void(ModelConfig&)> config_on_last_rank;
    std::string error;
  };
  const auto same_options = [](ReloadOptions&) {};
  const auto same_config = [](ModelConfig&) {};
  // Which ranks hold which value: the last rank's own, and every other rank's
  // (llama_gqa's intermediate_size is 96).
  const int n = world().size();
  const std::string first = n == 2 ? "rank 0" : "ranks 0-" + std::to_string(n - 2);
  const std::string last = "rank " + std::to_string(n - 1);
  // The first parameter a larger intermediate_size changes: layer 0's
  // down_proj, first by name of the MLP's weights ([hidden, intermediate / tp],
  // split by its columns as vLLM's RowParallelLinear), counted among the
  // model's parameters sorted by name.
  std::vector<std::string> names;
  const TensorParallelModel unchanged(v.config, on_this_rank());
  for (const auto& [name, t] : unchanged.named_parameters()) names.push_back(name);
  std::sort(names.begin(), names.end());
  const auto first_down_proj =
      std::find(names.begin(), names.end(), "model.layers.0.mlp.down_proj.weight") - names.begin();
  ASSERT_LT(first_down_proj, static_cast<std::ptrdiff_t>(names.size()));
  const auto down_proj = [&](std::int64_t intermediate) {
    return "'model.layers.0.mlp.down_proj.weight [64, " + std::to_string(intermediate / n) +
           "] bfloat16, row-parallel, layer 0, 1 shard'";
  };
  const std::vector<Case> cases = {
      {[](ReloadOptions& o) {
         o.bucket_bytes = 4096;
         o.checksums = false;
       },
       same_config,
       "ranks disagree on the bucket size, checksums (every rank must pass the same); "
       "nothing was reloaded; by rank: the bucket size: 8388608 on " +
           first + ", 4096 on " + last + "; checksums: true on " + first + ", false on " + last},
      // Explicit depths may differ; a depth chosen on some ranks only may not (the
      // choice is collective).
      {[](ReloadOptions& o) { o.pipeline_depth = 2; }, same_config,
       "ranks disagree on whether the pipeline depth is chosen per rank (every rank must pass "
       "the same); nothing was reloaded; by rank: whether the pipeline depth is chosen per rank: "
       "true on " +
           first + ", false on " + last},
      {same_options,
       [](ModelConfig& c) {
         c.architecture = "MistralForCausalLM";  // (Mistral's layout: Llama's)
         c.rms_norm_eps *= 2;                    // (not compared)
       },
       "ranks disagree on the model config's architectures (every rank must pass the same); "
       "nothing was reloaded; by rank: the model config's architectures: 'LlamaForCausalLM' "
       "on " +
           first + ", 'MistralForCausalLM' on " + last},
      {same_options,
       [](ModelConfig& c) {
         c.intermediate_size *= 2;
         c.final_logit_softcapping = 30;
       },
       "ranks disagree on the model config's intermediate_size, the model's parameters "
       "(names, shapes, dtypes, splits, layers, shards) (every rank must pass the same); "
       "nothing was reloaded; by rank: the model config's intermediate_size: 96 on " +
           first + ", 192 on " + last +
           "; the model's parameters (names, shapes, dtypes, splits, layers, shards): one value "
           "on " +
           first + ", another on " + last +
           " (the first that differs, counting from 0: parameter " +
           std::to_string(first_down_proj) + ": " + down_proj(96) + " on " + first + ", " +
           down_proj(192) + " on " + last + ")"},
  };
  for (const Case& c : cases) {
    ModelConfig config = v.config;
    ReloadOptions o;
    if (world().rank() == world().size() - 1) {
      c.options_on_last_rank(o);
      c.config_on_last_rank(config);
    }
    TensorParallelModel model(config, on_this_rank());
    auto source = testdata::memory_source(v.v1);
    std::map<std::string, at::Tensor> before;
    for (const auto& [name, t] : model.named_parameters()) before[name] = t.clone();
    std::string error;
    try {
      reload_weights(model, world(), world().rank() == 0 ? source.get() : nullptr, o);
    } catch (const UsageError& e) {
      error = e.what();
    }
    EXPECT_EQ(error, c.error);
    for (const auto& [name, t] : model.named_parameters())
      EXPECT_TRUE(testdata::same_bytes(t, before.at(name))) << name << " was written";
  }
}

// The checkpoint is cut short after the reader opened it: reads through the
// mapping (zero-copy, with or without checksums) and plain reads both become the
// same CheckpointError on every rank naming the file; no process dies.
TEST(Integrity, AFileCutShortDuringTheReloadIsTheSameErrorOnEveryRank) {
  TPRELOAD_REQUIRE_RANKS(2);
  const Versions v;
  mpitest::SharedDir dir;
  const std::string path = dir.path() + "/model.safetensors";
  struct Mode {
    bool zero_copy, checksums;
  };
  for (const Mode m : {Mode{true, true}, Mode{true, false}, Mode{false, true}}) {
    if (world().rank() == 0) write_safetensors(path, testdata::in_memory(v.v2));
    world().barrier();
    TensorParallelModel model(v.config, on_this_rank());
    std::unique_ptr<WeightSource> source;
    if (world().rank() == 0) {
      source = open_weight_source(path);
      std::uint64_t cut = 0;  // in the middle of the last tensor in the file
      for (const TensorInfo& t : source->tensors())
        cut = std::max(cut, t.file_offset + t.nbytes / 2);
      ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(cut)), 0);
    }
    ReloadOptions o;
    o.distribution = Distribution::kBroadcast;  // whole tensors: runs of the file
    o.zero_copy = m.zero_copy;
    o.checksums = m.checksums;
    std::string error;
    try {
      reload_weights(model, world(), source.get(), o);
    } catch (const CheckpointError& e) {
      error = e.what();
    }
    const std::string what = std::string("zero_copy=") + (m.zero_copy ? "1" : "0") +
                             " checksums=" + (m.checksums ? "1" : "0");
    EXPECT_TRUE(same_on_every_rank(error)) << what << ": " << error;
    EXPECT_NE(error.find("'" + path + "'"), std::string::npos) << what << ": " << error;
    world().barrier();
  }
}

}  // namespace
}  // namespace tpreload
