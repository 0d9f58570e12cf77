#include "faults.h"

#include <unistd.h>

#include <thread>

#include <utility>

#include "tpreload/comm/device.h"
#include "tpreload/core/error.h"

namespace tpreload::testing {
namespace {

using Clock = std::chrono::steady_clock;

class Broken final : public Transfer {
 public:
  Broken(std::string what, Clock::time_point deadline, bool fail)
      : Transfer(std::move(what), deadline), fail_(fail) {}

 private:
  bool poll() override {
    if (fail_) raise<CommError>(what(), " failed: injected fault");
    return false;
  }
  void expire() override { raise<CommTimeoutError>(what(), " did not complete: injected stall"); }
  bool fail_;
};

// Completes with the inner transfer, then flips one bit of what arrived.
class Flipping final : public Transfer {
 public:
  Flipping(std::unique_ptr<Transfer> inner, MutableBytes received, std::uint64_t bit,
           Device* device)
      : Transfer(inner->what(), Clock::now() + std::chrono::hours(1)),
        inner_(std::move(inner)),
        received_(received),
        bit_(bit),
        device_(device) {}

 private:
  bool poll() override {
    if (!inner_->test()) return false;
    if (!flipped_ && received_.size) {
      const std::uint64_t bit = bit_ % (received_.size * 8);
      // Device memory here is the emulated device's, which the host can address.
      if (device_ && !device_->host_addressable())
        raise<UsageError>("FaultyTransport cannot flip bits in non-addressable device memory");
      received_.data[bit / 8] ^= std::byte(1u << (bit % 8));
    }
    flipped_ = true;
    return true;
  }
  void expire() override { inner_->wait(); }
  std::unique_ptr<Transfer> inner_;
  MutableBytes received_;
  std::uint64_t bit_;
  Device* device_;
  bool flipped_ = false;
};

// Completes with the inner transfer, then fails on this rank.
class FailingAfter final : public Transfer {
 public:
  explicit FailingAfter(std::unique_ptr<Transfer> inner)
      : Transfer(inner->what(), Clock::now() + std::chrono::hours(1)), inner_(std::move(inner)) {}

 private:
  bool poll() override {
    if (!inner_->test()) return false;
    raise<CommError>(what(), " failed: injected fault (after it completed)");
  }
  void expire() override { inner_->wait(); }
  std::unique_ptr<Transfer> inner_;
};

}  // namespace

FaultyTransport::FaultyTransport(std::unique_ptr<DataTransport> inner, int nth, Fault fault,
                                 std::chrono::milliseconds timeout, std::uint64_t bit)
    : inner_(std::move(inner)), nth_(nth), fault_(fault), timeout_(timeout), bit_(bit) {}

std::unique_ptr<Transfer> FaultyTransport::broadcast(MutableBytes buffer, int root) {
  const bool hit = ++count_ == nth_;
  if (hit && fault_ == Fault::kExit) ::_exit(3);
  if (hit && fault_ != Fault::kFlipBit && fault_ != Fault::kFailAfter)
    return faulty("broadcast", nullptr, {});
  auto t = inner_->broadcast(buffer, root);
  if (!hit || (rank() == root && fault_ == Fault::kFlipBit)) return t;
  return faulty("broadcast", std::move(t), buffer);
}

std::unique_ptr<Transfer> FaultyTransport::scatter(ConstBytes send,
                                                   const std::vector<ByteRange>& ranges,
                                                   MutableBytes recv, int root) {
  const bool hit = ++count_ == nth_;
  if (hit && fault_ == Fault::kExit) ::_exit(3);
  if (hit && fault_ != Fault::kFlipBit && fault_ != Fault::kFailAfter)
    return faulty("scatter", nullptr, {});
  auto t = inner_->scatter(send, ranges, recv, root);
  if (!hit || (rank() == root && fault_ == Fault::kFlipBit)) return t;
  return faulty("scatter", std::move(t), recv);
}

std::unique_ptr<Transfer> FaultyTransport::faulty(const char* op, std::unique_ptr<Transfer> inner,
                                                  MutableBytes received) {
  if (fault_ == Fault::kFlipBit)
    return std::make_unique<Flipping>(std::move(inner), received, bit_, inner_->device());
  if (fault_ == Fault::kFailAfter) return std::make_unique<FailingAfter>(std::move(inner));
  return std::make_unique<Broken>(detail::concat("transfer ", count_, " (", op, ")"),
                                  Clock::now() + timeout_, fault_ == Fault::kFail);
}

FaultySource::FaultySource(std::unique_ptr<WeightSource> inner, std::uint64_t after_bytes,
                           Fault fault, std::chrono::milliseconds stall)
    : inner_(std::move(inner)), after_(after_bytes), fault_(fault), stall_(stall) {}

void FaultySource::read(std::size_t index, ByteRange range, MutableBytes dst) {
  if (read_ + range.length > after_) {
    if (fault_ == Fault::kFail)
      raise<CheckpointError>("reading '", inner_->tensors().at(index).name, "' of ",
                             inner_->describe(), " failed: injected I/O error after ", read_,
                             " bytes");
    std::this_thread::sleep_for(stall_);
  }
  inner_->read(index, range, dst);
  read_ += range.length;
}

void FaultyCommunicator::maybe_fault(const char* op) {
  if (++count_ != nth_) return;
  if (fault_ == Fault::kStall) std::this_thread::sleep_for(stall_);
  raise<CommError>("rank ", rank(), "/", size(), ": collective ", count_, " (", op,
                   ") failed: injected fault");
}

void FaultyCommunicator::broadcast(MutableBytes buffer, int root) {
  maybe_fault("broadcast");
  inner_.broadcast(buffer, root);
}

void FaultyCommunicator::scatterv(ConstBytes send, const std::vector<ByteRange>& ranges,
                                  MutableBytes recv, int root) {
  maybe_fault("scatterv");
  inner_.scatterv(send, ranges, recv, root);
}

void FaultyCommunicator::allreduce_bits(std::uint64_t* words, std::size_t count, BitOp op) {
  maybe_fault("allreduce_bits");
  inner_.allreduce_bits(words, count, op);
}

void FaultyCommunicator::allreduce_ints(std::int64_t* values, std::size_t count, IntOp op) {
  maybe_fault("allreduce_ints");
  inner_.allreduce_ints(values, count, op);
}

void FaultyCommunicator::allreduce_floats(float* values, std::size_t count) {
  maybe_fault("allreduce_floats");
  inner_.allreduce_floats(values, count);
}

void FaultyCommunicator::barrier() {
  maybe_fault("barrier");
  inner_.barrier();
}

}  // namespace tpreload::testing
