// Typed exceptions and the thin check macros every layer uses.
//
// Policy: library code throws one of the types below; it never prints and never
// exits. Programs catch `tpreload::Error` in main() and return non-zero. Messages
// say who (rank), what (operation, tensor), where (file, offset) and expected vs
// actual, so that a line in a log of 8 ranks is enough to act on.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tpreload {

// Base of every exception the library throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Bad or unreadable checkpoint bytes, files or indexes.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// Transport failures: a failed collective, a timeout, an aborted communicator.
class CommError : public Error {
 public:
  using Error::Error;
};

// A collective did not complete before its deadline.
class CommTimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// A model that cannot be built or a tensor that does not fit its parameter.
class ModelError : public Error {
 public:
  using Error::Error;
};

// Reload validation failures (names not loaded, mismatching ranks).
class ValidationError : public Error {
 public:
  using Error::Error;
};

// Invalid options or misuse of the API.
class UsageError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

// Build and throw the error for a failed library call. Each is defined in the
// layer that owns the C library, which knows how to turn the code into text.
[[noreturn]] void raise_mpi_error(int code, const char* expr, const char* file, int line);
[[noreturn]] void raise_h5_error(long long code, const char* expr, const char* file, int line);
[[noreturn]] void raise_cuda_error(int code, const char* expr, const char* file, int line);
[[noreturn]] void raise_nccl_error(int code, const char* expr, const char* file, int line);

}  // namespace detail

// Throw an exception of type `Type` whose message is the concatenation of args.
template <typename Type, typename... Args>
[[noreturn]] void raise(Args&&... args) {
  throw Type(detail::concat(std::forward<Args>(args)...));
}

}  // namespace tpreload

// MPI_SUCCESS is 0 by the MPI standard, so this header needs no mpi.h.
#define MPI_CHECK(expr)                                                                 \
  do {                                                                                  \
    const int tpreload_mpi_rc_ = (expr);                                                \
    if (tpreload_mpi_rc_ != 0)                                                          \
      ::tpreload::detail::raise_mpi_error(tpreload_mpi_rc_, #expr, __FILE__, __LINE__); \
  } while (0)

// HDF5 calls return a negative herr_t or hid_t on failure. Evaluates to the value.
#define H5_CHECK(expr)                                                                             \
  ([&]() {                                                                                         \
    auto tpreload_h5_rc_ = (expr);                                                                 \
    if (tpreload_h5_rc_ < 0)                                                                       \
      ::tpreload::detail::raise_h5_error(static_cast<long long>(tpreload_h5_rc_), #expr, __FILE__, \
                                         __LINE__);                                                \
    return tpreload_h5_rc_;                                                                        \
  }())

// CUDA runtime calls return cudaSuccess (0) or an error code.
#define CUDA_CHECK(expr)                                                                  \
  do {                                                                                    \
    const int tpreload_cuda_rc_ = static_cast<int>(expr);                                 \
    if (tpreload_cuda_rc_ != 0)                                                           \
      ::tpreload::detail::raise_cuda_error(tpreload_cuda_rc_, #expr, __FILE__, __LINE__); \
  } while (0)

// NCCL calls return ncclSuccess (0) or an error code; ncclInProgress (7) is not an
// error for non-blocking communicators, and callers that expect it check it first.
#define NCCL_CHECK(expr)                                                                  \
  do {                                                                                    \
    const int tpreload_nccl_rc_ = static_cast<int>(expr);                                 \
    if (tpreload_nccl_rc_ != 0)                                                           \
      ::tpreload::detail::raise_nccl_error(tpreload_nccl_rc_, #expr, __FILE__, __LINE__); \
  } while (0)
