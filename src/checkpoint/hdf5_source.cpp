// The HDF5 source (see hdf5.h).
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "file_util.h"
#include "hdf5_types.h"
#include "hdf5_util.h"
#include "shape_util.h"
#include "tpreload/checkpoint/hdf5.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

using detail::H5Id;

struct VisitState {
  std::vector<std::string> links;
};

herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* data) {
  if (info->type == H5L_TYPE_HARD) static_cast<VisitState*>(data)->links.emplace_back(name);
  return 0;
}

// Hard links below the root, in creation order if every group tracks it, else by name.
std::vector<std::string> visit_links(hid_t file) {
  VisitState state;
  if (H5Lvisit(file, H5_INDEX_CRT_ORDER, H5_ITER_INC, &collect_link, &state) >= 0)
    return state.links;
  H5Eclear2(H5E_DEFAULT);
  state.links.clear();
  H5_CHECK(H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, &collect_link, &state));
  return state.links;
}

std::string dotted(std::string path) {
  std::replace(path.begin(), path.end(), '/', '.');
  return path;
}

std::vector<std::int64_t> dataset_shape(hid_t space, const std::string& where) {
  const H5S_class_t cls = H5Sget_simple_extent_type(space);
  if (cls == H5S_SCALAR) return {};
  if (cls != H5S_SIMPLE) raise<CheckpointError>(where, ": dataset has no data (null dataspace)");
  const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  return {dims.begin(), dims.end()};
}

// Data stored in the file, through filters this libhdf5 has. A virtual
// dataset's data lives in other files, and HDF5 reads a missing one as fill
// values without an error: refused.
void check_storage(hid_t dataset, const std::string& where) {
  H5Id plist = detail::h5_plist(H5Dget_create_plist(dataset));
  if (H5Pget_layout(plist.get()) == H5D_VIRTUAL)
    raise<CheckpointError>(where,
                           ": dataset is virtual (its data lives in other files, which HDF5 "
                           "reads as fill values when they are missing); tpreload reads only "
                           "data stored in the file");
  const int n = H5_CHECK(H5Pget_nfilters(plist.get()));
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, config = 0;
    size_t nvalues = 0;
    char name[64] = "";
    const H5Z_filter_t id =
        H5_CHECK(H5Pget_filter2(plist.get(), static_cast<unsigned>(i), &flags, &nvalues, nullptr,
                                sizeof(name), name, &config));
    if (H5_CHECK(H5Zfilter_avail(id)) <= 0)
      raise<CheckpointError>(where, ": dataset uses filter ", id, " ('", name,
                             "'), which this libhdf5 cannot decode");
  }
}

std::uint64_t contiguous_offset(hid_t dataset) {
  const haddr_t offset = H5Dget_offset(dataset);
  if (offset == HADDR_UNDEF) H5Eclear2(H5E_DEFAULT);
  return offset == HADDR_UNDEF ? 0 : static_cast<std::uint64_t>(offset);
}

class Hdf5Source final : public WeightSource {
 public:
  explicit Hdf5Source(const std::string& path) : path_(path) {
    auto lock = detail::lock_hdf5();
    try {
      open_and_list();
    } catch (const CheckpointError& e) {
      file_ = H5Id();  // close while holding the lock
      if (std::strncmp(e.what(), "hdf5 file '", 11) == 0) throw;
      raise<CheckpointError>("hdf5 file '", path_, "': ", e.what());
    } catch (...) {
      file_ = H5Id();
      throw;
    }
  }

  ~Hdf5Source() override {
    auto lock = detail::lock_hdf5();
    file_ = H5Id();
  }

  std::string describe() const override {
    return detail::concat("hdf5 '", path_, "': ", infos_.size(), " tensors");
  }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }

  std::optional<ConstBytes> view(std::size_t index, ByteRange range) override {
    check_range(index, range);
    return std::nullopt;
  }

  void read(std::size_t index, ByteRange range, MutableBytes dst) override;

  std::uint64_t bytes_read() const override { return bytes_read_; }
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }

 private:
  std::string where(std::size_t index) const {
    return detail::concat("hdf5 file '", path_, "': tensor '", infos_[index].name, "' (dataset '/",
                          datasets_[index], "')");
  }
  void open_and_list();
  void add_dataset(const std::string& link, std::map<std::string, std::string>& seen);
  void check_range(std::size_t index, ByteRange range) const;
  void read_elements(std::size_t index, std::uint64_t first, std::uint64_t count, void* out);

  std::string path_;
  H5Id file_;
  std::vector<TensorInfo> infos_;
  std::vector<std::string> datasets_;  // path below the root, per tensor
  std::map<std::string, std::string> metadata_;
  std::uint64_t bytes_read_ = 0;
};

void Hdf5Source::open_and_list() {
  if (!detail::is_regular_file(path_))
    raise<CheckpointError>("hdf5 file '", path_, "': no such file");
  const htri_t is_h5 = H5Fis_hdf5(path_.c_str());
  if (is_h5 <= 0) {
    H5Eclear2(H5E_DEFAULT);
    raise<CheckpointError>("hdf5 file '", path_, "': not an HDF5 file (no HDF5 signature)");
  }
  file_ = detail::h5_file(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  std::map<std::string, std::string> seen;  // tensor name -> dataset path
  for (const auto& link : visit_links(file_.get())) add_dataset(link, seen);
}

void Hdf5Source::add_dataset(const std::string& link, std::map<std::string, std::string>& seen) {
  H5Id object = detail::h5_object(H5Oopen(file_.get(), link.c_str(), H5P_DEFAULT));
  if (H5Iget_type(object.get()) != H5I_DATASET) return;
  const std::string name = dotted(link);
  const std::string where =
      detail::concat("hdf5 file '", path_, "': tensor '", name, "' (dataset '/", link, "')");
  if (const auto it = seen.find(name); it != seen.end())
    raise<CheckpointError>(where, ": the name is also dataset '/", it->second, "'");
  seen.emplace(name, link);
  H5Id type = detail::h5_type(H5Dget_type(object.get()));
  std::string problem;
  const auto attr = detail::read_string_attribute(object.get(), "dtype", where);
  const auto dtype = detail::classify_h5_type(type.get(), attr, problem);
  if (!dtype) raise<CheckpointError>(where, ": ", problem);
  H5Id space = detail::h5_space(H5Dget_space(object.get()));
  TensorInfo info{name, *dtype, dataset_shape(space.get(), where), 0, path_, 0, -1};
  const auto nbytes = detail::checked_nbytes(info.shape, info.dtype);
  if (!nbytes)
    raise<CheckpointError>(where, ": shape ", detail::shape_string(info.shape),
                           " overflows 64 bits");
  info.nbytes = *nbytes;
  check_storage(object.get(), where);
  info.file_offset = contiguous_offset(object.get());
  infos_.push_back(std::move(info));
  datasets_.push_back(link);
}

void Hdf5Source::check_range(std::size_t index, ByteRange range) const {
  if (index >= infos_.size())
    raise<UsageError>("hdf5 file '", path_, "': tensor index ", index, " out of ", infos_.size());
  if (range.end() < range.offset || range.end() > infos_[index].nbytes)
    raise<CheckpointError>(where(index), ": range [", range.offset, ", ",
                           range.offset + range.length, ") exceeds its ", infos_[index].nbytes,
                           " bytes");
}

// Select flat elements [a, b) of the sub-array at `prefix` into `space`.
void select_flat(hid_t space, const std::vector<hsize_t>& dims, std::vector<hsize_t>& prefix,
                 std::uint64_t a, std::uint64_t b, bool& first) {
  const std::size_t k = prefix.size();
  auto add = [&](hsize_t index, hsize_t count, bool whole_rest) {
    std::vector<hsize_t> start(prefix), counts(k, 1);
    start.push_back(index);
    counts.push_back(count);
    for (std::size_t d = k + 1; d < dims.size(); ++d) {
      start.push_back(0);
      counts.push_back(whole_rest ? dims[d] : 1);
    }
    H5_CHECK(H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(),
                                 nullptr, counts.data(), nullptr));
    first = false;
  };
  if (k + 1 == dims.size()) return add(a, b - a, true);
  std::uint64_t stride = 1;
  for (std::size_t d = k + 1; d < dims.size(); ++d) stride *= dims[d];
  auto recurse = [&](std::uint64_t i, std::uint64_t lo, std::uint64_t hi) {
    prefix.push_back(i);
    select_flat(space, dims, prefix, lo, hi, first);
    prefix.pop_back();
  };
  if (a % stride != 0) {
    const std::uint64_t i = a / stride, stop = std::min(b, (i + 1) * stride);
    recurse(i, a - i * stride, stop - i * stride);
    a = stop;
  }
  if (const std::uint64_t whole = (b - a) / stride; whole > 0) {
    add(a / stride, whole, true);
    a += whole * stride;
  }
  if (a < b) recurse(a / stride, 0, b - a);
}

void Hdf5Source::read_elements(std::size_t index, std::uint64_t first, std::uint64_t count,
                               void* out) {
  H5Id dataset = detail::h5_dataset(H5Dopen2(file_.get(), datasets_[index].c_str(), H5P_DEFAULT));
  H5Id file_space = detail::h5_space(H5Dget_space(dataset.get()));
  std::vector<hsize_t> dims(infos_[index].shape.begin(), infos_[index].shape.end());
  if (dims.empty()) {
    H5_CHECK(H5Sselect_all(file_space.get()));
  } else {
    std::vector<hsize_t> prefix;
    bool first_slab = true;
    select_flat(file_space.get(), dims, prefix, first, first + count, first_slab);
  }
  const hsize_t mem_dims[1] = {count};
  H5Id mem_space = detail::h5_space(H5Screate_simple(1, mem_dims, nullptr));
  H5Id mem_type = detail::make_h5_type(infos_[index].dtype);
  H5_CHECK(
      H5Dread(dataset.get(), mem_type.get(), mem_space.get(), file_space.get(), H5P_DEFAULT, out));
}

void Hdf5Source::read(std::size_t index, ByteRange range, MutableBytes dst) {
  check_range(index, range);
  if (dst.size != range.length)
    raise<UsageError>(where(index), ": read of ", range.length, " bytes into a ", dst.size,
                      "-byte buffer");
  if (range.length == 0) return;
  const std::uint64_t esize = dtype_size(infos_[index].dtype);
  const std::uint64_t first = range.offset / esize, last = (range.end() + esize - 1) / esize;
  const bool aligned = range.offset % esize == 0 && range.length % esize == 0;
  std::vector<std::byte> staging(aligned ? 0 : (last - first) * esize);
  auto lock = detail::lock_hdf5();
  try {
    read_elements(index, first, last - first, aligned ? dst.data : staging.data());
  } catch (const CheckpointError& e) {
    raise<CheckpointError>(where(index), ": read of bytes [", range.offset, ", ", range.end(),
                           ") failed: ", e.what());
  }
  if (!aligned) std::memcpy(dst.data, staging.data() + (range.offset - first * esize), dst.size);
  bytes_read_ += range.length;
}

}  // namespace

std::unique_ptr<WeightSource> open_hdf5(const std::string& path) {
  return std::make_unique<Hdf5Source>(path);
}

bool is_hdf5_file(const std::string& path) {
  if (!detail::is_regular_file(path)) return false;
  auto lock = detail::lock_hdf5();
  const htri_t result = H5Fis_hdf5(path.c_str());
  if (result < 0) H5Eclear2(H5E_DEFAULT);
  return result > 0;
}

}  // namespace tpreload
