// The HDF5 entry points of a build without libhdf5 (TPRELOAD_HDF5=OFF, e.g. the
// GPU check on a machine without the HDF5 development files): HDF5 files are
// recognised by their signature and refused with a clear error.
#include <cstring>
#include <fstream>

#include "../file_util.h"
#include "tpreload/checkpoint/hdf5.h"
#include "tpreload/checkpoint/writers.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

[[noreturn]] void no_hdf5(const std::string& path) {
  raise<CheckpointError>("hdf5 file '", path,
                         "': this tpreload was built without HDF5 (TPRELOAD_HDF5=OFF)");
}

}  // namespace

std::unique_ptr<WeightSource> open_hdf5(const std::string& path) {
  no_hdf5(path);
}

bool is_hdf5_file(const std::string& path) {
  if (!detail::is_regular_file(path)) return false;
  static const char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  char head[8] = {0};
  std::ifstream in(path, std::ios::binary);
  return in.read(head, sizeof head) && std::memcmp(head, kSignature, sizeof head) == 0;
}

void write_hdf5(const std::string& path, const std::vector<TensorSpec>&, const FillFn&,
                const Hdf5WriteOptions&) {
  no_hdf5(path);
}

void write_hdf5(const std::string& path, const std::vector<InMemoryTensor>&,
                const Hdf5WriteOptions&) {
  no_hdf5(path);
}

}  // namespace tpreload
