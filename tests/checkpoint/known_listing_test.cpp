// Known listings: a source opened on files unchanged since an earlier open takes
// that open's listing (no header parsed again) and still reads the files' bytes;
// any change to a file's path, size or header lists it again, as an open without
// the known listing would, errors included.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>

#include "test_util.h"
#include "tpreload/checkpoint/kernel_format.h"
#include "tpreload/checkpoint/safetensors.h"
#include "tpreload/checkpoint/writers.h"

namespace tpreload {
namespace {

using test::TempDir;

std::vector<test::OwnedTensor> tensors(std::uint64_t seed) {
  return {
      test::random_tensor("model.embed_tokens.weight", DType::kBFloat16, {16, 8}, seed),
      test::random_tensor("model.layers.0.input_layernorm.weight", DType::kFloat32, {8}, seed + 1),
      test::random_tensor("model.layers.0.mlp.up_proj.weight", DType::kFloat16, {24, 8}, seed + 2),
      test::random_tensor("model.norm.weight", DType::kFloat32, {8}, seed + 3)};
}

const TensorInfo& listed(const WeightSource& source, const std::string& name) {
  for (const TensorInfo& t : source.tensors())
    if (t.name == name) return t;
  throw std::runtime_error("no tensor '" + name + "' in " + source.describe());
}

// The bytes of `want` as read through read(), read_many() and view().
void expect_reads(WeightSource& source, const std::vector<test::OwnedTensor>& want) {
  test::expect_same_tensors(source, want);
  std::vector<std::vector<std::byte>> got(want.size());
  std::vector<ReadRequest> requests;
  for (std::size_t w = 0; w < want.size(); ++w) {
    const auto index =
        static_cast<std::size_t>(&listed(source, want[w].name) - &source.tensors()[0]);
    got[w].resize(want[w].bytes.size());
    requests.push_back({index, {0, got[w].size()}, MutableBytes(got[w].data(), got[w].size())});
  }
  source.read_many(requests);
  for (std::size_t w = 0; w < want.size(); ++w) {
    EXPECT_TRUE(got[w] == want[w].bytes) << "read_many: " << want[w].name;
    const auto view = source.view(requests[w].index, {0, want[w].bytes.size()});
    ASSERT_TRUE(view.has_value());
    EXPECT_EQ(std::memcmp(view->data, want[w].bytes.data(), view->size), 0) << want[w].name;
  }
}

TEST(KnownListing, UnchangedFilesTakeItAndReadTheirBytes) {
  TempDir dir;
  const auto v1 = tensors(1);
  write_safetensors_sharded(dir.path(), test::as_memory(v1), 2);
  auto first = open_weight_source(dir.path());
  const std::shared_ptr<const KnownListing> known = first->known_listing();
  ASSERT_NE(known, nullptr);
  const std::vector<TensorInfo> listed = first->tensors();
  const std::vector<TensorInfo>* first_list = &first->tensors();
  first.reset();  // the listing outlives the source that made it

  auto again = open_weight_source(dir.path(), known);
  EXPECT_EQ(again->known_listing(), known);
  EXPECT_EQ(&again->tensors(), first_list) << "the known listing itself, not a parse of the files";
  EXPECT_EQ(again->tensors(), listed);
  expect_reads(*again, v1);

  // New bytes under the same header: the same listing, the new bytes read.
  const auto v2 = tensors(50);
  write_safetensors_sharded(dir.path(), test::as_memory(v2), 2);
  auto rewritten = open_weight_source(dir.path(), known);
  EXPECT_EQ(rewritten->known_listing(), known);
  expect_reads(*rewritten, v2);

  // A source of another kind ignores it.
  TempDir h5;
  write_hdf5(h5 / "m.h5", test::as_memory(v1));
  auto hdf5 = open_weight_source(h5 / "m.h5", known);
  EXPECT_EQ(hdf5->known_listing(), nullptr);
  test::expect_same_tensors(*hdf5, v1);
}

// Each change to what the listing is made of lists the files again: the result
// (listing or error) is what an open without the known listing gives.
TEST(KnownListing, AnyChangeToAFilesPathSizeOrHeaderListsItAgain) {
  TempDir dir, elsewhere;
  const std::string path = dir / "model.safetensors";
  const auto v1 = tensors(1);
  write_safetensors(path, test::as_memory(v1));
  const auto known = open_weight_source(path)->known_listing();
  ASSERT_NE(known, nullptr);
  const std::size_t size = test::read_file(path).size();

  auto expect_listed_again = [&](const std::string& at, const std::string& what) {
    auto fresh = open_weight_source(at);
    auto given = open_weight_source(at, known);
    EXPECT_NE(given->known_listing(), known) << what;
    EXPECT_EQ(given->tensors(), fresh->tensors()) << what;
    return given;
  };

  // A name of the same length: the header has the same length and the file the
  // same size; only its text differs.
  auto renamed = v1;
  renamed[3].name = "model.norm.weighx";
  write_safetensors(path, test::as_memory(renamed));
  ASSERT_EQ(test::read_file(path).size(), size);
  auto r = expect_listed_again(path, "a renamed tensor");
  EXPECT_EQ(listed(*r, "model.norm.weighx").shape, (std::vector<std::int64_t>{8}));
  expect_reads(*r, renamed);

  auto grown = v1;
  grown[2] = test::random_tensor("model.layers.0.mlp.up_proj.weight", DType::kFloat16, {32, 8}, 9);
  write_safetensors(path, test::as_memory(grown));
  auto g = expect_listed_again(path, "a tensor of another shape");
  EXPECT_EQ(listed(*g, "model.layers.0.mlp.up_proj.weight").shape,
            (std::vector<std::int64_t>{32, 8}));
  expect_reads(*g, grown);

  // The same bytes under another path: the listing names the file it is in.
  write_safetensors(path, test::as_memory(v1));
  test::write_file(elsewhere / "model.safetensors", test::read_file(path));
  auto moved = expect_listed_again(elsewhere / "model.safetensors", "another path");
  EXPECT_EQ(moved->tensors()[0].file, elsewhere / "model.safetensors");
  EXPECT_EQ(open_weight_source(path, known)->known_listing(), known) << "back as it was";

  // Broken files fail as without the known listing.
  const std::string good = test::read_file(path);
  std::string broken = good;
  const std::size_t quote = broken.find("\"dtype\"");
  ASSERT_NE(quote, std::string::npos);
  broken[quote + 1] = 'D';  // "Dtype": the entry lacks its dtype
  test::write_file(path, broken);
  const std::string want = test::error_of([&] { open_weight_source(path); });
  EXPECT_NE(want, "no error");
  EXPECT_EQ(test::error_of([&] { open_weight_source(path, known); }), want);
  test::write_file(path, good.substr(0, good.size() - 4));  // cut short
  const std::string cut = test::error_of([&] { open_weight_source(path); });
  EXPECT_NE(cut.find("safetensors file '" + path + "'"), std::string::npos) << cut;
  EXPECT_EQ(test::error_of([&] { open_weight_source(path, known); }), cut);
}

// Rank files swapped after a known listing was made are refused by their
// metadata, as without it.
TEST(KnownListing, SwappedRankFilesAreStillRefused) {
  TempDir dir;
  const std::string kConfig = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8})";
  const KernelFormatInfo info{2, DType::kBFloat16, "", kConfig};
  const std::vector<std::vector<test::OwnedTensor>> per_rank = {tensors(1), tensors(20)};
  write_kernel_format(dir.path(), info,
                      {test::as_memory(per_rank[0]), test::as_memory(per_rank[1])});
  const auto known = open_kernel_format(dir.path())->known_listing();
  ASSERT_NE(known, nullptr);
  EXPECT_EQ(open_weight_source(dir.path(), known)->known_listing(), known);
  const std::string r0 = dir / "rank-00000-of-00002.safetensors";
  const std::string r1 = dir / "rank-00001-of-00002.safetensors";
  ASSERT_EQ(::rename(r0.c_str(), (dir / "tmp").c_str()), 0);
  ASSERT_EQ(::rename(r1.c_str(), r0.c_str()), 0);
  ASSERT_EQ(::rename((dir / "tmp").c_str(), r1.c_str()), 0);
  const std::string swapped = test::error_of([&] { open_kernel_format(dir.path(), known); });
  EXPECT_NE(swapped.find("rank file '" + r0 + "' holds tp rank '1' of tp size '2' by its metadata"),
            std::string::npos)
      << swapped;
}

}  // namespace
}  // namespace tpreload
