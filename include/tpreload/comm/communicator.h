// The transport interface: collectives over byte buffers between the ranks of a
// group. It knows nothing of models or tensors; the reload engine drives it from
// a plan that every rank computes identically.
//
// Every method except rank(), size(), backend() and abort() is COLLECTIVE: every
// rank of the group must make the same calls, in the same order, with the same
// sizes, roots and ranges. A rank that skips or reorders a call makes the others
// time out; they never hang (see CommOptions::timeout).
//
// Errors: a failed call, or one that does not complete within the timeout, is
// reported naming the operation, the byte count, the root and the communicator.
// By default (CommOptions::abort_on_failure) the job is then aborted: requests
// still in flight point into the caller's buffers, so no rank may go on. With
// abort_on_failure off, the call throws CommError / CommTimeoutError and the
// communicator is broken (every later call throws); the caller must then end the
// process (abort()) without touching MPI state that the failed call used.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tpreload/core/span.h"

namespace tpreload {

namespace detail {
// A deadline this far ahead at most: `what` must be positive and at most a
// year (the clock's deadline overflows past about 292 years). Throws
// UsageError naming `what`.
void check_timeout(const char* what, std::chrono::milliseconds timeout);
// The arguments of a scatterv on rank `rank` of `size`, `who` naming the call:
// one range per rank, `recv` as long as this rank's range, and on the root
// (`root` true) every range within `send`. Throws UsageError naming what is off.
void check_scatter_arguments(const std::string& who, int rank, int size, ConstBytes send,
                             const std::vector<ByteRange>& ranges, MutableBytes recv, bool root);
}  // namespace detail

enum class BitOp { kOr, kAnd };
enum class IntOp { kSum, kMax, kMin };

struct CommOptions {
  // Deadline for one collective, from its start to its completion on this rank.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Largest message handed to the backend in one call; larger transfers are
  // split. Must be at most INT32_MAX for MPI (its counts are int).
  std::uint64_t max_message_bytes = std::uint64_t{1} << 30;
  // Abort the job on a failed or timed-out collective instead of throwing.
  bool abort_on_failure = true;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi", "nccl", ...
  virtual std::string backend() const = 0;

  // Root's `buffer` is copied into every rank's `buffer`; sizes must agree.
  virtual void broadcast(MutableBytes buffer, int root) = 0;

  // Root sends `ranges[r]` of its `send` buffer to rank r, which receives it into
  // `recv` (recv.size must equal ranges[rank()].length). `ranges` has size()
  // entries and is identical on every rank; ranges may be empty, uneven, in any
  // order and over 2 GiB. `send` is read on the root only. On the root, `recv`
  // may be the root's own range of `send` (received in place, no copy).
  virtual void scatterv(ConstBytes send, const std::vector<ByteRange>& ranges, MutableBytes recv,
                        int root) = 0;

  // Element-wise OR/AND of `count` 64-bit words across ranks, in place.
  virtual void allreduce_bits(std::uint64_t* words, std::size_t count, BitOp op) = 0;

  // Element-wise sum/max/min of `count` int64 values across ranks, in place.
  virtual void allreduce_ints(std::int64_t* values, std::size_t count, IntOp op) = 0;

  // Element-wise sum of `count` floats across ranks, in place (the tensor-parallel
  // forward pass sums row-parallel outputs with it). Summation order is the
  // backend's; results agree across ranks, not bit-for-bit with a serial sum.
  virtual void allreduce_floats(float* values, std::size_t count) = 0;

  virtual void barrier() = 0;

  // Ranks with the same `color` form a new group, ordered by (key, rank).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // COLLECTIVE. The lowest rank of this communicator that runs on this rank's
  // node (shares its memory): the same on every rank of a node, different on
  // each node. The default groups ranks by host name; MPI asks
  // MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
  virtual int node_leader();

  // Ends the whole job (every rank of every group) with `code`. Not collective:
  // this is how a rank that hit an error stops peers that wait on it.
  [[noreturn]] virtual void abort(int code) noexcept = 0;
};

// COLLECTIVE (one allreduce). Short texts gathered into numbered slots: every
// rank passes the same number of slots and fills those it owns, each slot
// owned by one rank and empty on every other; returns every slot's text, each
// cut at slot_words x 8 - 1 bytes (and at a NUL). What host_names() and the
// ranks' agreement (agree_on_values) gather.
std::vector<std::string> gather_texts(Communicator& comm, const std::vector<std::string>& slots,
                                      std::size_t slot_words);

// COLLECTIVE. Every rank's host name (gethostname, at most 64 characters), in
// rank order: for messages that say where a rank runs.
std::vector<std::string> host_names(Communicator& comm);

// A communicator of one rank (tp = 1 without MPI): every collective is a no-op
// or a local copy.
std::unique_ptr<Communicator> make_local_communicator();

// Ranks as threads of one process: `size` communicators of one group, the r-th
// for the thread that plays rank r (each collective returns once every rank's
// thread has made it, or fails on every rank after `options.timeout`; split()
// makes groups of threads too). Tests and embeddings that run ranks as threads
// move their data over them with make_communicator_transport().
std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int size,
                                                                     CommOptions options = {});

// Convenience wrappers over the vector forms.
inline void allreduce_bits(Communicator& comm, std::vector<std::uint64_t>& words, BitOp op) {
  comm.allreduce_bits(words.data(), words.size(), op);
}
inline void allreduce_ints(Communicator& comm, std::vector<std::int64_t>& values, IntOp op) {
  comm.allreduce_ints(values.data(), values.size(), op);
}

}  // namespace tpreload
