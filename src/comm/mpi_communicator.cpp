#include "tpreload/comm/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>

#include "tpreload/comm/chunking.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload {

namespace detail {

[[noreturn]] void raise_mpi_error(int code, const char* expr, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) std::snprintf(text, sizeof text, "?");
  int rank = -1;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  raise<CommError>("rank ", rank, ": ", expr, " failed with MPI error ", code, " (", text,
                   ") at ", file, ":", line);
}

}  // namespace detail

// ---------------------------------------------------------------- MpiRuntime

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
    owns_ = true;
    if (provided < MPI_THREAD_SERIALIZED)
      raise<CommError>("MPI provides thread level ", provided,
                       ", tpreload needs MPI_THREAD_SERIALIZED (", MPI_THREAD_SERIALIZED, ")");
  }
  // Errors come back as codes that MPI_CHECK turns into exceptions, not aborts.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));
}

MpiRuntime::~MpiRuntime() {
  if (owns_ && !finalized_)
    log().warn("MPI was not finalized (an error is unwinding); the launcher will end the job");
}

void MpiRuntime::finalize() {
  if (!owns_ || finalized_) return;
  finalized_ = true;
  MPI_CHECK(MPI_Finalize());
}

// ----------------------------------------------------------- MpiCommunicator

std::unique_ptr<MpiCommunicator> MpiCommunicator::world(CommOptions options) {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(dup, options, "world"));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, CommOptions options, std::string label)
    : comm_(comm), options_(options), label_(std::move(label)) {
  if (options_.max_message_bytes == 0 || options_.max_message_bytes > INT_MAX)
    raise<UsageError>("CommOptions::max_message_bytes must be in [1, ", INT_MAX, "], got ",
                      options_.max_message_bytes);
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // MPI_Comm_free is local in practice (no peer synchronisation); skip it after
  // finalize or once broken, when pending requests may still reference comm_.
  if (comm_ != MPI_COMM_NULL && !finalized && !broken_) MPI_Comm_free(&comm_);
}

void MpiCommunicator::check_usable(const char* op) const {
  if (broken_)
    raise<CommError>("rank ", rank_, "/", size_, ": ", op, " on communicator '", label_,
                     "' after an earlier failure; the communicator is broken");
}

void MpiCommunicator::check_root(const char* op, int root) const {
  check_usable(op);
  if (root < 0 || root >= size_)
    raise<UsageError>("rank ", rank_, "/", size_, ": ", op, " root ", root,
                      " is not a rank of communicator '", label_, "'");
}

void MpiCommunicator::wait(std::vector<MPI_Request>& requests, const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + options_.timeout;
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int rc = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                               MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      broken_ = true;
      detail::raise_mpi_error(rc, what.c_str(), __FILE__, __LINE__);
    }
    if (done) return;
    if (std::chrono::steady_clock::now() > deadline) {
      broken_ = true;
      raise<CommTimeoutError>(
          "rank ", rank_, "/", size_, ": ", what, " on communicator '", label_,
          "' did not complete within ", options_.timeout.count(),
          " ms; a peer is dead, stuck, or not making the same call");
    }
    // Non-blocking collectives advance only inside MPI_Test, so poll tightly
    // (yielding, for oversubscribed ranks) while data may be flowing; a sleep here
    // cost 15x on a 10 MB broadcast. Only a wait past one second, a stalled peer,
    // backs off to sleeping.
    if (std::chrono::steady_clock::now() - start < std::chrono::seconds(1) || polls % 64 != 0)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void MpiCommunicator::broadcast(MutableBytes buffer, int root) {
  check_root("broadcast", root);
  std::vector<MPI_Request> requests;
  for (const ByteRange& piece : split_range(buffer.size, options_.max_message_bytes)) {
    requests.emplace_back(MPI_REQUEST_NULL);
    MPI_CHECK(MPI_Ibcast(buffer.data + piece.offset, static_cast<int>(piece.length), MPI_BYTE,
                         root, comm_, &requests.back()));
  }
  wait(requests, detail::concat("broadcast of ", buffer.size, " bytes from root ", root));
}

void MpiCommunicator::scatterv(ConstBytes send, const std::vector<ByteRange>& ranges,
                               MutableBytes recv, int root) {
  check_root("scatterv", root);
  if (ranges.size() != static_cast<std::size_t>(size_))
    raise<UsageError>("rank ", rank_, "/", size_, ": scatterv got ", ranges.size(),
                      " ranges for ", size_, " ranks");
  if (recv.size != ranges[rank_].length)
    raise<UsageError>("rank ", rank_, "/", size_, ": scatterv receive buffer holds ", recv.size,
                      " bytes but the range for this rank is ", ranges[rank_].length, " bytes");
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r)
      if (ranges[r].end() > send.size)
        raise<UsageError>("rank ", rank_, "/", size_, ": scatterv range for rank ", r, " [",
                          ranges[r].offset, ", ", ranges[r].end(), ") exceeds the ", send.size,
                          "-byte send buffer");
  }
  const auto rounds = plan_scatter_rounds(ranges, options_.max_message_bytes, INT_MAX);
  std::vector<MPI_Request> requests;
  std::vector<int> counts(size_), displs(size_);
  for (const ScatterRound& round : rounds) {
    for (int r = 0; r < size_; ++r) {
      counts[r] = static_cast<int>(round.send[r].length);
      displs[r] = counts[r] ? static_cast<int>(round.send[r].offset - round.base) : 0;
    }
    // Send arguments are read only at the root; MPI copies counts and displs on posting.
    const std::byte* base = rank_ == root ? send.data + round.base : nullptr;
    requests.emplace_back(MPI_REQUEST_NULL);
    MPI_CHECK(MPI_Iscatterv(base, counts.data(), displs.data(), MPI_BYTE,
                            recv.data + round.recv_offset[rank_], counts[rank_], MPI_BYTE, root,
                            comm_, &requests.back()));
  }
  wait(requests, detail::concat("scatterv of ", recv.size, " bytes to this rank from root ",
                                root, " (", rounds.size(), " rounds)"));
}

template <typename T>
void MpiCommunicator::allreduce_words(T* values, std::size_t count, MPI_Datatype type, MPI_Op op,
                                      const char* name) {
  check_usable(name);
  std::vector<MPI_Request> requests;
  for (const ByteRange& piece : split_range(count * sizeof(T), options_.max_message_bytes / 8 * 8)) {
    requests.emplace_back(MPI_REQUEST_NULL);
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values + piece.offset / sizeof(T),
                             static_cast<int>(piece.length / sizeof(T)), type, op, comm_,
                             &requests.back()));
  }
  wait(requests, detail::concat(name, " of ", count, " words"));
}

void MpiCommunicator::allreduce_bits(std::uint64_t* words, std::size_t count, BitOp op) {
  allreduce_words(words, count, MPI_UINT64_T, op == BitOp::kOr ? MPI_BOR : MPI_BAND,
                  op == BitOp::kOr ? "allreduce(OR)" : "allreduce(AND)");
}

void MpiCommunicator::allreduce_ints(std::int64_t* values, std::size_t count, IntOp op) {
  const MPI_Op mpi_op = op == IntOp::kSum ? MPI_SUM : op == IntOp::kMax ? MPI_MAX : MPI_MIN;
  const char* name = op == IntOp::kSum   ? "allreduce(SUM)"
                     : op == IntOp::kMax ? "allreduce(MAX)"
                                         : "allreduce(MIN)";
  allreduce_words(values, count, MPI_INT64_T, mpi_op, name);
}

void MpiCommunicator::allreduce_floats(float* values, std::size_t count) {
  allreduce_words(values, count, MPI_FLOAT, MPI_SUM, "allreduce(SUM float)");
}

void MpiCommunicator::barrier() {
  check_usable("barrier");
  std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
  MPI_CHECK(MPI_Ibarrier(comm_, &requests[0]));
  wait(requests, "barrier");
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  check_usable("split");
  // MPI_Comm_split blocks without a deadline; a timed barrier first makes sure
  // every rank has arrived, so the split itself cannot wait on a missing peer.
  barrier();
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
  return std::unique_ptr<Communicator>(new MpiCommunicator(
      sub, options_, detail::concat(label_, "/split(color=", color, ")")));
}

void MpiCommunicator::abort(int code) noexcept {
  log().error("aborting the MPI job with code {} (communicator '{}')", code, label_);
  log().flush();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this only satisfies [[noreturn]].
}

}  // namespace tpreload
