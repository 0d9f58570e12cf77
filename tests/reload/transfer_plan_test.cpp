// The transfer plan of sharded sources, checked element by element against
// the test's own reading of the boxes: every needed element arrives once,
// from a rank that holds it, and nothing else moves.
#include "tpreload/reload/transfer_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "tpreload/core/error.h"

namespace tpreload {
namespace {

using Shape = std::vector<std::int64_t>;

// Row-major flat indices of the elements of `box` in a tensor of `shape`
// (written here from the definition of a box, not from the plan's grid).
std::vector<std::int64_t> elements_of(const Shape& shape, const Shape& offset, const Shape& size) {
  std::vector<std::int64_t> out;
  std::int64_t total = 1;
  for (std::int64_t s : shape) total *= s;
  for (std::int64_t flat = 0; flat < total; ++flat) {
    std::int64_t rest = flat;
    bool inside = true;
    for (std::size_t d = shape.size(); d-- > 0;) {
      const std::int64_t coordinate = rest % shape[d];
      rest /= shape[d];
      inside = inside && coordinate >= offset[d] && coordinate < offset[d] + size[d];
    }
    if (inside) out.push_back(flat);
  }
  return out;
}

HeldBox held(const std::string& name, const Shape& shape, const Shape& offset, const Shape& size,
             int rank, DType dtype = DType::kBFloat16) {
  return HeldBox{name, dtype, shape, Box{offset, size}, rank};
}
NeededBox need(const std::string& name, const Shape& offset, const Shape& size, int rank) {
  return NeededBox{name, Box{offset, size}, rank};
}

// Checks `plan` against the element maps of `held` and `needed`: each needed
// element of each rank is in exactly one transfer to it, whose sender holds
// it (the rank itself where it does), no transfer carries an element its
// receiver does not need, the byte counts are the transfers', and the shared
// regions are exactly the elements several ranks hold, with those ranks.
void expect_plan_covers(const TransferPlan& plan, const std::vector<HeldBox>& held,
                        const std::vector<NeededBox>& needed, int world) {
  std::map<std::string, Shape> shapes;
  std::map<std::string, std::size_t> bytes_per;
  for (const HeldBox& h : held) {
    shapes[h.name] = h.shape;
    bytes_per[h.name] = dtype_size(h.dtype);
  }
  // (name, flat) -> ranks holding; (name, rank) -> needed flats
  std::map<std::pair<std::string, std::int64_t>, std::set<int>> holders;
  for (const HeldBox& h : held)
    for (std::int64_t e : elements_of(h.shape, h.box.offset, h.box.size))
      holders[{h.name, e}].insert(h.rank);
  std::map<std::pair<std::string, int>, std::set<std::int64_t>> wanted;
  for (const NeededBox& n : needed)
    for (std::int64_t e : elements_of(shapes.at(n.name), n.box.offset, n.box.size))
      wanted[{n.name, n.rank}].insert(e);

  std::map<std::pair<std::string, int>, std::multiset<std::int64_t>> arrived;
  std::vector<std::uint64_t> sent(world, 0), received(world, 0);
  for (const TransferPlan::Transfer& t : plan.transfers) {
    const std::string& name = plan.tensors.at(t.tensor).name;
    const auto flats = elements_of(shapes.at(name), t.box.offset, t.box.size);
    EXPECT_EQ(t.bytes, flats.size() * bytes_per.at(name)) << name << " " << t.box.describe();
    for (std::int64_t e : flats) {
      const std::set<int>& h = holders[{name, e}];
      EXPECT_TRUE(h.count(t.from))
          << name << " element " << e << " sent by rank " << t.from << ", which does not hold it";
      if (h.count(t.to)) {
        EXPECT_EQ(t.from, t.to) << name << " element " << e << " held by rank " << t.to
                                << " was sent to it";
      }
      const auto& wanted_by = wanted[std::make_pair(name, t.to)];
      EXPECT_TRUE(wanted_by.count(e))
          << name << " element " << e << " sent to rank " << t.to << ", which does not need it";
      arrived[{name, t.to}].insert(e);
    }
    if (t.from != t.to) {
      sent[t.from] += t.bytes;
      received[t.to] += t.bytes;
    }
  }
  for (const auto& [key, flats] : wanted)
    for (std::int64_t e : flats)
      EXPECT_EQ(arrived[key].count(e), 1u)
          << key.first << " element " << e << " of rank " << key.second;
  EXPECT_EQ(plan.sent, sent);
  EXPECT_EQ(plan.received, received);

  std::map<std::pair<std::string, std::int64_t>, int> in_shared;
  for (const TransferPlan::Shared& s : plan.shared) {
    const std::string& name = plan.tensors.at(s.tensor).name;
    for (std::int64_t e : elements_of(shapes.at(name), s.box.offset, s.box.size)) {
      ++in_shared[{name, e}];
      const std::set<int>& h = holders[{name, e}];
      EXPECT_EQ(std::vector<int>(h.begin(), h.end()), s.ranks) << name << " element " << e;
    }
  }
  for (const auto& [key, ranks] : holders)
    EXPECT_EQ(in_shared[key], ranks.size() > 1 ? 1 : 0) << key.first << " element " << key.second;
}

// A trainer's FSDP row slices (ranks 4 and 5 of 6, which serve nothing) into
// four tensor-parallel ranks: a column-parallel weight (row slices), a
// row-parallel one (column slices), a norm every rank needs whole.
TEST(TransferPlan, FsdpRowSlicesIntoTensorParallelShards) {
  const Shape q{12, 10}, o{10, 12}, norm{10};
  std::vector<HeldBox> h;
  for (int s = 0; s < 2; ++s) {
    h.push_back(held("q.weight", q, {6 * s, 0}, {6, 10}, 4 + s));
    h.push_back(held("o.weight", o, {5 * s, 0}, {5, 12}, 4 + s));
    h.push_back(held("norm.weight", norm, {5 * s}, {5}, 4 + s, DType::kFloat32));
  }
  std::vector<NeededBox> n;
  for (int r = 0; r < 4; ++r) {
    n.push_back(need("q.weight", {3 * r, 0}, {3, 10}, r));
    n.push_back(need("o.weight", {0, 3 * r}, {10, 3}, r));
    n.push_back(need("norm.weight", {0}, {10}, r));
  }
  const TransferPlan plan = plan_transfers(h, n, 6, 1 << 20);
  expect_plan_covers(plan, h, n, 6);
  // Nothing passes through a rank that does not need it: the serving ranks
  // send nothing, the trainer ranks receive nothing.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(plan.sent[r], 0u) << r;
  EXPECT_EQ(plan.received[4] + plan.received[5], 0u);
  EXPECT_TRUE(plan.shared.empty());
  // The row-parallel weight's column slice of each rank comes from both
  // trainer ranks, one box each (the grid's cells merged back).
  int o_pieces_to_rank0 = 0;
  for (const auto& t : plan.transfers)
    if (plan.tensors[t.tensor].name == "o.weight" && t.to == 0) ++o_pieces_to_rank0;
  EXPECT_EQ(o_pieces_to_rank0, 2);
}

// Megatron-style column slices held by the serving ranks themselves: what a
// rank holds it keeps, the rest comes from its neighbours; 3-D stacked experts
// split by their middle dimension; a 0-d scale every rank holds.
TEST(TransferPlan, SlicesTheRanksHoldAreKeptAndTheRestExchanged) {
  const Shape w{8, 16}, experts{4, 6, 8};
  std::vector<HeldBox> h;
  std::vector<NeededBox> n;
  for (int r = 0; r < 4; ++r) {
    h.push_back(held("w", w, {0, 4 * r}, {8, 4}, r));  // columns
    n.push_back(need("w", {2 * r, 0}, {2, 16}, r));    // rows
    h.push_back(held("experts", experts, {0, 0, 2 * r}, {4, 6, 2}, r));
    n.push_back(need("experts", {r, 0, 0}, {1, 6, 8}, r));
    h.push_back(held("scale", {}, {}, {}, r, DType::kFloat32));
    n.push_back(need("scale", {}, {}, r));
  }
  const TransferPlan plan = plan_transfers(h, n, 4, 1 << 20);
  expect_plan_covers(plan, h, n, 4);
  // Each rank keeps a quarter of its rows of w and gets three quarters.
  for (int r = 0; r < 4; ++r) {
    const std::uint64_t w_bytes = 2 * 16 * 2, e_bytes = 6 * 8 * 2;
    EXPECT_EQ(plan.received[r], (w_bytes + e_bytes) * 3 / 4) << r;
  }
  // The scale: held by all four, so shared (to be compared), and kept by each.
  ASSERT_EQ(plan.shared.size(), 1u);
  EXPECT_EQ(plan.tensors[plan.shared[0].tensor].name, "scale");
  EXPECT_EQ(plan.shared[0].ranks, (std::vector<int>{0, 1, 2, 3}));
}

// Two replicas of a trainer (ranks 4-5 and 6-7 hold the same row slices) send
// to four serving ranks: each byte once, and the sending shared so that no
// holder sends more than 1.1 times their mean.
TEST(TransferPlan, ReplicasShareTheSendingWithinATenthOfTheMean) {
  std::vector<HeldBox> h;
  std::vector<NeededBox> n;
  const Shape shape{256, 64};
  for (int layer = 0; layer < 6; ++layer) {
    const std::string name = "layers." + std::to_string(layer) + ".w";
    for (int replica = 0; replica < 2; ++replica)
      for (int s = 0; s < 2; ++s)
        h.push_back(held(name, shape, {128 * s, 0}, {128, 64}, 4 + 2 * replica + s));
    for (int r = 0; r < 4; ++r) n.push_back(need(name, {0, 16 * r}, {256, 16}, r));
  }
  const TransferPlan plan = plan_transfers(h, n, 8, 2048);
  expect_plan_covers(plan, h, n, 8);
  std::uint64_t total = 0, most = 0;
  for (int r = 4; r < 8; ++r) {
    total += plan.sent[r];
    most = std::max(most, plan.sent[r]);
  }
  EXPECT_EQ(total, 6u * 256 * 64 * 2);
  EXPECT_LE(static_cast<double>(most), 1.1 * static_cast<double>(total) / 4) << most;
  // Every region both replicas hold is listed for comparison, with both ranks.
  for (const auto& s : plan.shared) EXPECT_EQ(s.ranks.size(), 2u);
  EXPECT_EQ(plan.shared.size(), 6u * 2);
}

TEST(TransferPlan, TheSameListsInAnyOrderGiveTheSamePlan) {
  std::vector<HeldBox> h;
  std::vector<NeededBox> n;
  for (int r = 0; r < 3; ++r) {
    h.push_back(held("a", {9, 4}, {3 * r, 0}, {3, 4}, r));
    h.push_back(held("b", {6}, {0}, {6}, r));
    n.push_back(need("a", {0, r}, {9, 1}, r));
    n.push_back(need("b", {2 * r}, {2}, r));
  }
  const TransferPlan first = plan_transfers(h, n, 3, 8);
  std::mt19937 random(7);
  std::shuffle(h.begin(), h.end(), random);
  std::shuffle(n.begin(), n.end(), random);
  const TransferPlan second = plan_transfers(h, n, 3, 8);
  ASSERT_EQ(first.transfers.size(), second.transfers.size());
  for (std::size_t i = 0; i < first.transfers.size(); ++i) {
    EXPECT_EQ(first.transfers[i].from, second.transfers[i].from) << i;
    EXPECT_EQ(first.transfers[i].to, second.transfers[i].to) << i;
    EXPECT_EQ(first.transfers[i].box, second.transfers[i].box) << i;
  }
  EXPECT_EQ(first.sent, second.sent);
}

std::string error_of(const std::vector<HeldBox>& h, const std::vector<NeededBox>& n, int world) {
  try {
    plan_transfers(h, n, world, 1024);
  } catch (const ValidationError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TransferPlan, WhatNoRankHoldsIsNamedWithTensorRangeAndRank) {
  // Rows 4-8 of columns 8-16 are missing: rank 1 holds only the left half of them.
  const std::vector<HeldBox> h = {held("w", {8, 16}, {0, 0}, {4, 16}, 0),
                                  held("w", {8, 16}, {4, 0}, {4, 8}, 1)};
  const std::string e = error_of(h, {need("w", {0, 0}, {8, 16}, 2)}, 3);
  EXPECT_NE(e.find("rank 2 needs [4:8, 8:16] of 'w' (shape [8, 16]), which no rank holds"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("held: rank 0 [0:4, 0:16], rank 1 [4:8, 0:8]"), std::string::npos) << e;
  EXPECT_NE(error_of(h, {need("v", {0}, {1}, 0)}, 3).find("rank 0 needs 'v', which no rank holds"),
            std::string::npos);
}

TEST(TransferPlan, DisagreeingHoldersAndBadBoxesAreRefused) {
  const std::string dtype = error_of(
      {held("w", {4, 4}, {0, 0}, {2, 4}, 0), held("w", {4, 4}, {2, 0}, {2, 4}, 1, DType::kFloat16)},
      {}, 2);
  EXPECT_NE(dtype.find("rank 0 holds 'w' as bfloat16 [4, 4], rank 1 as float16 [4, 4]"),
            std::string::npos)
      << dtype;
  const std::string shape =
      error_of({held("w", {4, 4}, {0, 0}, {2, 4}, 0), held("w", {4, 5}, {2, 0}, {2, 4}, 1)}, {}, 2);
  EXPECT_NE(shape.find("rank 1 as bfloat16 [4, 5]"), std::string::npos) << shape;
  EXPECT_NE(error_of({held("w", {4, 4}, {3, 0}, {2, 4}, 0)}, {}, 1)
                .find("rank 0 holds 'w': box [3:5, 0:4] does not fit the shape [4, 4]"),
            std::string::npos);
  EXPECT_NE(error_of({held("w", {4, 4}, {0, 0}, {4, 4}, 0)}, {need("w", {0}, {4}, 0)}, 1)
                .find("rank 0 needs 'w': box [0:4] has 1 dimensions, the tensor 2"),
            std::string::npos);
  EXPECT_NE(error_of({held("w", {4}, {0}, {4}, 3)}, {}, 2)
                .find("a box of 'w' names rank 3, outside the world of 2"),
            std::string::npos);
}

// A box's elements of a tensor whose every element is its own flat index.
std::vector<std::int32_t> box_values(const Shape& shape, const Box& box) {
  std::vector<std::int32_t> out;
  for (std::int64_t e : elements_of(shape, box.offset, box.size))
    out.push_back(static_cast<std::int32_t>(e));
  return out;
}

TEST(TransferPlan, CopyRegionMovesExactlyTheRegionBetweenBoxes) {
  const Shape shape{5, 6, 7};
  const Box from{{1, 0, 2}, {4, 6, 5}}, to{{0, 2, 0}, {5, 3, 7}}, region{{1, 2, 3}, {3, 2, 4}};
  const std::vector<std::int32_t> source = box_values(shape, from);
  std::vector<std::int32_t> target(static_cast<std::size_t>(to.elements()), -1);
  copy_region(ConstBytes(source), from, MutableBytes(target), to, region, 4);
  const auto in_region = elements_of(shape, region.offset, region.size);
  const auto flats = elements_of(shape, to.offset, to.size);
  for (std::size_t i = 0; i < flats.size(); ++i) {
    const bool inside = std::binary_search(in_region.begin(), in_region.end(), flats[i]);
    EXPECT_EQ(target[i], inside ? flats[i] : -1) << "element " << flats[i];
  }
  // A 0-d tensor: one element.
  const std::int32_t one = 42;
  std::int32_t copy = 0;
  copy_region(ConstBytes(&one, 4), Box{}, MutableBytes(&copy, 4), Box{}, Box{}, 4);
  EXPECT_EQ(copy, 42);
  // A region outside a box, or a buffer of another size, is refused.
  EXPECT_THROW(
      copy_region(ConstBytes(source), from, MutableBytes(target), to, Box{{0, 2, 3}, {1, 2, 4}}, 4),
      UsageError);
  EXPECT_THROW(copy_region(ConstBytes(source.data(), 4), from, MutableBytes(target), to, region, 4),
               UsageError);
}

// The plan carried out by hand: each sender packs its transfers out of what
// it holds, each receiver unpacks them into what it needs; every needed box
// then holds the tensor's own elements.
TEST(TransferPlan, CarriedOutThePlanFillsEveryNeededBox) {
  const Shape shape{10, 12};
  std::vector<HeldBox> h = {held("w", shape, {0, 0}, {4, 12}, 3, DType::kInt32),
                            held("w", shape, {4, 0}, {6, 12}, 4, DType::kInt32),
                            held("w", shape, {0, 0}, {10, 6}, 0, DType::kInt32)};
  std::vector<NeededBox> n = {need("w", {0, 0}, {10, 4}, 0), need("w", {0, 4}, {10, 4}, 1),
                              need("w", {0, 8}, {10, 4}, 2), need("w", {2, 2}, {7, 9}, 3)};
  const TransferPlan plan = plan_transfers(h, n, 5, 64);
  std::map<int, std::vector<std::int32_t>> holding, needing;
  for (const HeldBox& b : h) holding[b.rank] = box_values(shape, b.box);
  for (const NeededBox& b : n)
    needing[b.rank].assign(static_cast<std::size_t>(b.box.elements()), -1);
  auto box_of = [&](const auto& list, int rank) {
    for (const auto& b : list)
      if (b.rank == rank) return b.box;
    throw std::logic_error("no box");
  };
  for (const TransferPlan::Transfer& t : plan.transfers) {
    std::vector<std::int32_t> wire(static_cast<std::size_t>(t.box.elements()));
    copy_region(ConstBytes(holding.at(t.from)), box_of(h, t.from), MutableBytes(wire), t.box, t.box,
                4);
    copy_region(ConstBytes(wire), t.box, MutableBytes(needing.at(t.to)), box_of(n, t.to), t.box, 4);
  }
  for (const NeededBox& b : n) EXPECT_EQ(needing.at(b.rank), box_values(shape, b.box)) << b.rank;
}

}  // namespace
}  // namespace tpreload
