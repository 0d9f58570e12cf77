// All-or-nothing reloads and what a failed reload says, in one process: a
// transport that fails part-way, a device without room for the second copy, a
// source that lacks a parameter. The model's bytes before and after are compared
// with the independent slicing of tests/support.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <set>

#include "../support/emulated_device.h"
#include "../support/faults.h"
#include "../support/tiny_models.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/agreement.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/plan.h"
#include "tpreload/reload/reload.h"

namespace tpreload {
namespace {

using namespace std::chrono_literals;
using testing::EmulatedDevice;
using testing::FaultyTransport;

struct Fixture {
  ModelConfig config = testdata::tiny_config("llama_gqa");
  std::map<std::string, at::Tensor> v1 = testdata::random_checkpoint(config, 61);
  std::map<std::string, at::Tensor> v2 = testdata::random_checkpoint(config, 62);
  std::unique_ptr<Communicator> control = make_local_communicator();
};

ModelOptions on(std::shared_ptr<Device> device) {
  ModelOptions o;
  o.device = std::move(device);
  return o;
}

// The names whose bytes equal `ckpt`'s shards, and those that do not.
std::pair<std::set<std::string>, std::set<std::string>> compare(
    const TensorParallelModel& m, const ModelConfig& c,
    const std::map<std::string, at::Tensor>& ckpt) {
  std::set<std::string> same, differ;
  for (const auto& [name, t] : testdata::expected_shards(c, ckpt, 1, 0))
    (testdata::same_bytes(m.parameter_for_reload(name), t) ? same : differ).insert(name);
  return {same, differ};
}

void load(TensorParallelModel& m, Communicator& control,
          const std::map<std::string, at::Tensor>& ckpt) {
  auto source = testdata::memory_source(ckpt);
  ASSERT_TRUE(reload_weights(m, control, source.get(), ReloadOptions{}).complete());
}

// A ReloadableModel whose invalidation callback records what it was handed.
struct Served {
  Served(ReloadTarget& target, DataTransport* data) : model(target, {}, data) {
    model.on_reloaded([this](const ReloadResult& r) { seen.push_back(r); });
  }
  ReloadableModel model;
  std::vector<ReloadResult> seen;
};

TEST(Atomic, AFailureMidwayLeavesEveryParameterAsItWas) {
  Fixture f;
  for (bool device : {false, true}) {
    auto dev = std::make_shared<EmulatedDevice>();
    TensorParallelModel model(f.config, on(device ? dev : nullptr));
    load(model, *f.control, f.v1);
    for (int nth : {1, 3, 6}) {
      auto inner = make_communicator_transport(*f.control);
      if (device) inner = testing::make_emulated_device_transport(std::move(inner), *dev);
      FaultyTransport data(std::move(inner), nth, FaultyTransport::Fault::kFail);
      ReloadOptions o;
      o.atomic = true;
      o.bucket_bytes = 600;
      o.pipeline_depth = 2;
      auto source = testdata::memory_source(f.v2);
      try {
        reload_weights(model, *f.control, data, source.get(), o);
        FAIL() << "the injected failure went unnoticed";
      } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find(
                      "injected fault; atomic reload: every parameter is as it was"),
                  std::string::npos)
            << e.what();
      }
      const auto [same, differ] = compare(model, f.config, f.v1);
      EXPECT_TRUE(differ.empty()) << (device ? "device" : "host") << ", failure at transfer " << nth
                                  << ": " << differ.size() << " parameters changed, e.g. "
                                  << (differ.empty() ? "" : *differ.begin());
      EXPECT_FALSE(model.sink().shadowed()) << "the second copy outlived the failed reload";
    }
  }
}

TEST(Atomic, ASuccessfulReloadEqualsTheDefaultOneAndFreesTheCopy) {
  Fixture f;
  for (bool device : {false, true}) {
    auto dev = std::make_shared<EmulatedDevice>();
    TensorParallelModel model(f.config, on(device ? dev : nullptr));
    load(model, *f.control, f.v1);
    const std::uint64_t before = dev->live_bytes(MemoryKind::kDevice);
    auto inner = make_communicator_transport(*f.control);
    if (device) inner = testing::make_emulated_device_transport(std::move(inner), *dev);
    ReloadOptions o;
    o.atomic = true;
    o.bucket_bytes = 700;
    dev->reset_peaks();
    auto source = testdata::memory_source(f.v2);
    const ReloadResult r = reload_weights(model, *f.control, *inner, source.get(), o);
    EXPECT_TRUE(r.complete());
    EXPECT_TRUE(r.atomic);
    const auto [same, differ] = compare(model, f.config, f.v2);
    EXPECT_TRUE(differ.empty()) << differ.size() << " parameters differ from version 2";
    if (device) {
      EXPECT_EQ(dev->live_bytes(MemoryKind::kDevice), before) << "the second copy was not freed";
      // The second copy lived in device memory: the peak holds it besides the staging.
      std::uint64_t params = 0;
      for (const auto& [name, t] : model.named_parameters()) params += t.numel() * t.element_size();
      EXPECT_GE(dev->peak_bytes(MemoryKind::kDevice), before + params);
    }
  }
}

TEST(Atomic, ADeviceWithoutRoomForTheCopyIsRefusedBeforeAnyTransfer) {
  Fixture f;
  auto dev = std::make_shared<EmulatedDevice>();
  TensorParallelModel model(f.config, on(dev));
  load(model, *f.control, f.v1);
  dev->set_memory_limit(dev->live_bytes(MemoryKind::kDevice) + 1000);
  FaultyTransport data(
      testing::make_emulated_device_transport(make_communicator_transport(*f.control), *dev), 1000,
      FaultyTransport::Fault::kFail);
  ReloadOptions o;
  o.atomic = true;
  auto source = testdata::memory_source(f.v2);
  try {
    reload_weights(model, *f.control, data, source.get(), o);
    FAIL() << "an atomic reload without room for its copy went ahead";
  } catch (const UsageError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("preparing the atomic reload (nothing was reloaded) failed on rank 0/1: "
                        "--atomic needs a second copy of this rank's parameters (" +
                        std::to_string(model.sink().total_bytes()) + " bytes of emulated device)"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("out of memory on the emulated device"), std::string::npos) << text;
  }
  EXPECT_EQ(data.transfers(), 0);
  EXPECT_TRUE(compare(model, f.config, f.v1).second.empty());
}

TEST(Atomic, WithoutItAFailureNamesWhatMayBeMixedAndNothingElseChanged) {
  Fixture f;
  TensorParallelModel model(f.config, on(nullptr));
  load(model, *f.control, f.v1);
  FaultyTransport data(make_communicator_transport(*f.control), 4, FaultyTransport::Fault::kFail);
  ReloadOptions o;
  o.bucket_bytes = 600;
  auto source = testdata::memory_source(f.v2);
  std::string text;
  try {
    reload_weights(model, *f.control, data, source.get(), o);
    FAIL() << "the injected failure went unnoticed";
  } catch (const CommError& e) {
    text = e.what();
  }
  const auto [same, differ] = compare(model, f.config, f.v1);
  ASSERT_FALSE(differ.empty()) << "three buckets were applied before the failure";
  // Every parameter that changed is named (the list is cut after 8 names).
  const std::string count = std::to_string(model.sink().touched_names().size());
  EXPECT_NE(text.find("; " + count + " of "), std::string::npos) << text;
  EXPECT_GE(model.sink().touched_names().size(), differ.size());
  for (const auto& name : differ) {
    const auto& touched = model.sink().touched_names();
    EXPECT_TRUE(std::find(touched.begin(), touched.end(), name) != touched.end())
        << name << " changed but is not among the parameters said to be mixed";
  }
}

// The reader reads its own rows of a scatter bucket straight into its
// parameters: a read that fails part-way through a bucket has changed some of
// them though the bucket is never applied. Every parameter that changed must
// be named, for a failure at each of several points of the read.
TEST(Atomic, WithoutItAFailedReadNamesTheRowsReadIntoPlaceBeforeIt) {
  Fixture f;
  std::uint64_t total = 0;
  for (const auto& [name, t] : f.v2) total += static_cast<std::uint64_t>(t.nbytes());
  for (bool atomic : {false, true}) {
    int said_so = 0;
    for (int eighth = 1; eighth < 8; ++eighth) {
      const std::string what =
          (atomic ? "atomic, " : "") + std::string("failure at ") + std::to_string(eighth) + "/8";
      TensorParallelModel model(f.config, on(nullptr));
      load(model, *f.control, f.v1);
      ReloadOptions o;
      o.bucket_bytes = 4096;
      o.distribution = Distribution::kScatter;
      o.atomic = atomic;
      testing::FaultySource source(testdata::memory_source(f.v2), total * eighth / 8,
                                   testing::FaultySource::Fault::kFail);
      std::string text;
      try {
        reload_weights(model, *f.control, &source, o);
        FAIL() << what << ": the injected read failure went unnoticed";
      } catch (const CheckpointError& e) {
        text = e.what();
      }
      const auto& touched = model.sink().touched_names();
      const auto [same, differ] = compare(model, f.config, f.v1);
      said_so += text.find(
                     "; rank 0's own rows of this bucket may have changed too (it reads them "
                     "straight into its parameters)") != std::string::npos;
      if (atomic) {  // the rows went to the second copy
        EXPECT_TRUE(differ.empty()) << what << ": " << *differ.begin() << " changed";
        continue;
      }
      for (const auto& name : differ)
        EXPECT_TRUE(std::find(touched.begin(), touched.end(), name) != touched.end())
            << what << ": " << name << " changed but is not named: " << text;
      EXPECT_FALSE(differ.empty()) << what << " changed nothing";
    }
    if (atomic)
      EXPECT_EQ(said_so, 0) << "an atomic reload said that parameters may have changed";
    else
      EXPECT_GT(said_so, 0) << "no failing bucket said that the reader's rows of it changed";
  }
}

// A model whose post-load processing of one layer fails: the apply stops there.
class FailsAfterLayer final : public ReloadTarget {
 public:
  FailsAfterLayer(TensorParallelModel& model, std::int64_t layer) : model_(model), layer_(layer) {}
  const ShardingRules& rules() const override { return model_.rules(); }
  int tp_rank() const override { return model_.tp_rank(); }
  ParameterSink& sink() override { return model_.sink(); }
  void finish_layer(std::int64_t layer) override {
    if (layer == layer_) raise<ModelError>("injected failure processing layer ", layer);
    model_.finish_layer(layer);
  }
  void finish() override { model_.finish(); }

 private:
  TensorParallelModel& model_;
  std::int64_t layer_;
};

// Once the apply stopped, the reader reads nothing more into its parameters:
// with one buffer slot, a parameter whose writes all lie in buckets after the
// one whose processing failed keeps its old bytes, and every parameter that
// changed is named. (Which bucket holds which write comes from the plan the
// reload makes for the same options.)
TEST(Atomic, WithoutItNothingIsReadIntoPlaceOnceTheApplyStopped) {
  Fixture f;
  TensorParallelModel model(f.config, on(nullptr));
  load(model, *f.control, f.v1);
  FailsAfterLayer failing(model, 0);
  ReloadOptions o;
  o.bucket_bytes = 4096;
  o.distribution = Distribution::kScatter;
  o.pipeline_depth = 1;
  auto source = testdata::memory_source(f.v2);
  // The bucket after which layer 0 is processed, and the parameters written up to it.
  const SourceMetadata md{source->describe(), source->tensors(), source->kernel_format()};
  const PlanOptions po{WeightFormat::kCheckpoint, Distribution::kScatter, o.bucket_bytes, 1, 1,
                       o.scatter_replicated_bytes};
  const Plan plan = make_plan(md, model.rules(), po);
  const auto applies = resolve_applies(plan, md, model.rules(), po, 0);
  std::set<std::string> written;  // by the buckets up to the failing one
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    for (const RowWrite& w : applies[b].writes) written.insert(model.rules().params()[w.slot].name);
    const auto& done = plan.buckets[b].finished_layers;
    if (std::find(done.begin(), done.end(), 0) != done.end()) break;
  }
  std::string text;
  try {
    reload_weights(failing, *f.control, source.get(), o);
    FAIL() << "the injected failure went unnoticed";
  } catch (const ModelError& e) {
    text = e.what();
  }
  EXPECT_NE(text.find("injected failure processing layer 0"), std::string::npos) << text;
  const auto& touched = model.sink().touched_names();
  const auto [same, differ] = compare(model, f.config, f.v1);
  EXPECT_FALSE(differ.empty()) << "layer 0 was written before it failed";
  for (const auto& name : differ) {
    EXPECT_EQ(written.count(name), 1u) << name << " changed after the apply stopped: " << text;
    EXPECT_TRUE(std::find(touched.begin(), touched.end(), name) != touched.end())
        << name << " changed but is not named";
  }
  std::size_t later = 0;  // parameters written only after the failing bucket
  for (const auto& name : same) later += written.count(name) == 0;
  EXPECT_GT(later, 0u) << "the check saw no parameter written only after the failure";
}

// Records, for each layer it is asked to process, whether every parameter of
// that layer already held the new version's bytes; finish() can be made to fail.
class RecordsLayers final : public ReloadTarget {
 public:
  RecordsLayers(TensorParallelModel& model, std::map<std::string, at::Tensor> want)
      : model_(model), want_(std::move(want)) {}
  const ShardingRules& rules() const override { return model_.rules(); }
  int tp_rank() const override { return model_.tp_rank(); }
  ParameterSink& sink() override { return model_.sink(); }
  void finish_layer(std::int64_t layer) override {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    bool fresh = true;
    for (const auto& [name, t] : want_)
      if (name.rfind(prefix, 0) == 0)
        fresh = fresh && testdata::same_bytes(model_.parameter_for_reload(name), t);
    layers.push_back(layer);
    fresh_when_processed.push_back(fresh);
  }
  void finish() override {
    if (fail_finish) raise<ModelError>("injected failure in finish");
  }

  std::vector<std::int64_t> layers;
  std::vector<bool> fresh_when_processed;
  bool fail_finish = false;

 private:
  TensorParallelModel& model_;
  std::map<std::string, at::Tensor> want_;
};

// Per-layer processing reads the model's own storage, which in an atomic
// reload holds the old weights until the commit: each layer is processed once,
// in order, and sees its new weights, in either mode.
TEST(Atomic, EachLayerIsProcessedOnceWithItsNewWeights) {
  Fixture f;
  for (bool atomic : {false, true}) {
    TensorParallelModel model(f.config, on(nullptr));
    load(model, *f.control, f.v1);
    RecordsLayers target(model, testdata::expected_shards(f.config, f.v2, 1, 0));
    ReloadOptions o;
    o.atomic = atomic;
    o.bucket_bytes = 600;
    auto source = testdata::memory_source(f.v2);
    ASSERT_TRUE(reload_weights(target, *f.control, source.get(), o).complete());
    std::vector<std::int64_t> every_layer(static_cast<std::size_t>(f.config.num_hidden_layers));
    for (std::size_t l = 0; l < every_layer.size(); ++l)
      every_layer[l] = static_cast<std::int64_t>(l);
    EXPECT_EQ(target.layers, every_layer) << (atomic ? "atomic" : "default");
    for (std::size_t i = 0; i < target.layers.size(); ++i)
      EXPECT_TRUE(target.fresh_when_processed[i])
          << (atomic ? "atomic" : "default") << ": layer " << target.layers[i]
          << " was processed while it held old weights";
  }
}

// After the vote the new weights are committed: a failure from there on says
// so, and the callbacks run (caches built from the old weights must go).
TEST(Atomic, AFailureAfterTheCommitSaysTheNewWeightsAreInPlace) {
  Fixture f;
  TensorParallelModel model(f.config, on(nullptr));
  load(model, *f.control, f.v1);
  RecordsLayers target(model, {});
  target.fail_finish = true;
  auto data = make_communicator_transport(*f.control);
  Served served(target, data.get());
  ReloadOptions o;
  o.atomic = true;
  auto source = testdata::memory_source(f.v2);
  try {
    served.model.reload_from(*f.control, o, source.get());
    FAIL() << "the failure in finish() went unnoticed";
  } catch (const ModelError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("post-load processing (finish) failed on rank 0/1: injected failure in "
                        "finish; atomic reload: every rank had committed the new weights"),
              std::string::npos)
        << text;
  }
  EXPECT_TRUE(compare(model, f.config, f.v2).second.empty()) << "the commit was not whole";
  ASSERT_EQ(served.seen.size(), 1u) << "the callbacks did not run though every weight changed";
  EXPECT_EQ(served.seen[0].possibly_mixed.size(), model.named_parameters().size());
}

// A device that does not finish the commit's copies in time: the error is
// agreed (no rank waits for the stuck one in the next collective) and names
// what may be mixed; the callbacks run.
TEST(Atomic, ADeviceStuckInTheCommitIsAnAgreedErrorAndRunsTheCallbacks) {
  Fixture f;
  auto dev = std::make_shared<EmulatedDevice>();
  TensorParallelModel model(f.config, on(dev));
  load(model, *f.control, f.v1);
  auto data =
      testing::make_emulated_device_transport(make_communicator_transport(*f.control), *dev);
  Served served(model, data.get());
  // Only the commit writes into the model's own storage in an atomic reload.
  const at::Tensor norm = model.parameter_for_reload("model.norm.weight");
  dev->stall_on_write_to(norm.data_ptr(), static_cast<std::uint64_t>(norm.nbytes()));
  ReloadOptions o;
  o.atomic = true;
  o.device_timeout = 300ms;
  auto source = testdata::memory_source(f.v2);
  try {
    served.model.reload_from(*f.control, o, source.get());
    FAIL() << "a commit that never finished went unnoticed";
  } catch (const CommError& e) {
    const std::string text = e.what();
    EXPECT_TRUE(dynamic_cast<const AgreedError*>(&e)) << text;
    EXPECT_NE(text.find("committing the atomic reload failed on rank 0/1: "), std::string::npos)
        << text;
    EXPECT_NE(text.find("emulated device"), std::string::npos) << text;
    EXPECT_NE(text.find("; atomic reload: every rank had voted to commit, so the ranks whose "
                        "copies did not finish may hold a mix of old and new weights"),
              std::string::npos)
        << text;
  }
  EXPECT_TRUE(dev->stalled());
  EXPECT_EQ(dev->frees_while_stalled(), 0u) << "a free that would wait for the stuck device";
  ASSERT_EQ(served.seen.size(), 1u) << "the callbacks did not run though weights may have changed";
  EXPECT_EQ(served.seen[0].possibly_mixed.size(), model.named_parameters().size());
}

TEST(RequireComplete, AMissingTensorIsRefusedBeforeAnyWriteNamingIt) {
  Fixture f;
  TensorParallelModel model(f.config, on(nullptr));
  load(model, *f.control, f.v1);
  auto lacking = f.v2;
  lacking.erase("model.layers.1.mlp.up_proj.weight");
  lacking.erase("model.norm.weight");
  ReloadOptions o;
  o.require_complete = true;
  auto source = testdata::memory_source(lacking);
  try {
    reload_weights(model, *f.control, source.get(), o);
    FAIL() << "an incomplete source was reloaded";
  } catch (const ValidationError& e) {
    // (the source named: which of a job's loads was incomplete)
    EXPECT_NE(std::string(e.what()).find(
                  "--require-complete (nothing was reloaded) failed on rank 0/1: the source (" +
                  source->describe() + ") lacks 2 of the "),
              std::string::npos)
        << e.what();
    EXPECT_NE(
        std::string(e.what()).find(
            "parameters of tp rank 0: model.layers.1.mlp.gate_up_proj.weight, model.norm.weight"),
        std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(compare(model, f.config, f.v1).second.empty()) << "a parameter changed";
  // By default the same source reloads what it has and reports the rest.
  o.require_complete = false;
  source = testdata::memory_source(lacking);
  const ReloadResult r = reload_weights(model, *f.control, source.get(), o);
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(
      r.not_loaded_on_all_ranks,
      (std::vector<std::string>{"model.layers.1.mlp.gate_up_proj.weight", "model.norm.weight"}));
}

TEST(ReloadableModelFailure, CallbacksRunWhenWeightsChangedBeforeTheFailure) {
  Fixture f;
  TensorParallelModel model(f.config, on(nullptr));
  load(model, *f.control, f.v1);
  FaultyTransport data(make_communicator_transport(*f.control), 4, FaultyTransport::Fault::kFail);
  Served served(model, &data);
  ReloadOptions o;
  o.bucket_bytes = 600;
  auto source = testdata::memory_source(f.v2);
  EXPECT_THROW(served.model.reload_from(*f.control, o, source.get()), CommError);
  ASSERT_EQ(served.seen.size(), 1u)
      << "the callbacks did not run after a failure that changed weights";
  EXPECT_FALSE(served.seen[0].complete());
  EXPECT_NE(served.seen[0].error.find("injected fault"), std::string::npos);
  EXPECT_EQ(served.seen[0].possibly_mixed, model.sink().touched_names());
  EXPECT_FALSE(served.seen[0].possibly_mixed.empty());
}

}  // namespace
}  // namespace tpreload
