// An accelerator as the data plane and the parameter sink see it: two memory
// spaces (device memory and page-locked host memory), and in-order streams of
// asynchronous work (copies, fills, the int8 processing kernel) whose completion
// is observed through events. No torch, no CUDA types here: the CUDA backend
// (tpreload/comm/cuda_device.h) implements it over the CUDA runtime, and the
// tests implement it over host memory to run every path around the device on a
// machine without one.
//
// Ownership and lifetime: memory comes from memory() and pinned_memory() as
// Buffers; a pointer handed to a stream operation must stay valid until an event
// recorded after that operation is done(). Streams and events are owned by their
// callers (unique_ptr). A stream is used by one thread at a time.
//
// Errors: CommError naming the operation and the device's own error text.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "tpreload/comm/memory.h"
#include "tpreload/core/dtype.h"
#include "tpreload/core/error.h"
#include "tpreload/core/head_rows.h"

namespace tpreload {

enum class CopyKind : std::uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// Marks a point in a stream.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // True once every operation enqueued on the stream before the event completed.
  // Never blocks. Throws CommError when the device reports an error.
  virtual bool done() = 0;
  // A wait for this event gave up (wait_for_event's timeout): the device is
  // stuck. A device whose frees wait for all of its work (CUDA's cudaFree and
  // cudaFreeHost) leaks the memory freed from then on instead of blocking the
  // freeing thread for ever.
  virtual void gave_up() noexcept {}
};

class DeviceStream {
 public:
  virtual ~DeviceStream() = default;

  // Asynchronous, in order on this stream.
  virtual void copy(void* dst, const void* src, std::uint64_t bytes, CopyKind kind) = 0;
  // `rows` rows of `width` bytes: row i from src + i * src_pitch to dst + i * dst_pitch.
  virtual void copy_rows(void* dst, std::uint64_t dst_pitch, const void* src,
                         std::uint64_t src_pitch, std::uint64_t width, std::uint64_t rows,
                         CopyKind kind) = 0;
  virtual void zero(void* dst, std::uint64_t bytes) = 0;
  // The int8 processing of tpreload/model/quantize.h on device memory: `rows` rows
  // of `cols` elements of `dtype` (bfloat16, float16 or float32), row r at
  // src + r * row_stride elements, into q [rows x cols] and scale [rows]. The
  // bytes equal the CPU kernel's.
  virtual void quantize_int8(const void* src, DType dtype, std::int64_t rows, std::int64_t cols,
                             std::int64_t row_stride, std::int8_t* q, float* scale) = 0;

  // Floating values of `from` into `to` (tpreload/model/convert.h): `rows` rows of
  // `cols` elements, source row r at src + r * src_stride elements, into
  // contiguous rows at dst. The bytes equal the CPU conversion's.
  virtual void convert(const void* src, DType from, std::int64_t src_stride, void* dst, DType to,
                       std::int64_t rows, std::int64_t cols) = 0;

  // fp8::requantize_step (tpreload/core/float8.h) on device memory: the largest
  // of staged[first, first + count) into *out (out may be null) and the n
  // float8_e4m3fn codes at w requantized from staged[from] to it. The bytes equal
  // the CPU's.
  virtual void requantize_fp8(std::uint8_t* w, std::uint64_t n, const float* staged,
                              std::uint32_t from, std::uint32_t first, std::uint32_t count,
                              float* out) = 0;

  // fp8::quantize_step (tpreload/core/float8.h) on device memory: n values at x,
  // of `dtype` (float32, bfloat16 or float16), into n float8_e4m3fn codes and
  // their one scale, amax / 448. The bytes equal the CPU's.
  virtual void quantize_fp8(const void* x, DType dtype, std::uint64_t n, std::uint8_t* codes,
                            float* scale) = 0;

  // fp8::quantize_block_step on device memory: rows x cols values at x, of
  // `dtype`, into as many float8_e4m3fn codes and the ceil(rows / block) x
  // ceil(cols / block) grid of their scales. The bytes equal the CPU's.
  virtual void quantize_fp8_block(const void* x, DType dtype, std::int64_t rows, std::int64_t cols,
                                  std::int64_t block, std::uint8_t* codes, float* grid) = 0;

  // head_rows_element (tpreload/core/head_rows.h) for every element of `a`, whose
  // weight, scales and output are in device memory. The bytes equal the CPU's.
  virtual void head_rows(const HeadRows& a) = 0;

  // The raw CRC-32C of every kCrc32cBlock-byte block of device memory
  // [src, src + bytes) (tpreload/core/crc32c.h; the last block may be shorter)
  // into `raw`, pinned host memory of crc32c_blocks(bytes) values, readable once
  // the stream got past this point. crc32c_from_blocks() combines them.
  virtual void crc32c_blocks(const void* src, std::uint64_t bytes, std::uint32_t* raw) = 0;

  // An event marking everything enqueued so far.
  virtual std::unique_ptr<DeviceEvent> record() = 0;
  // Later work on this stream waits for `event` (recorded on any stream of the
  // same device) without blocking the host.
  virtual void wait_for(DeviceEvent& event) = 0;
  // The backend's handle (a cudaStream_t for CUDA), for transports that enqueue on it.
  virtual void* native_handle() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // "cuda:0 (NVIDIA H200, 139.8 GiB)"; "emulated device" in the tests.
  virtual std::string describe() const = 0;
  // "cuda", "emulated".
  virtual std::string backend() const = 0;
  virtual int ordinal() const = 0;
  // Whether the host can read and write device memory directly (true only for
  // the tests' emulated device): tensors over its memory are then CPU tensors.
  virtual bool host_addressable() const = 0;
  // Make this the calling thread's current device until the returned scope
  // ends, which makes current again the device that was (for libraries, such as
  // NCCL, that work on the current device; every method here does it for
  // itself, and the caller's current device, LibTorch's for example, is its own).
  class Scope {
   public:
    virtual ~Scope() = default;
  };
  [[nodiscard]] virtual std::unique_ptr<Scope> make_current() = 0;
  virtual Allocator& memory() = 0;         // MemoryKind::kDevice
  virtual Allocator& pinned_memory() = 0;  // MemoryKind::kPinnedHost
  virtual std::unique_ptr<DeviceStream> make_stream() = 0;
};

// Block until `event` is done. Throws CommTimeoutError naming `what` and the
// device when it is not done within `timeout` (the work is stuck: the caller
// must not reuse the buffers it touches), CommError for a device error.
void wait_for_event(DeviceEvent& event, std::chrono::milliseconds timeout, const std::string& what);

// Record an event on `stream` and wait for it (wait_for_event).
void synchronize(DeviceStream& stream, std::chrono::milliseconds timeout, const std::string& what);

// Runs `wait`, a wait for device work that touches `buffer` (synchronize(),
// a sink's flush()); when the device does not finish in time, the buffer is
// abandoned, never freed under that work, before the CommTimeoutError goes on.
template <typename Wait>
void wait_or_abandon(Buffer& buffer, Wait&& wait) {
  try {
    wait();
  } catch (const CommTimeoutError&) {
    buffer.release();
    throw;
  }
}

}  // namespace tpreload
