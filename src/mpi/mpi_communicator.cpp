#include "tpreload/comm/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <mutex>
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
  raise<CommError>("rank ", rank, ": ", expr, " failed with MPI error ", code, " (", text, ") at ",
                   file, ":", line);
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
    if (provided < MPI_THREAD_SERIALIZED) {  // the same on every rank: finalize together
      MPI_Finalize();
      raise<CommError>("MPI provides thread level ", provided,
                       ", tpreload needs MPI_THREAD_SERIALIZED (", MPI_THREAD_SERIALIZED, ")");
    }
  } else {
    // MPI belongs to the host program: check its thread level, change nothing.
    int provided = 0;
    MPI_CHECK(MPI_Query_thread(&provided));
    if (provided < MPI_THREAD_SERIALIZED)
      raise<CommError>("MPI was initialised with thread level ", provided,
                       "; tpreload needs MPI_THREAD_SERIALIZED (", MPI_THREAD_SERIALIZED, ")");
  }
  if (owns_) MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
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

MpiCommHandle::~MpiCommHandle() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // MPI_Comm_free is local in practice (no peer synchronisation).
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

MpiCommHandle& MpiCommHandle::operator=(MpiCommHandle&& other) noexcept {
  if (this != &other) {
    MpiCommHandle old(release());
    comm_ = other.release();
  }
  return *this;
}

void MpiCommunicator::check_options(const CommOptions& options) {
  // (at least one 64-bit word: allreduces split their words by it)
  if (options.max_message_bytes < 8 || options.max_message_bytes > INT_MAX)
    raise<UsageError>("CommOptions::max_message_bytes must be in [8, ", INT_MAX, "], got ",
                      options.max_message_bytes);
  detail::check_timeout("CommOptions::timeout", options.timeout);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::world(CommOptions options) {
  check_options(options);
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  return std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(MpiCommHandle(dup), options, "world"));
}

MpiCommunicator::MpiCommunicator(MpiCommHandle comm, CommOptions options, std::string label)
    : handle_(std::move(comm)), comm_(handle_.get()), options_(options), label_(std::move(label)) {
  // Errors come back as codes that MPI_CHECK turns into exceptions, not aborts.
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  // Once broken, requests may still reference comm_: leave it to process exit.
  if (broken_) handle_.release();
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

void MpiCommunicator::fail(const std::string& message, bool timeout) {
  broken_ = true;
  if (options_.abort_on_failure) {
    // Requests still in flight point into the caller's buffers; a process that
    // went on would let MPI write into freed memory. End the whole job instead.
    log().critical("{}; aborting the job", message);
    log().flush();
    MPI_Abort(MPI_COMM_WORLD, timeout ? 124 : 1);
  }
  if (timeout) throw CommTimeoutError(message);
  throw CommError(message);
}

// Requests of one non-blocking collective, with the count and displacement
// arrays MPI reads until it completes. Failure and expiry go through the
// communicator's fail(), which aborts the job by default.
class MpiTransfer final : public Transfer {
  struct Abandoned {
    std::vector<MPI_Request> requests;
    std::vector<std::vector<int>> counts, displs;
  };

 public:
  MpiTransfer(MpiCommunicator& comm, std::string what)
      : Transfer(std::move(what), Clock::now() + comm.options_.timeout), comm_(comm) {}
  // A transfer destroyed with requests still active (its failure or expiry was
  // thrown, CommOptions::abort_on_failure off) leaves its arrays to MPI: a later
  // MPI call may still progress those requests, and MPI reads the counts and
  // displacements until they complete. Kept until the process exits.
  ~MpiTransfer() override {
    const bool active = std::any_of(requests.begin(), requests.end(),
                                    [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
    if (!active) return;
    static std::mutex mutex;
    static auto* const kept = new std::vector<Abandoned>;  // (reachable, never freed)
    std::lock_guard<std::mutex> lock(mutex);
    kept->push_back({std::move(requests), std::move(counts), std::move(displs)});
  }

  std::vector<MPI_Request> requests;
  std::vector<std::vector<int>> counts, displs;

 private:
  bool poll() override {
    std::vector<MPI_Status> statuses(requests.size());
    int done = 0;
    const int rc =
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, statuses.data());
    if (rc != MPI_SUCCESS) {
      // MPI_ERR_IN_STATUS: the first request that failed says what went wrong
      // (those not complete yet say MPI_ERR_PENDING).
      int code = rc;
      for (const MPI_Status& st : statuses)
        if (rc == MPI_ERR_IN_STATUS && st.MPI_ERROR != MPI_SUCCESS &&
            st.MPI_ERROR != MPI_ERR_PENDING) {
          code = st.MPI_ERROR;
          break;
        }
      comm_.fail(
          detail::concat(prefix(), " failed with MPI error ", code, " (", error_text(code), ")"),
          false);
    }
    return done != 0;
  }
  void expire() override {
    comm_.fail(detail::concat(prefix(), " did not complete within ", comm_.options_.timeout.count(),
                              " ms; a peer is dead, stuck, or not making the same call"),
               true);
  }
  std::string prefix() const {
    return detail::concat("rank ", comm_.rank_, "/", comm_.size_, ": ", what(),
                          " on communicator '", comm_.label_, "'");
  }
  static std::string error_text(int code) {
    char text[MPI_MAX_ERROR_STRING] = {0};
    int length = 0;
    MPI_Error_string(code, text, &length);
    return text;
  }

  MpiCommunicator& comm_;
};

// A failure while posting leaves earlier posts of the same transfer in flight:
// it goes through fail() like a failure while waiting.
#define TPRELOAD_MPI_POST(comm, expr, what)                                                    \
  do {                                                                                         \
    const int tpreload_rc_ = (expr);                                                           \
    if (tpreload_rc_ != MPI_SUCCESS)                                                           \
      (comm).fail(detail::concat("rank ", (comm).rank_, "/", (comm).size_, ": posting ", what, \
                                 " failed: ", #expr, " returned MPI error ", tpreload_rc_),    \
                  false);                                                                      \
  } while (0)

std::unique_ptr<Transfer> MpiCommunicator::post_broadcast(MutableBytes buffer, int root) {
  check_root("broadcast", root);
  auto t = std::make_unique<MpiTransfer>(
      *this, detail::concat("broadcast of ", buffer.size, " bytes from root ", root));
  for (const ByteRange& piece : split_range(buffer.size, options_.max_message_bytes)) {
    t->requests.emplace_back(MPI_REQUEST_NULL);
    TPRELOAD_MPI_POST(*this,
                      MPI_Ibcast(buffer.data + piece.offset, static_cast<int>(piece.length),
                                 MPI_BYTE, root, comm_, &t->requests.back()),
                      t->what());
  }
  return t;
}

void MpiCommunicator::broadcast(MutableBytes buffer, int root) {
  post_broadcast(buffer, root)->wait();
}

std::unique_ptr<Transfer> MpiCommunicator::post_scatterv(ConstBytes send,
                                                         const std::vector<ByteRange>& ranges,
                                                         MutableBytes recv, int root) {
  check_root("scatterv", root);
  detail::check_scatter_arguments(detail::concat("rank ", rank_, "/", size_, ": scatterv"), rank_,
                                  size_, send, ranges, recv, rank_ == root);
  // The root may receive in place: its range of the send buffer is its result.
  const bool in_place =
      rank_ == root && recv.size > 0 && recv.data == send.data + ranges[root].offset;
  const auto rounds = plan_scatter_rounds(ranges, options_.max_message_bytes, INT_MAX);
  auto t = std::make_unique<MpiTransfer>(
      *this, detail::concat("scatterv of ", recv.size, " bytes to this rank from root ", root, " (",
                            rounds.size(), " rounds)"));
  // Each posted round keeps its own counts and displacements until it completes:
  // MPI forbids changing them while a non-blocking collective is in flight.
  t->counts.assign(rounds.size(), std::vector<int>(size_));
  t->displs.assign(rounds.size(), std::vector<int>(size_));
  for (std::size_t k = 0; k < rounds.size(); ++k) {
    const ScatterRound& round = rounds[k];
    for (int r = 0; r < size_; ++r) {
      t->counts[k][r] = static_cast<int>(round.send[r].length);
      t->displs[k][r] = t->counts[k][r] ? static_cast<int>(round.send[r].offset - round.base) : 0;
    }
    const std::byte* base = rank_ == root ? send.data + round.base : nullptr;
    t->requests.emplace_back(MPI_REQUEST_NULL);
    void* into = in_place ? MPI_IN_PLACE : static_cast<void*>(recv.data + round.recv_offset[rank_]);
    TPRELOAD_MPI_POST(
        *this,
        MPI_Iscatterv(base, t->counts[k].data(), t->displs[k].data(), MPI_BYTE, into,
                      t->counts[k][rank_], MPI_BYTE, root, comm_, &t->requests.back()),
        t->what());
  }
  return t;
}

std::unique_ptr<Transfer> MpiCommunicator::post_exchange(ConstBytes send, MutableBytes recv,
                                                         const std::vector<std::uint64_t>& counts) {
  check_usable("exchange");
  const detail::ExchangeLayout layout = detail::exchange_layout(rank_, size_, send, recv, counts);
  auto t = std::make_unique<MpiTransfer>(
      *this, detail::concat("exchange of ", send.size, " bytes sent and ", recv.size, " received"));
  const auto ranks = static_cast<std::size_t>(size_);
  // Pieces of one pair match in the order they were posted (MPI does not let
  // messages of one source, tag and communicator overtake each other).
  auto post = [&](bool sending, int peer) {
    const std::uint64_t bytes =
        sending ? counts[static_cast<std::size_t>(rank_) * ranks + static_cast<std::size_t>(peer)]
                : counts[static_cast<std::size_t>(peer) * ranks + static_cast<std::size_t>(rank_)];
    const std::uint64_t at =
        (sending ? layout.send_at : layout.recv_at)[static_cast<std::size_t>(peer)];
    for (const ByteRange& piece : split_range(bytes, options_.max_message_bytes)) {
      t->requests.emplace_back(MPI_REQUEST_NULL);
      const int count = static_cast<int>(piece.length);
      if (sending)
        TPRELOAD_MPI_POST(*this,
                          MPI_Isend(send.data + at + piece.offset, count, MPI_BYTE, peer, 0, comm_,
                                    &t->requests.back()),
                          t->what());
      else
        TPRELOAD_MPI_POST(*this,
                          MPI_Irecv(recv.data + at + piece.offset, count, MPI_BYTE, peer, 0, comm_,
                                    &t->requests.back()),
                          t->what());
    }
  };
  for (int peer = 0; peer < size_; ++peer) post(false, peer);  // receives first
  for (int peer = 0; peer < size_; ++peer) post(true, peer);
  return t;
}

void MpiCommunicator::scatterv(ConstBytes send, const std::vector<ByteRange>& ranges,
                               MutableBytes recv, int root) {
  post_scatterv(send, ranges, recv, root)->wait();
}

template <typename T>
void MpiCommunicator::allreduce_words(T* values, std::size_t count, MPI_Datatype type, MPI_Op op,
                                      const char* name) {
  check_usable(name);
  MpiTransfer t(*this, detail::concat(name, " of ", count, " words"));
  for (const ByteRange& piece :
       split_range(count * sizeof(T), options_.max_message_bytes / 8 * 8)) {
    t.requests.emplace_back(MPI_REQUEST_NULL);
    TPRELOAD_MPI_POST(*this,
                      MPI_Iallreduce(MPI_IN_PLACE, values + piece.offset / sizeof(T),
                                     static_cast<int>(piece.length / sizeof(T)), type, op, comm_,
                                     &t.requests.back()),
                      t.what());
  }
  t.wait();
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
  MpiTransfer t(*this, "barrier");
  t.requests.emplace_back(MPI_REQUEST_NULL);
  TPRELOAD_MPI_POST(*this, MPI_Ibarrier(comm_, &t.requests.back()), t.what());
  t.wait();
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  check_usable("split");
  // MPI_Comm_split blocks without a deadline; a timed barrier first makes sure
  // every rank has arrived, so the split itself cannot wait on a missing peer.
  barrier();
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
  return std::unique_ptr<Communicator>(new MpiCommunicator(
      MpiCommHandle(sub), options_, detail::concat(label_, "/split(color=", color, ")")));
}

void MpiCommunicator::abort(int code) noexcept {
  log().error("aborting the MPI job with code {} (communicator '{}')", code, label_);
  log().flush();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this only satisfies [[noreturn]].
}

namespace {

// Host bytes over a communicator of their own (a duplicate of the control one).
class MpiDataTransport final : public DataTransport {
 public:
  explicit MpiDataTransport(std::unique_ptr<MpiCommunicator> comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  std::string backend() const override { return "mpi"; }
  MemoryKind memory() const override { return MemoryKind::kHost; }
  std::unique_ptr<Transfer> broadcast(MutableBytes buffer, int root) override {
    return comm_->post_broadcast(buffer, root);
  }
  std::unique_ptr<Transfer> scatter(ConstBytes send, const std::vector<ByteRange>& ranges,
                                    MutableBytes recv, int root) override {
    return comm_->post_scatterv(send, ranges, recv, root);
  }
  std::unique_ptr<Transfer> exchange(ConstBytes send, MutableBytes recv,
                                     const std::vector<std::uint64_t>& counts) override {
    return comm_->post_exchange(send, recv, counts);
  }
  // Over a split of this transport's own communicator (never the control one).
  std::unique_ptr<DataTransport> split(Communicator&, int color, int key) override {
    std::unique_ptr<Communicator> sub = comm_->split(color, key);
    return std::make_unique<MpiDataTransport>(
        std::unique_ptr<MpiCommunicator>(static_cast<MpiCommunicator*>(sub.release())));
  }

 private:
  std::unique_ptr<MpiCommunicator> comm_;
};

}  // namespace

std::unique_ptr<DataTransport> MpiCommunicator::make_data_transport() {
  check_usable("make_data_transport");
  barrier();  // MPI_Comm_dup blocks without a deadline: make sure every rank is here
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(comm_, &dup));
  return std::make_unique<MpiDataTransport>(std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(MpiCommHandle(dup), options_, label_ + "/data")));
}

int MpiCommunicator::node_leader() {
  check_usable("node_leader");
  barrier();  // MPI_Comm_split_type and the blocking reduce below have no deadline
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  MpiCommHandle owner(node);
  int leader = rank_;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node));
  return leader;
}

std::pair<int, int> MpiCommunicator::node_rank_and_size() {
  check_usable("node_rank_and_size");
  barrier();  // MPI_Comm_split_type blocks without a deadline
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  MpiCommHandle owner(node);
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(node, &rank));
  MPI_CHECK(MPI_Comm_size(node, &size));
  return {rank, size};
}

}  // namespace tpreload
