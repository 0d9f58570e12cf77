#include <gtest/gtest.h>

#include "tpreload/core/dtype.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload {
namespace {

TEST(DType, SizesAndNamesRoundTrip) {
  const std::pair<DType, std::size_t> sizes[] = {
      {DType::kFloat32, 4}, {DType::kFloat16, 2}, {DType::kBFloat16, 2},
      {DType::kInt8, 1},    {DType::kInt32, 4},   {DType::kInt64, 8},
      {DType::kUInt8, 1},   {DType::kBool, 1},    {DType::kFloat64, 8}};
  for (auto [dtype, size] : sizes) {
    EXPECT_EQ(dtype_size(dtype), size) << dtype_name(dtype);
    EXPECT_EQ(dtype_from_name(dtype_name(dtype)), dtype);
    EXPECT_EQ(dtype_from_safetensors(dtype_safetensors_name(dtype)), dtype);
  }
}

TEST(DType, SpellingsOfEachFormat) {
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBFloat16);
  EXPECT_EQ(dtype_from_safetensors("BOOL"), DType::kBool);
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(dtype_from_name("half"), DType::kFloat16);
  EXPECT_EQ(dtype_safetensors_name(DType::kUInt8), "U8");
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), std::nullopt);
  EXPECT_EQ(dtype_from_name("float8"), std::nullopt);
  EXPECT_EQ(dtype_from_safetensors("bf16"), std::nullopt);  // case matters in the format
}

TEST(Errors, RaiseBuildsTheMessageAndType) {
  try {
    raise<CheckpointError>("file ", "a.safetensors", ": tensor 'w' has ", 12, " bytes");
    FAIL() << "raise returned";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "file a.safetensors: tensor 'w' has 12 bytes");
    EXPECT_NE(dynamic_cast<const CheckpointError*>(&e), nullptr);
  }
}

TEST(Errors, TimeoutIsACommError) {
  EXPECT_THROW(raise<CommTimeoutError>("x"), CommError);
}

TEST(Logging, RejectsUnknownLevel) {
  EXPECT_THROW(init_logging(0, 1, "loud"), UsageError);
  EXPECT_NO_THROW(init_logging(3, 8, "off"));
  EXPECT_EQ(log().level(), spdlog::level::off);
}

}  // namespace
}  // namespace tpreload
