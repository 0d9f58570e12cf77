// The data plane: moves bucket bytes between buffers of one memory space, with
// asynchronous completion and a deadline on every wait. The control plane
// (Communicator: metadata, agreement, validation) stays separate, on host memory.
//
// Backends: MPI over host buffers (MpiCommunicator::make_data_transport), NCCL
// over device buffers (tpreload/comm/nccl_transport.h), and any Communicator's own
// collectives (make_communicator_transport). A third backend implements this
// interface; the plan and the model do not change.
//
// COLLECTIVE: broadcast() and scatter() are posted by every rank of the transport
// in the same order with the same sizes, roots and ranges (the reload plan makes
// sure of it). Each returns a Transfer that the caller waits for before touching
// the buffers again and before posting the next transfer's wait.
//
// Ordering: a transport does not wait for work pending on other streams or
// threads. The bytes to send must be in place when a transfer is posted (for
// device memory: the copy that filled them waited for on the host), and the
// bytes received may be read only after the transfer's wait() returned.
//
// Errors: a failed transfer throws CommError naming the operation and bytes; one
// that does not complete by its deadline throws CommTimeoutError (and, by the
// backend's policy, aborts the job or the communicator first: buffers still in
// flight must not be reused).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tpreload/comm/memory.h"
#include "tpreload/core/span.h"

namespace tpreload {

class Communicator;
class Device;

namespace detail {
// Where the messages of an exchange (DataTransport::exchange) lie on rank
// `rank` of `size`: the one to rank t at send_at[t] of `send`, the one from
// rank f at recv_at[f] of `recv`. Throws UsageError naming the rank for counts
// or buffers that do not match.
struct ExchangeLayout {
  std::vector<std::uint64_t> send_at, recv_at;
};
ExchangeLayout exchange_layout(int rank, int size, ConstBytes send, MutableBytes recv,
                               const std::vector<std::uint64_t>& counts);
}  // namespace detail

// One posted transfer.
class Transfer {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Transfer() = default;

  // Whether it completed (never blocks). Throws CommError if it failed.
  bool test();
  // Block until it completes. Past the deadline set when it was posted: expire().
  void wait();
  // "broadcast of 16777216 bytes from root 0", for messages.
  const std::string& what() const { return what_; }

 protected:
  Transfer(std::string what, Clock::time_point deadline)
      : what_(std::move(what)), deadline_(deadline) {}
  // True when complete; throws CommError on failure.
  virtual bool poll() = 0;
  // Called once the deadline passed: abort what the backend must abort, then throw
  // CommTimeoutError (or end the job, by the backend's policy).
  [[noreturn]] virtual void expire() = 0;
  Clock::time_point deadline() const { return deadline_; }

 private:
  std::string what_;
  Clock::time_point deadline_;
  bool done_ = false;
};

// A transfer that completed when it was posted.
std::unique_ptr<Transfer> completed_transfer(std::string what);

class DataTransport {
 public:
  virtual ~DataTransport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi", "nccl", "control:<backend>".
  virtual std::string backend() const = 0;
  // Where the buffers given to this transport live: kHost (pageable or pinned
  // host memory) or kDevice (memory of device()).
  virtual MemoryKind memory() const = 0;
  virtual Device* device() const { return nullptr; }

  // Root's `buffer` to every rank's `buffer` (same size everywhere).
  virtual std::unique_ptr<Transfer> broadcast(MutableBytes buffer, int root) = 0;
  // Root sends `ranges[r]` of `send` to rank r, which receives it into `recv`
  // (recv.size == ranges[rank()].length). `ranges` is identical on every rank;
  // ranges may be empty and over 2 GiB. On the root, `recv` may be its own range
  // of `send` (in place).
  virtual std::unique_ptr<Transfer> scatter(ConstBytes send, const std::vector<ByteRange>& ranges,
                                            MutableBytes recv, int root) = 0;

  // Point to point among all ranks (an all-to-all of uneven sizes): rank f sends
  // counts[f * size() + t] bytes to rank t. This rank's messages lie one after
  // another in `send`, by destination rank; what it receives lands one message
  // after another in `recv`, by source rank. `counts` is identical on every
  // rank, its diagonal 0 (a rank copies to itself), `send` and `recv` exactly
  // as long as this rank's row and column add up to (UsageError otherwise). A
  // pair with nothing to send moves nothing, and no byte passes through a third
  // rank. The default runs one scatter() per rank that sends anything, each
  // waited for before the next, and returns a completed Transfer; a backend
  // with point-to-point operations posts them all at once instead.
  virtual std::unique_ptr<Transfer> exchange(ConstBytes send, MutableBytes recv,
                                             const std::vector<std::uint64_t>& counts);
  // COLLECTIVE. A transport of the same kind over the ranks that share `color`,
  // ordered by (key, rank): `group` is the control communicator split the same
  // way (Communicator::split(color, key)), which must outlive the result.
  // Collective over this transport's ranks (MPI) or the group's (NCCL): a rank
  // that fails does so after taking part. Throws UsageError for a backend that
  // cannot be split.
  virtual std::unique_ptr<DataTransport> split(Communicator& group, int color, int key);
};

// A host-memory transport over `comm`'s own blocking collectives (each transfer is
// complete when posted). `comm` must outlive it. For worlds whose control
// communicator also carries the data: one process, tests, reload_weights()
// without a data transport.
std::unique_ptr<DataTransport> make_communicator_transport(Communicator& comm);

}  // namespace tpreload
