// Fault injection for tests (seams around the code under test, never edits of
// it): a data transport that fails, stalls or flips a bit in its Nth transfer.
// Usable in one process (around make_communicator_transport) and under MPI
// (around an MPI or emulated-device transport): it changes only what this rank
// sees, as a fault on one link would.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "tpreload/comm/data_transport.h"

namespace tpreload::testing {

class FaultyTransport final : public DataTransport {
 public:
  enum class Fault {
    kFail,     // the Nth transfer throws CommError when waited for
    kStall,    // it never completes (the wait expires after `timeout`)
    kFlipBit,  // it completes, with one bit of the bytes received flipped
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

}  // namespace tpreload::testing
