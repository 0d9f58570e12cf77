#include "hdf5_types.h"

#include <memory>
#include <vector>

#include "hdf5_util.h"
#include "tpreload/core/error.h"

namespace tpreload::detail {
namespace {

bool is_ieee_half(hid_t type) {
  size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
  if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) return false;
  return spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 &&
         H5Tget_ebias(type) == 15 && H5Tget_offset(type) == 0;
}

std::optional<DType> float_dtype(hid_t type, size_t size) {
  if (size == 2) return is_ieee_half(type) ? std::optional(DType::kFloat16) : std::nullopt;
  if (size == 4 && H5Tget_precision(type) == 32) return DType::kFloat32;
  if (size == 8 && H5Tget_precision(type) == 64) return DType::kFloat64;
  return std::nullopt;
}

// `stored_as`: the dtype the attribute names where HDF5 holds it as unsigned
// integers of its size (bfloat16, the FP8 types).
std::optional<DType> integer_dtype(hid_t type, size_t size, std::optional<DType> stored_as) {
  const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
  if (H5Tget_precision(type) != size * 8) return std::nullopt;
  if (!is_signed && stored_as && dtype_size(*stored_as) == size) return stored_as;
  if (is_signed && size == 1) return DType::kInt8;
  if (is_signed && size == 4) return DType::kInt32;
  if (is_signed && size == 8) return DType::kInt64;
  if (!is_signed && size == 1) return DType::kUInt8;
  return std::nullopt;
}

// h5py's bool: an enum over int8 with exactly FALSE = 0 and TRUE = 1.
std::optional<DType> enum_dtype(hid_t type) {
  if (H5Tget_size(type) != 1 || H5Tget_nmembers(type) != 2) return std::nullopt;
  for (const auto& [name, value] : {std::pair<const char*, int>{"FALSE", 0}, {"TRUE", 1}}) {
    std::int8_t v = -1;
    if (H5Tenum_valueof(type, name, &v) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return std::nullopt;
    }
    if (v != value) return std::nullopt;
  }
  return DType::kBool;
}

}  // namespace

std::string describe_h5_type(hid_t type) {
  const size_t bits = H5Tget_size(type) * 8;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return concat(bits, "-bit ", H5Tget_sign(type) == H5T_SGN_2 ? "signed" : "unsigned",
                    " integer");
    case H5T_FLOAT:
      return concat(bits, "-bit float");
    case H5T_ENUM:
      return concat(bits, "-bit enum");
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "variable-length";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_REFERENCE:
      return "reference";
    case H5T_BITFIELD:
      return concat(bits, "-bit bitfield");
    default:
      return "unknown-class";
  }
}

std::optional<DType> classify_h5_type(hid_t type, const std::optional<std::string>& dtype_attr,
                                      std::string& problem) {
  // bfloat16 and the FP8 types are stored as unsigned integers of their size.
  std::optional<DType> stored_as;
  if (dtype_attr) {
    const auto named = dtype_from_name(*dtype_attr);
    if (named && (*named == DType::kBFloat16 || dtype_is_float8(*named))) stored_as = named;
  }
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  const bool u16 = cls == H5T_INTEGER && size == 2 && H5Tget_sign(type) == H5T_SGN_NONE;
  const bool unsigned_of_size = cls == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_NONE &&
                                stored_as && size == dtype_size(*stored_as);
  if (stored_as && !unsigned_of_size) {
    problem = concat("attribute dtype=\"", *dtype_attr, "\" on a ", describe_h5_type(type),
                     " dataset (", *dtype_attr, " must be stored as ", dtype_size(*stored_as) * 8,
                     "-bit unsigned integers)");
    return std::nullopt;
  }
  std::optional<DType> dtype;
  if (cls == H5T_FLOAT) dtype = float_dtype(type, size);
  if (cls == H5T_INTEGER) dtype = integer_dtype(type, size, stored_as);
  if (cls == H5T_ENUM) dtype = enum_dtype(type);
  if (!dtype) {
    problem = concat("unsupported type ", describe_h5_type(type),
                     u16 ? " without attribute dtype=\"bfloat16\"" : "",
                     " (supported: float16/32/64, int8/32/64, uint8, bool, uint16 with "
                     "attribute dtype=\"bfloat16\", and uint8 with attribute "
                     "dtype=\"float8_e4m3fn\" or \"float8_e5m2\")");
    return std::nullopt;
  }
  if (dtype_attr && dtype_from_name(*dtype_attr) != dtype) {
    problem = concat("attribute dtype=\"", *dtype_attr, "\" does not match the dataset's ",
                     describe_h5_type(type), " type (", dtype_name(*dtype), ")");
    return std::nullopt;
  }
  return dtype;
}

std::optional<std::string> read_string_attribute(hid_t obj, const char* name,
                                                 const std::string& where) {
  if (H5_CHECK(H5Aexists(obj, name)) == 0) return std::nullopt;
  H5Id attr = h5_attr(H5Aopen(obj, name, H5P_DEFAULT));
  H5Id type = h5_type(H5Aget_type(attr.get()));
  H5Id space = h5_space(H5Aget_space(attr.get()));
  if (H5Tget_class(type.get()) != H5T_STRING || H5Sget_simple_extent_npoints(space.get()) != 1)
    raise<CheckpointError>(where, ": attribute '", name, "' is not a single string (",
                           describe_h5_type(type.get()), ")");
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Id mem = h5_type(H5Tcopy(H5T_C_S1));
    H5_CHECK(H5Tset_size(mem.get(), H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(mem.get(), H5Tget_cset(type.get())));
    char* raw = nullptr;
    H5_CHECK(H5Aread(attr.get(), mem.get(), &raw));
    std::unique_ptr<char, herr_t (*)(void*)> owned(raw, &H5free_memory);
    return std::string(raw != nullptr ? raw : "");
  }
  std::vector<char> buf(H5Tget_size(type.get()) + 1, '\0');
  H5_CHECK(H5Aread(attr.get(), type.get(), buf.data()));
  std::string value(buf.data());
  while (!value.empty() && value.back() == ' ') value.pop_back();
  return value;
}

}  // namespace tpreload::detail
