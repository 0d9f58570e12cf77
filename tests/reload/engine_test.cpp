// The reload engine in one process: the control plane is a one-rank
// communicator, the data plane a transport given by the test. Parameters in host
// memory and in (emulated) device memory, over a host and a device transport;
// transports that fail or stall; a device that stalls; planes that do not fit.
// Every byte is checked against the independent slicing of tests/support.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <stdexcept>

#include "../support/emulated_device.h"
#include "../support/faults.h"
#include "../support/tiny_models.h"
#include "tpreload/checkpoint/synthetic.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/checkpoint/writers.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/data_transport.h"
#include "tpreload/core/error.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/reload.h"

namespace tpreload {
namespace {

using namespace std::chrono_literals;
using testing::EmulatedDevice;
using testing::FaultyTransport;
using Clock = std::chrono::steady_clock;

struct Fixture {
  ModelConfig config = testdata::tiny_config("llama_gqa");
  std::map<std::string, at::Tensor> v1 = testdata::random_checkpoint(config, 41);
  std::map<std::string, at::Tensor> v2 = testdata::random_checkpoint(config, 42);
  std::unique_ptr<Communicator> control = make_local_communicator();
};

ModelOptions options(std::shared_ptr<Device> device, const std::string& quantization = "") {
  ModelOptions o;
  o.device = std::move(device);
  o.quantization = quantization;
  return o;
}

std::map<std::string, void*> pointers(const TensorParallelModel& m) {
  std::map<std::string, void*> out;
  for (const auto& [n, t] : m.named_parameters()) out[n] = t.data_ptr();
  return out;
}

void expect_v(const TensorParallelModel& m, const ModelConfig& c,
              const std::map<std::string, at::Tensor>& ckpt, const std::string& what) {
  for (const auto& [name, t] : testdata::expected_shards(c, ckpt, 1, 0))
    EXPECT_TRUE(testdata::same_bytes(m.parameter_for_reload(name), t)) << what << ": " << name;
}

TEST(Engine, DeviceParametersOverHostAndDeviceTransports) {
  Fixture f;
  for (bool device_transport : {false, true}) {
    for (Distribution d : {Distribution::kBroadcast, Distribution::kScatter}) {
      for (int depth : {1, 3}) {
        auto device = std::make_shared<EmulatedDevice>();
        TensorParallelModel model(f.config, options(device));
        auto data = make_communicator_transport(*f.control);
        if (device_transport)
          data = testing::make_emulated_device_transport(std::move(data), *device);
        ReloadOptions o;
        o.distribution = d;
        o.bucket_bytes = 900;
        o.pipeline_depth = depth;
        const std::string what = std::string(device_transport ? "device" : "host") +
                                 " transport, " + std::string(distribution_name(d)) + ", depth " +
                                 std::to_string(depth);
        ReloadWorkspace workspace;
        auto s1 = testdata::memory_source(f.v1);
        reload_weights(model, *f.control, *data, s1.get(), o, &workspace);
        const auto before = pointers(model);
        auto s2 = testdata::memory_source(f.v2);
        const ReloadResult r = reload_weights(model, *f.control, *data, s2.get(), o, &workspace);
        EXPECT_TRUE(r.complete()) << what;
        expect_v(model, f.config, f.v2, what);
        EXPECT_EQ(pointers(model), before) << what;
        // Staging per space: bucket-sized buffers per slot, in the spaces the table in reload.h
        // says.
        const std::uint64_t bound = static_cast<std::uint64_t>(depth) * 2 * o.bucket_bytes;
        EXPECT_EQ(r.staging.host, 0u) << what << ": with device parameters host staging is pinned";
        EXPECT_GT(r.staging.pinned, 0u) << what;
        EXPECT_LE(r.staging.pinned, bound) << what;
        EXPECT_GT(r.staging.device, 0u) << what;
        EXPECT_LE(r.staging.device, bound) << what;
        EXPECT_EQ(
            workspace.bytes(MemoryKind::kDevice),
            device->live_bytes(MemoryKind::kDevice) -
                [&] {
                  std::uint64_t p = 0;
                  for (const auto& [n, t] : model.named_parameters())
                    p += t.numel() * t.element_size();
                  return p;
                }())
            << what << ": device memory is the parameters plus the workspace, nothing left over";
        EXPECT_EQ(r.transport, device_transport ? "emulated-device" : "control:local") << what;
      }
    }
  }
}

// --zero-copy sends a broadcast bucket straight from the file's mapping; a device
// must not copy from that pageable memory: with parameters on a device the
// buckets are read into pinned staging instead (the emulated device here refuses
// a host side of a copy that is not its pinned memory).
TEST(Engine, ZeroCopyWithDeviceParametersStagesThroughPinnedMemory) {
  Fixture f;
  const std::string file = ::testing::TempDir() + "tpreload-zero-copy-device.safetensors";
  write_safetensors(file, testdata::in_memory(f.v2));
  for (bool device_transport : {false, true}) {
    auto device = std::make_shared<EmulatedDevice>();
    TensorParallelModel model(f.config, options(device));
    auto data = make_communicator_transport(*f.control);
    if (device_transport) data = testing::make_emulated_device_transport(std::move(data), *device);
    ReloadOptions o;
    o.distribution = Distribution::kBroadcast;
    o.zero_copy = true;
    o.bucket_bytes = 900;
    device->require_pinned_host(true);
    auto source = open_weight_source(file);
    const ReloadResult r = reload_weights(model, *f.control, *data, source.get(), o);
    const std::string what = device_transport ? "device transport" : "host transport";
    EXPECT_TRUE(r.complete()) << what;
    expect_v(model, f.config, f.v2, what);
  }
}

// An FP8 checkpoint for a model without FP8 parameters: refused before any
// parameter byte changes, naming the tensor and both dtypes (FP8 values land
// only in FP8 parameters, with their scales; never by a plain conversion).
TEST(Engine, AnFp8CheckpointIntoBfloat16ParametersIsRefusedBeforeAnyWrite) {
  Fixture f;
  TensorParallelModel model(f.config, options(nullptr));
  auto s1 = testdata::memory_source(f.v1);
  reload_weights(model, *f.control, s1.get(), ReloadOptions{});
  std::vector<std::vector<std::byte>> bytes;
  std::vector<InMemoryTensor> fp8;
  for (const auto& [name, t] : f.v2) {
    const std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
    bytes.emplace_back(static_cast<std::size_t>(t.numel()));
    fill_synthetic({name, DType::kFloat8E4M3, shape}, {},
                   MutableBytes(bytes.back().data(), bytes.back().size()));
    fp8.push_back({name, DType::kFloat8E4M3, shape,
                   ConstBytes(bytes.back().data(), bytes.back().size()), nullptr});
  }
  auto source = make_in_memory_source(fp8);
  try {
    reload_weights(model, *f.control, source.get(), ReloadOptions{});
    FAIL() << "an FP8 checkpoint landed in bfloat16 parameters";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("float8_e4m3fn values are not converted to bfloat16 (FP8 values land "
                        "only in FP8 parameters"),
              std::string::npos)
        << what;
  }
  expect_v(model, f.config, f.v1, "after the refused FP8 reload");
}

// A progress callback that throws costs only the progress reports: the reload
// completes (a rank that left it there would leave its peers waiting) and the
// callback is not called again in it.
TEST(Engine, AProgressCallbackThatThrowsEndsOnlyTheReports) {
  Fixture f;
  TensorParallelModel model(f.config, options(nullptr));
  auto data = make_communicator_transport(*f.control);
  ReloadOptions o;
  o.bucket_bytes = 900;
  int calls = 0;
  o.progress = [&](const ReloadProgress&) {
    ++calls;
    throw std::runtime_error("the caller's progress bar broke");
  };
  auto source = testdata::memory_source(f.v2);
  ReloadResult r;
  ASSERT_NO_THROW(r = reload_weights(model, *f.control, *data, source.get(), o));
  EXPECT_TRUE(r.complete());
  EXPECT_GT(r.buckets, 1u) << "the callback would have been called more than once";
  EXPECT_EQ(calls, 1);
  expect_v(model, f.config, f.v2, "after the throwing callback");
}

// The depth a rank gets by default: 2 only with two cores of its own, counted
// both ways (its affinity, and the host's cores shared by its ranks).
TEST(Engine, ThePipelineDepthChosenNeedsTwoCoresPerRank) {
  struct Case {
    int usable, host, ranks, want;
    const char* what;
  };
  for (const Case c :
       {Case{1, 64, 8, 1, "bound to one core of a big host"},
        Case{64, 64, 8, 2, "8 ranks sharing 64 cores"}, Case{8, 64, 8, 2, "bound to 8 cores each"},
        Case{64, 64, 64, 1, "a rank per core"},
        Case{64, 64, 33, 1, "fewer than 2 cores each (64 / 33)"},
        Case{2, 2, 1, 2, "one rank on 2 cores"}, Case{2, 2, 2, 1, "two ranks on 2 cores"},
        Case{2, 2, 4, 1, "oversubscribed"}, Case{4, 5, 2, 2, "5 cores for 2 ranks"},
        Case{4, 3, 2, 1, "3 cores for 2 ranks"}, Case{0, 0, 0, 1, "counts missing"}})
    EXPECT_EQ(auto_pipeline_depth(c.usable, c.host, c.ranks), c.want) << c.what;
}

TEST(Engine, HostParametersStageInPageableMemoryOnly) {
  Fixture f;
  TensorParallelModel model(f.config, options(nullptr));
  auto source = testdata::memory_source(f.v2);
  ReloadOptions o;
  o.bucket_bytes = 1000;
  const ReloadResult r = reload_weights(model, *f.control, source.get(), o);
  expect_v(model, f.config, f.v2, "host");
  EXPECT_GT(r.staging.host, 0u);
  EXPECT_LE(r.staging.host, 2 * o.bucket_bytes);
  EXPECT_EQ(r.staging.pinned + r.staging.device, 0u);
  EXPECT_EQ(r.parameter_memory, "host");
}

TEST(Engine, Int8OnTheDeviceEqualsInt8OnTheHost) {
  Fixture f;
  const ModelConfig config = testdata::tiny_config("mistral_mqa");
  const auto ckpt = testdata::random_checkpoint(config, 43);
  for (Distribution d : {Distribution::kBroadcast, Distribution::kScatter}) {
    TensorParallelModel host(config, options(nullptr, "int8"));
    auto device = std::make_shared<EmulatedDevice>();
    TensorParallelModel dev(config, options(device, "int8"));
    auto dev_data =
        testing::make_emulated_device_transport(make_communicator_transport(*f.control), *device);
    ReloadOptions o;
    o.distribution = d;
    o.bucket_bytes = 500;
    auto a = testdata::memory_source(ckpt), b = testdata::memory_source(ckpt);
    reload_weights(host, *f.control, a.get(), o);
    reload_weights(dev, *f.control, *dev_data, b.get(), o);
    for (const auto& [name, t] : host.named_parameters())
      EXPECT_TRUE(testdata::same_bytes(dev.parameter_for_reload(name), t))
          << distribution_name(d) << " " << name;
  }
}

TEST(Engine, ADeviceTransportForHostParametersIsRefused) {
  Fixture f;
  EmulatedDevice device;
  TensorParallelModel model(f.config, options(nullptr));
  auto data =
      testing::make_emulated_device_transport(make_communicator_transport(*f.control), device);
  auto source = testdata::memory_source(f.v1);
  try {
    reload_weights(model, *f.control, *data, source.get(), ReloadOptions{});
    FAIL() << "accepted a device transport for host parameters";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "the emulated-device transport moves device memory, but the parameters "
                  "are in host memory"),
              std::string::npos)
        << e.what();
  }
}

TEST(Engine, AFailedTransferEndsTheReloadWithItsErrorAndNoHang) {
  Fixture f;
  for (bool device : {false, true}) {
    auto dev = std::make_shared<EmulatedDevice>();
    TensorParallelModel model(f.config, options(device ? dev : nullptr));
    auto inner = make_communicator_transport(*f.control);
    if (device) inner = testing::make_emulated_device_transport(std::move(inner), *dev);
    FaultyTransport data(std::move(inner), 3, FaultyTransport::Fault::kFail, 5s);
    ReloadOptions o;
    o.bucket_bytes = 600;
    o.pipeline_depth = 2;
    auto source = testdata::memory_source(f.v1);
    const auto start = Clock::now();
    try {
      reload_weights(model, *f.control, data, source.get(), o);
      FAIL() << "a failed transfer went unnoticed";
    } catch (const CommError& e) {  // this rank's alone: it says what it had written
      EXPECT_EQ(std::string(e.what()).rfind("transfer 3 (scatter) failed: injected fault; ", 0), 0u)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("parameters had been written on rank 0/1 and may hold "
                                           "a mix of old and new weights: "),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(data.transfers(), 3) << "nothing was posted after the failure";
    EXPECT_LT(Clock::now() - start, 5s);
  }
}

TEST(Engine, AStalledTransferTimesOut) {
  Fixture f;
  TensorParallelModel model(f.config, options(nullptr));
  FaultyTransport data(make_communicator_transport(*f.control), 2, FaultyTransport::Fault::kStall,
                       200ms);
  ReloadOptions o;
  o.bucket_bytes = 600;
  auto source = testdata::memory_source(f.v1);
  const auto start = Clock::now();
  EXPECT_THROW(reload_weights(model, *f.control, data, source.get(), o), CommTimeoutError);
  EXPECT_LT(Clock::now() - start, 10s);
}

TEST(Engine, AStalledDeviceTimesOutNamingItAndItsBuffersAreAbandoned) {
  Fixture f;
  auto device = std::make_shared<EmulatedDevice>();
  auto model = std::make_unique<TensorParallelModel>(f.config, options(device));
  device->stall(true);
  ReloadOptions o;
  o.device_timeout = 200ms;
  ReloadWorkspace workspace;
  auto source = testdata::memory_source(f.v1);
  const auto start = Clock::now();
  try {
    reload_weights(*model, *f.control, source.get(), o, &workspace);
    FAIL() << "a stalled device went unnoticed";
  } catch (const ModelError& e) {  // the apply failure every rank agrees on
    EXPECT_NE(std::string(e.what()).find("did not complete on the device within 200 ms"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("emulated device"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, 10s);
  // The stuck work may still read the staging buffers: the workspace let go of
  // them without freeing them (the device still counts them as live).
  EXPECT_EQ(workspace.bytes(), 0u);
  EXPECT_GT(device->live_bytes(MemoryKind::kPinnedHost), 0u);
  // A program that ends after the error frees its model: on a stuck GPU those
  // frees would never return (and the process never exit); they are leaked.
  model.reset();
  EXPECT_EQ(device->frees_while_stalled(), 0u) << "a free that would wait for the stuck device";
  EXPECT_GT(device->leaked_bytes(), 0u) << "the model's memory was not leaked";
  device->stall(false);
}

// The same on the reader's side: with a device data plane the reader copies
// each bucket to the device before sending it. A copy that never finishes is
// the reader's failure on every rank, naming the device, and the staging it
// may still touch is abandoned.
TEST(Engine, AStalledStagingCopyOnTheReaderNamesTheDeviceAndAbandonsItsBuffers) {
  Fixture f;
  auto device = std::make_shared<EmulatedDevice>();
  TensorParallelModel model(f.config, options(device));
  auto data =
      testing::make_emulated_device_transport(make_communicator_transport(*f.control), *device);
  device->stall(true);  // the reader's copy of the first bucket is the first device work
  ReloadOptions o;
  o.device_timeout = 200ms;
  ReloadWorkspace workspace;
  auto source = testdata::memory_source(f.v1);
  try {
    reload_weights(model, *f.control, *data, source.get(), o, &workspace);
    FAIL() << "a stalled staging copy went unnoticed";
  } catch (const CheckpointError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("reading bucket 1 of "), std::string::npos) << text;
    EXPECT_NE(text.find(": the device did not finish staging it: copying bucket 1 ("),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("emulated device did not complete on the device within 200 ms"),
              std::string::npos)
        << text;
  }
  EXPECT_EQ(workspace.bytes(), 0u) << "staging the stuck copy may touch was kept for reuse";
  EXPECT_GT(device->live_bytes(MemoryKind::kPinnedHost), 0u) << "it was freed";
  EXPECT_EQ(device->frees_while_stalled(), 0u) << "a free that would wait for the stuck device";
  device->stall(false);
}

// One workspace kept for a model on one device, then for a model on another:
// the staging buffers of the first device are not handed to the second (whose
// copies would read and write the other device's memory).
TEST(Engine, AWorkspaceFollowsTheModelToAnotherDevice) {
  Fixture f;
  // (the devices outlive the workspace, which frees its buffers through them)
  const std::shared_ptr<EmulatedDevice> devices[2] = {std::make_shared<EmulatedDevice>(),
                                                      std::make_shared<EmulatedDevice>()};
  ReloadWorkspace workspace;
  for (int i = 0; i < 2; ++i) {
    TensorParallelModel model(f.config, options(devices[i]));
    auto source = testdata::memory_source(f.v2);
    const ReloadResult r =
        reload_weights(model, *f.control, source.get(), ReloadOptions{}, &workspace);
    EXPECT_TRUE(r.complete()) << "device " << i;
    expect_v(model, f.config, f.v2, "device " + std::to_string(i));
  }
}

// Waiting for a slot that a slow apply holds is not a stalled read: with a device
// slower per bucket than read_stall_timeout, the reload completes (the reader
// rank used to abort the job here).
TEST(Engine, ASlowApplyIsNotAStalledRead) {
  Fixture f;
  auto device = std::make_shared<EmulatedDevice>();
  TensorParallelModel model(f.config, options(device));
  device->set_delay(700ms);  // two waits per bucket: 1.4 s > the 1 s stall limit
  ReloadOptions o;
  o.read_stall_timeout = std::chrono::seconds(1);
  o.bucket_bytes = 1 << 20;  // broadcasts, then scatters: two buckets
  o.scatter_replicated_bytes = 0;
  auto source = testdata::memory_source(f.v2);
  const ReloadResult r = reload_weights(model, *f.control, source.get(), o);
  EXPECT_GE(r.buckets, 2u);
  EXPECT_TRUE(r.complete());
  expect_v(model, f.config, f.v2, "slow device");
}

// A checkpoint mixing dtypes, with 1-D bfloat16 tensors of odd length (head_dim 9)
// before float32 ones in the same bucket: every piece must start aligned to its
// elements, or the device kernels that convert float32 norms into the bfloat16
// model would read misaligned floats (the emulated device refuses them, as a GPU
// faults on them).
TEST(Engine, MixedDtypesLandAlignedOnTheDevice) {
  Fixture f;
  const ModelConfig config = parse_model_config(R"({"architectures":["LlamaForCausalLM"],
    "hidden_size":36,"intermediate_size":48,"num_hidden_layers":1,"num_attention_heads":4,
    "num_key_value_heads":1,"vocab_size":70,"attention_bias":true,"torch_dtype":"bfloat16"})",
                                                "odd");
  auto ckpt = testdata::random_checkpoint(config, 44);
  std::map<std::string, at::Tensor> want = ckpt;
  // float32 norms and o_proj.bias; in file order o_proj.bias follows the 9-element
  // k_proj.bias, so without alignment it would start 2 bytes off a float.
  for (auto& [name, t] : ckpt)
    if (name.find("norm") != std::string::npos || name.find("o_proj.bias") != std::string::npos) {
      t = (t.to(at::kFloat) * 1.01f).contiguous();
      want[name] = t.to(at::kBFloat16);
    }
  for (Distribution d : {Distribution::kBroadcast, Distribution::kScatter}) {
    auto device = std::make_shared<EmulatedDevice>();
    TensorParallelModel model(config, options(device));
    auto data =
        testing::make_emulated_device_transport(make_communicator_transport(*f.control), *device);
    ReloadOptions o;
    o.distribution = d;
    o.bucket_bytes = 1 << 20;  // one bucket per kind
    auto source = testdata::memory_source(ckpt);
    EXPECT_TRUE(reload_weights(model, *f.control, *data, source.get(), o).complete());
    expect_v(model, config, want,
             std::string("mixed dtypes, ") + std::string(distribution_name(d)));
  }
}

}  // namespace
}  // namespace tpreload
