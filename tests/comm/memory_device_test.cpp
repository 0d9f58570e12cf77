// Memory spaces, the device interface's waits, and the emulated device the other
// tests rely on: its strictness is what makes them able to fail.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "../support/emulated_device.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/data_transport.h"
#include "tpreload/comm/device.h"
#include "tpreload/comm/memory.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

using testing::EmulatedDevice;
using namespace std::chrono_literals;

TEST(Buffer, FreesOnceThroughItsDeleterAndMoves) {
  int frees = 0;
  {
    Buffer a(new std::byte[8], 8, MemoryKind::kHost, [&](std::byte* p) {
      ++frees;
      delete[] p;
    });
    Buffer b = std::move(a);
    EXPECT_FALSE(a);
    EXPECT_EQ(b.size(), 8u);
    Buffer c;
    c = std::move(b);
    EXPECT_EQ(frees, 0);
  }
  EXPECT_EQ(frees, 1);
}

TEST(HostAllocator, GivesWritableHostMemory) {
  Buffer b = host_allocator().allocate(1000);
  ASSERT_TRUE(b);
  EXPECT_EQ(b.kind(), MemoryKind::kHost);
  std::memset(b.data(), 7, b.size());
  EXPECT_FALSE(host_allocator().allocate(0));
}

TEST(EmulatedDevice, WorkRunsOnlyOnceAnEventAfterItIsWaitedFor) {
  EmulatedDevice device(/*polls_before_done=*/3);
  Buffer d = device.memory().allocate(16);
  std::vector<std::byte> host(16, std::byte{9});
  auto stream = device.make_stream();
  stream->copy(d.data(), host.data(), 16, CopyKind::kHostToDevice);
  EXPECT_EQ(d.data()[0], std::byte{0xCD}) << "not run before a wait";
  auto event = stream->record();
  EXPECT_FALSE(event->done());
  wait_for_event(*event, 1s, "test copy");
  EXPECT_EQ(d.data()[15], std::byte{9});
}

TEST(EmulatedDevice, RefusesHostPointersAsDeviceMemoryAndTheReverse) {
  EmulatedDevice device;
  Buffer d = device.memory().allocate(64);
  Buffer pinned = device.pinned_memory().allocate(64);
  std::vector<std::byte> host(64);
  auto stream = device.make_stream();
  EXPECT_THROW(stream->copy(host.data(), pinned.data(), 64, CopyKind::kHostToDevice), CommError);
  EXPECT_THROW(stream->copy(d.data(), d.data(), 64, CopyKind::kHostToDevice), CommError);
  EXPECT_THROW(stream->copy(d.data() + 8, d.data(), 64, CopyKind::kDeviceToDevice), CommError)
      << "a range running past the allocation";
  EXPECT_THROW(stream->zero(host.data(), 8), CommError);
  EXPECT_NO_THROW(stream->copy(d.data(), pinned.data(), 64, CopyKind::kHostToDevice));
}

TEST(EmulatedDevice, CountsLiveAndPeakBytesPerSpace) {
  EmulatedDevice device;
  {
    Buffer a = device.memory().allocate(100);
    Buffer b = device.memory().allocate(50);
    Buffer p = device.pinned_memory().allocate(30);
    EXPECT_EQ(device.live_bytes(MemoryKind::kDevice), 150u);
    EXPECT_EQ(device.live_bytes(MemoryKind::kPinnedHost), 30u);
  }
  EXPECT_EQ(device.live_bytes(MemoryKind::kDevice), 0u);
  EXPECT_EQ(device.peak_bytes(MemoryKind::kDevice), 150u);
}

// Once a wait gives up, the device is stuck: what is freed from then on is
// leaked (a CUDA free would wait for the stuck work), not freed, until the
// work finishes after all.
TEST(WaitForEvent, AWaitThatGivesUpStopsTheDeviceFreeingMemory) {
  EmulatedDevice device;
  Buffer before = device.memory().allocate(100);
  Buffer after = device.pinned_memory().allocate(40);
  device.stall(true);
  before = Buffer();  // freed while stalled, before anything gave up: counted
  EXPECT_EQ(device.frees_while_stalled(), 1u);
  auto stream = device.make_stream();
  auto event = stream->record();
  EXPECT_THROW(wait_for_event(*event, 20ms, "copying"), CommTimeoutError);
  after = Buffer();
  EXPECT_EQ(device.frees_while_stalled(), 1u) << "freed after the wait gave up";
  EXPECT_EQ(device.leaked_bytes(), 40u);
  EXPECT_EQ(device.live_bytes(MemoryKind::kPinnedHost), 40u) << "leaked memory stays the device's";
  device.stall(false);  // the stuck work finishes: frees free again
  Buffer again = device.memory().allocate(8);
  again = Buffer();
  EXPECT_EQ(device.live_bytes(MemoryKind::kDevice), 0u);
  EXPECT_EQ(device.leaked_bytes(), 40u);
}

TEST(WaitForEvent, AStalledDeviceTimesOutNamingTheWork) {
  EmulatedDevice device;
  device.stall(true);
  auto stream = device.make_stream();
  auto event = stream->record();
  const auto start = std::chrono::steady_clock::now();
  try {
    wait_for_event(*event, 50ms, "copying bucket 3");
    FAIL() << "a stalled event completed";
  } catch (const CommTimeoutError& e) {
    EXPECT_NE(
        std::string(e.what()).find("copying bucket 3 did not complete on the device within 50 ms"),
        std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(EmulatedDevice, CrossStreamWaitOrdersWork) {
  EmulatedDevice device;
  Buffer a = device.memory().allocate(8), b = device.memory().allocate(8);
  std::vector<std::byte> host(8, std::byte{4});
  auto first = device.make_stream(), second = device.make_stream();
  first->copy(a.data(), host.data(), 8, CopyKind::kHostToDevice);
  auto copied = first->record();
  second->wait_for(*copied);
  second->copy(b.data(), a.data(), 8, CopyKind::kDeviceToDevice);
  synchronize(*second, 1s, "second stream");
  EXPECT_EQ(b.data()[7], std::byte{4}) << "the second stream ran the first's copy first";
}

TEST(CommunicatorTransport, MovesHostBytesOverTheCommunicator) {
  auto comm = make_local_communicator();
  auto data = make_communicator_transport(*comm);
  EXPECT_EQ(data->memory(), MemoryKind::kHost);
  std::vector<std::byte> send(10, std::byte{3}), recv(4);
  auto t = data->scatter(ConstBytes(send.data(), send.size()), {{6, 4}},
                         MutableBytes(recv.data(), 4), 0);
  EXPECT_TRUE(t->test());
  t->wait();
  EXPECT_EQ(recv[3], std::byte{3});
}

// Every backend's scatter checks its arguments through one function: one range
// per rank, a receive buffer as long as this rank's range, and on the root
// every range within the send buffer (an offset past it, and a length that
// would wrap the end around, included).
TEST(ScatterArguments, EachMistakeIsNamed) {
  std::vector<std::byte> send(16), recv(4);
  const ConstBytes all(send.data(), send.size());
  const MutableBytes four(recv.data(), 4);
  auto error = [&](const std::vector<ByteRange>& ranges, MutableBytes into, bool root) {
    try {
      detail::check_scatter_arguments("rank 1/3: scatter", 1, 3, all, ranges, into, root);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error({{0, 4}, {4, 4}, {8, 4}}, four, true), "");
  EXPECT_EQ(error({{0, 4}, {4, 4}}, four, true), "rank 1/3: scatter: got 2 ranges for 3 ranks");
  EXPECT_EQ(error({{0, 4}, {4, 3}, {8, 4}}, four, false),
            "rank 1/3: scatter: the receive buffer holds 4 bytes but the range for this rank is 3 "
            "bytes");
  EXPECT_EQ(error({{0, 4}, {4, 4}, {14, 4}}, four, true),
            "rank 1/3: scatter: the range for rank 2 [14, +4) exceeds the 16-byte send buffer");
  EXPECT_EQ(error({{0, 4}, {4, 4}, {14, 4}}, four, false), "") << "only the root has a send buffer";
  EXPECT_EQ(error({{20, 0}, {4, 4}, {8, 4}}, four, true),
            "rank 1/3: scatter: the range for rank 0 [20, +0) exceeds the 16-byte send buffer");
  EXPECT_EQ(error({{8, ~std::uint64_t{0} - 4}, {4, 4}, {8, 4}}, four, true),
            "rank 1/3: scatter: the range for rank 0 [8, +18446744073709551611) exceeds the "
            "16-byte send buffer")
      << "a length that wraps past the end";
  // The local communicator goes through it.
  auto comm = make_local_communicator();
  try {
    comm->scatterv(all, {{14, 4}}, four, 0);
    ADD_FAILURE() << "a range past the send buffer was copied";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "local scatterv: the range for rank 0 [14, +4) exceeds the 16-byte send buffer");
  }
}

}  // namespace
}  // namespace tpreload
