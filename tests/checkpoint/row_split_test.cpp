// make_row_split_source(): a stacked tensor listed as its row parts, read through
// every kind of source by read, view, read_split and read_many; the refusals of
// a stacked tensor whose rows do not add up and of a part the checkpoint also
// holds; a 3-D tensor split by rows of its last dimension.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>

#include "test_util.h"
#include "tpreload/checkpoint/hdf5.h"
#include "tpreload/checkpoint/row_split.h"
#include "tpreload/checkpoint/safetensors.h"
#include "tpreload/checkpoint/writers.h"

namespace tpreload {
namespace {

using test::TempDir;

// A [rows, cols] int32 tensor holding row * 1000 + col.
std::vector<std::int32_t> numbered(std::int64_t rows, std::int64_t cols) {
  std::vector<std::int32_t> v;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) v.push_back(static_cast<std::int32_t>(r * 1000 + c));
  return v;
}

struct Checkpoint {
  std::vector<std::int32_t> qkv = numbered(9, 5);      // q 4 rows, k 3, v 2
  std::vector<std::int32_t> norm = numbered(1, 3);     // not stacked
  std::vector<std::int32_t> gate_up = numbered(6, 1);  // 1-D: gate 2, up 4
  std::vector<InMemoryTensor> tensors() const {
    return {{"norm", DType::kInt32, {3}, ConstBytes(norm.data(), 12), nullptr},
            {"qkv", DType::kInt32, {9, 5}, ConstBytes(qkv.data(), qkv.size() * 4), nullptr},
            {"gate_up", DType::kInt32, {6}, ConstBytes(gate_up.data(), 24), nullptr}};
  }
};

std::vector<RowSplit> splits() {
  return {{"qkv", {{"q", 4}, {"k", 3}, {"v", 2}}}, {"gate_up", {{"gate", 2}, {"up", 4}}}};
}

// What part `name` must hold: rows [first, first + rows) of its stacked tensor,
// written out from the numbering (1-D tensors: row r is the value r * 1000).
struct Part {
  std::string name, stacked;  // stacked: the base tensor's name
  std::vector<std::int64_t> shape;
  std::int64_t first;
};
const Part kParts[] = {{"norm", "norm", {3}, -1},   {"q", "qkv", {4, 5}, 0},
                       {"k", "qkv", {3, 5}, 4},     {"v", "qkv", {2, 5}, 7},
                       {"gate", "gate_up", {2}, 0}, {"up", "gate_up", {4}, 2}};

const Part& part_named(const std::string& name) {
  for (const Part& p : kParts)
    if (p.name == name) return p;
  throw std::invalid_argument("no part " + name);
}

std::vector<std::int32_t> expected(const Part& p) {
  if (p.first < 0) return numbered(1, 3);
  std::vector<std::int32_t> v;
  const std::int64_t cols = p.shape.size() == 2 ? p.shape[1] : 1;
  for (std::int64_t r = 0; r < p.shape[0]; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      v.push_back(static_cast<std::int32_t>((p.first + r) * 1000 + c));
  return v;
}

// The base's names with each stacked tensor's parts in its place.
std::vector<std::string> names_in_place(const WeightSource& base) {
  std::vector<std::string> names;
  for (const TensorInfo& t : base.tensors())
    for (const Part& p : kParts)
      if (p.stacked == t.name) names.push_back(p.name);
  return names;
}

const TensorInfo& base_tensor(const WeightSource& base, const std::string& name) {
  for (const TensorInfo& t : base.tensors())
    if (t.name == name) return t;
  throw std::invalid_argument("no tensor " + name);
}

void expect_parts(WeightSource& base) {
  const auto source = make_row_split_source(base, splits(), "the test's model");
  const auto& listed = source->tensors();
  std::vector<std::string> names;
  for (const TensorInfo& t : listed) names.push_back(t.name);
  ASSERT_EQ(names, names_in_place(base)) << source->describe();
  EXPECT_NE(source->describe().find("the test's model"), std::string::npos);
  for (std::size_t i = 0; i < listed.size(); ++i) {
    const TensorInfo& t = listed[i];
    const Part& p = part_named(t.name);
    SCOPED_TRACE(base.describe() + ": " + p.name);
    EXPECT_EQ(t.shape, p.shape);
    EXPECT_EQ(t.dtype, DType::kInt32);
    const auto want = expected(p);
    ASSERT_EQ(t.nbytes, want.size() * 4);
    // The part's bytes are where the stacked tensor's rows are in its file.
    const TensorInfo& from = base_tensor(base, p.stacked);
    const std::uint64_t row_bytes = (p.shape.size() == 2 ? p.shape[1] : 1) * 4;
    EXPECT_EQ(t.file, from.file);
    if (from.file_offset != 0) {
      EXPECT_EQ(t.file_offset, from.file_offset + std::max<std::int64_t>(p.first, 0) * row_bytes);
    } else {  // (0: not plainly in a file, which readers must still know)
      EXPECT_EQ(t.file_offset, 0u);
    }
    std::vector<std::int32_t> got(want.size(), -1);
    source->read(i, {0, t.nbytes}, MutableBytes(got.data(), t.nbytes));
    EXPECT_EQ(got, want);
    if (const auto view = source->view(i, {4, t.nbytes - 4})) {
      ASSERT_EQ(view->size, t.nbytes - 4);
      EXPECT_EQ(std::memcmp(view->data, want.data() + 1, view->size), 0);
    }
    std::vector<std::int32_t> split(want.size(), -1);  // the first value, then the rest
    source->read_split(
        i, {0, t.nbytes},
        {MutableBytes(split.data(), 4), MutableBytes(split.data() + 1, t.nbytes - 4)});
    EXPECT_EQ(split, want);
    try {
      source->read(i, {4, t.nbytes}, MutableBytes(got.data(), t.nbytes));
      ADD_FAILURE() << "a read past the part's end went through";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + p.name + "'"), std::string::npos) << e.what();
    }
  }
  // Every part in one read_many (k, v and q follow each other in the file).
  std::vector<std::vector<std::int32_t>> got(listed.size());
  std::vector<ReadRequest> requests;
  for (std::size_t i : {0, 2, 3, 1, 4, 5}) {
    got[i].assign(listed[i].nbytes / 4, -1);
    requests.push_back({i, {0, listed[i].nbytes}, MutableBytes(got[i].data(), listed[i].nbytes)});
  }
  const std::uint64_t before = source->bytes_read();
  source->read_many(requests);
  for (std::size_t i = 0; i < listed.size(); ++i)
    EXPECT_EQ(got[i], expected(part_named(listed[i].name))) << listed[i].name;
  EXPECT_EQ(source->bytes_read() - before, (3 + 45 + 6) * 4u) << "the base's count";
}

TEST(RowSplit, PartsReadAsTheStackedTensorsRowsFromEverySource) {
  TempDir dir;
  const Checkpoint ckpt;
  write_safetensors(dir / "w.safetensors", ckpt.tensors(), {});
  write_safetensors_sharded(dir / "sharded", ckpt.tensors(), 2);
  write_hdf5(dir / "w.h5", ckpt.tensors());
  for (const std::string& path : {dir / "w.safetensors", dir / "sharded", dir / "w.h5"}) {
    auto base = open_weight_source(path);
    expect_parts(*base);
  }
  auto memory = make_in_memory_source(ckpt.tensors());
  expect_parts(*memory);
}

std::string listing_error(WeightSource& base, std::vector<RowSplit> with) {
  const auto source = make_row_split_source(base, std::move(with), "Phi3ForCausalLM's config");
  try {
    source->tensors();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(RowSplit, RowsThatDoNotAddUpAndPartsHeldTwiceAreRefusedNamingThem) {
  TempDir dir;
  const Checkpoint ckpt;
  write_safetensors(dir / "w.safetensors", ckpt.tensors(), {});
  auto base = open_weight_source(dir / "w.safetensors");
  const std::string rows = listing_error(*base, {{"qkv", {{"q", 4}, {"k", 4}, {"v", 4}}}});
  EXPECT_NE(rows.find("w.safetensors: tensor 'qkv' has shape [9, 5]; Phi3ForCausalLM's config "
                      "stacks 12 rows (q 4 + k 4 + v 4) in it"),
            std::string::npos)
      << rows;
  const std::string twice = listing_error(*base, {{"qkv", {{"q", 4}, {"norm", 5}}}});
  EXPECT_NE(twice.find("holds both 'qkv' and 'norm'"), std::string::npos) << twice;
  // A stacked tensor the checkpoint does not hold changes nothing.
  const auto absent = make_row_split_source(*base, {{"nothing", {{"a", 1}}}}, "a config");
  EXPECT_EQ(absent->tensors(), base->tensors());
}

// A 3-D tensor split by rows of its last dimension (GraniteMoE's experts
// [E, 2 x I, hidden]): each part [rows, last], its values the rows the test
// indexes itself, from files and memory; rows that do not add up refused.
TEST(RowSplit, FlatPartsAreRowsOfTheLastDimension) {
  std::vector<std::int32_t> experts;  // [2 experts, 4 rows, 3]: e * 100 + row * 10 + col
  for (int e = 0; e < 2; ++e)
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 3; ++c) experts.push_back(e * 100 + r * 10 + c);
  const std::vector<InMemoryTensor> tensors = {{"experts",
                                                DType::kInt32,
                                                {2, 4, 3},
                                                ConstBytes(experts.data(), experts.size() * 4),
                                                nullptr}};
  RowSplit split{"experts", {{"e0.gate", 2}, {"e0.up", 2}, {"e1.gate", 1}, {"e1.up", 3}}};
  split.flat = true;
  split.shape = {2, 4, 3};
  TempDir dir;
  write_safetensors(dir / "w.safetensors", tensors, {});
  write_hdf5(dir / "w.h5", tensors);
  auto file = open_weight_source(dir / "w.safetensors");
  auto h5 = open_weight_source(dir / "w.h5");
  auto memory = make_in_memory_source(tensors);
  for (WeightSource* base : {file.get(), h5.get(), memory.get()}) {
    SCOPED_TRACE(base->describe());
    const auto source = make_row_split_source(*base, {split}, "the test's model");
    const auto& listed = source->tensors();
    ASSERT_EQ(listed.size(), 4u);
    int flat_row = 0;  // rows of 3 counted over both experts
    for (std::size_t i = 0; i < listed.size(); ++i) {
      const std::int64_t rows = split.parts[i].rows;
      EXPECT_EQ(listed[i].name, split.parts[i].name);
      EXPECT_EQ(listed[i].shape, (std::vector<std::int64_t>{rows, 3}));
      std::vector<std::int32_t> want;
      for (int r = flat_row; r < flat_row + rows; ++r)
        for (int c = 0; c < 3; ++c) want.push_back((r / 4) * 100 + (r % 4) * 10 + c);
      flat_row += static_cast<int>(rows);
      ASSERT_EQ(listed[i].nbytes, want.size() * 4);
      const std::uint64_t n = listed[i].nbytes;
      std::vector<std::int32_t> got(want.size(), -1);
      source->read(i, {0, n}, MutableBytes(got.data(), n));
      EXPECT_EQ(got, want) << listed[i].name;
      if (const auto view = source->view(i, {4, n - 4})) {  // (from the second value)
        ASSERT_EQ(view->size, n - 4);
        EXPECT_EQ(std::memcmp(view->data, want.data() + 1, view->size), 0) << listed[i].name;
      }
      std::vector<std::int32_t> split_read(want.size(), -1);
      source->read_split(
          i, {0, n},
          {MutableBytes(split_read.data(), 4), MutableBytes(split_read.data() + 1, n - 4)});
      EXPECT_EQ(split_read, want) << listed[i].name;
      try {
        source->read(i, {4, n}, MutableBytes(got.data(), n));
        ADD_FAILURE() << "a read past " << listed[i].name << "'s end went through";
      } catch (const CheckpointError& e) {
        EXPECT_NE(std::string(e.what()).find("'" + listed[i].name + "'"), std::string::npos)
            << e.what();
      }
    }
  }
  RowSplit short_split{"experts", {{"e0", 4}, {"e1", 3}}};
  short_split.flat = true;
  const std::string rows = listing_error(*file, {short_split});
  EXPECT_NE(rows.find("tensor 'experts' has shape [2, 4, 3]; Phi3ForCausalLM's config stacks 7 "
                      "rows (e0 4 + e1 3) of its last dimension in it"),
            std::string::npos)
      << rows;
  // The same rows in another shape (many flatten alike), and a 1-D tensor.
  RowSplit other_shape{"experts", {{"e0", 4}, {"e1", 4}}, true, {4, 2, 3}};
  const std::string shape = listing_error(*file, {other_shape});
  EXPECT_NE(shape.find("tensor 'experts' has shape [2, 4, 3]; Phi3ForCausalLM's config stacks 8 "
                       "rows (e0 4 + e1 4) of its last dimension in it, a tensor of shape "
                       "[4, 2, 3]"),
            std::string::npos)
      << shape;
  const Checkpoint ckpt;
  auto flat_1d = make_in_memory_source(ckpt.tensors());
  const std::string one_d = listing_error(*flat_1d, {{"gate_up", {{"gate", 1}}, true}});
  EXPECT_NE(one_d.find("tensor 'gate_up' has shape [6]"), std::string::npos) << one_d;
}

}  // namespace
}  // namespace tpreload
