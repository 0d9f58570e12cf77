// Internal: RAII owners of HDF5 identifiers, the process-wide HDF5 lock, and the
// type conventions shared by the HDF5 reader and writer. Not part of the public API.
//
// libhdf5 (the serial build) is not thread-safe: every call into it must hold
// hdf5_mutex(), in readers and writers alike.
#pragma once

#include <hdf5.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "tpreload/core/dtype.h"

namespace tpreload::detail {

// Owns one hid_t and closes it with the matching H5?close on destruction.
class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);

  H5Id() = default;
  H5Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Id(H5Id&& other) noexcept
      : id_(std::exchange(other.id_, H5I_INVALID_HID)), closer_(other.closer_) {}
  H5Id& operator=(H5Id&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      closer_ = other.closer_;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Close now and throw (via H5_CHECK) if closing fails, e.g. a file's final flush.
  void close();

 private:
  void reset() noexcept;

  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Each wraps a creating call through H5_CHECK (throws CheckpointError with the
// HDF5 error stack on failure) and returns the owner.
H5Id h5_file(hid_t id);
H5Id h5_group(hid_t id);
H5Id h5_dataset(hid_t id);
H5Id h5_space(hid_t id);
H5Id h5_type(hid_t id);
H5Id h5_attr(hid_t id);
H5Id h5_plist(hid_t id);
H5Id h5_object(hid_t id);

// The lock every HDF5 call must hold. Also makes sure the library is initialised
// and its automatic error printing is off (errors are reported by exceptions).
std::unique_lock<std::mutex> lock_hdf5();

// The 16-bit IEEE float type h5py uses for numpy.float16 (little-endian).
H5Id make_float16_type();
// h5py's bool type: an int8 enum {FALSE = 0, TRUE = 1}.
H5Id make_bool_type();
// The little-endian in-memory/file type of `dtype` (bfloat16: uint16).
H5Id make_h5_type(DType dtype);

}  // namespace tpreload::detail
