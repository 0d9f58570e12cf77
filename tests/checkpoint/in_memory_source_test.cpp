#include <gtest/gtest.h>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

TEST(InMemorySource, ListsViewsAndReadsWithoutCopyingOnView) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<std::int8_t> b = {-1, 7};
  auto source = make_in_memory_source({{"a", DType::kFloat32, {2, 3}, ConstBytes(a), nullptr},
                                       {"b", DType::kInt8, {2}, ConstBytes(b), nullptr}});
  ASSERT_EQ(source->tensors().size(), 2u);
  EXPECT_EQ(source->tensors()[0].nbytes, 24u);
  EXPECT_EQ(source->bytes_read(), 0u);
  const auto view = source->view(0, {4, 8});
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->data, reinterpret_cast<const std::byte*>(a.data()) + 4);
  std::int8_t got[2] = {0, 0};
  source->read(1, {0, 2}, MutableBytes(got, 2));
  EXPECT_EQ(got[0], -1);
  EXPECT_EQ(got[1], 7);
  EXPECT_EQ(source->bytes_read(), 10u);
  EXPECT_THROW(source->view(0, {20, 8}), UsageError);
}

TEST(InMemorySource, RejectsDuplicatesAndSizeMismatch) {
  std::vector<float> a(4);
  EXPECT_THROW(make_in_memory_source({{"a", DType::kFloat32, {4}, ConstBytes(a), nullptr},
                                      {"a", DType::kFloat32, {4}, ConstBytes(a), nullptr}}),
               CheckpointError);
  try {
    make_in_memory_source({{"w", DType::kFloat16, {3}, ConstBytes(a), nullptr}});
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_STREQ(e.what(), "in-memory tensor 'w': shape x float16 needs 6 bytes, got 16");
  }
}

}  // namespace
}  // namespace tpreload
