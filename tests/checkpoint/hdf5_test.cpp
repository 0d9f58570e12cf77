// HDF5: round trips of every dtype (nested, flat, chunked+gzip), partial reads,
// files written with the raw HDF5 C API and by h5py, and the broken-file corpus.
#include <hdf5.h>

#include <gtest/gtest.h>

#include <cstring>

#include "test_util.h"
#include "tpreload/checkpoint/hdf5.h"
#include "tpreload/checkpoint/safetensors.h"
#include "tpreload/checkpoint/writers.h"

namespace tpreload {
namespace {

using test::TempDir;

// A raw hid_t closed on scope exit (the tests build fixtures with the bare C API).
class Raw {
 public:
  Raw(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {
    if (id < 0) throw std::runtime_error("HDF5 call failed in test fixture");
  }
  ~Raw() { close_(id_); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;
  operator hid_t() const { return id_; }  // NOLINT: convenience in fixtures

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// Create dataset `path` of `type` and `dims` under `loc` and write `data` (memory type `mem`).
void raw_dataset(hid_t loc, const char* path, hid_t type, std::vector<hsize_t> dims, hid_t mem,
                 const void* data, hid_t dcpl = H5P_DEFAULT) {
  Raw space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), &H5Sclose);
  Raw ds(H5Dcreate2(loc, path, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), &H5Dclose);
  if (H5Dwrite(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) throw std::runtime_error("write");
}

void raw_string_attribute(hid_t loc, const char* dataset, const char* value) {
  Raw ds(H5Dopen2(loc, dataset, H5P_DEFAULT), &H5Dclose);
  Raw type(H5Tcopy(H5T_C_S1), &H5Tclose);
  H5Tset_size(type, std::strlen(value) + 1);  // fixed length, unlike h5py's variable length
  Raw space(H5Screate(H5S_SCALAR), &H5Sclose);
  Raw attr(H5Acreate2(ds, "dtype", type, space, H5P_DEFAULT, H5P_DEFAULT), &H5Aclose);
  H5Awrite(attr, type, value);
}

Raw raw_file(const std::string& path) {
  return Raw(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), &H5Fclose);
}

Raw raw_groups(hid_t file, const char* path) {
  Raw lcpl(H5Pcreate(H5P_LINK_CREATE), &H5Pclose);
  H5Pset_create_intermediate_group(lcpl, 1);
  return Raw(H5Gcreate2(file, path, lcpl, H5P_DEFAULT, H5P_DEFAULT), &H5Gclose);
}

std::vector<std::string> names_of(const WeightSource& source) {
  std::vector<std::string> names;
  for (const auto& t : source.tensors()) names.push_back(t.name);
  return names;
}

TEST(Hdf5, RoundTripsEveryDTypeInEachLayout) {
  const auto tensors = test::every_dtype_tensors();
  std::vector<std::string> written;
  for (const auto& t : tensors) written.push_back(t.name);
  for (const auto layout : {Hdf5Layout::kNested, Hdf5Layout::kFlat}) {
    for (const int gzip : {0, 6}) {
      TempDir dir;
      write_hdf5(dir / "m.h5", test::as_memory(tensors), {layout, gzip, 64});
      auto source = open_hdf5(dir / "m.h5");
      test::expect_same_tensors(*source, tensors);
      EXPECT_EQ(names_of(*source), written) << "creation order is kept";
      EXPECT_FALSE(source->view(0, {0, 4}).has_value());
      std::uint64_t total = 0;
      for (const auto& t : tensors) total += t.bytes.size();
      EXPECT_EQ(source->bytes_read(), total);
    }
  }
}

TEST(Hdf5, ConvertsToSafetensorsAndBackByteForByte) {
  TempDir dir;
  const auto tensors = test::every_dtype_tensors();
  write_safetensors(dir / "a.safetensors", test::as_memory(tensors));
  auto st = open_safetensors(dir / "a.safetensors");
  write_hdf5(dir / "a.h5", specs_of(*st), fill_from(*st), {Hdf5Layout::kNested, 4, 1 << 20});
  auto h5 = open_hdf5(dir / "a.h5");
  write_safetensors(dir / "b.safetensors", specs_of(*h5), fill_from(*h5));
  EXPECT_EQ(test::read_file(dir / "b.safetensors"), test::read_file(dir / "a.safetensors"));
}

TEST(Hdf5, PartialReadsSelectJustTheRequestedBytes) {
  TempDir dir;
  const std::vector<test::OwnedTensor> tensors = {
      test::random_tensor("a", DType::kFloat32, {4, 6, 5}),
      test::random_tensor("b", DType::kInt8, {7, 3}),
      test::random_tensor("c", DType::kFloat64, {9})};
  write_hdf5(dir / "p.h5", test::as_memory(tensors), {Hdf5Layout::kNested, 1, 40});
  auto source = open_hdf5(dir / "p.h5");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& want = tensors[i].bytes;
    for (std::uint64_t off : {0, 1, 3, 4, 20, 29, 57}) {
      for (std::uint64_t len : {0, 1, 4, 5, 24, 33, 100}) {
        if (off + len > want.size()) continue;
        std::vector<std::byte> got(len);
        source->read(i, {off, len}, MutableBytes(got.data(), len));
        EXPECT_EQ(std::memcmp(got.data(), want.data() + off, len), 0)
            << tensors[i].name << " [" << off << ", +" << len << ")";
      }
    }
  }
  EXPECT_EQ(test::error_of([&] {
              std::byte b[8];
              source->read(2, {70, 8}, MutableBytes(b, 8));
            }),
            "hdf5 file '" + (dir / "p.h5") +
                "': tensor 'c' (dataset '/c'): range [70, 78) exceeds "
                "its 72 bytes");
}

TEST(Hdf5, ReadsAFileWrittenWithTheRawCApiInBothLayouts) {
  TempDir dir;
  const float f[6] = {1, 2, 3, -4, 5.5f, 6};
  const std::int8_t q[16] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 15, -16};
  const std::int64_t big[3] = {1, -1, 1LL << 40};
  const std::uint16_t bf[2] = {0x3f80, 0xc000};  // bfloat16 1.0, -2.0
  {
    Raw file = raw_file(dir / "raw.h5");
    raw_dataset(file, "model.embed.weight", H5T_IEEE_F32BE, {2, 3}, H5T_NATIVE_FLOAT, f);
    Raw group = raw_groups(file, "model/layers/0");
    Raw dcpl(H5Pcreate(H5P_DATASET_CREATE), &H5Pclose);
    const hsize_t chunk[2] = {2, 4};
    H5Pset_chunk(dcpl, 2, chunk);
    H5Pset_deflate(dcpl, 9);
    raw_dataset(group, "q", H5T_STD_I8LE, {4, 4}, H5T_NATIVE_INT8, q, dcpl);
    raw_dataset(group, "big", H5T_STD_I64BE, {3}, H5T_NATIVE_INT64, big);
    raw_dataset(group, "bf", H5T_STD_U16LE, {2}, H5T_NATIVE_UINT16, bf);
    raw_string_attribute(group, "bf", "bfloat16");
  }
  auto source = open_hdf5(dir / "raw.h5");
  std::vector<test::OwnedTensor> want(4);
  want[0] = {"model.embed.weight", DType::kFloat32, {2, 3}, {}};
  want[0].bytes.assign(reinterpret_cast<const std::byte*>(f),
                       reinterpret_cast<const std::byte*>(f) + 24);
  want[1] = {"model.layers.0.q", DType::kInt8, {4, 4}, {}};
  want[1].bytes.assign(reinterpret_cast<const std::byte*>(q),
                       reinterpret_cast<const std::byte*>(q) + 16);
  want[2] = {"model.layers.0.big", DType::kInt64, {3}, {}};
  want[2].bytes.assign(reinterpret_cast<const std::byte*>(big),
                       reinterpret_cast<const std::byte*>(big) + 24);
  want[3] = {"model.layers.0.bf", DType::kBFloat16, {2}, {}};
  want[3].bytes.assign(reinterpret_cast<const std::byte*>(bf),
                       reinterpret_cast<const std::byte*>(bf) + 4);
  test::expect_same_tensors(*source, want);
}

std::string python() {
  if (const char* p = std::getenv("TPRELOAD_PYTHON")) return p;
  return ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

TEST(Hdf5, ReadsAFileWrittenByH5py) {
  TempDir dir;
  const std::string script =
      "import h5py, numpy as np\n"
      "with h5py.File('" +
      (dir / "py.h5") +
      "', 'w') as f:\n"
      "    f['model.norm.weight'] = np.array([1.0, -2.0, 0.5], dtype=np.float16)\n"
      "    f.create_dataset('model/layers/0/mlp/up_proj/weight', data=np.arange(12, "
      "dtype=np.float32).reshape(3, 4), compression='gzip', chunks=(1, 4))\n"
      "    f['model/layers/0/q'] = np.array([[-128, 127], [0, 5]], dtype=np.int8)\n"
      "    f['model/layers/0/b'] = np.array([0x3f80, 0x4000], dtype=np.uint16)\n"
      "    f['model/layers/0/b'].attrs['dtype'] = 'bfloat16'\n"
      "    f['flags'] = np.array([True, False, True])\n";
  test::write_file(dir / "make.py", script);
  ASSERT_EQ(std::system((python() + " " + (dir / "make.py")).c_str()), 0)
      << "python3 with h5py is required (scripts/setup.sh installs python3-h5py)";
  auto source = open_hdf5(dir / "py.h5");
  const std::uint16_t half[3] = {0x3c00, 0xc000, 0x3800};
  float up[12];
  for (int i = 0; i < 12; ++i) up[i] = static_cast<float>(i);
  const std::int8_t q[4] = {-128, 127, 0, 5};
  const std::uint16_t bf[2] = {0x3f80, 0x4000};
  const std::uint8_t flags[3] = {1, 0, 1};
  auto owned = [](const char* name, DType d, std::vector<std::int64_t> shape, const void* p,
                  size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    return test::OwnedTensor{name, d, std::move(shape), std::vector<std::byte>(b, b + n)};
  };
  test::expect_same_tensors(
      *source, {owned("model.norm.weight", DType::kFloat16, {3}, half, 6),
                owned("model.layers.0.mlp.up_proj.weight", DType::kFloat32, {3, 4}, up, 48),
                owned("model.layers.0.q", DType::kInt8, {2, 2}, q, 4),
                owned("model.layers.0.b", DType::kBFloat16, {2}, bf, 4),
                owned("flags", DType::kBool, {3}, flags, 3)});
}

TEST(Hdf5, OurFilesReadInH5py) {
  TempDir dir;
  const std::vector<test::OwnedTensor> tensors = {
      test::random_tensor("model.layers.0.w", DType::kBFloat16, {2, 3}),
      test::random_tensor("model.norm.weight", DType::kFloat16, {4})};
  write_hdf5(dir / "ours.h5", test::as_memory(tensors), {Hdf5Layout::kNested, 3, 1 << 20});
  const std::string script =
      "import h5py, numpy as np\n"
      "f = h5py.File('" +
      (dir / "ours.h5") +
      "', 'r')\n"
      "w = f['model/layers/0/w']\n"
      "assert w.dtype == np.uint16 and w.attrs['dtype'] == 'bfloat16' and w.shape == (2, 3)\n"
      "n = f['model/norm/weight']\n"
      "assert n.dtype == np.float16, n.dtype\n"
      "open('" +
      (dir / "out.bin") + "', 'wb').write(w[()].tobytes() + n[()].tobytes())\n";
  test::write_file(dir / "check.py", script);
  ASSERT_EQ(std::system((python() + " " + (dir / "check.py")).c_str()), 0);
  std::string want(reinterpret_cast<const char*>(tensors[0].bytes.data()), 12);
  want.append(reinterpret_cast<const char*>(tensors[1].bytes.data()), 8);
  EXPECT_EQ(test::read_file(dir / "out.bin"), want);
}

class Hdf5Corpus : public ::testing::Test {
 protected:
  std::string open_error() {
    return test::error_of([&] { open_hdf5(path_); });
  }
  std::string prefix(const std::string& tensor, const std::string& dataset) const {
    return "hdf5 file '" + path_ + "': tensor '" + tensor + "' (dataset '" + dataset + "'): ";
  }
  TempDir dir_;
  const std::string path_ = dir_ / "bad.h5";
};

constexpr const char* kSupported =
    " (supported: float16/32/64, int8/32/64, uint8, bool, uint16 with attribute "
    "dtype=\"bfloat16\", and uint8 with attribute dtype=\"float8_e4m3fn\" or "
    "\"float8_e5m2\")";

TEST_F(Hdf5Corpus, NotAnHdf5File) {
  test::write_file(path_, "this is not HDF5 at all, just some text");
  EXPECT_EQ(open_error(), "hdf5 file '" + path_ + "': not an HDF5 file (no HDF5 signature)");
}

TEST_F(Hdf5Corpus, Int16Dataset) {
  const std::int16_t v[2] = {1, 2};
  {
    Raw file = raw_file(path_);
    Raw g = raw_groups(file, "a");
    raw_dataset(g, "b", H5T_STD_I16LE, {2}, H5T_NATIVE_SHORT, v);
  }
  EXPECT_EQ(open_error(),
            prefix("a.b", "/a/b") + "unsupported type 16-bit signed integer" + kSupported);
}

TEST_F(Hdf5Corpus, CompoundDataset) {
  struct Pair {
    int x;
    float y;
  } v[1] = {{1, 2}};
  {
    Raw file = raw_file(path_);
    Raw type(H5Tcreate(H5T_COMPOUND, sizeof(Pair)), &H5Tclose);
    H5Tinsert(type, "x", HOFFSET(Pair, x), H5T_NATIVE_INT);
    H5Tinsert(type, "y", HOFFSET(Pair, y), H5T_NATIVE_FLOAT);
    raw_dataset(file, "pairs", type, {1}, type, v);
  }
  EXPECT_EQ(open_error(), prefix("pairs", "/pairs") + "unsupported type compound" + kSupported);
}

TEST_F(Hdf5Corpus, Uint16WithoutTheBfloat16Attribute) {
  const std::uint16_t v[2] = {1, 2};
  {
    Raw file = raw_file(path_);
    raw_dataset(file, "w", H5T_STD_U16LE, {2}, H5T_NATIVE_UINT16, v);
  }
  EXPECT_EQ(open_error(), prefix("w", "/w") +
                              "unsupported type 16-bit unsigned integer without "
                              "attribute dtype=\"bfloat16\"" +
                              kSupported);
}

TEST_F(Hdf5Corpus, Bfloat16AttributeOnANon16BitDataset) {
  const float v[2] = {1, 2};
  {
    Raw file = raw_file(path_);
    raw_dataset(file, "model.w", H5T_IEEE_F32LE, {2}, H5T_NATIVE_FLOAT, v);
    raw_string_attribute(file, "model.w", "bfloat16");
  }
  EXPECT_EQ(open_error(), prefix("model.w", "/model.w") +
                              "attribute dtype=\"bfloat16\" on a 32-bit float dataset (bfloat16 "
                              "must be stored as 16-bit unsigned integers)");
}

TEST_F(Hdf5Corpus, Float8AttributeOnA16BitDataset) {
  const std::uint16_t v[2] = {1, 2};
  {
    Raw file = raw_file(path_);
    raw_dataset(file, "model.w", H5T_STD_U16LE, {2}, H5T_NATIVE_UINT16, v);
    raw_string_attribute(file, "model.w", "float8_e4m3fn");
  }
  EXPECT_EQ(open_error(), prefix("model.w", "/model.w") +
                              "attribute dtype=\"float8_e4m3fn\" on a 16-bit unsigned integer "
                              "dataset (float8_e4m3fn must be stored as 8-bit unsigned integers)");
}

TEST_F(Hdf5Corpus, DTypeAttributeThatContradictsTheType) {
  const std::int8_t v[2] = {1, 2};
  {
    Raw file = raw_file(path_);
    raw_dataset(file, "w", H5T_STD_I8LE, {2}, H5T_NATIVE_INT8, v);
    raw_string_attribute(file, "w", "float16");
  }
  EXPECT_EQ(open_error(), prefix("w", "/w") +
                              "attribute dtype=\"float16\" does not match the "
                              "dataset's 8-bit signed integer type (int8)");
}

TEST_F(Hdf5Corpus, SameNameFlatAndNested) {
  const float v[1] = {1};
  {
    Raw file = raw_file(path_);
    raw_dataset(file, "a.b", H5T_IEEE_F32LE, {1}, H5T_NATIVE_FLOAT, v);
    Raw g = raw_groups(file, "a");
    raw_dataset(g, "b", H5T_IEEE_F32LE, {1}, H5T_NATIVE_FLOAT, v);
  }
  EXPECT_EQ(open_error(), prefix("a.b", "/a.b") + "the name is also dataset '/a/b'");
}

// A virtual dataset maps another file's data; HDF5 reads a missing one as
// zeros without an error, so the dataset is refused whether it is there or not.
TEST_F(Hdf5Corpus, VirtualDataset) {
  const std::vector<hsize_t> dims{4};
  {
    Raw space(H5Screate_simple(1, dims.data(), nullptr), &H5Sclose);
    Raw dcpl(H5Pcreate(H5P_DATASET_CREATE), &H5Pclose);
    ASSERT_GE(H5Pset_virtual(dcpl, space, "elsewhere.h5", "/s", space), 0);
    Raw file = raw_file(path_);
    Raw ds(H5Dcreate2(file, "v", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), &H5Dclose);
  }
  EXPECT_EQ(open_error(), prefix("v", "/v") +
                              "dataset is virtual (its data lives in other files, which HDF5 reads "
                              "as fill values when they are missing); tpreload reads only data "
                              "stored in the file");
}

TEST_F(Hdf5Corpus, MissingFile) {
  EXPECT_EQ(open_error(), "hdf5 file '" + path_ + "': no such file");
}

TEST(Hdf5Errors, H5CheckReportsTheHdf5ErrorStack) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string message = test::error_of(
      [] { H5_CHECK(H5Fopen("/nonexistent/dir/x.h5", H5F_ACC_RDONLY, H5P_DEFAULT)); });
  EXPECT_EQ(message.rfind("HDF5 call H5Fopen(\"/nonexistent/dir/x.h5\", H5F_ACC_RDONLY, "
                          "H5P_DEFAULT) failed (-1) at hdf5_test.cpp:",
                          0),
            0u)
      << message;
  EXPECT_NE(message.find("#0 H5Fopen(): unable to open file"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

TEST(Hdf5Writer, RejectsNamesThatCannotNestAndLeavesNoFile) {
  TempDir dir;
  const float v = 0;
  const std::vector<InMemoryTensor> clash = {
      {"a.b", DType::kFloat32, {1}, ConstBytes(&v, 4), nullptr},
      {"a.b.c", DType::kFloat32, {1}, ConstBytes(&v, 4), nullptr}};
  EXPECT_EQ(test::error_of([&] { write_hdf5(dir / "x.h5", clash); }),
            "writing '" + (dir / "x.h5") +
                "': tensor 'a.b.c' needs group '/a/b', which is the "
                "dataset of another tensor");
  const std::vector<InMemoryTensor> empty = {
      {"a..b", DType::kFloat32, {1}, ConstBytes(&v, 4), nullptr}};
  EXPECT_EQ(test::error_of([&] { write_hdf5(dir / "y.h5", empty); }),
            "writing '" + (dir / "y.h5") +
                "': tensor name 'a..b' has an empty component (nested "
                "layout)");
  EXPECT_TRUE(test::dir_entries(dir.path()).empty());
  write_hdf5(dir / "flat.h5", clash, {Hdf5Layout::kFlat, 0, 1 << 20});
  EXPECT_EQ(open_hdf5(dir / "flat.h5")->tensors().size(), 2u);
}

}  // namespace
}  // namespace tpreload
