// The broken-file corpus for safetensors: every file is laid down by hand here, and
// each must fail with exactly the one-line error below (file, tensor, values).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tpreload/checkpoint/safetensors.h"

namespace tpreload {
namespace {

using test::TempDir;

class SafetensorsCorpus : public ::testing::Test {
 protected:
  // Write `bytes` as `name` and return the error opening it gives.
  std::string open_error(const std::string& bytes) {
    test::write_file(path_, bytes);
    return test::error_of([&] { open_safetensors(path_); });
  }
  std::string open_error(const std::string& header, const std::string& data) {  // hand-built
    return open_error(test::safetensors_bytes(header, data));
  }
  std::string prefix() const { return "safetensors file '" + path_ + "': "; }

  TempDir dir_;
  const std::string path_ = dir_ / "bad.safetensors";
};

std::string f32(const std::string& name, const std::string& shape, int begin, int end) {
  return "\"" + name + R"(":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[)" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// A FIFO by the file's name is refused, not waited on (opening one for reading
// blocks until some writer opens it).
TEST_F(SafetensorsCorpus, AFifoIsRefusedNotWaitedFor) {
  ASSERT_EQ(::mkfifo(path_.c_str(), 0600), 0);
  EXPECT_EQ(test::error_of([&] { read_safetensors_header(path_); }),
            "'" + path_ + "' is not a regular file");
  EXPECT_EQ(test::error_of([&] { open_safetensors(path_); }),
            "'" + path_ + "' is not a regular file");
}

TEST_F(SafetensorsCorpus, FileTooShortForTheHeaderLength) {
  EXPECT_EQ(open_error(std::string("\x10\0\0", 3)),
            prefix() + "file is 3 bytes, too small for the 8-byte header length");
}

TEST_F(SafetensorsCorpus, HeaderLengthOverTheCap) {
  std::string bytes = test::safetensors_bytes("{}", "");
  bytes[0] = 0, bytes[1] = static_cast<char>(0xC2), bytes[2] = static_cast<char>(0xEB),
  bytes[3] = 0x0B;
  EXPECT_EQ(open_error(bytes),  // 0x0BEBC200 = 200,000,000
            prefix() + "header length 200000000 exceeds the limit of 100000000 bytes");
  std::string huge(8, static_cast<char>(0xFF));  // 2^64 - 1: no overflow in 8 + N
  EXPECT_EQ(open_error(huge + "{}"),
            prefix() + "header length 18446744073709551615 exceeds the limit of 100000000 bytes");
}

TEST_F(SafetensorsCorpus, TruncatedHeader) {
  const std::string full =
      test::safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcd");
  EXPECT_EQ(open_error(full.substr(0, 30)),
            prefix() + "header length 54 runs past the end of the 30-byte file");
}

TEST_F(SafetensorsCorpus, HeaderThatIsNotJson) {
  EXPECT_EQ(open_error("hello", ""),
            prefix() + "header does not start with '{' (not a JSON object)");
  EXPECT_EQ(open_error("{\"a\": nope}", ""),
            prefix() +
                "header is not valid JSON: [json.exception.parse_error.101] parse error at "
                "line 1, column 8: syntax error while parsing value - invalid literal; "
                "last read: '\"a\": no'");
  EXPECT_EQ(open_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", "abcd"),
            prefix() +
                "header is not valid JSON: [json.exception.parse_error.101] parse error at "
                "line 1, column 54: syntax error while parsing object - unexpected "
                "end of input; expected '}'");
}

TEST_F(SafetensorsCorpus, TruncatedData) {
  EXPECT_EQ(open_error("{" + f32("a", "[2]", 0, 8) + "," + f32("b", "[4]", 8, 24) + "}",
                       std::string(20, 'x')),
            prefix() +
                "tensor 'b': data_offsets [8, 24) exceed the data section of 20 bytes "
                "(file truncated?)");
}

TEST_F(SafetensorsCorpus, OffsetsOutOfBounds) {
  EXPECT_EQ(open_error("{" + f32("a", "[2]", 0, 8) + "," + f32("b", "[2]", 1000, 1008) + "}",
                       std::string(16, 'x')),
            prefix() +
                "tensor 'b': data_offsets [1000, 1008) exceed the data section of 16 bytes "
                "(file truncated?)");
}

TEST_F(SafetensorsCorpus, OverlappingOffsets) {
  EXPECT_EQ(open_error("{" + f32("a", "[2]", 0, 8) + "," + f32("b", "[2]", 4, 12) + "}",
                       std::string(12, 'x')),
            prefix() + "tensor 'b': data_offsets [4, 12) overlap tensor 'a' at [0, 8)");
}

TEST_F(SafetensorsCorpus, GapBetweenTensors) {
  EXPECT_EQ(open_error("{" + f32("a", "[2]", 0, 8) + "," + f32("b", "[2]", 12, 20) + "}",
                       std::string(20, 'x')),
            prefix() +
                "tensor 'b': data_offsets [12, 20) leave a gap after byte 8 (offsets must "
                "be contiguous from 0)");
}

TEST_F(SafetensorsCorpus, TrailingBytesAfterTheData) {
  EXPECT_EQ(open_error("{" + f32("a", "[2]", 0, 8) + "}", std::string(12, 'x')),
            prefix() +
                "tensor 'a': tensors end at data byte 8 but the data section holds 12 "
                "bytes (4 unexpected trailing bytes)");
}

TEST_F(SafetensorsCorpus, ShapeAndBytesMismatch) {
  EXPECT_EQ(open_error("{" + f32("a", "[2,3]", 0, 20) + "}", std::string(20, 'x')),
            prefix() +
                "tensor 'a': shape [2, 3] x F32 needs 24 bytes but data_offsets [0, 20) "
                "span 20");
  EXPECT_EQ(open_error("{" + f32("a", "[4294967296,4294967296]", 0, 4) + "}", "abcd"),
            prefix() + "tensor 'a': shape [4294967296, 4294967296] x F32 overflows 64 bits");
  EXPECT_EQ(open_error("{" + f32("a", "[-1]", 0, 4) + "}", "abcd"),
            prefix() +
                "tensor 'a': shape [-1] has a dimension that is not a non-negative 64-bit "
                "integer");
  EXPECT_EQ(open_error("{" + f32("a", "[1]", 4, 0) + "}", "abcd"),
            prefix() + "tensor 'a': data_offsets [4, 0) end before they begin");
}

TEST_F(SafetensorsCorpus, UnknownDType) {
  EXPECT_EQ(open_error(R"({"a":{"dtype":"F8_E8M0","shape":[4],"data_offsets":[0,4]}})", "abcd"),
            prefix() + "tensor 'a': unknown dtype 'F8_E8M0'");
  EXPECT_EQ(open_error(R"({"a":{"shape":[4],"data_offsets":[0,4]}})", "abcd"),
            prefix() + "tensor 'a': 'dtype' is missing or not a string");
}

TEST_F(SafetensorsCorpus, DuplicateNames) {
  EXPECT_EQ(open_error("{" + f32("a", "[1]", 0, 4) + "," + f32("a", "[1]", 4, 8) + "}",
                       std::string(8, 'x')),
            prefix() + "duplicate tensor name 'a' in header");
}

// Printing a value recurses once per level: a header nesting 100,000 arrays
// overflowed the stack in the message that named it. Anything nested deeper
// than 64 levels is refused as it is parsed. A field twice in a tensor's entry
// is refused as the format's reference parser refuses it, not the last one taken.
TEST_F(SafetensorsCorpus, DeepNestingAndAFieldTwiceAreRefusedByName) {
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  EXPECT_EQ(open_error(R"({"a":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})", ""),
            prefix() + "header entry 'a' is nested deeper than 64 levels");
  EXPECT_EQ(open_error(R"({"__metadata__":{"k":)" + deep + "}}", ""),
            prefix() + "header entry '__metadata__' is nested deeper than 64 levels");
  // 64 levels under the header (the entry's object is the first) still parse.
  const std::string levels_63 = std::string(63, '[') + std::string(63, ']');
  EXPECT_EQ(open_error(R"({"__metadata__":{"k":)" + levels_63 + "}}", ""),
            prefix() + "'__metadata__' value of key 'k' is not a string: " + levels_63);
  EXPECT_EQ(
      open_error(R"({"a":{"dtype":"I8","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcd"),
      prefix() + "tensor 'a': field 'dtype' appears twice");
}

TEST_F(SafetensorsCorpus, MetadataThatIsNotStrings) {
  EXPECT_EQ(open_error(R"({"__metadata__":{"k":3}})", ""),
            prefix() + "'__metadata__' value of key 'k' is not a string: 3");
}

class SafetensorsIndexCorpus : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_file(dir_ / "f1.safetensors",
                     test::safetensors_bytes("{" + f32("a", "[1]", 0, 4) + "}", "abcd"));
  }
  std::string open_with_index(const nlohmann::json& weight_map) {
    test::write_file(index(), nlohmann::json{{"weight_map", weight_map}}.dump());
    return test::error_of([&] { open_safetensors(dir_.path()); });
  }
  std::string index() const { return dir_ / "model.safetensors.index.json"; }
  std::string prefix() const { return "safetensors index '" + index() + "': "; }

  TempDir dir_;
};

TEST_F(SafetensorsIndexCorpus, IndexNamingAMissingFile) {
  EXPECT_EQ(open_with_index({{"a", "f1.safetensors"}, {"b", "model-00002-of-00002.safetensors"}}),
            prefix() + "tensor 'b': file 'model-00002-of-00002.safetensors' does not exist");
}

TEST_F(SafetensorsIndexCorpus, IndexNamingATensorTheFileLacks) {
  EXPECT_EQ(open_with_index({{"a", "f1.safetensors"}, {"zz", "f1.safetensors"}}),
            prefix() + "tensor 'zz' is mapped to 'f1.safetensors', which does not contain it");
}

TEST_F(SafetensorsIndexCorpus, TensorMissingFromTheIndex) {
  test::write_file(dir_ / "f2.safetensors",
                   test::safetensors_bytes("{" + f32("b", "[1]", 0, 4) + "}", "abcd"));
  EXPECT_EQ(open_with_index({{"a", "f1.safetensors"}, {"c", "f2.safetensors"}}),
            prefix() + "tensor 'c' is mapped to 'f2.safetensors', which does not contain it");
  EXPECT_EQ(open_with_index(
                {{"a", "f1.safetensors"}, {"a2", "f1.safetensors"}, {"zz", "f2.safetensors"}}),
            prefix() + "tensor 'a2' is mapped to 'f1.safetensors', which does not contain it");
  test::write_file(
      dir_ / "f2.safetensors",
      test::safetensors_bytes("{" + f32("b", "[1]", 0, 4) + "," + f32("c", "[1]", 4, 8) + "}",
                              "abcdefgh"));
  EXPECT_EQ(open_with_index({{"a", "f1.safetensors"}, {"c", "f2.safetensors"}}),
            prefix() + "tensor 'b' in 'f2.safetensors' is missing from the weight_map");
}

TEST_F(SafetensorsIndexCorpus, IndexEscapingTheDirectory) {
  EXPECT_EQ(open_with_index({{"a", "../f1.safetensors"}}),
            prefix() + "tensor 'a': file name '../f1.safetensors' is not a plain file name");
}

TEST_F(SafetensorsIndexCorpus, IndexThatIsNotJsonOrHasNoWeightMap) {
  test::write_file(index(), "{\"metadata\": {}}");
  EXPECT_EQ(test::error_of([&] { open_safetensors(dir_.path()); }),
            prefix() + "no 'weight_map' object");
}

TEST_F(SafetensorsIndexCorpus, IndexNestedTooDeepIsRefusedNotPrinted) {
  // A non-string metadata value is kept as its JSON text: printing 100,000
  // levels of it overflowed the stack.
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  test::write_file(index(),
                   R"({"metadata":{"k":)" + deep + R"(},"weight_map":{"a":"f1.safetensors"}})");
  const std::string error = test::error_of([&] { open_safetensors(dir_.path()); });
  EXPECT_EQ(error.rfind(prefix() + "not valid JSON: ", 0), 0u) << error;
  EXPECT_NE(error.find("nested deeper than 64 levels"), std::string::npos) << error;
}

TEST_F(SafetensorsIndexCorpus, SameTensorInTwoFilesWithoutIndex) {
  test::write_file(dir_ / "f2.safetensors",
                   test::safetensors_bytes("{" + f32("a", "[1]", 0, 4) + "}", "abcd"));
  EXPECT_EQ(test::error_of([&] { open_safetensors(dir_.path()); }),
            "safetensors file '" + (dir_ / "f2.safetensors") + "': tensor 'a' is also in '" +
                (dir_ / "f1.safetensors") + "'");
}

}  // namespace
}  // namespace tpreload
