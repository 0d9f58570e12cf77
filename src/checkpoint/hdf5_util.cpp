#include "hdf5_util.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload {
namespace detail {
namespace {

herr_t append_frame(unsigned n, const H5E_error2_t* e, void* client) {
  auto* out = static_cast<std::string*>(client);
  char major[128] = "", minor[128] = "";
  H5Eget_msg(e->maj_num, nullptr, major, sizeof(major));
  H5Eget_msg(e->min_num, nullptr, minor, sizeof(minor));
  *out += concat(n == 0 ? "" : "; ", "#", n, " ", e->func_name,
                 "(): ", e->desc != nullptr ? e->desc : "", " (", major, ": ", minor, ")");
  return 0;
}

// The current HDF5 error stack as one line; clears it.
std::string error_stack_text() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, &append_frame, &text);
  H5Eclear2(H5E_DEFAULT);
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text.empty() ? "no HDF5 error stack" : text;
}

H5Id owned(hid_t id, H5Id::Closer closer, const char* what) {
  if (id < 0) raise_h5_error(id, what, __FILE__, __LINE__);
  return H5Id(id, closer);
}

}  // namespace

void H5Id::reset() noexcept {
  if (id_ >= 0 && closer_ != nullptr && closer_(id_) < 0) {
    H5Eclear2(H5E_DEFAULT);
    log().warn("closing HDF5 object {} failed", static_cast<long long>(id_));
  }
  id_ = H5I_INVALID_HID;
}

void H5Id::close() {
  const hid_t id = std::exchange(id_, H5I_INVALID_HID);
  if (id >= 0 && closer_ != nullptr) H5_CHECK(closer_(id));
}

H5Id h5_file(hid_t id) {
  return owned(id, &H5Fclose, "H5F open/create");
}
H5Id h5_group(hid_t id) {
  return owned(id, &H5Gclose, "H5G open/create");
}
H5Id h5_dataset(hid_t id) {
  return owned(id, &H5Dclose, "H5D open/create");
}
H5Id h5_space(hid_t id) {
  return owned(id, &H5Sclose, "H5S create/get");
}
H5Id h5_type(hid_t id) {
  return owned(id, &H5Tclose, "H5T create/get");
}
H5Id h5_attr(hid_t id) {
  return owned(id, &H5Aclose, "H5A open/create");
}
H5Id h5_plist(hid_t id) {
  return owned(id, &H5Pclose, "H5P create/get");
}
H5Id h5_object(hid_t id) {
  return owned(id, &H5Oclose, "H5Oopen");
}

std::unique_lock<std::mutex> lock_hdf5() {
  static std::mutex mutex;
  std::unique_lock<std::mutex> lock(mutex);
  static const bool initialised = [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)initialised;
  return lock;
}

H5Id make_float16_type() {
  H5Id t = h5_type(H5Tcopy(H5T_IEEE_F32LE));
  H5_CHECK(H5Tset_fields(t.get(), 15, 10, 5, 0, 10));
  H5_CHECK(H5Tset_size(t.get(), 2));
  H5_CHECK(H5Tset_ebias(t.get(), 15));
  return t;
}

H5Id make_bool_type() {
  H5Id t = h5_type(H5Tenum_create(H5T_STD_I8LE));
  const std::int8_t no = 0, yes = 1;
  H5_CHECK(H5Tenum_insert(t.get(), "FALSE", &no));
  H5_CHECK(H5Tenum_insert(t.get(), "TRUE", &yes));
  return t;
}

H5Id make_h5_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return make_float16_type();
    case DType::kBool:
      return make_bool_type();
    case DType::kFloat32:
      return h5_type(H5Tcopy(H5T_IEEE_F32LE));
    case DType::kFloat64:
      return h5_type(H5Tcopy(H5T_IEEE_F64LE));
    case DType::kBFloat16:
      return h5_type(H5Tcopy(H5T_STD_U16LE));
    case DType::kInt8:
      return h5_type(H5Tcopy(H5T_STD_I8LE));
    case DType::kInt32:
      return h5_type(H5Tcopy(H5T_STD_I32LE));
    case DType::kInt64:
      return h5_type(H5Tcopy(H5T_STD_I64LE));
    case DType::kUInt8:
    case DType::kFloat8E4M3:  // (with attribute dtype naming it)
    case DType::kFloat8E5M2:
      return h5_type(H5Tcopy(H5T_STD_U8LE));
  }
  raise<UsageError>("no HDF5 type for dtype ", static_cast<int>(dtype));
}

// Declared in core/error.h; HDF5 belongs to the checkpoint layer.
[[noreturn]] void raise_h5_error(long long code, const char* expr, const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  raise<CheckpointError>("HDF5 call ", expr, " failed (", code, ") at ",
                         slash != nullptr ? slash + 1 : file, ":", line, ": ", error_stack_text());
}

}  // namespace detail
}  // namespace tpreload
