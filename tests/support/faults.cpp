#include "faults.h"

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

}  // namespace

FaultyTransport::FaultyTransport(std::unique_ptr<DataTransport> inner, int nth, Fault fault,
                                 std::chrono::milliseconds timeout, std::uint64_t bit)
    : inner_(std::move(inner)), nth_(nth), fault_(fault), timeout_(timeout), bit_(bit) {}

std::unique_ptr<Transfer> FaultyTransport::broadcast(MutableBytes buffer, int root) {
  const bool hit = ++count_ == nth_;
  if (hit && fault_ != Fault::kFlipBit) return faulty("broadcast", nullptr, {});
  auto t = inner_->broadcast(buffer, root);
  if (!hit || rank() == root) return t;
  return faulty("broadcast", std::move(t), buffer);
}

std::unique_ptr<Transfer> FaultyTransport::scatter(ConstBytes send,
                                                   const std::vector<ByteRange>& ranges,
                                                   MutableBytes recv, int root) {
  const bool hit = ++count_ == nth_;
  if (hit && fault_ != Fault::kFlipBit) return faulty("scatter", nullptr, {});
  auto t = inner_->scatter(send, ranges, recv, root);
  if (!hit || rank() == root) return t;
  return faulty("scatter", std::move(t), recv);
}

std::unique_ptr<Transfer> FaultyTransport::faulty(const char* op, std::unique_ptr<Transfer> inner,
                                                  MutableBytes received) {
  if (fault_ == Fault::kFlipBit)
    return std::make_unique<Flipping>(std::move(inner), received, bit_, inner_->device());
  return std::make_unique<Broken>(detail::concat("transfer ", count_, " (", op, ")"),
                                  Clock::now() + timeout_, fault_ == Fault::kFail);
}

}  // namespace tpreload::testing
