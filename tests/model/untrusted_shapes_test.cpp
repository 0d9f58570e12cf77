// A source without views (HDF5 is one) that declares a shape no model holds: the
// local load refuses it, naming the tensor and both shapes, before the shape
// sizes any buffer (an allocation of the declared 2^40 rows would fail with a
// different error, or take the machine's memory).
#include <gtest/gtest.h>

#include "../support/tiny_models.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"
#include "tpreload/model/model.h"

namespace tpreload {
namespace {

// Lists one tensor with the declared shape; reading it is a test failure.
class DeclaringSource final : public WeightSource {
 public:
  DeclaringSource(std::string name, std::vector<std::int64_t> shape, DType dtype) {
    std::uint64_t n = 2;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    infos_.push_back({std::move(name), dtype, std::move(shape), n, "declared.h5", 0, -1});
  }
  std::string describe() const override { return "hdf5 'declared.h5'"; }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  std::optional<ConstBytes> view(std::size_t, ByteRange) override { return std::nullopt; }
  void read(std::size_t, ByteRange, MutableBytes) override {
    ADD_FAILURE() << "the declared tensor was read";
  }
  std::uint64_t bytes_read() const override { return 0; }
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }

 private:
  std::vector<TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

TEST(UntrustedShapes, AHugeDeclaredShapeIsRefusedBeforeAnyAllocation) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  TensorParallelModel model(config, ModelOptions{});
  const std::int64_t rows = std::int64_t{1} << 40;
  DeclaringSource source("model.embed_tokens.weight", {rows, config.hidden_size}, DType::kBFloat16);
  std::string error;
  try {
    model.load_weights(source);
  } catch (const ModelError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("loading from hdf5 'declared.h5': "), std::string::npos) << error;
  EXPECT_NE(error.find("model.embed_tokens.weight"), std::string::npos) << error;
  EXPECT_NE(error.find(std::to_string(rows)), std::string::npos) << error;
  EXPECT_NE(error.find(std::to_string(config.vocab_size)), std::string::npos)
      << "the expected shape is named: " << error;
}

}  // namespace
}  // namespace tpreload
