// Parameters in device memory (the emulated device of tests/support): allocated
// there, zeroed, loaded through the sink's device writes, int8 through the device
// kernel path, CRCs read back in chunks. Expected bytes come from the independent
// slicing in tests/support (or, for int8, from the host model, whose bytes the
// host tests check against the formula).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <zlib.h>

#include "../support/emulated_device.h"
#include "../support/tiny_models.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"
#include "tpreload/model/model.h"

namespace tpreload {
namespace {

using testing::EmulatedDevice;

ModelOptions on(std::shared_ptr<Device> device, int tp, int rank, std::string quantization = "") {
  ModelOptions o;
  o.tp_size = tp;
  o.tp_rank = rank;
  o.quantization = std::move(quantization);
  o.device = std::move(device);
  return o;
}

TEST(DeviceParams, LiveInDeviceMemoryAndStartAsZeros) {
  auto device = std::make_shared<EmulatedDevice>();
  TensorParallelModel model(testdata::tiny_config("llama_gqa"), on(device, 2, 0));
  for (const auto& [name, t] : model.named_parameters()) {
    const std::uint64_t n = t.numel() * t.element_size();
    EXPECT_TRUE(device->is_device_memory(t.data_ptr(), n)) << name;
    EXPECT_TRUE(at::equal(t, at::zeros_like(t)))
        << name << " is not zeroed (device memory starts 0xCD)";
  }
}

TEST(DeviceParams, EveryRankLoadsTheIndependentSlices) {
  for (const char* name : testdata::kTinyConfigs) {
    const ModelConfig config = testdata::tiny_config(name);
    const auto ckpt = testdata::random_checkpoint(config, 21);
    for (int tp : {1, 2, 4}) {
      for (int rank = 0; rank < tp; ++rank) {
        auto device = std::make_shared<EmulatedDevice>();
        TensorParallelModel model(config, on(device, tp, rank));
        auto source = testdata::memory_source(ckpt);
        const auto loaded = model.load_weights(*source);
        for (const auto& [param, want] : testdata::expected_shards(config, ckpt, tp, rank)) {
          EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(param), want))
              << name << " tp " << tp << " rank " << rank << " " << param;
          // (a derived parameter is computed, not loaded: DeepSeek's W_UK_T)
          EXPECT_EQ(loaded.count(param), model.rules().find_param(param)->from_checkpoint ? 1u : 0u)
              << param;
        }
      }
    }
  }
}

TEST(DeviceParams, Int8OnTheDeviceEqualsInt8OnTheHost) {
  const ModelConfig config = testdata::tiny_config("mistral_mqa");  // float16 weights
  const auto ckpt = testdata::random_checkpoint(config, 22);
  for (int rank = 0; rank < 2; ++rank) {
    TensorParallelModel host(config, on(nullptr, 2, rank, "int8"));
    TensorParallelModel device(config, on(std::make_shared<EmulatedDevice>(), 2, rank, "int8"));
    auto a = testdata::memory_source(ckpt), b = testdata::memory_source(ckpt);
    host.load_weights(*a);
    device.load_weights(*b);
    for (const auto& [param, t] : host.named_parameters())
      EXPECT_TRUE(testdata::same_bytes(device.parameter_for_reload(param), t)) << param;
  }
}

TEST(DeviceParams, CrcIsReadBackInChunksAndEqualsTheBytes) {
  const ModelConfig config = testdata::tiny_config("qwen2_tied");
  auto device = std::make_shared<EmulatedDevice>();
  TensorParallelModel model(config, on(device, 1, 0));
  auto source = testdata::memory_source(testdata::random_checkpoint(config, 23));
  model.load_weights(*source);
  const auto& specs = model.rules().params();
  for (ParamSlot s = 0; s < specs.size(); ++s) {
    const at::Tensor t = model.parameter_for_reload(specs[s].name);
    const std::uint32_t want = static_cast<std::uint32_t>(
        crc32(crc32(0L, Z_NULL, 0), static_cast<const Bytef*>(t.data_ptr()),
              t.numel() * t.element_size()));
    const std::uint64_t before = device->operations();
    EXPECT_EQ(model.sink().crc32(s, 100), want) << specs[s].name;
    const std::uint64_t chunks = (t.numel() * t.element_size() + 99) / 100;
    EXPECT_EQ(device->operations() - before, chunks)
        << specs[s].name << ": one device copy per 100-byte chunk";
  }
}

// Pinning a buffer per read-back and freeing it after (cudaFreeHost waits for the
// whole device) cost more than the read-back on a GPU: a sink pins one buffer
// and reuses it, growing it only for a larger read.
TEST(DeviceParams, ReadBacksReuseOnePinnedBuffer) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  auto device = std::make_shared<EmulatedDevice>();
  TensorParallelModel model(config, on(device, 2, 0));
  ParameterSink& sink = model.sink();
  ParamSlot largest = 0;
  for (ParamSlot s = 0; s < sink.size(); ++s)
    if (sink.storage(s).bytes > sink.storage(largest).bytes) largest = s;
  const ParamStorage& big = sink.storage(largest);
  sink.crc32(largest);
  sink.crc32c(big.data, big.bytes, "the largest");
  const std::uint64_t pinned = device->allocations(MemoryKind::kPinnedHost);
  for (int pass = 0; pass < 2; ++pass) {
    for (ParamSlot s = 0; s < sink.size(); ++s) {
      sink.crc32(s);
      sink.crc32(s, 100);
      sink.crc32c(sink.storage(s).data, sink.storage(s).bytes, "a parameter");
    }
  }
  EXPECT_EQ(device->allocations(MemoryKind::kPinnedHost), pinned)
      << "read-backs of " << sink.size() << " parameters pinned new buffers";
}

TEST(DeviceParams, HostBlocksAreStagedNotWrittenFromTheHost) {
  // A block given to the model is host memory: it must reach the device through
  // a host-to-device copy (the emulated device refuses host pointers as device
  // memory, so a write straight from the block would throw here).
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  auto device = std::make_shared<EmulatedDevice>();
  TensorParallelModel model(config, on(device, 2, 1));
  const auto pl = model.rules().place("model.layers.0.mlp.down_proj.weight", 1);
  ASSERT_TRUE(pl);
  const at::Tensor full = at::randn(pl->source_shape).to(at::kBFloat16);
  model.load_checkpoint_tensor(*pl, full, false);
  const at::Tensor want = full.narrow(1, pl->source_start, pl->source_length);
  EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(pl->param), want));
}

// A device that never finishes reading a parameter back (or checksumming it):
// the error names the device and the parameter, and the pinned buffer the stuck
// work may still write is abandoned, not freed under it.
TEST(DeviceParams, AStuckReadBackAbandonsItsPinnedBuffer) {
  using namespace std::chrono_literals;
  for (const bool digest : {false, true}) {
    auto device = std::make_shared<EmulatedDevice>();
    TensorParallelModel model(testdata::tiny_config("llama_gqa"), on(device, 2, 0));
    ParameterSink& sink = model.sink();
    const ParamSlot slot = model.rules().find_slot("model.norm.weight");
    const ParamStorage& s = sink.storage(slot);
    const std::uint64_t pinned_before = device->live_bytes(MemoryKind::kPinnedHost);
    device->stall(true);
    try {
      if (digest)
        sink.crc32c(s.data, s.bytes, "'model.norm.weight'", 200ms);
      else
        sink.crc32(slot, std::uint64_t{16} << 20, 200ms);
      FAIL() << "a stuck device went unnoticed";
    } catch (const CommTimeoutError& e) {
      const std::string want = digest ? "checksumming 'model.norm.weight' on emulated device"
                                      : "reading back 'model.norm.weight' from emulated device";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    EXPECT_GT(device->live_bytes(MemoryKind::kPinnedHost), pinned_before)
        << (digest ? "crc32c" : "crc32")
        << ": the pinned buffer the stuck work may write was freed";
    EXPECT_EQ(device->frees_while_stalled(), 0u)
        << (digest ? "crc32c" : "crc32") << ": a free that would wait for the stuck device";
    device->stall(false);
  }
}

}  // namespace
}  // namespace tpreload
