// The data plane across ranks: the MPI data transport (its own communicator,
// non-blocking transfers) under the control plane, and parameters in device
// memory (the emulated device of tests/support) staged through pinned host
// memory over MPI (what `--device cuda --transport mpi` does) or moved as device
// memory by a device transport (what NCCL does). Every rank's parameters must
// equal the independent slicing of tests/support, byte for byte, in place.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <zlib.h>

#include <algorithm>
#include <filesystem>

#include "../tests/support/emulated_device.h"
#include "../tests/support/faults.h"
#include "../tests/support/tiny_models.h"
#include "mpi_test_main.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"
#include "tpreload/model/kernel_shards.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/report.h"

namespace tpreload {
namespace {

TPRELOAD_TINY_MODEL_WORLD_SIZES();

using mpitest::mpi_world;
using mpitest::world;
using testing::EmulatedDevice;

enum class Plane { kMpiHost, kMpiPinnedToDevice, kDeviceTransport };

const char* name_of(Plane p) {
  return p == Plane::kMpiHost             ? "mpi, host parameters"
         : p == Plane::kMpiPinnedToDevice ? "mpi, device parameters"
                                          : "device transport, device parameters";
}

struct PlaneSetup {
  std::shared_ptr<EmulatedDevice> device;
  std::unique_ptr<DataTransport> data;
};

PlaneSetup make_plane(Plane p) {
  PlaneSetup s;
  s.data = mpi_world().make_data_transport();
  if (p != Plane::kMpiHost) s.device = std::make_shared<EmulatedDevice>();
  if (p == Plane::kDeviceTransport)
    s.data = testing::make_emulated_device_transport(std::move(s.data), *s.device);
  return s;
}

ModelOptions model_options(int tp, const PlaneSetup& s, const std::string& quantization = "") {
  ModelOptions o;
  o.tp_size = tp;
  o.tp_rank = world().rank() % tp;
  o.quantization = quantization;
  o.device = s.device;
  return o;
}

std::map<std::string, void*> pointers(const TensorParallelModel& m) {
  std::map<std::string, void*> out;
  for (const auto& [n, t] : m.named_parameters()) out[n] = t.data_ptr();
  return out;
}

ReloadResult reload(TensorParallelModel& m, DataTransport& data,
                    const std::map<std::string, at::Tensor>& ckpt, const ReloadOptions& o,
                    ReloadWorkspace& ws) {
  auto source = world().rank() == o.reader_rank || o.readers != Readers::kOne
                    ? testdata::memory_source(ckpt)
                    : nullptr;
  return reload_weights(m, world(), data, source.get(), o, &ws);
}

// Un-stalls the device of rank `stuck` (stalled by the test) after checking that
// nothing was freed on it while stalled: a CUDA free would have waited for the
// stuck work.
void resume(PlaneSetup& s, int stuck) {
  if (world().rank() != stuck) return;
  EXPECT_EQ(s.device->frees_while_stalled(), 0u) << "a free that would wait for the stuck device";
  s.device->stall(false);
}

// Every parameter of `model` holds the bytes `want` gives it, and the model has
// no parameter `want` does not name.
void expect_bytes(const TensorParallelModel& model, const std::map<std::string, at::Tensor>& want,
                  const std::string& what) {
  EXPECT_EQ(model.named_parameters().size(), want.size()) << what;
  for (const auto& [name, t] : want)
    EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(name), t)) << what << ": " << name;
}

TEST(DataPlane, CheckpointFormatOverEveryPlane) {
  for (const char* config_name : {"llama_gqa", "qwen2_tied"}) {
    const ModelConfig config = testdata::tiny_config(config_name);
    const auto v1 = testdata::random_checkpoint(config, 1100),
               v2 = testdata::random_checkpoint(config, 1101);
    for (int tp : {world().size(), std::max(1, world().size() / 2)}) {
      if (world().size() % tp) continue;
      const auto want = testdata::expected_shards(config, v2, tp, world().rank() % tp);
      for (Plane p : {Plane::kMpiHost, Plane::kMpiPinnedToDevice, Plane::kDeviceTransport}) {
        // Broadcast and scatter from the reader rank, every rank reading
        // (device parameters: through pinned staging, whatever the transport),
        // and a reader per node (nodes of half the world, each transport split)
        // with both distributions, and with the node readers taking turns at
        // the broadcast buckets (modes 5 and 6: every replicated tensor
        // broadcast, so that scatter has broadcast buckets too).
        for (int mode = 0; mode < 7; ++mode) {
          const Distribution d = mode == 0 || mode == 3 || mode == 5 ? Distribution::kBroadcast
                                                                     : Distribution::kScatter;
          PlaneSetup s = make_plane(p);
          TensorParallelModel model(config, model_options(tp, s));
          ReloadOptions o;
          o.distribution = d;
          o.readers = mode == 2 ? Readers::kAll : mode >= 3 ? Readers::kNode : Readers::kOne;
          o.ranks_per_node = std::max(1, world().size() / 2);
          o.bucket_bytes = 4000;
          o.pipeline_depth = 2;
          o.reader_rank = world().size() - 1;
          o.rotate_broadcast_roots = mode >= 5;
          if (mode == 6) o.scatter_replicated_bytes = 0;
          ReloadWorkspace ws;
          reload(model, *s.data, v1, o, ws);
          const auto before = pointers(model);
          const ReloadResult r = reload(model, *s.data, v2, o, ws);
          const std::string what = std::string(config_name) + " tp " + std::to_string(tp) + ", " +
                                   name_of(p) + ", " + std::string(distribution_name(d)) +
                                   " readers " + std::string(readers_name(o.readers)) +
                                   (o.rotate_broadcast_roots ? " rotated broadcast roots" : "");
          EXPECT_TRUE(r.complete()) << what;
          expect_bytes(model, want, what);
          EXPECT_EQ(pointers(model), before) << what;
          EXPECT_EQ(r.transport, p == Plane::kDeviceTransport ? "emulated-device" : "mpi") << what;
          // Every rank reading into host parameters needs no pipeline; device
          // parameters are staged through one at the depth asked for.
          EXPECT_EQ(r.pipeline_depth, mode == 2 && p == Plane::kMpiHost ? 0 : 2) << what;
        }
      }
    }
  }
}

// A broadcast bucket verified block by block where the view is in device
// memory (the device sums 4 KiB blocks, the host combines them into the 64 KiB
// blocks a rank's writes read): a flip is caught where rank 1 reads the bytes,
// naming them, and changes nothing elsewhere; both happen.
TEST(DataPlane, ABroadcastViewOnTheDeviceIsVerifiedWhereItIsRead) {
  TPRELOAD_REQUIRE_RANKS(2);
  const ModelConfig config = testdata::tiny_config("llama_wide");
  const int tp = world().size();
  const auto v1 = testdata::random_checkpoint(config, 1201),
             v2 = testdata::random_checkpoint(config, 1202);
  const auto want = testdata::expected_shards(config, v2, tp, world().rank());
  int caught = 0, harmless = 0;
  for (std::uint64_t j = 0; j < 16; ++j) {
    PlaneSetup s = make_plane(Plane::kDeviceTransport);
    TensorParallelModel model(config, model_options(tp, s));
    ReloadOptions o;
    o.distribution = Distribution::kBroadcast;
    o.bucket_bytes = 1 << 20;
    ReloadWorkspace ws;
    reload(model, *s.data, v1, o, ws);
    const std::uint64_t bit = j * (std::uint64_t{64} << 13) + 8 * 999 + 5;  // every 64 KiB
    std::unique_ptr<DataTransport> data = std::move(s.data);
    if (world().rank() == 1)
      data = std::make_unique<testing::FaultyTransport>(std::move(data), 2,
                                                        testing::FaultyTransport::Fault::kFlipBit,
                                                        std::chrono::seconds(5), bit);
    std::string error;
    try {
      reload(model, *data, v2, o, ws);
    } catch (const CommError& e) {
      error = e.what();
    }
    const std::string what = "bit " + std::to_string(bit);
    ASSERT_TRUE(mpitest::same_on_every_rank(error)) << what << ": " << error;
    if (error.empty()) {
      ++harmless;
      for (const auto& [name, t] : want)
        EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(name), t))
            << what << ": unnoticed, and landed in " << name;
      continue;
    }
    ++caught;
    EXPECT_NE(error.find("arrived corrupted on rank 1/" + std::to_string(tp) + " in its bytes ["),
              std::string::npos)
        << what << ": " << error;
  }
  EXPECT_GT(caught, 0) << "no flip landed in bytes rank 1 reads: the test proves nothing";
  EXPECT_GT(harmless, 0) << "every flip was caught: rank 1 verifies bytes it does not read";
}

TEST(DataPlane, Int8AndKernelFormatOnDeviceParameters) {
  const ModelConfig config = testdata::tiny_config("mistral_mqa");
  const auto ckpt = testdata::random_checkpoint(config, 1200);
  const int tp = world().size();
  // The expected bytes: this rank's shards sliced and quantized by the tests'
  // own rules and formula.
  const auto want = testdata::expected_int8_shards(config, ckpt, tp, world().rank());
  ASSERT_FALSE(want.empty());
  for (Plane p : {Plane::kMpiPinnedToDevice, Plane::kDeviceTransport}) {
    for (Distribution d : {Distribution::kBroadcast, Distribution::kScatter}) {
      PlaneSetup s = make_plane(p);
      TensorParallelModel model(config, model_options(tp, s, "int8"));
      ReloadOptions o;
      o.distribution = d;
      o.bucket_bytes = 700;
      ReloadWorkspace ws;
      const ReloadResult r = reload(model, *s.data, ckpt, o, ws);
      EXPECT_TRUE(r.complete());
      expect_bytes(model, want, std::string(name_of(p)) + " " + std::string(distribution_name(d)));
    }
  }
  // Kernel format: the same bytes, written as per-rank shards and copied by name.
  std::string dir(256, '\0');
  if (world().rank() == 0) {
    char tmpl[] = "/tmp/tpreload-data-plane-XXXXXX";
    if (!mkdtemp(tmpl)) {  // leaving here would leave the other ranks in the broadcast
      ADD_FAILURE() << "mkdtemp failed";
      world().abort(3);
    }
    dir = tmpl;
    auto source = testdata::memory_source(ckpt);
    write_kernel_shards(config, *source, dir + "/kernel", {tp, "int8"});
    dir.resize(256, '\0');
  }
  world().broadcast(MutableBytes(dir.data(), dir.size()), 0);
  dir = dir.c_str();
  for (Plane p : {Plane::kMpiPinnedToDevice, Plane::kDeviceTransport}) {
    PlaneSetup s = make_plane(p);
    TensorParallelModel model(config, model_options(tp, s, "int8"));
    ReloadOptions o;
    o.format = WeightFormat::kKernel;
    o.bucket_bytes = 900;
    ReloadWorkspace ws;
    auto source = world().rank() == 0 ? open_weight_source(dir + "/kernel") : nullptr;
    EXPECT_TRUE(reload_weights(model, world(), *s.data, source.get(), o, &ws).complete());
    expect_bytes(model, want, std::string("kernel ") + name_of(p));
  }
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// Staging per memory space stays bucket-sized (pipeline depth x send + receive),
// counted both by the report and by the device's own allocation counters.
// A stalled apply in a job: one rank's device never finishes its bucket's work.
// That rank's wait times out, every rank raises the same ModelError naming the
// device (none hangs), and the job goes on: the next reload, with the device
// working again, loads every parameter on every rank. Host transport (over a
// device transport the stuck device stalls the transfer itself, which ends the
// job at its deadline like any stalled transfer), default and atomic mode.
TEST(DataPlane, AStalledDeviceOnOneRankIsTheSameErrorOnEveryRankAndTheJobGoesOn) {
  TPRELOAD_REQUIRE_RANKS(2);
  using Clock = std::chrono::steady_clock;
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 1300);
  const int tp = world().size();
  const int stuck = world().size() - 1;
  const auto want = testdata::expected_shards(config, ckpt, tp, world().rank());
  for (Plane p : {Plane::kMpiPinnedToDevice}) {
    for (bool atomic : {false, true}) {
      PlaneSetup s = make_plane(p);
      TensorParallelModel model(config, model_options(tp, s));
      ReloadOptions o;
      o.device_timeout = std::chrono::milliseconds(300);
      o.atomic = atomic;
      o.bucket_bytes = 4096;
      const std::string what = std::string(name_of(p)) + (atomic ? " atomic" : "");
      ReloadWorkspace ws;
      if (world().rank() == stuck) s.device->stall(true);
      const auto start = Clock::now();
      std::string error;
      try {
        reload(model, *s.data, ckpt, o, ws);
        ADD_FAILURE() << what << ": a stalled device went unnoticed";
      } catch (const ModelError& e) {
        error = e.what();
      }
      EXPECT_LT(Clock::now() - start, std::chrono::seconds(20)) << what;
      EXPECT_NE(error.find("within 300 ms"), std::string::npos) << what << ": " << error;
      EXPECT_NE(error.find("emulated device"), std::string::npos) << what << ": " << error;
      EXPECT_TRUE(mpitest::same_on_every_rank(error)) << what << ": " << error;
      resume(s, stuck);
      world().barrier();
      ReloadWorkspace fresh;  // the stuck rank abandoned its staging
      const ReloadResult r = reload(model, *s.data, ckpt, o, fresh);
      EXPECT_TRUE(r.complete()) << what;
      for (const auto& [name, t] : want)
        EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(name), t))
            << what << ": " << name;
    }
  }
}

// Fingerprints read device parameters back: a device stuck on one rank there is
// the same CommError on every rank, soon, instead of its peers waiting in the
// gather; with the device working again they are every rank's zlib CRC-32s of
// its shards (computed here from the tests' own slicing).
TEST(DataPlane, AStuckDeviceWhileGatheringFingerprintsIsTheSameErrorOnEveryRank) {
  TPRELOAD_REQUIRE_RANKS(2);
  using Clock = std::chrono::steady_clock;
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 1310);
  const int tp = world().size(), stuck = world().size() - 1;
  PlaneSetup s = make_plane(Plane::kMpiPinnedToDevice);
  TensorParallelModel model(config, model_options(tp, s));
  ReloadOptions o;
  o.bucket_bytes = 4096;
  ReloadWorkspace ws;
  ASSERT_TRUE(reload(model, *s.data, ckpt, o, ws).complete());
  if (world().rank() == stuck) s.device->stall(true);
  const auto start = Clock::now();
  std::string error;
  try {
    gather_fingerprints(model, world(), std::chrono::milliseconds(300));
    ADD_FAILURE() << "a stuck device went unnoticed";
  } catch (const CommError& e) {
    error = e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(error.find("reading the parameters back for their fingerprints failed on rank " +
                       std::to_string(stuck) + "/"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("within 300 ms"), std::string::npos) << error;
  EXPECT_TRUE(mpitest::same_on_every_rank(error)) << error;
  resume(s, stuck);
  world().barrier();

  const auto fingerprints = gather_fingerprints(model, world(), std::chrono::seconds(20));
  ASSERT_EQ(fingerprints.size(), model.named_parameters().size());
  for (int r = 0; r < tp; ++r) {
    for (const auto& [name, t] : testdata::expected_shards(config, ckpt, tp, r)) {
      const auto f = std::find_if(fingerprints.begin(), fingerprints.end(),
                                  [&](const ParamFingerprint& p) { return p.name == name; });
      ASSERT_NE(f, fingerprints.end()) << name;
      const at::Tensor c = t.contiguous();
      const auto want = static_cast<std::uint32_t>(
          crc32(0L, static_cast<const Bytef*>(c.data_ptr()), static_cast<uInt>(c.nbytes())));
      EXPECT_EQ(f->crc32_by_rank.at(static_cast<std::size_t>(r)), want) << name << " on rank " << r;
    }
  }
}

// Every rank reading, device parameters: one rank's device gets stuck while
// another rank's read fails. The read failure is what every rank raises, and the
// stuck rank still abandons the staging its device may touch instead of
// keeping it for the next reload (or freeing it).
TEST(DataPlane, AStuckDeviceAbandonsItsStagingAlsoWhenAReadFailureIsRaised) {
  TPRELOAD_REQUIRE_RANKS(2);
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 1400);
  const int stuck = world().size() - 1;
  PlaneSetup s = make_plane(Plane::kMpiPinnedToDevice);
  TensorParallelModel model(config, model_options(world().size(), s));
  ReloadOptions o;
  o.readers = Readers::kAll;
  o.device_timeout = std::chrono::milliseconds(300);
  o.bucket_bytes = 4096;
  std::unique_ptr<WeightSource> source = testdata::memory_source(ckpt);
  if (world().rank() == 0) {
    std::uint64_t total = 0;
    for (const auto& t : source->tensors()) total += t.nbytes;
    // Half way through rank 0's own share (about 1 / world size of the bytes).
    source = std::make_unique<testing::FaultySource>(
        std::move(source), total / (2 * world().size()), testing::FaultySource::Fault::kFail);
  }
  if (world().rank() == stuck) s.device->stall(true);
  ReloadWorkspace ws;
  std::string error;
  try {
    reload_weights(model, world(), *s.data, source.get(), o, &ws);
    ADD_FAILURE() << "a failed read went unnoticed";
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("failed on rank 0 (--readers all"), std::string::npos) << error;
  EXPECT_TRUE(mpitest::same_on_every_rank(error)) << error;
  if (world().rank() == stuck) {
    EXPECT_EQ(ws.bytes(), 0u) << "the stuck rank kept staging its device may still use";
    EXPECT_GT(s.device->live_bytes(MemoryKind::kPinnedHost), 0u) << "it was freed, not abandoned";
  }
  resume(s, stuck);
  world().barrier();
}

// The CommError a reload over a failing node transport raises ("" and a test
// failure if none).
template <typename F>
std::string node_transfer_error(F&& reload_over_faulty) {
  try {
    reload_over_faulty();
    ADD_FAILURE() << "a failed node transfer went unnoticed";
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

// A reader per node, the last node's data transport failing on every rank of
// it: the other nodes run on, and then every rank raises the same CommError
// naming that node's first rank; the failed planes are dropped, so the next
// reload (here over a sound transport) makes new ones and completes. Atomic:
// no parameter on any rank changed.
TEST(DataPlane, ANodeWhoseTransportFailsIsOneErrorOnEveryRankAndTheNextReloadWorks) {
  TPRELOAD_REQUIRE_RANKS(2);
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto v1 = testdata::random_checkpoint(config, 1500),
             v2 = testdata::random_checkpoint(config, 1501);
  const int n = world().size(), per_node = std::max(1, n / 2);
  const int last_node = (n - 1) / per_node * per_node;  // its first rank
  const auto want_v1 = testdata::expected_shards(config, v1, n, world().rank());
  const auto want_v2 = testdata::expected_shards(config, v2, n, world().rank());
  for (bool atomic : {false, true}) {
    PlaneSetup s = make_plane(Plane::kMpiHost);
    std::unique_ptr<DataTransport> faulty = mpi_world().make_data_transport();
    if (world().rank() >= last_node)
      faulty = std::make_unique<testing::FaultyTransport>(std::move(faulty), 2,
                                                          testing::FaultyTransport::Fault::kFail);
    TensorParallelModel model(config, model_options(n, s));
    ReloadOptions o;
    o.readers = Readers::kNode;
    o.ranks_per_node = per_node;
    o.bucket_bytes = 4096;
    o.atomic = atomic;
    ReloadWorkspace ws;
    ASSERT_TRUE(reload(model, *s.data, v1, o, ws).complete());
    const std::string error = node_transfer_error([&] { reload(model, *faulty, v2, o, ws); });
    EXPECT_NE(error.find("a transfer within a node (--readers node; ranks of that node may hold a "
                         "mix of old and new weights) failed on rank " +
                         std::to_string(last_node) + "/" + std::to_string(n)),
              std::string::npos)
        << error;
    EXPECT_TRUE(mpitest::same_on_every_rank(error)) << error;
    EXPECT_EQ(ws.node_planes(), nullptr) << "planes a failure may have broken were kept";
    if (atomic) {
      for (const auto& [name, t] : want_v1)
        EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(name), t))
            << "atomic: " << name << " changed";
    }
    ASSERT_TRUE(reload(model, *s.data, v2, o, ws).complete());
    for (const auto& [name, t] : want_v2)
      EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(name), t)) << name;
  }
}

// A reader per node, the node reader of the last node alone failing its second
// transfer after it completed (its peers received the bucket: only the
// reader's side reports an error): the peers would wait for that reader's next
// announcement; instead the whole node stops at it, every rank raises the same
// CommError naming the reader, soon (well before the control plane's 60 s), and
// the next reload over a sound transport completes.
TEST(DataPlane, ANodeReaderWhoseTransferAloneFailsStopsItsWholeNodeAtOnce) {
  TPRELOAD_REQUIRE_RANKS(2);
  using Clock = std::chrono::steady_clock;
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto v1 = testdata::random_checkpoint(config, 1520),
             v2 = testdata::random_checkpoint(config, 1521);
  const int n = world().size(), per_node = n >= 4 ? n / 2 : n;  // nodes of two ranks or more
  const int reader = (n - 1) / per_node * per_node;  // the last node's first rank: its reader
  const auto want_v2 = testdata::expected_shards(config, v2, n, world().rank());
  PlaneSetup s = make_plane(Plane::kMpiHost);
  std::unique_ptr<DataTransport> faulty = mpi_world().make_data_transport();
  if (world().rank() == reader)
    faulty = std::make_unique<testing::FaultyTransport>(
        std::move(faulty), 2, testing::FaultyTransport::Fault::kFailAfter);
  TensorParallelModel model(config, model_options(n, s));
  ReloadOptions o;
  o.readers = Readers::kNode;
  o.ranks_per_node = per_node;
  o.bucket_bytes = 4096;
  ReloadWorkspace ws;
  ASSERT_TRUE(reload(model, *s.data, v1, o, ws).complete());
  const auto start = Clock::now();
  const std::string error = node_transfer_error([&] { reload(model, *faulty, v2, o, ws); });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20)) << "the node waited for its reader";
  EXPECT_NE(error.find("a transfer within a node (--readers node; ranks of that node may hold a "
                       "mix of old and new weights) failed on rank " +
                       std::to_string(reader) + "/" + std::to_string(n) + ": "),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("injected fault"), std::string::npos) << error;
  EXPECT_TRUE(mpitest::same_on_every_rank(error)) << error;
  ASSERT_TRUE(reload(model, *s.data, v2, o, ws).complete());
  for (const auto& [name, t] : want_v2)
    EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(name), t)) << name;
}

// A transport whose split fails on the ranks from `from` on (as NCCL failing to
// join a node's communicator would), and otherwise is `inner`.
class SplitFailsFrom final : public DataTransport {
 public:
  SplitFailsFrom(DataTransport& inner, int from) : inner_(inner), from_(from) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend(); }
  MemoryKind memory() const override { return inner_.memory(); }
  std::unique_ptr<Transfer> broadcast(MutableBytes buffer, int root) override {
    return inner_.broadcast(buffer, root);
  }
  std::unique_ptr<Transfer> scatter(ConstBytes send, const std::vector<ByteRange>& ranges,
                                    MutableBytes recv, int root) override {
    return inner_.scatter(send, ranges, recv, root);
  }
  // (after taking part in the inner split, which is collective, as a failed NCCL
  // join fails after its collective steps)
  std::unique_ptr<DataTransport> split(Communicator& group, int color, int key) override {
    auto split = inner_.split(group, color, key);
    if (rank() >= from_) raise<CommError>("rank ", rank(), " could not join its node's transport");
    return split;
  }

 private:
  DataTransport& inner_;
  int from_;
};

// Making the node planes fails on the last node only: every rank raises the same
// error, before anything is read, and no parameter changed.
TEST(DataPlane, ANodeThatCannotMakeItsPlanesIsOneErrorBeforeAnyRead) {
  TPRELOAD_REQUIRE_RANKS(2);
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto v1 = testdata::random_checkpoint(config, 1510),
             v2 = testdata::random_checkpoint(config, 1511);
  const int n = world().size(), per_node = std::max(1, n / 2);
  const int last_node = (n - 1) / per_node * per_node;
  PlaneSetup s = make_plane(Plane::kMpiHost);
  SplitFailsFrom data(*s.data, last_node);
  TensorParallelModel model(config, model_options(n, s));
  ReloadOptions o;
  ReloadWorkspace ws;
  ASSERT_TRUE(reload(model, *s.data, v1, o, ws).complete());  // one reader: no split
  o.readers = Readers::kNode;
  o.ranks_per_node = per_node;
  std::string error;
  try {
    reload(model, data, v2, o, ws);
    ADD_FAILURE() << "a failed split went unnoticed";
  } catch (const CommError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("making the node planes for --readers node (nothing was reloaded) failed "
                       "on rank " +
                       std::to_string(last_node) + "/" + std::to_string(n) + ": rank " +
                       std::to_string(last_node) + " could not join its node's transport"),
            std::string::npos)
      << error;
  EXPECT_TRUE(mpitest::same_on_every_rank(error)) << error;
  EXPECT_EQ(ws.node_planes(), nullptr) << "half-made planes were kept";
  for (const auto& [name, t] : testdata::expected_shards(config, v1, n, world().rank()))
    EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(name), t)) << name << " changed";
  ASSERT_TRUE(reload(model, *s.data, v2, o, ws).complete()) << "over a transport that splits";
  for (const auto& [name, t] : testdata::expected_shards(config, v2, n, world().rank()))
    EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(name), t)) << name;
}

TEST(DataPlane, StagingPerMemorySpaceIsBoundedByTheBucket) {
  const ModelConfig config = parse_model_config(R"({"architectures":["LlamaForCausalLM"],
    "hidden_size":128,"intermediate_size":512,"num_hidden_layers":8,"num_attention_heads":8,
    "num_key_value_heads":8,"vocab_size":1000,"torch_dtype":"bfloat16"})",
                                                "staging test");
  const auto ckpt = testdata::random_checkpoint(config, 1300);
  std::uint64_t model_bytes = 0;
  for (const auto& [name, t] : ckpt) model_bytes += t.numel() * t.element_size();
  const std::uint64_t bucket = 16 << 10, row = 512 * 2;  // largest row: down_proj, 512 bf16
  for (Plane p : {Plane::kMpiPinnedToDevice, Plane::kDeviceTransport}) {
    for (Distribution d : {Distribution::kBroadcast, Distribution::kScatter}) {
      PlaneSetup s = make_plane(p);
      TensorParallelModel model(config, model_options(world().size(), s));
      std::uint64_t param_bytes = 0;
      for (const auto& [n, t] : model.named_parameters())
        param_bytes += t.numel() * t.element_size();
      s.device->reset_peaks();
      ReloadOptions o;
      o.distribution = d;
      o.bucket_bytes = bucket;
      o.pipeline_depth = 2;
      ReloadWorkspace ws;
      const ReloadResult r = reload(model, *s.data, ckpt, o, ws);
      ASSERT_TRUE(r.complete());
      const std::uint64_t bound = o.pipeline_depth * 2 * (bucket + row);
      const std::string what = std::string(name_of(p)) + " " + std::string(distribution_name(d));
      EXPECT_LE(r.staging.device, bound) << what;
      EXPECT_LE(r.staging.pinned, bound) << what;
      EXPECT_EQ(r.staging.host, 0u) << what;
      EXPECT_LT(r.peak_staging_bytes * 4, model_bytes) << what;
      // The device's own count: parameters, staging, and the bounded pieces the
      // sink and model read back through (nothing of the model's size).
      EXPECT_LE(s.device->peak_bytes(MemoryKind::kDevice), param_bytes + bound) << what;
      EXPECT_LE(s.device->peak_bytes(MemoryKind::kPinnedHost), bound) << what;
    }
  }
}

}  // namespace
}  // namespace tpreload
