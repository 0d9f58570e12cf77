#include "tpreload/reload/sharded_source.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "tpreload/checkpoint/row_split.h"
#include "tpreload/core/error.h"

namespace tpreload {

ShardedSource::ShardedSource(std::vector<HeldTensor> held) : held_(std::move(held)) {
  std::set<std::tuple<std::string, std::vector<std::int64_t>, std::vector<std::int64_t>>> seen;
  for (const HeldTensor& h : held_) {
    const std::size_t dims = h.shape.size();
    bool fits = h.box.offset.size() == dims && h.box.size.size() == dims;
    for (std::size_t d = 0; fits && d < dims; ++d)
      fits = h.box.offset[d] >= 0 && h.box.size[d] >= 0 &&
             h.box.offset[d] + h.box.size[d] <= h.shape[d];
    if (!fits)
      raise<CheckpointError>("sharded source: '", h.name, "' holds the box ", h.box.describe(),
                             ", which does not fit its shape ", Box::whole(h.shape).describe());
    const std::uint64_t expected =
        static_cast<std::uint64_t>(h.box.elements()) * dtype_size(h.dtype);
    if (h.bytes.size != expected || (expected > 0 && h.bytes.data == nullptr))
      raise<CheckpointError>("sharded source: '", h.name, "' box ", h.box.describe(), " of ",
                             dtype_name(h.dtype), " is ", expected, " bytes, given ", h.bytes.size);
    if (!seen.emplace(h.name, h.box.offset, h.box.size).second)
      raise<CheckpointError>("sharded source: '", h.name, "' box ", h.box.describe(),
                             " is given twice");
  }
  // Boxes of one tensor that overlap must agree where they do (which would
  // land is otherwise arbitrary); across ranks the reload compares them.
  std::map<std::string, std::vector<const HeldTensor*>> tensors;
  for (const HeldTensor& h : held_) tensors[h.name].push_back(&h);
  std::vector<std::byte> a, b;
  for (const auto& [name, boxes] : tensors)
    for (std::size_t i = 0; i < boxes.size(); ++i)
      for (std::size_t j = i + 1; j < boxes.size(); ++j) {
        const HeldTensor& x = *boxes[i];
        const HeldTensor& y = *boxes[j];
        const std::optional<Box> both = intersect(x.box, y.box);
        if (!both) continue;
        if (x.dtype != y.dtype || x.shape != y.shape)
          raise<CheckpointError>("sharded source: '", name, "' is held as ", dtype_name(x.dtype),
                                 " ", shape_string(x.shape), " and as ", dtype_name(y.dtype), " ",
                                 shape_string(y.shape));
        const std::size_t bytes = static_cast<std::size_t>(both->elements()) * dtype_size(x.dtype);
        a.resize(bytes);
        b.resize(bytes);
        copy_region(x.bytes, x.box, MutableBytes(a.data(), bytes), *both, *both,
                    dtype_size(x.dtype));
        copy_region(y.bytes, y.box, MutableBytes(b.data(), bytes), *both, *both,
                    dtype_size(y.dtype));
        if (a != b)
          raise<CheckpointError>("sharded source: boxes ", x.box.describe(), " and ",
                                 y.box.describe(), " of '", name, "' hold different bytes in ",
                                 both->describe());
      }
}

std::uint64_t ShardedSource::bytes() const {
  std::uint64_t n = 0;
  for (const HeldTensor& h : held_) n += h.bytes.size;
  return n;
}

std::string ShardedSource::describe() const {
  std::set<std::string> names;
  for (const HeldTensor& h : held_) names.insert(h.name);
  return detail::concat(held_.size(), " boxes of ", names.size(), " tensors (", bytes(), " bytes)");
}

ShardedSource split_stacked(const ShardedSource& held, const std::vector<RowSplit>& splits) {
  std::map<std::string, const RowSplit*> by_name;
  for (const RowSplit& s : splits) by_name.emplace(s.name, &s);
  std::vector<HeldTensor> out;
  for (const HeldTensor& h : held.held()) {
    const auto found = by_name.find(h.name);
    if (found == by_name.end()) {
      out.push_back(h);
      continue;
    }
    const RowSplit& split = *found->second;
    const std::size_t dims = h.shape.size();
    std::int64_t parts_rows = 0;
    for (const RowPart& p : split.parts) parts_rows += p.rows;
    // The rows it stacks: of its first dimension, or (flat) of its last, every
    // leading one flattened; `inner`: the flattened rows per row of dimension 0.
    std::int64_t inner = 1;
    if (split.flat)
      for (std::size_t d = 1; d + 1 < dims; ++d) inner *= h.shape[d];
    const bool shaped = dims >= (split.flat ? 2u : 1u) &&
                        (split.shape.empty() || h.shape == split.shape) &&
                        h.shape[0] * inner == parts_rows;
    if (!shaped)
      raise<CheckpointError>("sharded source: '", h.name, "' has shape ", shape_string(h.shape),
                             "; the model's config stacks ", parts_rows, " rows",
                             split.flat ? " of its last dimension" : "", " in it");
    for (std::size_t d = 1; split.flat && d + 1 < dims; ++d)
      if (h.box.offset[d] != 0 || h.box.size[d] != h.shape[d])
        raise<CheckpointError>("sharded source: '", h.name, "' box ", h.box.describe(),
                               " cuts dimension ", d,
                               " of a tensor the model takes by rows of "
                               "its last dimension (",
                               shape_string(h.shape), "): hold whole rows of its first dimension");
    // The box as rows (flat rows) of `row_bytes` each, row-major.
    const std::int64_t first = h.box.offset[0] * inner, rows = h.box.size[0] * inner;
    const std::uint64_t row_bytes = rows == 0 ? 0 : h.bytes.size / static_cast<std::uint64_t>(rows);
    std::int64_t start = 0;
    for (const RowPart& p : split.parts) {
      const std::int64_t lo = std::max(first, start), hi = std::min(first + rows, start + p.rows);
      start += p.rows;
      if (lo >= hi) continue;
      HeldTensor part = h;
      part.name = p.name;
      if (split.flat) {
        part.shape = {p.rows, h.shape.back()};
        part.box = {{lo - (start - p.rows), h.box.offset.back()}, {hi - lo, h.box.size.back()}};
      } else {
        part.shape[0] = p.rows;
        part.box.offset[0] = lo - (start - p.rows);
        part.box.size[0] = hi - lo;
      }
      part.bytes = ConstBytes(h.bytes.data + static_cast<std::uint64_t>(lo - first) * row_bytes,
                              static_cast<std::uint64_t>(hi - lo) * row_bytes);
      out.push_back(std::move(part));
    }
  }
  return ShardedSource(std::move(out));
}

Box slice_box(const std::vector<std::int64_t>& shape, int dim, int part, int parts) {
  if (parts < 1 || part < 0 || part >= parts)
    raise<UsageError>("slice_box: part ", part, " of ", parts);
  Box box = Box::whole(shape);
  if (dim < 0) return box;
  if (static_cast<std::size_t>(dim) >= shape.size())
    raise<UsageError>("slice_box: dimension ", dim, " of a ", shape.size(), "-d tensor");
  const std::int64_t n = shape[static_cast<std::size_t>(dim)];
  const std::int64_t base = n / parts, extra = n % parts;
  box.offset[static_cast<std::size_t>(dim)] = part * base + std::min<std::int64_t>(part, extra);
  box.size[static_cast<std::size_t>(dim)] = base + (part < extra ? 1 : 0);
  return box;
}

}  // namespace tpreload
