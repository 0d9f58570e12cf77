// The safetensors header's two parsers: the fast one takes what writers produce
// (ours, with metadata and padding), gives the same entries as the general one,
// and hands everything else to it, so that unusual but valid headers still load
// (escapes, other keys, key order, whitespace) and invalid ones fail alike.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "test_util.h"
#include "tpreload/checkpoint/safetensors.h"
#include "tpreload/checkpoint/writers.h"

namespace tpreload {
namespace {

using test::TempDir;

// The header text of a file: its 8-byte length, then that many bytes.
std::string header_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes.at(i));
  return bytes.substr(8, n);
}

SafetensorsHeader general(const std::string& text) {
  SafetensorsHeader h;
  detail::parse_safetensors_entries_general(text, h, "test");
  return h;
}

void expect_same(const SafetensorsHeader& a, const SafetensorsHeader& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    EXPECT_EQ(a.tensors[i].data.offset, b.tensors[i].data.offset);
    EXPECT_EQ(a.tensors[i].data.length, b.tensors[i].data.length);
  }
  EXPECT_EQ(a.metadata, b.metadata);
}

TEST(SafetensorsFastHeader, TakesWhatTheWriterProducesWithTheGeneralParsersEntries) {
  TempDir dir;
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 300; ++i)  // names past the small-string size, several dtypes, a scalar
    specs.push_back({"model.layers." + std::to_string(i) + ".mlp.experts.7.down_proj.weight",
                     i % 3 == 0   ? DType::kBFloat16
                     : i % 3 == 1 ? DType::kFloat32
                                  : DType::kInt8,
                     i == 5 ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{3, i % 7}});
  const std::string path = dir / "w.safetensors";
  write_safetensors(path, specs,
                    [](std::size_t, MutableBytes dst) { std::memset(dst.data, 1, dst.size); },
                    {{"format", "pt"}, {"step", "200"}});
  const std::string text = header_text(path);
  ASSERT_EQ(text.back(), ' ');  // the writer pads with spaces
  SafetensorsHeader fast;
  ASSERT_TRUE(detail::parse_safetensors_entries_fast(text, fast));
  expect_same(fast, general(text));
  EXPECT_EQ(fast.metadata.at("step"), "200");
  // And each entry as the specs say (the writer groups by element size, so look up by name).
  ASSERT_EQ(fast.tensors.size(), specs.size());
  for (const auto& e : fast.tensors) {
    const std::size_t i = std::stoul(e.name.substr(13));
    EXPECT_EQ(e.dtype, specs[i].dtype) << e.name;
    EXPECT_EQ(e.shape, specs[i].shape) << e.name;
    std::uint64_t n = dtype_size(specs[i].dtype);
    for (auto d : specs[i].shape) n *= static_cast<std::uint64_t>(d);
    EXPECT_EQ(e.data.length, n) << e.name;
  }
}

TEST(SafetensorsFastHeader, HandsUnusualButValidHeadersToTheGeneralParser) {
  const std::string body = R"("dtype":"F32","shape":[1],"data_offsets":[0,4])";
  struct Case {
    std::string text;
    std::string name;  // what the general parser names the one tensor
  };
  for (const Case& c : std::vector<Case>{
           {R"({"a\u0041":{)" + body + "}}", "aA"},              // an escape
           {"{\"caf\xc3\xa9\":{" + body + "}}", "caf\xc3\xa9"},  // UTF-8
           {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":[{}]}})", "a"},  // a key
           {R"({"a":{"shape":[1.0],"dtype":"F32","data_offsets":[0,4]}})", ""},  // float: refused
           {R"({"__metadata__":{"k":"1","k":"2"},"a":{)" + body + "}}", "a"},    // a key twice
       }) {
    SafetensorsHeader fast;
    EXPECT_FALSE(detail::parse_safetensors_entries_fast(c.text, fast)) << c.text;
    EXPECT_TRUE(fast.tensors.empty() && fast.metadata.empty()) << c.text;
    if (c.name.empty()) {
      EXPECT_THROW(parse_safetensors_header(c.text, 8 + c.text.size() + 4, "t"), CheckpointError);
      continue;
    }
    const auto h = parse_safetensors_header(c.text, 8 + c.text.size() + 4, "t");
    ASSERT_EQ(h.tensors.size(), 1u) << c.text;
    EXPECT_EQ(h.tensors[0].name, c.name);
    EXPECT_EQ(h.tensors[0].data.length, 4u);
  }
  // The last metadata value wins, as in the general parser's JSON objects.
  const std::string twice = R"({"__metadata__":{"k":"1","k":"2"}})";
  EXPECT_EQ(parse_safetensors_header(twice, 8 + twice.size(), "t").metadata.at("k"), "2");
}

TEST(SafetensorsFastHeader, TakesAnyKeyOrderAndJsonWhitespace) {
  const std::string text =
      "{ \"b\" :\n {\"data_offsets\" : [ 4 , 12 ] ,\t\"shape\":[ 2 ],\"dtype\":\"F32\"} ,\r\n"
      " \"a\":{\"dtype\":\"I8\",\"shape\":[],\"data_offsets\":[0,1]}}   ";
  SafetensorsHeader fast;
  ASSERT_TRUE(detail::parse_safetensors_entries_fast(text, fast));
  expect_same(fast, general(text));
  ASSERT_EQ(fast.tensors.size(), 2u);
  EXPECT_EQ(fast.tensors[0].name, "b");
  EXPECT_EQ(fast.tensors[0].data.offset, 4u);
  EXPECT_EQ(fast.tensors[0].data.length, 8u);
  EXPECT_EQ(fast.tensors[1].shape, std::vector<std::int64_t>{});
}

TEST(SafetensorsFastHeader, RefusesWhatTheGeneralParserMustName) {
  const std::string body = R"("dtype":"F32","shape":[1],"data_offsets":[0,4])";
  for (const std::string& text : std::vector<std::string>{
           " {\"a\":{" + body + "}}",                                     // leading space
           "{\"a\":{" + body + "}} x",                                    // trailing text
           "{\"a\":{" + body + "},\"a\":{" + body + "}}",                 // a name twice
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",   // wrong size
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})",   // end before begin
           R"({"a":{"dtype":"X9","shape":[1],"data_offsets":[0,4]}})",    // unknown dtype
           R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",  // negative
           R"({"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}})",  // leading zero
           R"({"a":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})",
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})",
           R"({"a":{"dtype":"F32","shape":[1]}})",  // offsets missing
           R"({"a":[]})", R"({"__metadata__":{"k":1}})",
           "{\"a\":{" + body + "}",  // unclosed
       }) {
    SafetensorsHeader fast;
    EXPECT_FALSE(detail::parse_safetensors_entries_fast(text, fast)) << text;
    // Nothing half-filled is left behind (the name-twice case had read one entry).
    EXPECT_TRUE(fast.tensors.empty() && fast.metadata.empty()) << text;
    EXPECT_THROW(general(text), CheckpointError) << text;
  }
}

}  // namespace
}  // namespace tpreload
