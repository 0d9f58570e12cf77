// Helpers for the checkpoint tests: temporary directories, raw file bytes, random
// tensors, and capturing an error message.
#pragma once

#include <dirent.h>
#include <ftw.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tpreload/checkpoint/synthetic.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"

namespace tpreload::test {

// A fresh directory under /tmp, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/tpreload_ckpt_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    ::nftw(
        path_.c_str(),
        [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A safetensors file laid down by hand: 8-byte little-endian length, header, data.
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

// Files in `dir` (names), sorted.
inline std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> names;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), &::closedir);
  while (d && (errno = 0, true)) {
    const dirent* e = ::readdir(d.get());
    if (e == nullptr) break;
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A tensor that owns its bytes (seeded random, valid for its dtype).
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};

inline OwnedTensor random_tensor(const std::string& name, DType dtype,
                                 std::vector<std::int64_t> shape, std::uint64_t seed = 1) {
  OwnedTensor t{name, dtype, std::move(shape), {}};
  std::uint64_t n = dtype_size(dtype);
  for (auto d : t.shape) n *= static_cast<std::uint64_t>(d);
  t.bytes.resize(n);
  fill_synthetic({name, dtype, t.shape}, {seed, 0.5, 10000.0}, MutableBytes(t.bytes.data(), n));
  return t;
}

inline std::vector<InMemoryTensor> as_memory(const std::vector<OwnedTensor>& tensors) {
  std::vector<InMemoryTensor> out;
  for (const auto& t : tensors)
    out.push_back({t.name, t.dtype, t.shape, ConstBytes(t.bytes.data(), t.bytes.size()), nullptr});
  return out;
}

// One tensor of each dtype (kAllDTypes), with assorted shapes (scalar, empty, 3-d).
inline std::vector<OwnedTensor> every_dtype_tensors() {
  std::vector<OwnedTensor> out;
  int i = 0;
  for (const DType d : kAllDTypes) {
    const std::string name =
        "model.layers." + std::to_string(i) + ".t_" + std::string(dtype_name(d));
    out.push_back(random_tensor(name, d, {3, 5, 7 + i}, 100 + i));
    ++i;
  }
  out.push_back(random_tensor("extra.scalar", DType::kFloat32, {}, 7));
  out.push_back(random_tensor("extra.empty", DType::kInt32, {0, 4}, 8));
  return out;
}

// Every tensor of `source` read whole, compared with `expected` by name.
inline void expect_same_tensors(WeightSource& source, const std::vector<OwnedTensor>& expected) {
  ASSERT_EQ(source.tensors().size(), expected.size()) << source.describe();
  for (const auto& want : expected) {
    std::size_t index = source.tensors().size();
    for (std::size_t i = 0; i < source.tensors().size(); ++i)
      if (source.tensors()[i].name == want.name) index = i;
    ASSERT_LT(index, source.tensors().size()) << "missing " << want.name;
    const TensorInfo& info = source.tensors()[index];
    EXPECT_EQ(info.dtype, want.dtype) << want.name;
    EXPECT_EQ(info.shape, want.shape) << want.name;
    ASSERT_EQ(info.nbytes, want.bytes.size()) << want.name;
    std::vector<std::byte> got(info.nbytes);
    source.read(index, {0, info.nbytes}, MutableBytes(got.data(), got.size()));
    EXPECT_TRUE(got == want.bytes) << "bytes differ for " << want.name;
  }
}

// The message of the Error `fn` throws, or "no error".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace tpreload::test
