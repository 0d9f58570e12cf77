// Dtype conversion on load: the bytes torch's Tensor.to() gives, for every pair
// of floating dtypes, on the host and through the (emulated) device; checkpoints
// of another dtype land converted; integer tensors are refused.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <limits>

#include "../support/emulated_device.h"
#include "../support/tiny_models.h"
#include "tpreload/core/error.h"
#include "tpreload/model/convert.h"
#include "tpreload/model/model.h"
#include "tpreload/model/torch_dtype.h"

namespace tpreload {
namespace {

const DType kFloats[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64};

// Values that exercise rounding: random normals at many scales, ties in the
// target's last place, subnormals of each type, the largest finite values,
// overflow to infinity, infinities, signed zeros. (NaN is checked separately:
// torch's own vector and scalar paths give different NaN payloads.)
at::Tensor nasty_values() {
  at::manual_seed(5);
  std::vector<float> v;
  const at::Tensor r =
      at::randn({4000}) * at::pow(2.0, at::randint(-30, 30, {4000}).to(at::kFloat));
  for (std::int64_t i = 0; i < r.numel(); ++i) v.push_back(r[i].item<float>());
  for (float f : {0.0f, -0.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1.0f + 1.0f / 2048,
                  1.0f + 3.0f / 2048, 65504.0f, 65520.0f, 70000.0f, 6e-8f, 3e-8f, 1e-40f, -1e-45f,
                  3.3895e38f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max()})
    v.push_back(f);
  return at::tensor(v);
}

TEST(Convert, EveryFloatingPairGivesTorchsBytes) {
  const at::Tensor base = nasty_values();
  for (DType from : kFloats) {
    const at::Tensor src = base.to(dtype_to_torch(from));
    for (DType to : kFloats) {
      const at::Tensor want = src.to(dtype_to_torch(to));
      at::Tensor got = at::empty_like(want);
      convert_rows(src.data_ptr(), from, src.numel(), got.data_ptr(), to, 1, src.numel());
      EXPECT_TRUE(testdata::same_bytes(got, want)) << dtype_name(from) << " -> " << dtype_name(to);
    }
  }
}

// float64 sources that float32 cannot hold: torch rounds them to float32 first,
// then to the 16-bit type (double rounding), and so must the conversion; with
// overflow, underflow and float64 subnormals.
TEST(Convert, Float64SourcesRoundThroughFloat32AsTorchDoes) {
  std::vector<double> v = {
      1.0 + 1.0 / 256 + std::ldexp(1.0, -40),   // bf16 tie only after float rounding
      1.0 + 1.0 / 2048 + std::ldexp(1.0, -45),  // the same for float16
      -(1.0 + 3.0 / 256 - std::ldexp(1.0, -41)),
      1e300,
      -1e300,
      1e-300,
      -1e-300,
      4.9e-324,
      3.4028235677973366e38,
      3.4028235e38 * 1.0000001,
      1.0 / 3.0,
      -2.0 / 3.0,
      65519.99999999,
      65520.0};
  at::manual_seed(9);
  const at::Tensor r =
      at::randn({3000}, at::kDouble) * at::pow(2.0, at::randint(-40, 40, {3000}).to(at::kDouble));
  for (std::int64_t i = 0; i < r.numel(); ++i) v.push_back(r[i].item<double>());
  const at::Tensor src = at::tensor(v, at::kDouble);
  for (DType to : kFloats) {
    const at::Tensor want = src.to(dtype_to_torch(to));
    at::Tensor got = at::empty_like(want);
    convert_rows(src.data_ptr(), DType::kFloat64, src.numel(), got.data_ptr(), to, 1, src.numel());
    EXPECT_TRUE(testdata::same_bytes(got, want)) << "float64 -> " << dtype_name(to);
  }
}

TEST(Convert, StridedRowsAndNaNs) {
  const at::Tensor full = at::randn({7, 13});
  full[3][4] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor window = full.narrow(1, 2, 9);  // rows 13 apart, 9 wide
  at::Tensor got = at::empty({7, 9}, at::kBFloat16);
  convert_rows(static_cast<const float*>(full.data_ptr()) + 2, DType::kFloat32, 13, got.data_ptr(),
               DType::kBFloat16, 7, 9);
  const at::Tensor want = window.to(at::kBFloat16);
  EXPECT_TRUE(at::equal(got.isnan(), want.isnan()));
  EXPECT_TRUE(at::equal(got.nan_to_num(0), want.nan_to_num(0)));
  EXPECT_THROW(
      convert_rows(full.data_ptr(), DType::kInt32, 1, got.data_ptr(), DType::kFloat32, 1, 1),
      UsageError);
}

ModelOptions on(std::shared_ptr<Device> device, int tp, int rank) {
  ModelOptions o;
  o.tp_size = tp;
  o.tp_rank = rank;
  o.device = std::move(device);
  return o;
}

// A float32 (or float16) checkpoint into a bfloat16 model, and a bfloat16 one into
// a float32 model: every parameter equals the independent slice of the checkpoint
// converted by torch.
TEST(Convert, CheckpointsOfAnotherDtypeLandConverted) {
  for (const char* name : {"llama_gqa", "qwen2_tied", "qwen3_moe"}) {
    const ModelConfig config = testdata::tiny_config(name);
    const auto native = testdata::random_checkpoint(config, 60);
    for (at::ScalarType stored : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
      std::map<std::string, at::Tensor> ckpt, want_ckpt;
      for (const auto& [n, t] : native) {
        ckpt[n] = (t.to(at::kDouble) * 1.37).to(stored);  // values the model's dtype must round
        want_ckpt[n] = ckpt[n].to(dtype_to_torch(config.dtype));
      }
      for (bool device : {false, true}) {
        TensorParallelModel model(
            config, on(device ? std::make_shared<testing::EmulatedDevice>() : nullptr, 2, 1));
        auto source = testdata::memory_source(ckpt);
        const auto loaded = model.load_weights(*source);
        for (const auto& [param, want] : testdata::expected_shards(config, want_ckpt, 2, 1)) {
          EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(param), want))
              << name << " from " << c10::toString(stored) << (device ? " on the device " : " ")
              << param;
          EXPECT_EQ(loaded.count(param), 1u) << param;
        }
      }
    }
  }
}

TEST(Convert, IntegerTensorsAreRefusedNamingTheDtypes) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  TensorParallelModel model(config, on(nullptr, 1, 0));
  const auto pl = model.rules().place("model.norm.weight", 0);
  ASSERT_TRUE(pl);
  try {
    model.load_checkpoint_tensor(*pl, at::ones({64}, at::kInt), false);
    FAIL() << "an int32 tensor was converted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("int32 values are not converted to bfloat16"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tpreload
