// The MPI backend of the control plane (Communicator) and of the host data plane
// (DataTransport), on host memory. Its own library, tpreload_mpi: the reload
// engine does not link MPI; programs do.
//
// Every collective is posted non-blocking (MPI_Ibcast, MPI_Iscatterv,
// MPI_Iallreduce, MPI_Ibarrier) and completed by polling against the deadline in
// CommOptions, so a dead or diverging peer gives a CommTimeoutError instead of a
// hang. Messages above CommOptions::max_message_bytes (at most INT32_MAX) are
// split, so sizes are 64-bit end to end.
//
// Needs MPI initialised with at least MPI_THREAD_SERIALIZED (MpiRuntime does this);
// one communicator must not be used from two threads at once.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "tpreload/comm/communicator.h"
#include "tpreload/comm/data_transport.h"

namespace tpreload {

// Owns MPI initialisation for the process. finalize() is the explicit, collective
// teardown; the destructor never waits on other ranks (if finalize() was not
// called, e.g. while unwinding an error, it only logs, and the launcher ends the
// job).
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  void finalize();
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

 private:
  bool owns_ = false;
  bool finalized_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
};

// Move-only owner of an MPI_Comm (freed on destruction unless MPI is finalized).
class MpiCommHandle {
 public:
  explicit MpiCommHandle(MPI_Comm comm = MPI_COMM_NULL) : comm_(comm) {}
  ~MpiCommHandle();
  MpiCommHandle(MpiCommHandle&& other) noexcept : comm_(other.release()) {}
  MpiCommHandle& operator=(MpiCommHandle&& other) noexcept;
  MpiCommHandle(const MpiCommHandle&) = delete;
  MpiCommHandle& operator=(const MpiCommHandle&) = delete;
  MPI_Comm get() const { return comm_; }
  MPI_Comm release() {
    MPI_Comm c = comm_;
    comm_ = MPI_COMM_NULL;
    return c;
  }

 private:
  MPI_Comm comm_;
};

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over a duplicate of MPI_COMM_WORLD (collective over the world).
  static std::unique_ptr<MpiCommunicator> world(CommOptions options = {});

  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  const CommOptions& options() const { return options_; }

  void broadcast(MutableBytes buffer, int root) override;
  void scatterv(ConstBytes send, const std::vector<ByteRange>& ranges, MutableBytes recv,
                int root) override;
  void allreduce_bits(std::uint64_t* words, std::size_t count, BitOp op) override;
  void allreduce_ints(std::int64_t* values, std::size_t count, IntOp op) override;
  void allreduce_floats(float* values, std::size_t count) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  int node_leader() override;  // MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)
  [[noreturn]] void abort(int code) noexcept override;

  // The non-blocking forms: post and return the transfer in flight (the blocking
  // broadcast() and scatterv() are these plus wait()). The caller waits for it
  // before reusing the buffers or posting a collective it must not overtake.
  std::unique_ptr<Transfer> post_broadcast(MutableBytes buffer, int root);
  // DataTransport::exchange as MPI non-blocking sends and receives, one per
  // peer (in pieces of at most CommOptions::max_message_bytes), all posted at
  // once; only ranks with bytes for each other take part.
  std::unique_ptr<Transfer> post_exchange(ConstBytes send, MutableBytes recv,
                                          const std::vector<std::uint64_t>& counts);
  std::unique_ptr<Transfer> post_scatterv(ConstBytes send, const std::vector<ByteRange>& ranges,
                                          MutableBytes recv, int root);

  // COLLECTIVE. A host-memory data transport over a duplicate of this
  // communicator, so that data transfers never match control collectives.
  std::unique_ptr<DataTransport> make_data_transport();

  // COLLECTIVE. The ranks that share this rank's node (MPI_COMM_TYPE_SHARED):
  // this rank's index among them and their count.
  std::pair<int, int> node_rank_and_size();

 private:
  friend class MpiTransfer;
  MpiCommunicator(MpiCommHandle comm, CommOptions options, std::string label);
  static void check_options(const CommOptions& options);
  void check_usable(const char* op) const;
  // Mark broken; abort the job (CommOptions::abort_on_failure) or throw.
  [[noreturn]] void fail(const std::string& message, bool timeout);
  void check_root(const char* op, int root) const;
  template <typename T>
  void allreduce_words(T* values, std::size_t count, MPI_Datatype type, MPI_Op op,
                       const char* name);

  MpiCommHandle handle_;
  MPI_Comm comm_ = MPI_COMM_NULL;  // handle_.get(), for brevity
  CommOptions options_;
  std::string label_;  // "world", "world/split(color=1)", ... for messages
  int rank_ = 0;
  int size_ = 1;
  bool broken_ = false;
};

}  // namespace tpreload
