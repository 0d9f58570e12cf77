// Parsing and validation of a safetensors header (see safetensors.h).
#include <cerrno>
#include <cstring>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "../core/json_depth.h"
#include "file_util.h"
#include "shape_util.h"
#include "tpreload/checkpoint/safetensors.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

using nlohmann::json;

template <typename... Args>
[[noreturn]] void fail(const std::string& origin, Args&&... args) {
  raise<CheckpointError>("safetensors file '", origin, "': ", std::forward<Args>(args)...);
}

std::map<std::string, std::string> parse_metadata(const json& j, const std::string& origin) {
  if (!j.is_object()) fail(origin, "'__metadata__' is not an object of strings");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string())
      fail(origin, "'__metadata__' value of key '", key, "' is not a string: ", value.dump());
    out[key] = value.get<std::string>();
  }
  return out;
}

std::uint64_t non_negative(const json& v, bool& ok) {
  ok = v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
  return ok ? v.get<std::uint64_t>() : 0;
}

std::vector<std::int64_t> parse_shape(const json& e, const std::string& name,
                                      const std::string& origin) {
  if (!e.contains("shape") || !e["shape"].is_array())
    fail(origin, "tensor '", name, "': 'shape' is missing or not a list");
  std::vector<std::int64_t> shape;
  for (const auto& d : e["shape"]) {
    bool ok = false;
    const std::uint64_t v = non_negative(d, ok);
    if (!ok || v > static_cast<std::uint64_t>(INT64_MAX))
      fail(origin, "tensor '", name, "': shape ", e["shape"].dump(),
           " has a dimension that is not a non-negative 64-bit integer");
    shape.push_back(static_cast<std::int64_t>(v));
  }
  return shape;
}

ByteRange parse_offsets(const json& e, const std::string& name, const std::string& origin) {
  const json* offsets = e.contains("data_offsets") ? &e["data_offsets"] : nullptr;
  bool ok_begin = false, ok_end = false;
  if (offsets == nullptr || !offsets->is_array() || offsets->size() != 2)
    fail(origin, "tensor '", name, "': 'data_offsets' is missing or not [begin, end]");
  const std::uint64_t begin = non_negative((*offsets)[0], ok_begin);
  const std::uint64_t end = non_negative((*offsets)[1], ok_end);
  if (!ok_begin || !ok_end)
    fail(origin, "tensor '", name, "': data_offsets ", offsets->dump(),
         " are not non-negative integers");
  if (end < begin)
    fail(origin, "tensor '", name, "': data_offsets [", begin, ", ", end,
         ") end before they begin");
  return {begin, end - begin};
}

SafetensorsEntry parse_entry(const std::string& name, const json& e, const std::string& origin) {
  if (!e.is_object()) fail(origin, "tensor '", name, "': header entry is not an object");
  if (!e.contains("dtype") || !e["dtype"].is_string())
    fail(origin, "tensor '", name, "': 'dtype' is missing or not a string");
  const auto dtype_text = e["dtype"].get<std::string>();
  const auto dtype = dtype_from_safetensors(dtype_text);
  if (!dtype) fail(origin, "tensor '", name, "': unknown dtype '", dtype_text, "'");
  SafetensorsEntry entry{name, *dtype, parse_shape(e, name, origin),
                         parse_offsets(e, name, origin)};
  const auto want = detail::checked_nbytes(entry.shape, entry.dtype);
  if (!want)
    fail(origin, "tensor '", name, "': shape ", detail::shape_string(entry.shape), " x ",
         dtype_text, " overflows 64 bits");
  if (*want != entry.data.length)
    fail(origin, "tensor '", name, "': shape ", detail::shape_string(entry.shape), " x ",
         dtype_text, " needs ", *want, " bytes but data_offsets [", entry.data.offset, ", ",
         entry.data.end(), ") span ", entry.data.length);
  return entry;
}

// Sorted, starting at 0, contiguous, in bounds, and ending at the end of the file.
void check_layout(const SafetensorsHeader& h, const std::string& origin) {
  std::uint64_t expected = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const auto& t : h.tensors) {
    if (t.data.end() > h.data_bytes)
      fail(origin, "tensor '", t.name, "': data_offsets [", t.data.offset, ", ", t.data.end(),
           ") exceed the data section of ", h.data_bytes, " bytes (file truncated?)");
    if (t.data.offset < expected)
      fail(origin, "tensor '", t.name, "': data_offsets [", t.data.offset, ", ", t.data.end(),
           ") overlap tensor '", previous->name, "' at [", previous->data.offset, ", ",
           previous->data.end(), ")");
    if (t.data.offset > expected)
      fail(origin, "tensor '", t.name, "': data_offsets [", t.data.offset, ", ", t.data.end(),
           ") leave a gap after byte ", expected, " (offsets must be contiguous from 0)");
    expected = t.data.end();
    previous = &t;
  }
  if (expected != h.data_bytes)
    fail(origin, "tensor '", previous ? previous->name : std::string("(none)"),
         "': tensors end at data byte ", expected, " but the data section holds ", h.data_bytes,
         " bytes (", h.data_bytes - expected, " unexpected trailing bytes)");
}

// One pass over the header text straight into the tensor list: each top-level
// entry (a small object) is built on its own and validated as soon as it closes,
// so no document of the whole header is ever held (a 20,703-tensor header parsed
// into a DOM and scanned again for duplicates cost most of a small-tensor reload).
class HeaderBuilder final : public nlohmann::json_sax<json> {
 public:
  HeaderBuilder(SafetensorsHeader& header, const std::string& origin)
      : header_(header), origin_(origin) {}

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override { return value(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return value(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
  bool string(string_t& v) override { return value(json(std::move(v))); }
  bool binary(binary_t& v) override { return value(json::binary(std::move(v))); }
  bool start_object(std::size_t) override { return open(json::object()); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& key) override {
    if (open_.empty()) {
      name_ = std::move(key);  // a tensor name (or __metadata__)
    } else {
      keys_.back() = std::move(key);
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail(origin_, "header is not valid JSON: ", e.what());
  }

  // After the whole text parsed: names seen twice are refused.
  void finish() {
    if (!duplicate_.empty()) fail(origin_, "duplicate tensor name '", duplicate_, "' in header");
  }

 private:
  // A value at the top level closes an entry; deeper, it goes into its parent.
  bool value(json&& v) {
    if (!top_) return top_ = true;  // (never: the text starts with '{')
    if (open_.empty()) return entry(std::move(v));
    json& parent = *open_.back();
    if (parent.is_array())
      parent.push_back(std::move(v));
    else
      member(parent) = std::move(v);
    return true;
  }
  // The member of `parent` that the last key names. A field twice in a
  // tensor's entry is refused, as the format's reference parser refuses it,
  // not the last one taken; elsewhere (metadata, keys no one reads) the last
  // one wins, as there.
  json& member(json& parent) {
    const std::string& k = keys_.back();
    if (&parent == &entry_ && name_ != "__metadata__" && parent.contains(k))
      fail(origin_, "tensor '", name_, "': field '", k, "' appears twice");
    return parent[k];
  }
  bool open(json&& container) {
    if (!top_) return top_ = true;  // the header object itself
    if (open_.size() >= static_cast<std::size_t>(detail::kMaxJsonDepth))
      fail(origin_, "header entry '", name_, "' is nested deeper than ", detail::kMaxJsonDepth,
           " levels");
    json* at = nullptr;
    if (open_.empty()) {
      entry_ = std::move(container);
      at = &entry_;
    } else if (json& parent = *open_.back(); parent.is_array()) {
      parent.push_back(std::move(container));
      at = &parent.back();
    } else {
      at = &(member(parent) = std::move(container));
    }
    open_.push_back(at);
    keys_.emplace_back();
    return true;
  }
  bool close() {
    if (open_.empty()) return true;  // the header object itself
    open_.pop_back();
    keys_.pop_back();
    return open_.empty() ? entry(std::move(entry_)) : true;
  }
  bool entry(json&& v) {
    if (!names_.insert(name_).second && duplicate_.empty()) duplicate_ = name_;
    if (name_ == "__metadata__")
      header_.metadata = parse_metadata(v, origin_);
    else
      header_.tensors.push_back(parse_entry(name_, v, origin_));
    return true;
  }

  SafetensorsHeader& header_;
  const std::string& origin_;
  bool top_ = false;
  std::string name_;
  json entry_;
  std::vector<json*> open_;        // containers being built inside the entry
  std::vector<std::string> keys_;  // each open object's pending key
  std::unordered_set<std::string> names_;
  std::string duplicate_;
};

// The fast path: a cursor over the header text that accepts only the common
// shape (see parse_safetensors_entries_fast) and gives up (false) at the first
// byte outside it, leaving every message to the general parser.
class FastHeader {
 public:
  explicit FastHeader(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  bool parse(SafetensorsHeader& out) {
    if (peek() != '{') return false;  // (the general parser names what is there)
    ++p_;
    // ~100 header bytes per tensor: room for all of them up front (growing the
    // list by doubling moved every entry ~15 times for 20,000 tensors).
    // (at most a million up front: a header that is mostly __metadata__ must not
    // reserve more than its own size)
    const auto most = std::min<std::size_t>(static_cast<std::size_t>(end_ - p_) / 64, 1 << 20);
    std::unordered_set<std::string_view> names;
    names.reserve(most);
    out.tensors.reserve(most);
    space();
    if (peek() == '}') return finish_object();
    for (;;) {
      std::string_view name;
      if (!string(name) || !take(':')) return false;
      if (!names.insert(name).second) return false;
      if (name == "__metadata__") {
        if (!metadata(out.metadata)) return false;
      } else {
        out.tensors.emplace_back();
        if (!tensor(name, out.tensors.back())) return false;
      }
      space();
      if (peek() == ',') {
        ++p_;
        continue;
      }
      return finish_object();
    }
  }

 private:
  char peek() const { return p_ < end_ ? *p_ : '\0'; }
  void space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool take(char c) {
    space();
    if (peek() != c) return false;
    ++p_;
    return true;
  }
  // The closing brace of the header, then only whitespace.
  bool finish_object() {
    if (!take('}')) return false;
    space();
    return p_ == end_;
  }
  // An ASCII string without escapes or control characters (escapes, and UTF-8
  // that must be checked: the general parser).
  bool string(std::string_view& out) {
    if (!take('"')) return false;
    const char* start = p_;
    while (p_ < end_ && *p_ != '"') {
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '\\' || c < 0x20 || c >= 0x80) return false;
      ++p_;
    }
    if (p_ == end_) return false;
    out = std::string_view(start, static_cast<std::size_t>(p_ - start));
    ++p_;
    return true;
  }
  // A non-negative integer in plain form (no sign, fraction, exponent or leading
  // zero) that fits 63 bits (shape dimensions) or 64 bits (offsets).
  bool integer(std::uint64_t& out, std::uint64_t limit) {
    space();
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
    if (*p_ == '0' && p_ + 1 < end_ && p_[1] >= '0' && p_[1] <= '9') return false;
    std::uint64_t v = 0;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      const std::uint64_t d = static_cast<std::uint64_t>(*p_ - '0');
      if (v > (limit - d) / 10) return false;
      v = v * 10 + d;
      ++p_;
    }
    if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) return false;
    out = v;
    return true;
  }
  bool metadata(std::map<std::string, std::string>& out) {
    if (!take('{')) return false;
    space();
    if (peek() == '}') return ++p_, true;
    for (;;) {
      std::string_view key, value;
      if (!string(key) || !take(':') || !string(value)) return false;
      if (!out.emplace(key, value).second) return false;  // a key twice: the general parser's
      space();
      if (peek() == ',') {
        ++p_;
        continue;
      }
      return take('}');
    }
  }
  bool tensor(std::string_view name, SafetensorsEntry& e) {
    if (!take('{')) return false;
    bool dtype = false, shape = false, offsets = false;
    std::uint64_t begin = 0, end = 0;
    for (int fields = 0; fields < 3; ++fields) {
      if (fields > 0 && !take(',')) return false;
      std::string_view key;
      if (!string(key) || !take(':')) return false;
      if (key == "dtype" && !dtype) {
        std::string_view text;
        if (!string(text)) return false;
        const auto d = dtype_from_safetensors(text);
        if (!d) return false;
        e.dtype = *d;
        dtype = true;
      } else if (key == "shape" && !shape) {
        if (!take('[')) return false;
        space();
        if (peek() == ']') {
          ++p_;
        } else {
          for (;;) {
            std::uint64_t dim = 0;
            if (!integer(dim, static_cast<std::uint64_t>(INT64_MAX))) return false;
            e.shape.push_back(static_cast<std::int64_t>(dim));
            space();
            if (peek() == ',') {
              ++p_;
              continue;
            }
            if (!take(']')) return false;
            break;
          }
        }
        shape = true;
      } else if (key == "data_offsets" && !offsets) {
        if (!take('[') || !integer(begin, UINT64_MAX) || !take(',') || !integer(end, UINT64_MAX) ||
            !take(']'))
          return false;
        offsets = true;
      } else {
        return false;  // another key, or one twice
      }
    }
    if (!take('}') || end < begin) return false;
    e.name = std::string(name);
    e.data = {begin, end - begin};
    const auto want = detail::checked_nbytes(e.shape, e.dtype);
    return want && *want == e.data.length;
  }

  const char* p_;
  const char* end_;
};

}  // namespace

namespace detail {

bool parse_safetensors_entries_fast(std::string_view json_text, SafetensorsHeader& out) {
  if (FastHeader(json_text).parse(out)) return true;
  out.tensors.clear();  // nothing half-filled for the general parser
  out.metadata.clear();
  return false;
}

void parse_safetensors_entries_general(std::string_view json_text, SafetensorsHeader& out,
                                       const std::string& origin) {
  if (json_text.empty() || json_text.front() != '{')
    fail(origin, "header does not start with '{' (not a JSON object)");
  HeaderBuilder builder(out, origin);
  json::sax_parse(json_text.begin(), json_text.end(), &builder);
  builder.finish();
}

}  // namespace detail

SafetensorsHeader parse_safetensors_header(std::string_view json_text, std::uint64_t file_size,
                                           const std::string& origin) {
  SafetensorsHeader h;
  h.header_bytes = json_text.size();
  h.data_start = 8 + h.header_bytes;
  if (h.data_start > file_size)
    fail(origin, "header of ", h.header_bytes, " bytes runs past the end of the ", file_size,
         "-byte file");
  h.data_bytes = file_size - h.data_start;
  if (!detail::parse_safetensors_entries_fast(json_text, h))
    detail::parse_safetensors_entries_general(json_text, h, origin);
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.data.offset != b.data.offset ? a.data.offset < b.data.offset
                                          : a.data.end() < b.data.end();
  });
  check_layout(h, origin);
  return h;
}

namespace detail {

SafetensorsHeaderText read_safetensors_header_text(int fd, std::uint64_t size,
                                                   const std::string& path) {
  if (size < 8) fail(path, "file is ", size, " bytes, too small for the 8-byte header length");
  unsigned char len_bytes[8];
  detail::pread_exact(fd, len_bytes, 8, 0, path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kSafetensorsMaxHeaderBytes)
    fail(path, "header length ", n, " exceeds the limit of ", kSafetensorsMaxHeaderBytes, " bytes");
  if (n > size - 8)
    fail(path, "header length ", n, " runs past the end of the ", size, "-byte file");
  SafetensorsHeaderText out{size, std::string(n, '\0')};
  detail::pread_exact(fd, out.text.data(), n, 8, path);
  return out;
}

SafetensorsHeaderText read_safetensors_header_text(const std::string& path) {
  // Opened as a source opens it (a plain file, a FIFO refused without waiting);
  // the header is read with pread, not through the mapping.
  const MappedFile file = MappedFile::open(path);
  return read_safetensors_header_text(file.fd(), file.size(), path);
}

}  // namespace detail

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const detail::SafetensorsHeaderText h = detail::read_safetensors_header_text(path);
  return parse_safetensors_header(h.text, h.file_size, path);
}

}  // namespace tpreload
