#include "tpreload/comm/data_transport.h"

#include <thread>

#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"

namespace tpreload {

bool Transfer::test() {
  if (!done_) done_ = poll();
  return done_;
}

void Transfer::wait() {
  const auto start = Clock::now();
  for (int polls = 0; !test(); ++polls) {
    const auto now = Clock::now();
    if (now > deadline_) expire();
    // Progress is made inside poll() for some backends (MPI): poll tightly while
    // data may be flowing, and back off only once a peer seems stalled.
    if (now - start < std::chrono::seconds(1) || polls % 64 != 0)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

namespace {

class CompletedTransfer final : public Transfer {
 public:
  explicit CompletedTransfer(std::string what) : Transfer(std::move(what), Clock::now()) {}

 private:
  bool poll() override { return true; }
  void expire() override { raise<CommTimeoutError>(what(), ": expired after completing"); }
};

// Host data over a communicator's blocking collectives.
class CommunicatorTransport final : public DataTransport {
 public:
  explicit CommunicatorTransport(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  std::string backend() const override { return "control:" + comm_.backend(); }
  MemoryKind memory() const override { return MemoryKind::kHost; }

  std::unique_ptr<Transfer> broadcast(MutableBytes buffer, int root) override {
    comm_.broadcast(buffer, root);
    return completed_transfer(
        detail::concat("broadcast of ", buffer.size, " bytes from root ", root));
  }
  std::unique_ptr<Transfer> scatter(ConstBytes send, const std::vector<ByteRange>& ranges,
                                    MutableBytes recv, int root) override {
    comm_.scatterv(send, ranges, recv, root);
    return completed_transfer(detail::concat("scatter of ", recv.size, " bytes to rank ", rank()));
  }
  // The group's own collectives carry its data.
  std::unique_ptr<DataTransport> split(Communicator& group, int, int) override {
    return std::make_unique<CommunicatorTransport>(group);
  }

 private:
  Communicator& comm_;
};

}  // namespace

std::unique_ptr<DataTransport> DataTransport::split(Communicator&, int, int) {
  raise<UsageError>("the ", backend(),
                    " data transport cannot be split into groups (as --readers node needs)");
}

namespace detail {

ExchangeLayout exchange_layout(int rank, int size, ConstBytes send, MutableBytes recv,
                               const std::vector<std::uint64_t>& counts) {
  const auto ranks = static_cast<std::size_t>(size);
  if (counts.size() != ranks * ranks)
    raise<UsageError>("rank ", rank, ": exchange over ", size, " ranks with ", counts.size(),
                      " counts (", ranks * ranks, " expected)");
  auto count = [&](int from, int to) {
    return counts[static_cast<std::size_t>(from) * ranks + static_cast<std::size_t>(to)];
  };
  ExchangeLayout layout;
  std::uint64_t out = 0, in = 0;
  for (int r = 0; r < size; ++r) {
    if (count(r, r) != 0)
      raise<UsageError>("rank ", rank, ": exchange with ", count(r, r), " bytes from rank ", r,
                        " to itself");
    layout.send_at.push_back(out);
    layout.recv_at.push_back(in);
    out += count(rank, r);
    in += count(r, rank);
  }
  if (send.size != out || recv.size != in)
    raise<UsageError>("rank ", rank, ": exchange sends ", out, " and receives ", in,
                      " bytes, given buffers of ", send.size, " and ", recv.size);
  return layout;
}

}  // namespace detail

std::unique_ptr<Transfer> DataTransport::exchange(ConstBytes send, MutableBytes recv,
                                                  const std::vector<std::uint64_t>& counts) {
  const int n = size(), me = rank();
  const detail::ExchangeLayout layout = detail::exchange_layout(me, n, send, recv, counts);
  const auto ranks = static_cast<std::size_t>(n);
  for (int root = 0; root < n; ++root) {
    std::vector<ByteRange> ranges;
    std::uint64_t offset = 0;
    for (std::size_t to = 0; to < ranks; ++to) {
      const std::uint64_t bytes = counts[static_cast<std::size_t>(root) * ranks + to];
      ranges.push_back({offset, bytes});
      offset += bytes;
    }
    if (offset == 0) continue;  // (every rank knows this root sends nothing)
    const std::uint64_t mine = ranges[static_cast<std::size_t>(me)].length;
    const std::uint64_t at = layout.recv_at[static_cast<std::size_t>(root)];
    scatter(root == me ? send : ConstBytes(), ranges, MutableBytes(recv.data + at, mine), root)
        ->wait();
  }
  return completed_transfer(detail::concat("exchange of ", send.size, " bytes sent and ", recv.size,
                                           " received by rank ", me));
}

std::unique_ptr<Transfer> completed_transfer(std::string what) {
  return std::make_unique<CompletedTransfer>(std::move(what));
}

std::unique_ptr<DataTransport> make_communicator_transport(Communicator& comm) {
  return std::make_unique<CommunicatorTransport>(comm);
}

}  // namespace tpreload
