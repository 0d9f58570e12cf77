// The HDF5 writer (see writers.h).
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "file_util.h"
#include "hdf5_util.h"
#include "tpreload/checkpoint/writers.h"
#include "tpreload/core/error.h"
#include "writer_util.h"

namespace tpreload {
namespace {

using detail::H5Id;

H5Id creation_order_plist(hid_t cls) {
  H5Id plist = detail::h5_plist(H5Pcreate(cls));
  H5_CHECK(H5Pset_link_creation_order(plist.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED));
  return plist;
}

// Dataset path components of a tensor name in `layout`. Throws UsageError.
std::vector<std::string> components(const std::string& name, Hdf5Layout layout,
                                    const std::string& path) {
  if (name.find('/') != std::string::npos || name == "." || name.empty())
    raise<UsageError>("writing '", path, "': tensor name '", name, "' is not a valid HDF5 name");
  if (layout == Hdf5Layout::kFlat) return {name};
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (parts.back().empty())
      raise<UsageError>("writing '", path, "': tensor name '", name,
                        "' has an empty component (nested layout)");
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

// Chunk dimensions of about `target` bytes: whole trailing dimensions, cut leading ones.
std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims, std::uint64_t esize,
                                std::uint64_t target) {
  std::vector<hsize_t> chunk(dims);
  for (std::size_t d = 0; d < chunk.size(); ++d) {
    std::uint64_t rest = esize;
    for (std::size_t e = d + 1; e < chunk.size(); ++e) rest *= chunk[e];
    if (rest * chunk[d] <= target) break;
    chunk[d] = std::max<std::uint64_t>(1, target / rest);
    if (rest <= target) break;
  }
  return chunk;
}

// Owns the file and its groups; every HDF5 call runs under the HDF5 lock, but fill
// callbacks run outside it (they may read from another HDF5 source).
class Hdf5FileWriter {
 public:
  Hdf5FileWriter(const std::string& temp, std::string target, Hdf5WriteOptions options)
      : target_(std::move(target)), options_(options) {
    auto lock = detail::lock_hdf5();
    H5Id fcpl = creation_order_plist(H5P_FILE_CREATE);
    file_ = detail::h5_file(H5Fcreate(temp.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT));
  }
  ~Hdf5FileWriter() {
    auto lock = detail::lock_hdf5();
    groups_.clear();
    file_ = H5Id();
  }

  void write(const TensorSpec& spec, const std::vector<std::byte>& bytes) {
    auto lock = detail::lock_hdf5();
    const auto parts = components(spec.name, options_.layout, target_);
    std::string parent_path;
    hid_t parent = file_.get();
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      parent_path += "/" + parts[i];
      parent = group(parent, parent_path, parts[i], spec.name);
    }
    const std::string path = parent_path + "/" + parts.back();
    if (groups_.count(path) != 0 || !datasets_.insert(path).second)
      raise<UsageError>("writing '", target_, "': tensor '", spec.name, "' would be dataset '",
                        path, "', which already exists as a group or dataset");
    create_dataset(parent, parts.back(), spec, bytes);
  }

  void close() {
    auto lock = detail::lock_hdf5();
    groups_.clear();
    file_.close();
  }

 private:
  hid_t group(hid_t parent, const std::string& path, const std::string& leaf,
              const std::string& tensor) {
    if (const auto it = groups_.find(path); it != groups_.end()) return it->second.get();
    if (datasets_.count(path) != 0)
      raise<UsageError>("writing '", target_, "': tensor '", tensor, "' needs group '", path,
                        "', which is the dataset of another tensor");
    H5Id gcpl = creation_order_plist(H5P_GROUP_CREATE);
    H5Id g =
        detail::h5_group(H5Gcreate2(parent, leaf.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
    return groups_.emplace(path, std::move(g)).first->second.get();
  }

  H5Id dataset_plist(const std::vector<hsize_t>& dims, DType dtype) {
    H5Id dcpl = detail::h5_plist(H5Pcreate(H5P_DATASET_CREATE));
    bool chunkable = options_.gzip_level > 0 && !dims.empty();
    for (const hsize_t d : dims) chunkable = chunkable && d > 0;
    if (chunkable) {
      const auto chunk = chunk_dims(dims, dtype_size(dtype), options_.chunk_bytes);
      H5_CHECK(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()));
      H5_CHECK(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(options_.gzip_level)));
    }
    return dcpl;
  }

  void create_dataset(hid_t parent, const std::string& leaf, const TensorSpec& spec,
                      const std::vector<std::byte>& bytes) {
    const std::vector<hsize_t> dims(spec.shape.begin(), spec.shape.end());
    H5Id space = detail::h5_space(
        dims.empty() ? H5Screate(H5S_SCALAR)
                     : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
    H5Id type = detail::make_h5_type(spec.dtype);
    H5Id dcpl = dataset_plist(dims, spec.dtype);
    H5Id dataset = detail::h5_dataset(H5Dcreate2(parent, leaf.c_str(), type.get(), space.get(),
                                                 H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
    // Types HDF5 has no native form of: their bits as unsigned integers, named.
    if (spec.dtype == DType::kBFloat16 || dtype_is_float8(spec.dtype))
      write_dtype_attribute(dataset.get(), std::string(dtype_name(spec.dtype)).c_str());
    if (!bytes.empty())
      H5_CHECK(H5Dwrite(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()));
    dataset.close();
  }

  // A scalar variable-length UTF-8 string, as h5py writes a str attribute.
  static void write_dtype_attribute(hid_t dataset, const char* value) {
    H5Id type = detail::h5_type(H5Tcopy(H5T_C_S1));
    H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
    H5Id space = detail::h5_space(H5Screate(H5S_SCALAR));
    H5Id attr = detail::h5_attr(
        H5Acreate2(dataset, "dtype", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
    H5_CHECK(H5Awrite(attr.get(), type.get(), &value));
  }

  std::string target_;
  Hdf5WriteOptions options_;
  H5Id file_;
  std::map<std::string, H5Id> groups_;
  std::set<std::string> datasets_;
};

}  // namespace

void write_hdf5(const std::string& path, const std::vector<TensorSpec>& tensors, const FillFn& fill,
                const Hdf5WriteOptions& options) {
  if (options.gzip_level < 0 || options.gzip_level > 9 || options.chunk_bytes == 0)
    raise<UsageError>("writing '", path, "': gzip level ", options.gzip_level,
                      " not in 0..9 or chunk_bytes 0");
  const auto sizes = detail::checked_specs(tensors, path);
  detail::AtomicFile out(path);
  out.close_fd();
  {
    Hdf5FileWriter writer(out.temp_path(), path, options);
    std::vector<std::byte> buffer;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      buffer.assign(sizes[i], std::byte{0});
      fill(i, MutableBytes(buffer.data(), buffer.size()));
      try {
        writer.write(tensors[i], buffer);
      } catch (const CheckpointError& e) {
        raise<CheckpointError>("writing '", path, "': tensor '", tensors[i].name, "': ", e.what());
      }
    }
    writer.close();
  }
  out.commit();
}

void write_hdf5(const std::string& path, const std::vector<InMemoryTensor>& tensors,
                const Hdf5WriteOptions& options) {
  write_hdf5(path, detail::specs_from_memory(tensors), detail::fill_from_memory(tensors), options);
}

}  // namespace tpreload
