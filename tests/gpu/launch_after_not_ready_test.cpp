// cudaEventQuery's "not ready" is left as the thread's last error: a kernel
// launch that read the last error after it would fail though it succeeded. A
// poll that saw "not ready" (a stream held by a host function until the test
// releases it), then launches of every kernel on another stream on the same
// thread: each must succeed and compute. Needs a CUDA device: run by
// scripts/gpu_check.sh.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "held_stream.h"
#include "tpreload/comm/cuda_device.h"
#include "tpreload/core/crc32c.h"

namespace tpreload {
namespace {

using namespace std::chrono_literals;

TEST(CudaNotReady, ALaunchAfterAPollThatSawNotReadySucceeds) {
  std::shared_ptr<Device> device = open_cuda_device(0);
  auto held = device->make_stream();
  auto work = device->make_stream();
  static std::atomic<bool> released{false};  // (outlives a test that fails half-way)
  struct Release {  // (a failing check must not leave frees waiting on the held stream)
    ~Release() { released = true; }
  } release;
  ASSERT_EQ(testing::hold(*held, &released), cudaSuccess);
  auto pending = held->record();
  ASSERT_FALSE(pending->done()) << "the held stream finished: the test holds nothing";
  // The runtime's own query, as any code on the thread may make it: its "not
  // ready" stays the thread's last error (done() above clears its own).
  cudaEvent_t raw = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(raw, static_cast<cudaStream_t>(held->native_handle())), cudaSuccess);
  auto not_ready = [&] { return cudaEventQuery(raw) == cudaErrorNotReady; };

  constexpr std::uint64_t kBytes = 3 * 4096 + 17;
  Buffer host = device->pinned_memory().allocate(kBytes);
  for (std::uint64_t i = 0; i < kBytes; ++i) host.data()[i] = static_cast<std::byte>(i * 7 + 1);
  Buffer src = device->memory().allocate(kBytes);
  Buffer out = device->memory().allocate(kBytes * 2);
  Buffer scale = device->memory().allocate(4 * sizeof(float));
  Buffer sums = device->pinned_memory().allocate(crc32c_blocks(kBytes) * sizeof(std::uint32_t));
  work->copy(src.data(), host.data(), kBytes, CopyKind::kHostToDevice);
  // Every kernel, each after a fresh "not ready" on this thread.
  ASSERT_TRUE(not_ready());
  EXPECT_NO_THROW(
      work->crc32c_blocks(src.data(), kBytes, reinterpret_cast<std::uint32_t*>(sums.data())));
  ASSERT_TRUE(not_ready());
  EXPECT_NO_THROW(
      work->convert(src.data(), DType::kBFloat16, 16, out.data(), DType::kFloat32, 4, 16));
  ASSERT_TRUE(not_ready());
  EXPECT_NO_THROW(work->quantize_int8(src.data(), DType::kBFloat16, 4, 16, 16,
                                      reinterpret_cast<std::int8_t*>(out.data()),
                                      reinterpret_cast<float*>(scale.data())));
  synchronize(*work, 30s, "the kernels launched after 'not ready'");
  EXPECT_EQ(crc32c_from_blocks(reinterpret_cast<const std::uint32_t*>(sums.data()), kBytes),
            crc32c(host.data(), kBytes))
      << "the CRC-32C kernel launched after 'not ready' did not compute";
  released = true;
  synchronize(*held, 30s, "the released stream");
  EXPECT_TRUE(pending->done());
  cudaEventDestroy(raw);
}

}  // namespace
}  // namespace tpreload
