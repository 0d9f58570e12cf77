// Fault injection for tests (seams around the code under test, never edits of
// it): a data transport that fails, stalls, flips a bit in or exits the process
// at its Nth transfer, and a weight source that fails or stalls after N bytes.
// Usable in one process (around make_communicator_transport) and under MPI
// (around an MPI or emulated-device transport): it changes only what this rank
// sees, as a fault on one link would.
#pragma once

#include <cstdlib>

#include <chrono>
#include <cstdint>
#include <memory>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/data_transport.h"

namespace tpreload::testing {

class FaultyTransport final : public DataTransport {
 public:
  enum class Fault {
    kFail,       // the Nth transfer throws CommError when waited for
    kFailAfter,  // it runs as usual, and once complete throws CommError here all
                 // the same (peers see it succeed: a failure on one side only)
    kStall,      // it never completes (the wait expires after `timeout`)
    kFlipBit,    // it completes, with one bit of the bytes received flipped
    kExit,       // the process exits (status 3) when it is posted: a rank that dies
  };
  // Transfers count from 1 on this rank. With kFlipBit the bit flipped is bit
  // `bit` of the received bytes (modulo their size); a transfer that receives
  // nothing here flips nothing.
  FaultyTransport(std::unique_ptr<DataTransport> inner, int nth, Fault fault,
                  std::chrono::milliseconds timeout = std::chrono::seconds(5),
                  std::uint64_t bit = 12345);
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  MemoryKind memory() const override { return inner_->memory(); }
  Device* device() const override { return inner_->device(); }
  std::unique_ptr<Transfer> broadcast(MutableBytes buffer, int root) override;
  std::unique_ptr<Transfer> scatter(ConstBytes send, const std::vector<ByteRange>& ranges,
                                    MutableBytes recv, int root) override;
  // The group's transport has the same fault, counting its own transfers.
  std::unique_ptr<DataTransport> split(Communicator& group, int color, int key) override {
    return std::make_unique<FaultyTransport>(inner_->split(group, color, key), nth_, fault_,
                                             timeout_, bit_);
  }
  int transfers() const { return count_; }

 private:
  std::unique_ptr<Transfer> faulty(const char* op, std::unique_ptr<Transfer> inner,
                                   MutableBytes received);
  std::unique_ptr<DataTransport> inner_;
  int nth_, count_ = 0;
  Fault fault_;
  std::chrono::milliseconds timeout_;
  std::uint64_t bit_;
};

// A source whose reads fail (CheckpointError, as an I/O error would) or stall
// once `after_bytes` tensor bytes have been read. It offers no views, so every
// byte goes through read().
class FaultySource final : public WeightSource {
 public:
  enum class Fault { kFail, kStall };
  FaultySource(std::unique_ptr<WeightSource> inner, std::uint64_t after_bytes, Fault fault,
               std::chrono::milliseconds stall = std::chrono::seconds(60));
  std::string describe() const override { return inner_->describe(); }
  const std::vector<TensorInfo>& tensors() const override { return inner_->tensors(); }
  std::optional<ConstBytes> view(std::size_t, ByteRange) override { return std::nullopt; }
  void read(std::size_t index, ByteRange range, MutableBytes dst) override;
  std::uint64_t bytes_read() const override { return inner_->bytes_read(); }
  const std::map<std::string, std::string>& metadata() const override { return inner_->metadata(); }
  std::optional<KernelFormatInfo> kernel_format() const override { return inner_->kernel_format(); }

 private:
  std::unique_ptr<WeightSource> inner_;
  std::uint64_t after_, read_ = 0;
  Fault fault_;
  std::chrono::milliseconds stall_;
};

// A control communicator whose Nth collective on this rank (broadcast, scatterv,
// an allreduce or a barrier, counted from 1) fails (CommError, as a collective
// that MPI reported failed) or stalls (never joined: the peers' deadlines end
// the job). Every other call goes to `inner`.
class FaultyCommunicator final : public Communicator {
 public:
  enum class Fault { kFail, kStall };
  FaultyCommunicator(Communicator& inner, int nth, Fault fault,
                     std::chrono::milliseconds stall = std::chrono::seconds(60))
      : inner_(inner), nth_(nth), fault_(fault), stall_(stall) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend(); }
  void broadcast(MutableBytes buffer, int root) override;
  void scatterv(ConstBytes send, const std::vector<ByteRange>& ranges, MutableBytes recv,
                int root) override;
  void allreduce_bits(std::uint64_t* words, std::size_t count, BitOp op) override;
  void allreduce_ints(std::int64_t* values, std::size_t count, IntOp op) override;
  void allreduce_floats(float* values, std::size_t count) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override {
    return inner_.split(color, key);
  }
  int node_leader() override { return inner_.node_leader(); }
  [[noreturn]] void abort(int code) noexcept override {
    inner_.abort(code);
    std::abort();  // (never reached: the inner abort ends the job)
  }
  int collectives() const { return count_; }

 private:
  void maybe_fault(const char* op);
  Communicator& inner_;
  int nth_, count_ = 0;
  Fault fault_;
  std::chrono::milliseconds stall_;
};

}  // namespace tpreload::testing
