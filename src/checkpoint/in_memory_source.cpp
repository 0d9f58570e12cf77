#include <set>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

std::uint64_t expected_bytes(const InMemoryTensor& t) {
  std::uint64_t n = dtype_size(t.dtype);
  for (std::int64_t d : t.shape) {
    if (d < 0) raise<CheckpointError>("in-memory tensor '", t.name, "' has negative dimension ", d);
    n *= static_cast<std::uint64_t>(d);
  }
  return n;
}

class InMemorySource final : public WeightSource {
 public:
  InMemorySource(std::vector<InMemoryTensor> tensors, std::optional<KernelFormatInfo> kernel)
      : tensors_(std::move(tensors)), kernel_(std::move(kernel)) {
    std::set<std::pair<int, std::string>> seen;
    for (const auto& t : tensors_) {
      check_rank(t);
      if (!seen.insert({t.tp_rank, t.name}).second)
        raise<CheckpointError>(
            "in-memory weights: duplicate tensor name '", t.name, "'",
            kernel_ ? detail::concat(" for tp rank ", t.tp_rank) : std::string());
      const std::uint64_t want = expected_bytes(t);
      if (want != t.bytes.size)
        raise<CheckpointError>("in-memory tensor '", t.name, "': shape x ", dtype_name(t.dtype),
                               " needs ", want, " bytes, got ", t.bytes.size);
      infos_.push_back({t.name, t.dtype, t.shape, want, "<memory>", 0, kernel_ ? t.tp_rank : -1});
    }
  }

  std::string describe() const override {
    if (!kernel_) return detail::concat("in-memory weights (", tensors_.size(), " tensors)");
    return detail::concat("in-memory kernel-format weights (", tensors_.size(),
                          " tensors, tp_size ", kernel_->tp_size, ")");
  }
  std::optional<KernelFormatInfo> kernel_format() const override { return kernel_; }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }

  std::optional<ConstBytes> view(std::size_t index, ByteRange range) override {
    const ConstBytes all = checked(index, range);
    bytes_read_ += range.length;
    return all.subspan(range.offset, range.length);
  }

  void read(std::size_t index, ByteRange range, MutableBytes dst) override {
    if (dst.size != range.length)
      raise<UsageError>("in-memory tensor '", infos_.at(index).name, "': read of ", range.length,
                        " bytes into a ", dst.size, "-byte buffer");
    const ConstBytes bytes = *view(index, range);
    std::copy(bytes.data, bytes.data + bytes.size, dst.data);
  }

  std::uint64_t bytes_read() const override { return bytes_read_; }
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }

 private:
  void check_rank(const InMemoryTensor& t) const {
    if (!kernel_ && t.tp_rank != -1)
      raise<CheckpointError>("in-memory tensor '", t.name, "' names tp rank ", t.tp_rank,
                             ", but the weights are checkpoint format (give KernelFormatInfo for "
                             "kernel-format tensors)");
    if (kernel_ && (t.tp_rank < 0 || t.tp_rank >= kernel_->tp_size))
      raise<CheckpointError>("in-memory kernel-format tensor '", t.name, "' has tp rank ",
                             t.tp_rank, ", not one of the ", kernel_->tp_size, " ranks");
  }

  ConstBytes checked(std::size_t index, ByteRange range) const {
    if (index >= tensors_.size())
      raise<UsageError>("in-memory weights: tensor index ", index, " out of ", tensors_.size());
    const ConstBytes all = tensors_[index].bytes;
    if (range.end() > all.size || range.end() < range.offset)
      raise<UsageError>("in-memory tensor '", infos_[index].name, "': range [", range.offset, ", ",
                        range.end(), ") exceeds its ", all.size, " bytes");
    return all;
  }

  std::vector<InMemoryTensor> tensors_;
  std::optional<KernelFormatInfo> kernel_;
  std::vector<TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
  std::uint64_t bytes_read_ = 0;
};

class FunctionStream final : public WeightStream {
 public:
  FunctionStream(std::function<std::optional<InMemoryTensor>()> next,
                 std::optional<KernelFormatInfo> kernel, std::string description)
      : next_(std::move(next)), kernel_(std::move(kernel)), description_(std::move(description)) {
    if (!next_) raise<UsageError>("a weight stream needs a function that yields its tensors");
  }
  std::string describe() const override { return description_; }
  std::optional<InMemoryTensor> next() override { return next_(); }
  std::optional<KernelFormatInfo> kernel_format() const override { return kernel_; }

 private:
  std::function<std::optional<InMemoryTensor>()> next_;
  std::optional<KernelFormatInfo> kernel_;
  std::string description_;
};

}  // namespace

std::unique_ptr<WeightStream> make_weight_stream(
    std::function<std::optional<InMemoryTensor>()> next, std::optional<KernelFormatInfo> kernel,
    std::string description) {
  return std::make_unique<FunctionStream>(std::move(next), std::move(kernel),
                                          std::move(description));
}

std::unique_ptr<WeightSource> make_in_memory_source(std::vector<InMemoryTensor> tensors,
                                                    std::optional<KernelFormatInfo> kernel) {
  return std::make_unique<InMemorySource>(std::move(tensors), std::move(kernel));
}

}  // namespace tpreload
