// Reloads from a WeightStream in one process (the multi-rank cases, kernel
// format and failures agreed on every rank are in mpi_tests/reload_test.cpp
// and fp8_tensor_test.cpp): stacked tensors, progress over the segments, an
// empty stream, a reader without one, and --require-complete, which a stream
// can only check at its end. Every byte is checked against the independent
// slicing of tests/support.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "../support/streams.h"
#include "../support/tiny_models.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/reload.h"

namespace tpreload {
namespace {

using testing::counting_stream;
using testing::StreamCounts;

void expect_shards(const TensorParallelModel& m, const ModelConfig& c,
                   const std::map<std::string, at::Tensor>& ckpt, const std::string& what) {
  std::size_t wrong = 0;
  for (const auto& [name, t] : testdata::expected_shards(c, ckpt, 1, 0))
    if (!testdata::same_bytes(m.parameter_for_reload(name), t) && ++wrong <= 3)
      ADD_FAILURE() << what << ": " << name << " differs";
  EXPECT_EQ(wrong, 0u) << what;
}

struct Loaded {
  ModelConfig config;
  std::map<std::string, at::Tensor> v1, v2;
  std::unique_ptr<Communicator> control = make_local_communicator();
  TensorParallelModel model;

  explicit Loaded(const std::string& name)
      : config(testdata::tiny_config(name)),
        v1(testdata::random_checkpoint(config, 1)),
        v2(testdata::random_checkpoint(config, 2)),
        model(config, ModelOptions{}) {
    auto first = testdata::memory_source(v1);
    reload_weights(model, *control, first.get(), ReloadOptions{});
  }
};

// Phi-3's stacked q/k/v and gate/up, in segments of 2 KiB: cut as the
// loaders cut them. Progress: a call per bucket of every segment, in order,
// then the finished one with every byte.
TEST(Stream, StackedTensorsAndProgressOverTheSegments) {
  Loaded f("phi3");
  ReloadOptions o;
  o.bucket_bytes = 1024;
  o.pipeline_depth = 2;
  std::vector<ReloadProgress> calls;
  o.progress = [&](const ReloadProgress& p) { calls.push_back(p); };
  auto counts = std::make_shared<StreamCounts>();
  auto stream = counting_stream(testdata::in_memory(f.v2), counts);
  const ReloadResult r = reload_from_stream(f.model, *f.control, stream.get(), o);
  EXPECT_TRUE(r.complete());
  EXPECT_TRUE(r.skipped.empty());
  expect_shards(f.model, f.config, f.v2, "phi3 from a stream");
  std::uint64_t total = 0;
  for (const auto& [name, t] : f.v2) total += t.nbytes();
  EXPECT_EQ(r.bytes_read, total);
  ASSERT_EQ(calls.size(), r.buckets + 1);
  for (std::size_t i = 0; i + 1 < calls.size(); ++i) {
    EXPECT_EQ(calls[i].buckets_done, i + 1);
    EXPECT_FALSE(calls[i].finished);
    if (i > 0) {
      EXPECT_GT(calls[i].bytes_done, calls[i - 1].bytes_done);
    }
  }
  EXPECT_TRUE(calls.back().finished);
  EXPECT_EQ(calls.back().buckets_done, r.buckets);
  EXPECT_EQ(calls.back().buckets_total, r.buckets);
  EXPECT_EQ(calls.back().bytes_done, calls.back().bytes_total);
  EXPECT_EQ(calls.back().bytes_done, total);
}

// An empty stream loads nothing and says so; a reader rank given no stream
// is named; in neither case does a parameter change.
TEST(Stream, AnEmptyStreamLoadsNothingAndAMissingOneIsNamed) {
  Loaded f("llama_gqa");
  auto counts = std::make_shared<StreamCounts>();
  auto empty = counting_stream({}, counts);
  const ReloadResult r = reload_from_stream(f.model, *f.control, empty.get(), ReloadOptions{});
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(r.buckets, 0u);
  EXPECT_EQ(r.not_loaded_on_all_ranks, f.model.expected_names(WeightFormat::kCheckpoint));
  try {
    reload_from_stream(f.model, *f.control, nullptr, ReloadOptions{});
    FAIL() << "a reader without a stream";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("taking the weight stream's next tensors failed on rank "
                                         "0/1: the weight stream: no weight stream was given to "
                                         "the reader rank 0"),
              std::string::npos)
        << e.what();
  }
  expect_shards(f.model, f.config, f.v1, "after an empty and a missing stream");
}

// --require-complete is refused without --atomic, before the stream is
// touched; atomic, a stream that lacks a tensor fails before the commit
// (every parameter as it was), and a whole one loads.
TEST(Stream, RequireCompleteIsCheckedBeforeTheCommit) {
  Loaded f("llama_gqa");
  ReloadOptions o;
  o.bucket_bytes = 2048;
  o.require_complete = true;
  auto counts = std::make_shared<StreamCounts>();
  auto stream = counting_stream(testdata::in_memory(f.v2), counts);
  try {
    reload_from_stream(f.model, *f.control, stream.get(), o);
    FAIL() << "--require-complete without --atomic";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("reload atomically (the check then runs before the "
                                         "commit)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(counts->yielded, 0u);
  o.atomic = true;
  const std::string lacking = "model.layers.1.mlp.down_proj.weight";
  std::vector<InMemoryTensor> most = testdata::in_memory(f.v2);
  most.erase(std::find_if(most.begin(), most.end(),
                          [&](const InMemoryTensor& t) { return t.name == lacking; }));
  auto partial = counting_stream(most, counts);
  try {
    reload_from_stream(f.model, *f.control, partial.get(), o);
    FAIL() << "a stream without " << lacking;
  } catch (const ValidationError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--require-complete: the weight stream lacked 1 parameter some rank "
                       "needs: " +
                       lacking),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("every parameter is as it was before the reload"), std::string::npos) << msg;
  }
  expect_shards(f.model, f.config, f.v1, "after the refused stream");
  auto whole = counting_stream(testdata::in_memory(f.v2), counts);
  EXPECT_TRUE(reload_from_stream(f.model, *f.control, whole.get(), o).complete());
  expect_shards(f.model, f.config, f.v2, "from the whole stream");
}

}  // namespace
}  // namespace tpreload
