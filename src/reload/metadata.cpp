// The metadata broadcast's wire format: a flat little-endian byte string. The
// parser accepts only what serialize_metadata writes (known dtypes, 0/1 flags,
// byte counts that match shapes), so a blob that parses serializes back to the
// same bytes (tests/fuzz/metadata_fuzz.cpp holds it to that).
#include <cstring>

#include "tpreload/core/error.h"
#include "tpreload/reload/plan.h"

namespace tpreload {
namespace {

// Writes the wire format; with Counting = true, only counts its bytes (the first
// of two passes, so that the output is allocated once, at its size).
template <bool Counting>
class Writer {
 public:
  explicit Writer(std::size_t size = 0) : out_(Counting ? 0 : size) {}
  template <typename T>
  void put(T value) {
    bytes(&value, sizeof(T));
  }
  void put(const std::string& s) {
    put<std::uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  std::size_t size() const { return at_; }
  std::vector<std::uint8_t> take() { return std::move(out_); }

 private:
  void bytes(const void* p, std::size_t n) {
    if (!Counting && n) std::memcpy(out_.data() + at_, p, n);
    at_ += n;
  }
  std::vector<std::uint8_t> out_;
  std::size_t at_ = 0;
};

// Every field of a listing, in wire order, to `sink` (a Writer or a Hasher).
template <typename Sink>
void put_listing(Sink& w, const std::string& description, const std::vector<TensorInfo>& tensors,
                 const std::optional<KernelFormatInfo>& kernel) {
  w.put(description);
  w.template put<std::uint64_t>(tensors.size());
  for (const TensorInfo& t : tensors) {
    w.put(t.name);
    w.template put<std::uint8_t>(static_cast<std::uint8_t>(t.dtype));
    w.template put<std::uint32_t>(static_cast<std::uint32_t>(t.shape.size()));
    for (auto d : t.shape) w.template put<std::int64_t>(d);
    w.template put<std::uint64_t>(t.nbytes);
    w.put(t.file);
    w.template put<std::uint64_t>(t.file_offset);
    w.template put<std::int32_t>(t.tp_rank);
  }
  w.template put<std::uint8_t>(kernel.has_value());
  if (kernel) {
    w.template put<std::int32_t>(kernel->tp_size);
    w.template put<std::uint8_t>(static_cast<std::uint8_t>(kernel->dtype));
    w.put(kernel->quantization);
    w.template put<std::uint8_t>(kernel->expert_parallel);
    w.put(kernel->config_json);
  }
}

// FNV-1a-style mixing, a 64-bit word at a time (strings too: 8 bytes per step).
class Hasher {
 public:
  template <typename T>
  void put(T value) {
    word(static_cast<std::uint64_t>(value));
  }
  void put(const std::string& s) {
    word(s.size());
    std::size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      std::uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      word(w);
    }
    std::uint64_t tail = 0;
    std::memcpy(&tail, s.data() + i, s.size() - i);
    word(tail);
  }
  std::uint64_t value() const { return h_; }

 private:
  void word(std::uint64_t w) {
    h_ = (h_ ^ w) * 0x100000001b3ull;
    h_ ^= h_ >> 29;
  }
  std::uint64_t h_ = 1469598103934665603ull;
};

class Reader {
 public:
  explicit Reader(const std::vector<std::uint8_t>& in) : in_(in) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  std::string get_string() {
    const auto n = get<std::uint64_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(in_.data() + at_), n);
    at_ += n;
    return s;
  }
  bool done() const { return at_ == in_.size(); }
  bool flag(const char* what) {
    const auto v = get<std::uint8_t>();
    if (v > 1) raise<CommError>("reload metadata: ", what, " is ", int(v), ", not 0 or 1");
    return v == 1;
  }
  DType dtype(const std::string& what) {
    const auto v = get<std::uint8_t>();
    for (DType d : kAllDTypes)
      if (static_cast<std::uint8_t>(d) == v) return d;
    raise<CommError>("reload metadata: ", what, " has dtype code ", int(v), ", not a known dtype");
  }

 private:
  void need(std::uint64_t n) const {
    if (n > in_.size() - at_)
      raise<CommError>("reload metadata is truncated: need ", n, " bytes at offset ", at_, " of ",
                       in_.size());
  }
  const std::vector<std::uint8_t>& in_;
  std::uint64_t at_ = 0;
};

}  // namespace

std::vector<std::uint8_t> serialize_metadata(const std::string& description,
                                             const std::vector<TensorInfo>& tensors,
                                             const std::optional<KernelFormatInfo>& kernel) {
  Writer<true> count;
  put_listing(count, description, tensors, kernel);
  Writer<false> w(count.size());
  put_listing(w, description, tensors, kernel);
  return w.take();
}

std::vector<std::uint8_t> serialize_metadata(const SourceMetadata& m) {
  return serialize_metadata(m.description, m.tensors, m.kernel);
}

std::uint64_t listing_hash(const std::string& description, const std::vector<TensorInfo>& tensors,
                           const std::optional<KernelFormatInfo>& kernel) {
  Hasher h;
  put_listing(h, description, tensors, kernel);
  return h.value();
}

bool same_listing(const SourceMetadata& m, const std::string& description,
                  const std::vector<TensorInfo>& tensors,
                  const std::optional<KernelFormatInfo>& kernel) {
  return m.description == description && m.tensors == tensors && m.kernel == kernel;
}

SourceMetadata parse_metadata(const std::vector<std::uint8_t>& bytes) {
  Reader r(bytes);
  SourceMetadata m;
  m.description = r.get_string();
  const auto count = r.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < count; ++i) {
    TensorInfo t;
    t.name = r.get_string();
    t.dtype = r.dtype("tensor '" + t.name + "'");
    const auto ndim = r.get<std::uint32_t>();
    std::uint64_t bytes = dtype_size(t.dtype);
    for (std::uint32_t d = 0; d < ndim; ++d) {
      t.shape.push_back(r.get<std::int64_t>());
      if (t.shape.back() < 0 ||
          __builtin_mul_overflow(bytes, static_cast<std::uint64_t>(t.shape.back()), &bytes))
        raise<CommError>("reload metadata: tensor '", t.name, "' has dimension ", t.shape.back(),
                         " (negative, or the size overflows 64 bits)");
    }
    t.nbytes = r.get<std::uint64_t>();
    if (t.nbytes != bytes)
      raise<CommError>("reload metadata: tensor '", t.name, "' says ", t.nbytes,
                       " bytes, its shape and dtype make ", bytes);
    t.file = r.get_string();
    t.file_offset = r.get<std::uint64_t>();
    t.tp_rank = r.get<std::int32_t>();
    if (t.tp_rank < -1)
      raise<CommError>("reload metadata: tensor '", t.name, "' has tp rank ", t.tp_rank);
    m.tensors.push_back(std::move(t));
  }
  if (r.flag("the kernel-format flag")) {
    KernelFormatInfo k;
    k.tp_size = r.get<std::int32_t>();
    if (k.tp_size < 1) raise<CommError>("reload metadata: kernel-format tp size ", k.tp_size);
    k.dtype = r.dtype("the kernel format");
    k.quantization = r.get_string();
    k.expert_parallel = r.flag("the expert-parallel flag");
    k.config_json = r.get_string();
    m.kernel = k;
  }
  if (!r.done()) raise<CommError>("reload metadata has trailing bytes");
  return m;
}

}  // namespace tpreload
