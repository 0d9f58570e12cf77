#include "tpreload/reload/sharded_source.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

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
