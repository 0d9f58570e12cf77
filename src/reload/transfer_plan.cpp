#include "tpreload/reload/transfer_plan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "tpreload/core/error.h"

namespace tpreload {

std::int64_t Box::elements() const {
  std::int64_t n = 1;
  for (std::int64_t s : size) n *= s;
  return n;
}

std::string Box::describe() const {
  std::string out = "[";
  for (std::size_t d = 0; d < offset.size(); ++d)
    out += (d ? ", " : "") + std::to_string(offset[d]) + ":" + std::to_string(offset[d] + size[d]);
  return out + "]";
}

Box Box::whole(const std::vector<std::int64_t>& shape) {
  return Box{std::vector<std::int64_t>(shape.size(), 0), shape};
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  Box out = a;
  for (std::size_t d = 0; d < a.offset.size(); ++d) {
    const std::int64_t begin = std::max(a.offset[d], b.offset[d]);
    const std::int64_t end = std::min(a.offset[d] + a.size[d], b.offset[d] + b.size[d]);
    if (end <= begin) return std::nullopt;
    out.offset[d] = begin;
    out.size[d] = end - begin;
  }
  return out;
}

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) out += (d ? ", " : "") + std::to_string(shape[d]);
  return out + "]";
}

// Why `box` is not a box of a tensor of `shape` ("" when it is).
std::string box_problem(const Box& box, const std::vector<std::int64_t>& shape) {
  if (box.offset.size() != shape.size() || box.size.size() != shape.size())
    return "box " + box.describe() + " has " + std::to_string(box.offset.size()) +
           " dimensions, the tensor " + std::to_string(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (box.offset[d] < 0 || box.size[d] < 0 || box.offset[d] + box.size[d] > shape[d])
      return "box " + box.describe() + " does not fit the shape " + shape_text(shape);
  return "";
}

bool contains(const Box& outer, const Box& inner) {
  for (std::size_t d = 0; d < outer.offset.size(); ++d)
    if (inner.offset[d] < outer.offset[d] ||
        inner.offset[d] + inner.size[d] > outer.offset[d] + outer.size[d])
      return false;
  return true;
}

// The grid every box edge of one tensor cuts it into: along each dimension,
// the sorted distinct edges.
using Cuts = std::vector<std::vector<std::int64_t>>;

void add_edges(Cuts& cuts, const Box& box) {
  for (std::size_t d = 0; d < cuts.size(); ++d) {
    cuts[d].push_back(box.offset[d]);
    cuts[d].push_back(box.offset[d] + box.size[d]);
  }
}

// Calls f(cell) for each cell of the grid inside `box` (whose edges are cuts),
// the last dimension fastest.
template <typename F>
void for_each_cell(const Cuts& cuts, const Box& box, F&& f) {
  const std::size_t dims = cuts.size();
  if (box.elements() == 0) return;
  std::vector<std::size_t> first(dims), last(dims), at(dims);
  for (std::size_t d = 0; d < dims; ++d) {
    first[d] = static_cast<std::size_t>(
        std::lower_bound(cuts[d].begin(), cuts[d].end(), box.offset[d]) - cuts[d].begin());
    last[d] = static_cast<std::size_t>(
        std::lower_bound(cuts[d].begin(), cuts[d].end(), box.offset[d] + box.size[d]) -
        cuts[d].begin());
    at[d] = first[d];
  }
  Box cell{std::vector<std::int64_t>(dims), std::vector<std::int64_t>(dims)};
  while (true) {
    for (std::size_t d = 0; d < dims; ++d) {
      cell.offset[d] = cuts[d][at[d]];
      cell.size[d] = cuts[d][at[d] + 1] - cuts[d][at[d]];
    }
    f(cell);
    std::size_t d = dims;
    while (d > 0) {
      --d;
      if (++at[d] < last[d]) break;
      at[d] = first[d];
      if (d == 0) return;
    }
    if (dims == 0) return;
  }
}

// Merges boxes with equal keys that touch along one dimension and agree on
// every other, one dimension at a time from the last: pieces of one region cut
// by the grid become one box again.
template <typename Key>
void merge_boxes(std::vector<std::pair<Key, Box>>& items, std::size_t dims) {
  for (std::size_t d = dims; d-- > 0;) {
    auto rest = [d](const Box& b) {
      Box r = b;
      r.offset.erase(r.offset.begin() + static_cast<std::ptrdiff_t>(d));
      r.size.erase(r.size.begin() + static_cast<std::ptrdiff_t>(d));
      return std::make_pair(r.offset, r.size);
    };
    std::sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
      const auto ra = rest(a.second), rb = rest(b.second);
      return std::tie(a.first, ra, a.second.offset[d]) < std::tie(b.first, rb, b.second.offset[d]);
    });
    std::vector<std::pair<Key, Box>> merged;
    for (auto& item : items) {
      if (!merged.empty()) {
        auto& prev = merged.back();
        if (prev.first == item.first && rest(prev.second) == rest(item.second) &&
            prev.second.offset[d] + prev.second.size[d] == item.second.offset[d]) {
          prev.second.size[d] += item.second.size[d];
          continue;
        }
      }
      merged.push_back(std::move(item));
    }
    items = std::move(merged);
  }
}

std::string held_listing(const std::vector<const HeldBox*>& held) {
  std::string out;
  const std::size_t shown = std::min<std::size_t>(held.size(), 8);
  for (std::size_t i = 0; i < shown; ++i)
    out += (i ? ", " : "") + std::string("rank ") + std::to_string(held[i]->rank) + " " +
           held[i]->box.describe();
  if (held.size() > shown) out += " and " + std::to_string(held.size() - shown) + " more";
  return out;
}

}  // namespace

TransferPlan plan_transfers(std::vector<HeldBox> held, std::vector<NeededBox> needed,
                            int world_size, std::uint64_t piece_bytes) {
  if (world_size < 1) throw UsageError("plan_transfers: world size " + std::to_string(world_size));
  if (piece_bytes == 0) throw UsageError("plan_transfers: pieces of 0 bytes");
  auto check_rank = [world_size](int rank, const std::string& what) {
    if (rank < 0 || rank >= world_size)
      throw ValidationError("sharded sources: " + what + " names rank " + std::to_string(rank) +
                            ", outside the world of " + std::to_string(world_size));
  };
  auto box_key = [](const Box& b) { return std::tie(b.offset, b.size); };
  std::sort(held.begin(), held.end(), [&](const HeldBox& a, const HeldBox& b) {
    return std::tie(a.name, a.rank) < std::tie(b.name, b.rank) ||
           (std::tie(a.name, a.rank) == std::tie(b.name, b.rank) &&
            box_key(a.box) < box_key(b.box));
  });
  std::sort(needed.begin(), needed.end(), [&](const NeededBox& a, const NeededBox& b) {
    return std::tie(a.name, a.rank) < std::tie(b.name, b.rank) ||
           (std::tie(a.name, a.rank) == std::tie(b.name, b.rank) &&
            box_key(a.box) < box_key(b.box));
  });

  TransferPlan plan;
  plan.sent.assign(static_cast<std::size_t>(world_size), 0);
  plan.received.assign(static_cast<std::size_t>(world_size), 0);
  // Each tensor's held boxes, and the tensors by name.
  std::vector<std::vector<const HeldBox*>> holders;
  for (const HeldBox& h : held) {
    check_rank(h.rank, "a box of '" + h.name + "'");
    if (plan.tensors.empty() || plan.tensors.back().name != h.name) {
      plan.tensors.push_back({h.name, h.dtype, h.shape});
      holders.emplace_back();
    }
    const TransferPlan::Tensor& t = plan.tensors.back();
    const HeldBox& first = *(holders.back().empty() ? &h : holders.back().front());
    if (h.dtype != t.dtype || h.shape != t.shape)
      throw ValidationError("sharded sources: rank " + std::to_string(first.rank) + " holds '" +
                            h.name + "' as " + std::string(dtype_name(t.dtype)) + " " +
                            shape_text(t.shape) + ", rank " + std::to_string(h.rank) + " as " +
                            std::string(dtype_name(h.dtype)) + " " + shape_text(h.shape));
    if (const std::string why = box_problem(h.box, h.shape); !why.empty())
      throw ValidationError("sharded sources: rank " + std::to_string(h.rank) + " holds '" +
                            h.name + "': " + why);
    holders.back().push_back(&h);
  }
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < plan.tensors.size(); ++i) index.emplace(plan.tensors[i].name, i);
  std::vector<std::vector<const NeededBox*>> needs(plan.tensors.size());
  for (const NeededBox& n : needed) {
    check_rank(n.rank, "a need of '" + n.name + "'");
    const auto it = index.find(n.name);
    if (it == index.end())
      throw ValidationError("sharded sources: rank " + std::to_string(n.rank) + " needs '" +
                            n.name + "', which no rank holds");
    if (const std::string why = box_problem(n.box, plan.tensors[it->second].shape); !why.empty())
      throw ValidationError("sharded sources: rank " + std::to_string(n.rank) + " needs '" +
                            n.name + "': " + why);
    needs[it->second].push_back(&n);
  }

  for (std::size_t t = 0; t < plan.tensors.size(); ++t) {
    const TransferPlan::Tensor& tensor = plan.tensors[t];
    const std::size_t dims = tensor.shape.size();
    Cuts cuts(dims);
    for (const HeldBox* h : holders[t]) add_edges(cuts, h->box);
    for (const NeededBox* n : needs[t]) add_edges(cuts, n->box);
    for (auto& c : cuts) {
      std::sort(c.begin(), c.end());
      c.erase(std::unique(c.begin(), c.end()), c.end());
    }
    // The ranks holding a cell, ascending and distinct.
    auto ranks_holding = [&](const Box& cell) {
      std::vector<int> ranks;
      for (const HeldBox* h : holders[t])
        if (contains(h->box, cell) && (ranks.empty() || ranks.back() != h->rank))
          ranks.push_back(h->rank);
      return ranks;
    };

    // Regions several ranks hold.
    std::vector<std::pair<std::vector<int>, Box>> shared;
    for (const HeldBox* h : holders[t])
      for_each_cell(cuts, h->box, [&](const Box& cell) {
        const HeldBox* first =
            *std::find_if(holders[t].begin(), holders[t].end(),
                          [&](const HeldBox* o) { return contains(o->box, cell); });
        if (first != h) return;  // (each cell once: from the first box that holds it)
        std::vector<int> ranks = ranks_holding(cell);
        if (ranks.size() > 1) shared.emplace_back(std::move(ranks), cell);
      });
    merge_boxes(shared, dims);
    for (auto& [ranks, box] : shared) plan.shared.push_back({t, std::move(box), std::move(ranks)});

    // Each needed box, cell by cell: kept where its rank holds it, else sent in
    // pieces by the least-loaded holder.
    const std::uint64_t element_bytes = dtype_size(tensor.dtype);
    std::vector<std::pair<std::pair<int, int>, Box>> moves;  // ((to, from), box)
    for (const NeededBox* n : needs[t]) {
      std::vector<std::pair<int, Box>> missing;
      for_each_cell(cuts, n->box, [&](const Box& cell) {
        const std::vector<int> ranks = ranks_holding(cell);
        if (ranks.empty()) {
          missing.emplace_back(0, cell);
          return;
        }
        if (std::binary_search(ranks.begin(), ranks.end(), n->rank)) {
          moves.push_back({{n->rank, n->rank}, cell});
          return;
        }
        std::int64_t rows = 1;
        if (dims > 0 && ranks.size() > 1) {
          const std::uint64_t row_bytes =
              static_cast<std::uint64_t>(cell.elements() /
                                         std::max<std::int64_t>(cell.size[0], 1)) *
              element_bytes;
          rows = std::max<std::int64_t>(
              1, static_cast<std::int64_t>(piece_bytes / std::max<std::uint64_t>(row_bytes, 1)));
        } else if (dims > 0) {
          rows = cell.size[0];
        }
        const std::int64_t begin = dims > 0 ? cell.offset[0] : 0;
        const std::int64_t end = dims > 0 ? begin + cell.size[0] : 1;
        for (std::int64_t r = begin; r < end; r += rows) {
          Box piece = cell;
          if (dims > 0) {
            piece.offset[0] = r;
            piece.size[0] = std::min(rows, end - r);
          }
          int from = ranks.front();
          for (int h : ranks)
            if (plan.sent[static_cast<std::size_t>(h)] < plan.sent[static_cast<std::size_t>(from)])
              from = h;
          const std::uint64_t bytes = static_cast<std::uint64_t>(piece.elements()) * element_bytes;
          plan.sent[static_cast<std::size_t>(from)] += bytes;
          plan.received[static_cast<std::size_t>(n->rank)] += bytes;
          moves.push_back({{n->rank, from}, std::move(piece)});
        }
      });
      if (!missing.empty()) {
        merge_boxes(missing, dims);
        throw ValidationError("sharded sources: rank " + std::to_string(n->rank) + " needs " +
                              missing.front().second.describe() + " of '" + tensor.name +
                              "' (shape " + shape_text(tensor.shape) + "), which no rank holds" +
                              (missing.size() > 1
                                   ? " (and " + std::to_string(missing.size() - 1) +
                                         " other region" + (missing.size() > 2 ? "s" : "") + ")"
                                   : "") +
                              "; held: " + held_listing(holders[t]));
      }
    }
    merge_boxes(moves, dims);
    std::sort(moves.begin(), moves.end(), [](const auto& a, const auto& b) {
      return std::tie(a.first.first, a.second.offset, a.first.second) <
             std::tie(b.first.first, b.second.offset, b.first.second);
    });
    for (auto& [ends, box] : moves) {
      const std::uint64_t bytes = static_cast<std::uint64_t>(box.elements()) * element_bytes;
      plan.transfers.push_back({t, ends.second, ends.first, std::move(box), bytes});
    }
  }
  return plan;
}

void copy_region(ConstBytes from, const Box& from_box, MutableBytes to, const Box& to_box,
                 const Box& region, std::size_t element_bytes) {
  const std::size_t dims = region.offset.size();
  auto fits = [&](const Box& box, std::size_t bytes) {
    return box.offset.size() == dims && box.size.size() == dims && region.size.size() == dims &&
           contains(box, region) &&
           static_cast<std::uint64_t>(box.elements()) * element_bytes == bytes;
  };
  if (!fits(from_box, from.size) || !fits(to_box, to.size))
    throw UsageError("copy_region: region " + region.describe() + " is not inside " +
                     from_box.describe() + " (" + std::to_string(from.size) + " bytes) and " +
                     to_box.describe() + " (" + std::to_string(to.size) + " bytes)");
  if (region.elements() == 0) return;
  // Each box's stride per dimension, in bytes; the copies are runs along the
  // last dimension.
  auto strides = [&](const Box& box) {
    std::vector<std::uint64_t> s(dims, element_bytes);
    for (std::size_t d = dims; d-- > 1;) s[d - 1] = s[d] * static_cast<std::uint64_t>(box.size[d]);
    return s;
  };
  const std::vector<std::uint64_t> fs = strides(from_box), ts = strides(to_box);
  const std::uint64_t run =
      dims ? static_cast<std::uint64_t>(region.size[dims - 1]) * element_bytes : element_bytes;
  std::vector<std::int64_t> at(dims == 0 ? 0 : dims - 1, 0);  // position in the outer dimensions
  while (true) {
    std::uint64_t f = 0, t = 0;
    for (std::size_t d = 0; d < dims; ++d) {
      const std::int64_t i = region.offset[d] + (d + 1 < dims ? at[d] : 0);
      f += static_cast<std::uint64_t>(i - from_box.offset[d]) * fs[d];
      t += static_cast<std::uint64_t>(i - to_box.offset[d]) * ts[d];
    }
    std::memcpy(to.data + t, from.data + f, run);
    std::size_t d = at.size();
    while (d > 0) {
      --d;
      if (++at[d] < region.size[d]) break;
      at[d] = 0;
      if (d == 0) return;
    }
    if (at.empty()) return;
  }
}

}  // namespace tpreload
