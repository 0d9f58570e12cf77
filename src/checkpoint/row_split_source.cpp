// make_row_split_source(): stacked tensors listed as their row parts (see
// row_split.h).
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include "tpreload/checkpoint/row_split.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

std::string parts_text(const RowSplit& split) {
  std::string text;
  std::int64_t total = 0;
  for (const RowPart& p : split.parts) {
    text += detail::concat(text.empty() ? "" : " + ", p.name, " ", p.rows);
    total += p.rows;
  }
  return detail::concat(total, " rows (", text, ")");
}

class RowSplitSource final : public WeightSource {
 public:
  RowSplitSource(WeightSource& base, std::vector<RowSplit> splits, std::string whose)
      : base_(base), whose_(std::move(whose)) {
    for (RowSplit& s : splits) splits_.emplace(s.name, std::move(s));
  }

  std::string describe() const override {
    const auto& listed = tensors();
    return detail::concat(base_.describe(), "; ", stacked_, " stacked tensors listed as their ",
                          listed.size() + stacked_ - base_.tensors().size(), " parts (", whose_,
                          ")");
  }

  // (A mutex rather than std::call_once: a listing that throws is retried, and
  // call_once after a throw hangs on some libstdc++ targets.)
  const std::vector<TensorInfo>& tensors() const override {
    std::lock_guard<std::mutex> lock(listing_);
    if (!listed_) {
      list();
      listed_ = true;
    }
    return tensors_;
  }

  std::optional<ConstBytes> view(std::size_t index, ByteRange range) override {
    const auto [at, mapped] = in_base(index, range);
    return base_.view(at, mapped);
  }

  void read(std::size_t index, ByteRange range, MutableBytes dst) override {
    const auto [at, mapped] = in_base(index, range);
    base_.read(at, mapped, dst);
  }

  void read_split(std::size_t index, ByteRange range,
                  const std::vector<MutableBytes>& parts) override {
    const auto [at, mapped] = in_base(index, range);
    base_.read_split(at, mapped, parts);
  }

  void read_many(const std::vector<ReadRequest>& requests) override {
    std::vector<ReadRequest> mapped;
    mapped.reserve(requests.size());
    for (const ReadRequest& r : requests) {
      const auto [at, range] = in_base(r.index, r.range);
      mapped.push_back({at, range, r.dst});
    }
    base_.read_many(mapped);
  }

  std::uint64_t bytes_read() const override { return base_.bytes_read(); }
  const std::map<std::string, std::string>& metadata() const override { return base_.metadata(); }
  std::optional<KernelFormatInfo> kernel_format() const override { return base_.kernel_format(); }
  void check_mapped_reads() const override { base_.check_mapped_reads(); }
  std::shared_ptr<const KnownListing> known_listing() const override {
    return base_.known_listing();
  }

 private:
  // Where listed tensor i's bytes are in `base`: its index there and the offset
  // of its first byte.
  struct Origin {
    std::size_t index = 0;
    std::uint64_t offset = 0;
  };

  void list() const {
    const std::vector<TensorInfo>& all = base_.tensors();
    std::set<std::string> names;
    for (const TensorInfo& t : all) names.insert(t.name);
    std::vector<TensorInfo> listed;
    std::vector<Origin> origins;
    stacked_ = 0;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const TensorInfo& t = all[i];
      const auto split = splits_.find(t.name);
      if (split == splits_.end()) {
        listed.push_back(t);
        origins.push_back({i, 0});
        continue;
      }
      check(t, split->second, names);
      const bool flat = split->second.flat;
      const std::uint64_t row_bytes = t.nbytes / static_cast<std::uint64_t>(stacked_rows(t, flat));
      std::uint64_t offset = 0;
      for (const RowPart& p : split->second.parts) {
        TensorInfo part = t;
        part.name = p.name;
        if (flat)
          part.shape = {p.rows, t.shape.back()};
        else
          part.shape[0] = p.rows;
        part.nbytes = row_bytes * static_cast<std::uint64_t>(p.rows);
        if (t.file_offset != 0) part.file_offset = t.file_offset + offset;
        listed.push_back(std::move(part));
        origins.push_back({i, offset});
        offset += row_bytes * static_cast<std::uint64_t>(p.rows);
      }
      ++stacked_;
    }
    tensors_ = std::move(listed);
    origins_ = std::move(origins);
  }

  // The rows a stacked tensor holds: of its first dimension, or (`flat`) of
  // its last, every leading one flattened; 0 for a scalar.
  static std::int64_t stacked_rows(const TensorInfo& t, bool flat) {
    if (t.shape.empty()) return 0;
    if (!flat) return t.shape[0];
    return std::accumulate(t.shape.begin(), t.shape.end() - 1, std::int64_t{1},
                           std::multiplies<std::int64_t>());
  }

  void check(const TensorInfo& t, const RowSplit& split, const std::set<std::string>& names) const {
    const std::int64_t rows =
        std::accumulate(split.parts.begin(), split.parts.end(), std::int64_t{0},
                        [](std::int64_t sum, const RowPart& p) { return sum + p.rows; });
    const bool shaped =
        (!split.flat || t.shape.size() >= 2) && (split.shape.empty() || t.shape == split.shape);
    if (t.shape.empty() || !shaped || rows == 0 || stacked_rows(t, split.flat) != rows)
      raise<CheckpointError>(
          t.file, ": tensor '", t.name, "' has shape ", shape_string(t.shape), "; ", whose_,
          " stacks ", parts_text(split), split.flat ? " of its last dimension" : "", " in it",
          split.shape.empty() ? std::string() : ", a tensor of shape " + shape_string(split.shape));
    for (const RowPart& p : split.parts)
      if (names.count(p.name))
        raise<CheckpointError>(t.file, ": the checkpoint holds both '", t.name, "' and '", p.name,
                               "', which ", whose_, " takes from rows of '", t.name,
                               "': one of them would be loaded twice");
  }

  // `range` of listed tensor `index` as a range of its tensor in `base`.
  std::pair<std::size_t, ByteRange> in_base(std::size_t index, ByteRange range) const {
    const auto& listed = tensors();
    if (index >= listed.size())
      raise<UsageError>(base_.describe(), ": tensor index ", index, " out of ", listed.size());
    const TensorInfo& t = listed[index];
    if (range.end() > t.nbytes || range.end() < range.offset)
      raise<CheckpointError>(t.file, ": tensor '", t.name, "': range [", range.offset, ", ",
                             range.end(), ") exceeds its ", t.nbytes, " bytes");
    const Origin& o = origins_[index];
    return {o.index, {o.offset + range.offset, range.length}};
  }

  WeightSource& base_;
  std::map<std::string, RowSplit> splits_;
  std::string whose_;
  mutable std::mutex listing_;
  mutable bool listed_ = false;
  mutable std::vector<TensorInfo> tensors_;
  mutable std::vector<Origin> origins_;
  mutable std::size_t stacked_ = 0;
};

}  // namespace

std::unique_ptr<WeightSource> make_row_split_source(WeightSource& base,
                                                    std::vector<RowSplit> splits,
                                                    std::string whose) {
  return std::make_unique<RowSplitSource>(base, std::move(splits), std::move(whose));
}

}  // namespace tpreload
