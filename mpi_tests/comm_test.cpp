// Collectives of the MPI communicator at every world size, checking every byte.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "mpi_test_main.h"
#include "tpreload/comm/agreement.h"
#include "tpreload/comm/mpi_communicator.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

using mpitest::world;

// The byte a sender puts at `offset` of a buffer tagged `tag`.
std::uint8_t pattern(std::uint64_t tag, std::uint64_t offset) {
  return static_cast<std::uint8_t>((offset * 131 + tag * 7 + (offset >> 8)) & 0xff);
}

std::vector<std::uint8_t> filled(std::size_t n, std::uint64_t tag, std::uint64_t start = 0) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = pattern(tag, start + i);
  return v;
}

std::size_t count_wrong(const std::vector<std::uint8_t>& got, std::uint64_t tag,
                        std::uint64_t start = 0) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != pattern(tag, start + i);
  return wrong;
}

// A communicator that splits every message above 1000 bytes, to exercise chunking.
std::unique_ptr<MpiCommunicator> small_message_world() {
  CommOptions options;
  options.timeout = std::chrono::seconds(60);
  options.max_message_bytes = 1000;
  return MpiCommunicator::world(options);
}

std::string world_error(const CommOptions& options) {
  try {
    MpiCommunicator::world(options);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

// Refused before any collective: a message limit under one 64-bit word (every
// allreduce splits its words by it), and a timeout that is not positive or so
// long that the deadline overflows the clock.
TEST(Options, AreCheckedBeforeAnyCollective) {
  CommOptions o;
  o.max_message_bytes = 7;
  EXPECT_EQ(world_error(o), "CommOptions::max_message_bytes must be in [8, 2147483647], got 7");
  o.max_message_bytes = 8;
  EXPECT_EQ(world_error(o), "no error");
  const long long year_ms = 366LL * 24 * 60 * 60 * 1000;
  for (const long long ms : {0LL, -5LL, year_ms + 1, 300 * year_ms}) {
    o.timeout = std::chrono::milliseconds(ms);
    EXPECT_EQ(world_error(o), "CommOptions::timeout must be positive and at most a year (" +
                                  std::to_string(year_ms) + " ms), got " + std::to_string(ms) +
                                  " ms");
  }
  o.timeout = std::chrono::milliseconds(year_ms);
  EXPECT_EQ(world_error(o), "no error");
}

TEST(Broadcast, EverySizeFromEveryRoot) {
  for (std::size_t n : {0, 1, 7, 4096, 1000 * 1000 + 3}) {
    for (int root = 0; root < world().size(); ++root) {
      auto buf = world().rank() == root ? filled(n, root) : std::vector<std::uint8_t>(n, 0xAA);
      world().broadcast(MutableBytes(buf), root);
      EXPECT_EQ(count_wrong(buf, root), 0u) << "size " << n << " root " << root;
    }
  }
}

TEST(Broadcast, SplitIntoManyMessages) {
  auto comm = small_message_world();
  const std::size_t n = 10 * 1000 + 17;  // 11 messages of at most 1000 bytes
  const int root = comm->size() - 1;
  auto buf = comm->rank() == root ? filled(n, 99) : std::vector<std::uint8_t>(n, 0);
  comm->broadcast(MutableBytes(buf), root);
  EXPECT_EQ(count_wrong(buf, 99), 0u);
}

// Ranges into the root buffer: uneven, one empty, laid out in reverse rank order.
std::vector<ByteRange> uneven_ranges(int size, std::uint64_t unit) {
  std::vector<ByteRange> ranges(size);
  std::uint64_t offset = 0;
  for (int r = size - 1; r >= 0; --r) {
    const std::uint64_t length = r == 1 ? 0 : unit * (r + 1) + r;
    ranges[r] = {offset, length};
    offset += length + 5;  // gaps between ranges are never sent
  }
  return ranges;
}

void check_scatterv(Communicator& comm, std::uint64_t unit, int root) {
  const auto ranges = uneven_ranges(comm.size(), unit);
  std::uint64_t total = 0;
  for (const auto& r : ranges) total = std::max(total, r.end());
  const auto send = comm.rank() == root ? filled(total, 5) : std::vector<std::uint8_t>();
  std::vector<std::uint8_t> recv(ranges[comm.rank()].length, 0xEE);
  comm.scatterv(ConstBytes(send), ranges, MutableBytes(recv), root);
  EXPECT_EQ(count_wrong(recv, 5, ranges[comm.rank()].offset), 0u)
      << "unit " << unit << " root " << root;
}

TEST(Scatterv, UnevenAndEmptyRangesFromEveryRoot) {
  for (std::uint64_t unit : {1, 100, 300 * 1000})
    for (int root = 0; root < world().size(); ++root) check_scatterv(world(), unit, root);
}

TEST(Scatterv, SplitIntoManyRounds) {
  auto comm = small_message_world();
  check_scatterv(*comm, 2500, 0);
}

// The MPI data transport's point-to-point exchange: rank f sends rank t
// (f + 3t) % 4 x `unit` bytes (none to itself), tagged f * 64 + t; each
// message is found where the source order puts it, split into messages of at
// most 1000 bytes on the small-message world.
void check_exchange(MpiCommunicator& comm, std::uint64_t unit) {
  const int n = comm.size(), me = comm.rank();
  const auto ranks = static_cast<std::size_t>(n);
  auto bytes = [&](int f, int t) {
    return f == t ? std::uint64_t{0} : static_cast<std::uint64_t>((f + 3 * t) % 4) * unit;
  };
  std::vector<std::uint64_t> counts(ranks * ranks);
  std::vector<std::uint8_t> send, recv;
  std::uint64_t in = 0;
  for (int f = 0; f < n; ++f)
    for (int t = 0; t < n; ++t) counts[static_cast<std::size_t>(f) * ranks + t] = bytes(f, t);
  for (int t = 0; t < n; ++t) {
    const auto part = filled(bytes(me, t), static_cast<std::uint64_t>(me * 64 + t));
    send.insert(send.end(), part.begin(), part.end());
    in += bytes(t, me);
  }
  recv.assign(in, 0xEE);
  auto data = comm.make_data_transport();
  EXPECT_EQ(data->backend(), "mpi");
  data->exchange(ConstBytes(send), MutableBytes(recv), counts)->wait();
  std::uint64_t at = 0;
  for (int f = 0; f < n; ++f) {
    const std::vector<std::uint8_t> got(recv.begin() + at, recv.begin() + at + bytes(f, me));
    EXPECT_EQ(count_wrong(got, static_cast<std::uint64_t>(f * 64 + me)), 0u)
        << "from rank " << f << " unit " << unit;
    at += bytes(f, me);
  }
}

TEST(Exchange, PointToPointInSourceOrder) {
  for (std::uint64_t unit : {1, 4099}) check_exchange(mpitest::mpi_world(), unit);
}

TEST(Exchange, SplitIntoManyMessages) {
  auto comm = small_message_world();
  check_exchange(*comm, 2500);
}

TEST(Scatterv, AllRangesEmpty) {
  std::vector<ByteRange> ranges(world().size());
  std::vector<std::uint8_t> send(world().rank() == 0 ? 16 : 0), recv;
  world().scatterv(ConstBytes(send), ranges, MutableBytes(recv), 0);
  SUCCEED();  // completing at all, on every rank, is the check
}

TEST(Scatterv, WrongReceiveSizeIsRejectedBeforeAnyTransfer) {
  std::vector<ByteRange> ranges(world().size(), ByteRange{0, 8});
  std::vector<std::uint8_t> send(8), recv(7);
  EXPECT_THROW(world().scatterv(ConstBytes(send), ranges, MutableBytes(recv), 0), UsageError);
}

TEST(Allreduce, BitsOrAndAnd) {
  const int size = world().size(), rank = world().rank();
  const std::size_t words = 3;  // bits 0..191; ranks set bit (rank * 23) and bit 100
  std::vector<std::uint64_t> mine(words, 0);
  auto set = [&](std::vector<std::uint64_t>& w, int bit) { w[bit / 64] |= 1ull << (bit % 64); };
  set(mine, rank * 23);
  set(mine, 100);
  auto ored = mine, anded = mine;
  allreduce_bits(world(), ored, BitOp::kOr);
  allreduce_bits(world(), anded, BitOp::kAnd);
  std::vector<std::uint64_t> want_or(words, 0), want_and(words, 0);
  for (int r = 0; r < size; ++r) set(want_or, r * 23);
  set(want_or, 100);
  set(want_and, 100);
  if (size == 1) want_and = want_or;
  EXPECT_EQ(ored, want_or);
  EXPECT_EQ(anded, want_and);
}

TEST(Allreduce, IntsSumMaxMin) {
  const int size = world().size(), rank = world().rank();
  const std::int64_t big = std::int64_t{1} << 40;
  std::vector<std::int64_t> sum = {rank, big + rank, -rank};
  auto max = sum, min = sum;
  allreduce_ints(world(), sum, IntOp::kSum);
  allreduce_ints(world(), max, IntOp::kMax);
  allreduce_ints(world(), min, IntOp::kMin);
  const std::int64_t ranks_sum = std::int64_t{size} * (size - 1) / 2;
  EXPECT_EQ(sum, (std::vector<std::int64_t>{ranks_sum, big * size + ranks_sum, -ranks_sum}));
  EXPECT_EQ(max, (std::vector<std::int64_t>{size - 1, big + size - 1, 0}));
  EXPECT_EQ(min, (std::vector<std::int64_t>{0, big, -(size - 1)}));
}

TEST(Allreduce, ManyMessages) {
  auto comm = small_message_world();
  std::vector<std::int64_t> values(1000);  // 8000 bytes: 8 messages of 125 values
  std::iota(values.begin(), values.end(), comm->rank());
  comm->allreduce_ints(values.data(), values.size(), IntOp::kSum);
  const std::int64_t n = comm->size();
  for (std::size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(values[i], n * static_cast<std::int64_t>(i) + n * (n - 1) / 2) << "index " << i;
}

TEST(Split, TensorParallelGroupsByColor) {
  const int rank = world().rank(), size = world().size();
  const int tp = size >= 2 ? 2 : 1;              // groups of `tp` consecutive ranks
  auto group = world().split(rank / tp, -rank);  // reversed order inside each group
  const int group_size = std::min(tp, size - rank / tp * tp);
  ASSERT_EQ(group->size(), group_size);
  EXPECT_EQ(group->rank(), (rank / tp * tp + group_size - 1) - rank);
  std::int64_t from_root = rank;  // the group's rank 0 is its highest world rank
  std::vector<std::uint8_t> buf(8);
  std::memcpy(buf.data(), &from_root, 8);
  group->broadcast(MutableBytes(buf), 0);
  std::memcpy(&from_root, buf.data(), 8);
  EXPECT_EQ(from_root, rank / tp * tp + group_size - 1);
  std::int64_t members = 1;
  group->allreduce_ints(&members, 1, IntOp::kSum);
  EXPECT_EQ(members, group_size);
}

// Texts gathered into slots: each slot from the one rank that owns it (here
// slot 2r and 2r + 1 from rank r, the second cut to its 15 bytes), empty slots
// staying empty.
TEST(GatherTexts, EachSlotFromItsOwnerCutToItsWords) {
  const int rank = world().rank(), size = world().size();
  std::vector<std::string> slots(2 * size + 1);  // (the last owned by nobody)
  slots[2 * rank] = "rank " + std::to_string(rank);
  slots[2 * rank + 1] = std::string(20, static_cast<char>('a' + rank));
  const std::vector<std::string> texts = gather_texts(world(), slots, 2);
  ASSERT_EQ(texts.size(), slots.size());
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(texts[2 * r], "rank " + std::to_string(r));
    EXPECT_EQ(texts[2 * r + 1], std::string(15, static_cast<char>('a' + r)));
  }
  EXPECT_EQ(texts.back(), "");
}

// The test's own lists of ranks: joined one by one, runs of two or more as a-b.
std::string listed(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const bool run_before = i > 0 && ranks[i - 1] == ranks[i] - 1;
    const bool run_after = i + 1 < ranks.size() && ranks[i + 1] == ranks[i] + 1;
    if (run_before && run_after) continue;
    if (run_before)
      out += "-" + std::to_string(ranks[i]);
    else
      out += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return out;
}

// What agree_on_values raises for `values` with " (told)" as the consequence,
// or "no error".
std::string disagreement_of(const std::vector<AgreedValue>& values) {
  try {
    agree_on_values<UsageError>(world(), values, " (told)");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

// Values that differ between ranks are named with which ranks hold which: at
// most three values per name (the rest counted, their ranks listed), texts cut
// to 95 bytes (head, tail and a short hash), an empty text as '' (a text on
// other ranks: the same collectives everywhere), signed numbers as such,
// opaque hashes only as "one value" and "another"; values every rank shares
// are not named.
TEST(Agreement, NamesWhichRanksHoldWhichValue) {
  const int rank = world().rank(), size = world().size();
  const std::string long_text(200, 'x');
  const std::vector<AgreedValue> values = {
      {"the same", 7},
      {"parity", static_cast<std::uint64_t>(rank % 2)},
      {"the rank", static_cast<std::uint64_t>(rank)},
      {"a flag", rank == size - 1},
      {"a text", long_text + (rank == 0 ? "a" : "b")},
      {"an empty text", rank == 0 ? "" : "fp8"},
      {"a signed number", rank == 0 ? -1 : 0},
      AgreedValue::opaque_hash("a layout", rank == 0 ? 11 : 12)};
  const std::string error = disagreement_of(values);
  if (size == 1) {
    EXPECT_EQ(error, "no error");
    return;
  }
  std::vector<int> even, odd, others, all_but_first, all_but_last;
  for (int r = 0; r < size; ++r) {
    (r % 2 ? odd : even).push_back(r);
    if (r >= 3) others.push_back(r);
    if (r > 0) all_but_first.push_back(r);
    if (r < size - 1) all_but_last.push_back(r);
  }
  std::string by_rank = "parity: 0 on " + listed(even) + ", 1 on " + listed(odd) + "; the rank: ";
  for (int r = 0; r < std::min(size, 3); ++r)
    by_rank += (r ? ", " : "") + std::to_string(r) + " on rank " + std::to_string(r);
  if (size == 4) by_rank += ", 1 other value on rank 3";
  if (size > 4) by_rank += ", " + std::to_string(size - 3) + " other values on " + listed(others);
  // A long text keeps its head, its last 24 bytes and the low 24 bits of its
  // FNV-1a (computed here), 95 bytes in all.
  auto cut = [&](char last) {
    const std::string text = long_text + last;
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char b : text) h = (h ^ b) * 0x100000001b3ull;
    char hex[8];
    std::snprintf(hex, sizeof hex, "%06llx", static_cast<unsigned long long>(h & 0xffffff));
    return std::string(60, 'x') + "..." + std::string(23, 'x') + last + " #" + hex;
  };
  by_rank += "; a flag: false on " + listed(all_but_last) + ", true on rank " +
             std::to_string(size - 1) + "; a text: " + cut('a') + " on rank 0, " + cut('b') +
             " on " + listed(all_but_first) + "; an empty text: '' on rank 0, fp8 on " +
             listed(all_but_first) + "; a signed number: -1 on rank 0, 0 on " +
             listed(all_but_first) + "; a layout: one value on rank 0, another on " +
             listed(all_but_first);
  EXPECT_EQ(error,
            "ranks disagree on parity, the rank, a flag, a text, an empty text, a signed number, a "
            "layout (told); by rank: " +
                by_rank);
}

// An opaque value that lists its items adds the first item that differs, by
// rank: here the last rank changes entry 2, and rank 1 (from 3 ranks) lists
// only two entries, so it shows none there; an item of 200 bytes is shown
// whole. Opaque values whose items are all alike, that list none, or whose
// items() throws on some rank show only their groups (and no rank hangs).
TEST(Agreement, AnOpaqueValueWithItemsShowsTheFirstItemThatDiffers) {
  const int rank = world().rank(), size = world().size();
  const bool last = rank == size - 1, short_list = rank == 1 && size > 2;
  const auto long_item = [](bool changed) { return std::string(200, 'x') + (changed ? "b" : "a"); };
  auto entries = [&] {
    std::vector<std::string> e = {"p0", "p1", last ? "p2 changed" : "p2", "p3"};
    if (short_list) e.resize(2);
    return e;
  };
  const std::vector<AgreedValue> values = {
      AgreedValue::opaque_hash("a layout",
                               last         ? 3
                               : short_list ? 2
                                            : 1,
                               entries, "entry"),
      AgreedValue::opaque_hash(
          "alike items", static_cast<std::uint64_t>(rank % 2),
          [] { return std::vector<std::string>{"same"}; }, "entry"),
      AgreedValue::opaque_hash("no items", last ? 5 : 4),
      AgreedValue::opaque_hash("long items", last ? 7 : 6,
                               [&] { return std::vector<std::string>{long_item(last)}; }),
      AgreedValue::opaque_hash("failing items", last ? 9 : 8, [&] {
        if (last) throw std::runtime_error("cannot list them");
        return std::vector<std::string>{"fine"};
      })};
  const std::string error = disagreement_of(values);
  if (size == 1) {
    EXPECT_EQ(error, "no error");
    return;
  }
  // plain: neither the last rank nor the short list
  std::vector<int> plain, even, odd, all_but_last;
  for (int r = 0; r < size; ++r) {
    if (r != size - 1 && !(r == 1 && size > 2)) plain.push_back(r);
    if (r != size - 1) all_but_last.push_back(r);
    (r % 2 ? odd : even).push_back(r);
  }
  const std::string last_rank = "rank " + std::to_string(size - 1);
  std::string layout = "a layout: one value on " + listed(plain) + ", another on ";
  std::string entry2 = "'p2' on " + listed(plain) + ", ";
  if (size > 2) {
    layout += "rank 1, another on ";
    entry2 += "none (2 in all) on rank 1, ";
  }
  layout += last_rank + " (the first that differs, counting from 0: entry 2: " + entry2 +
            "'p2 changed' on " + last_rank + ")";
  const std::string others = listed(all_but_last);
  EXPECT_EQ(error,
            "ranks disagree on a layout, alike items, no items, long items, failing items (told); "
            "by rank: " +
                layout + "; alike items: one value on " + listed(even) + ", another on " +
                listed(odd) + "; no items: one value on " + others + ", another on " + last_rank +
                "; long items: one value on " + others + ", another on " + last_rank +
                " (the first that differs, counting from 0: item 0: '" + long_item(false) +
                "' on " + others + ", '" + long_item(true) + "' on " + last_rank +
                "); failing items: one value on " + others + ", another on " + last_rank);
}

// One rank's problem as the same error on every rank: the lowest rank that has
// one, its text, how many other ranks had one ("1 other rank", "2 other
// ranks"), and the note for when some ranks had none (rank 0 has none here).
TEST(AgreeOnProblem, NamesTheLowestRankAndCountsTheOthers) {
  const int rank = world().rank(), size = world().size();
  std::optional<std::string> problem;
  if (rank > 0) problem = "p" + std::to_string(rank);
  std::string error = "no error";
  try {
    agree_on_problem<UsageError>(world(), problem, "testing", "; rank 0 had none");
  } catch (const UsageError& e) {
    error = e.what();
  }
  if (size == 1) {
    EXPECT_EQ(error, "no error");
    return;
  }
  std::string expected = "testing failed on rank 1/" + std::to_string(size) + ": p1";
  if (size == 3) expected += " (and on 1 other rank)";
  if (size > 3) expected += " (and on " + std::to_string(size - 2) + " other ranks)";
  EXPECT_EQ(error, expected + "; rank 0 had none");
}

TEST(Barrier, CompletesOnEveryRank) {
  world().barrier();
  world().barrier();
  SUCCEED();
}

}  // namespace
}  // namespace tpreload
