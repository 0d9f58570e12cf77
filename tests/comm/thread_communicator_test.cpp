// Ranks as threads: every collective of the threads communicator against
// values the test computes itself, groups made by split(), and a rank that
// does not come (every other rank fails, none waits forever).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>

#include "../support/thread_ranks.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/data_transport.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

using testing::run_ranks;

// Byte i of rank r's pattern.
std::byte pattern(int r, std::size_t i) {
  return static_cast<std::byte>((r * 131 + i * 7) & 0xff);
}

TEST(ThreadCommunicator, BroadcastsFromEveryRoot) {
  for (int n : {1, 3, 4})
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4099}})
      run_ranks(n, [&](Communicator& c) {
        EXPECT_EQ(c.backend(), "threads");
        for (int root = 0; root < n; ++root) {
          std::vector<std::byte> buffer(bytes);
          for (std::size_t i = 0; i < bytes; ++i)
            buffer[i] = c.rank() == root ? pattern(root, i) : std::byte{0xEE};
          c.broadcast({buffer.data(), buffer.size()}, root);
          for (std::size_t i = 0; i < bytes; ++i)
            ASSERT_EQ(buffer[i], pattern(root, i)) << "rank " << c.rank() << " byte " << i;
        }
      });
}

// DataTransport::exchange over the threads communicator: rank f sends rank t
// (f + 2t) % 5 bytes (none to itself), byte i of that message pattern(f * 8 + t,
// i); every rank finds each message from each source, in source order.
TEST(ThreadCommunicator, ExchangesPointToPointThroughTheTransport) {
  for (int n : {1, 2, 4})
    run_ranks(n, [&](Communicator& c) {
      const auto ranks = static_cast<std::size_t>(n);
      auto bytes = [&](int f, int t) {
        return f == t ? std::uint64_t{0} : static_cast<std::uint64_t>((f + 2 * t) % 5);
      };
      std::vector<std::uint64_t> counts(ranks * ranks);
      for (int f = 0; f < n; ++f)
        for (int t = 0; t < n; ++t) counts[static_cast<std::size_t>(f) * ranks + t] = bytes(f, t);
      std::vector<std::byte> send, recv;
      for (int t = 0; t < n; ++t)
        for (std::size_t i = 0; i < bytes(c.rank(), t); ++i)
          send.push_back(pattern(c.rank() * 8 + t, i));
      std::uint64_t in = 0;
      for (int f = 0; f < n; ++f) in += bytes(f, c.rank());
      recv.assign(in, std::byte{0xEE});
      auto transport = make_communicator_transport(c);
      transport->exchange({send.data(), send.size()}, {recv.data(), recv.size()}, counts)->wait();
      std::size_t at = 0;
      for (int f = 0; f < n; ++f)
        for (std::size_t i = 0; i < bytes(f, c.rank()); ++i, ++at)
          ASSERT_EQ(recv[at], pattern(f * 8 + c.rank(), i))
              << "rank " << c.rank() << " from " << f << " byte " << i;
      // Buffers that do not match the counts are refused before anything moves.
      std::vector<std::byte> short_recv(in + 1);
      EXPECT_THROW(transport->exchange({send.data(), send.size()},
                                       {short_recv.data(), short_recv.size()}, counts),
                   UsageError);
    });
}

TEST(ThreadCommunicator, ScattersUnevenRangesInAnyOrderAndInPlaceOnTheRoot) {
  const int n = 4;
  // Rank r's range: 10 * r bytes (rank 0 none), laid out in reverse rank order.
  std::vector<ByteRange> ranges(n);
  std::uint64_t offset = 0;
  for (int r = n - 1; r >= 0; --r) {
    ranges[static_cast<std::size_t>(r)] = {offset, static_cast<std::uint64_t>(10 * r)};
    offset += static_cast<std::uint64_t>(10 * r);
  }
  for (int root = 0; root < n; ++root)
    run_ranks(n, [&](Communicator& c) {
      std::vector<std::byte> send(offset);
      if (c.rank() == root)
        for (std::size_t i = 0; i < send.size(); ++i) send[i] = pattern(root, i);
      const ByteRange mine = ranges[static_cast<std::size_t>(c.rank())];
      std::vector<std::byte> recv(mine.length);
      // (the root receives in place: its own range of `send`)
      MutableBytes into = c.rank() == root ? MutableBytes{send.data() + mine.offset, mine.length}
                                           : MutableBytes{recv.data(), recv.size()};
      c.scatterv({send.data(), send.size()}, ranges, into, root);
      for (std::size_t i = 0; i < mine.length; ++i)
        ASSERT_EQ(into.data[i], pattern(root, mine.offset + i)) << "rank " << c.rank();
    });
}

TEST(ThreadCommunicator, ReducesAsTheFormulasSay) {
  const int n = 5;
  run_ranks(n, [&](Communicator& c) {
    const int r = c.rank();
    std::vector<std::uint64_t> bits = {std::uint64_t{1} << r, ~(std::uint64_t{1} << r)};
    std::vector<std::uint64_t> both = bits;
    allreduce_bits(c, bits, BitOp::kOr);
    EXPECT_EQ(bits[0], (std::uint64_t{1} << n) - 1);
    EXPECT_EQ(bits[1], ~std::uint64_t{0});
    allreduce_bits(c, both, BitOp::kAnd);
    EXPECT_EQ(both[0], n == 1 ? 1u : 0u);
    EXPECT_EQ(both[1], ~((std::uint64_t{1} << n) - 1));
    for (IntOp op : {IntOp::kSum, IntOp::kMax, IntOp::kMin}) {
      std::vector<std::int64_t> v = {r - 2, 1000 * r, -r};
      allreduce_ints(c, v, op);
      const std::int64_t sum_r = n * (n - 1) / 2;
      const std::vector<std::int64_t> want =
          op == IntOp::kSum   ? std::vector<std::int64_t>{sum_r - 2 * n, 1000 * sum_r, -sum_r}
          : op == IntOp::kMax ? std::vector<std::int64_t>{n - 3, 1000 * (n - 1), 0}
                              : std::vector<std::int64_t>{-2, 0, -(n - 1)};
      EXPECT_EQ(v, want);
    }
    std::vector<float> f = {0.5f * static_cast<float>(r), 1.0f};
    c.allreduce_floats(f.data(), f.size());
    EXPECT_FLOAT_EQ(f[0], 0.5f * static_cast<float>(n * (n - 1) / 2));
    EXPECT_FLOAT_EQ(f[1], static_cast<float>(n));
  });
}

// Split by parity, ordered by descending rank: each group's collectives are
// its own, and the key orders its ranks.
TEST(ThreadCommunicator, SplitMakesGroupsOrderedByKey) {
  const int n = 5;
  run_ranks(n, [&](Communicator& c) {
    std::unique_ptr<Communicator> g = c.split(c.rank() % 2, -c.rank());
    const int members = c.rank() % 2 == 0 ? (n + 1) / 2 : n / 2;
    ASSERT_EQ(g->size(), members);
    // Descending world ranks of this parity: the highest is rank 0.
    const int highest = c.rank() % 2 == (n - 1) % 2 ? n - 1 : n - 2;
    EXPECT_EQ(g->rank(), (highest - c.rank()) / 2);
    std::vector<std::int64_t> sum = {c.rank()};
    allreduce_ints(*g, sum, IntOp::kSum);
    std::int64_t want = 0;
    for (int r = c.rank() % 2; r < n; r += 2) want += r;
    EXPECT_EQ(sum[0], want);
    // The world still works beside its groups, and their host names agree.
    c.barrier();
    EXPECT_EQ(host_names(*g).size(), static_cast<std::size_t>(members));
    EXPECT_EQ(g->node_leader(), 0);
  });
}

TEST(ThreadCommunicator, CarriesAReloadsDataPlane) {
  run_ranks(3, [&](Communicator& c) {
    auto data = make_communicator_transport(c);
    std::vector<std::byte> buffer(100, c.rank() == 2 ? std::byte{7} : std::byte{0});
    data->broadcast({buffer.data(), buffer.size()}, 2)->wait();
    EXPECT_EQ(buffer, std::vector<std::byte>(100, std::byte{7}));
  });
}

TEST(ThreadCommunicator, MismatchedCallsFailOnEveryRank) {
  std::atomic<int> failed{0};
  run_ranks(3, [&](Communicator& c) {
    std::vector<std::byte> buffer(c.rank() == 1 ? 8 : 16);
    try {
      c.broadcast({buffer.data(), buffer.size()}, 0);
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 passed 8 bytes"), std::string::npos) << e.what();
      ++failed;
    }
  });
  EXPECT_EQ(failed.load(), 3);
}

TEST(ThreadCommunicator, ARankThatDoesNotComeFailsTheOthersAtTheDeadline) {
  std::atomic<int> timed_out{0}, broken{0};
  const auto start = std::chrono::steady_clock::now();
  run_ranks(
      3,
      [&](Communicator& c) {
        if (c.rank() == 2) return;  // (never calls the barrier)
        try {
          c.barrier();
        } catch (const CommTimeoutError& e) {
          EXPECT_NE(std::string(e.what()).find("barrier timed out after 200 ms"), std::string::npos)
              << e.what();
          ++timed_out;
        } catch (const CommError& e) {
          EXPECT_NE(std::string(e.what()).find("the communicator is broken"), std::string::npos)
              << e.what();
          ++broken;
        }
        // Broken for good: a later call fails at once.
        EXPECT_THROW(c.barrier(), CommError);
      },
      std::chrono::milliseconds(200));
  // One rank's deadline passes first and breaks the group for the other.
  EXPECT_EQ(timed_out.load() + broken.load(), 2);
  EXPECT_GE(timed_out.load(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace tpreload
