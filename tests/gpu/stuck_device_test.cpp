// A CUDA device stuck in work that does not finish (a stream held by a host
// function that waits for the test): once a wait for it gives up, memory freed
// is leaked instead of blocking in cudaFree / cudaFreeHost (which wait for all
// of the device's work), and freed again once the work finishes. Needs a CUDA
// device: run by scripts/gpu_check.sh.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "held_stream.h"
#include "tpreload/comm/cuda_device.h"

namespace tpreload {
namespace {

using namespace std::chrono_literals;

// Frees `buffer` on another thread: whether that returned within `limit`.
bool returns_within(std::chrono::milliseconds limit, Buffer& buffer) {
  auto done = std::async(std::launch::async, [&buffer] { buffer = Buffer(); });
  return done.wait_for(limit) == std::future_status::ready;
}

TEST(CudaStuckDevice, FreesAreLeakedWhileItIsStuckAndFreeAgainAfter) {
  std::shared_ptr<Device> device = open_cuda_device(0);
  // (64 MiB each: far above the allocation granularity, so that a free shows)
  constexpr std::uint64_t kSize = std::uint64_t{64} << 20;
  Buffer device_memory = device->memory().allocate(kSize);
  Buffer pinned = device->pinned_memory().allocate(kSize);
  Buffer after = device->memory().allocate(kSize);
  auto stream = device->make_stream();
  static std::atomic<bool> released{false};  // (outlives a test that fails half-way)
  ASSERT_EQ(testing::hold(*stream, &released), cudaSuccess);
  auto stuck = stream->record();
  EXPECT_THROW(wait_for_event(*stuck, 200ms, "the held stream"), CommTimeoutError);
  // cudaFree and cudaFreeHost would wait for the held stream: leaked instead.
  EXPECT_TRUE(returns_within(5s, device_memory)) << "cudaFree waited for the stuck work";
  EXPECT_TRUE(returns_within(5s, pinned)) << "cudaFreeHost waited for the stuck work";
  released = true;
  synchronize(*stream, 30s, "the released stream");
  // The work finished: this free is a real one (it returns, and the memory is
  // the device's again).
  std::size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  EXPECT_TRUE(returns_within(5s, after));
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_GE(free_after, free_before + kSize / 2) << "freed after the work finished: still leaked";
}

}  // namespace
}  // namespace tpreload
