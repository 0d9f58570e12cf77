#include "tpreload/model/row_writes.h"

#include <algorithm>

#include "tpreload/core/error.h"

namespace tpreload {
namespace {

WriteKind kind_for(const ParamSpec& param, DType src) {
  if (param.staged) return WriteKind::kStageScale;
  if (param.quantize_fp8) return WriteKind::kStageRows;
  if (param.dtype == DType::kInt8 && src != DType::kInt8) return WriteKind::kQuantizeInt8;
  return src == param.dtype ? WriteKind::kCopy : WriteKind::kConvert;
}

}  // namespace

std::int64_t shape_rows(const std::vector<std::int64_t>& shape) {
  return shape.empty() ? 1 : shape[0];
}

std::uint64_t shape_row_bytes(const std::vector<std::int64_t>& shape, DType dtype) {
  std::uint64_t n = dtype_size(dtype);
  for (std::size_t d = 1; d < shape.size(); ++d) n *= static_cast<std::uint64_t>(shape[d]);
  return n;
}

std::int64_t param_rows(const std::vector<std::int64_t>& shape) {
  if (shape.size() <= 1) return shape_rows(shape);
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
  return rows;
}

std::uint64_t param_row_bytes(const std::vector<std::int64_t>& shape, DType dtype) {
  if (shape.size() <= 1) return dtype_size(dtype);
  return static_cast<std::uint64_t>(shape.back()) * dtype_size(dtype);
}

std::uint64_t write_source_row_bytes(const RowWrite& w, const ParamSpec& param) {
  return param_row_bytes(param.shape, param.dtype) / dtype_size(param.dtype) *
         dtype_size(w.src_dtype);
}

std::uint64_t write_source_end(const RowWrite& w, const ParamSpec& param) {
  if (w.rows <= 0) return w.src_offset;
  return w.src_offset + static_cast<std::uint64_t>(w.rows - 1) * w.src_pitch +
         write_source_row_bytes(w, param);
}

bool plain_row_copy(const RowWrite& w, const ParamSpec& param) {
  return w.kind == WriteKind::kCopy && w.rows > 0 &&
         w.src_pitch == param_row_bytes(param.shape, param.dtype);
}

bool convertible(DType from, DType to, bool quantized) {
  if (quantized)
    return from == DType::kBFloat16 || from == DType::kFloat16 || from == DType::kFloat32;
  return from == to || (dtype_is_floating(from) && dtype_is_floating(to));
}

std::optional<RowWrite> checkpoint_row_write(const ShardingRules& rules, const Placement& pl,
                                             DType src, std::int64_t row0, std::int64_t rows,
                                             bool presliced, std::uint64_t offset) {
  if (!pl.held) return std::nullopt;
  if (pl.slot >= rules.params().size())
    raise<ModelError>("tensor '", pl.checkpoint_name, "': placement has no parameter slot");
  const ParamSpec& param = rules.params()[pl.slot];
  const auto& unit = presliced ? pl.slice_shape() : pl.source_shape;
  const std::uint64_t pitch = shape_row_bytes(unit, src);
  RowWrite w{pl.slot, kind_for(param, src), src, offset, pitch, pl.dest_row + row0, rows};
  if (presliced || pl.source_dim < 0) return rows > 0 ? std::optional(w) : std::nullopt;
  if (pl.source_dim == 1) {
    // Row-parallel: every full row holds this rank's column window.
    if (unit.size() >= 2 && unit[1] > 0)
      w.src_offset += static_cast<std::uint64_t>(pl.source_start) *
                      (pitch / static_cast<std::uint64_t>(unit[1]));
    return rows > 0 ? std::optional(w) : std::nullopt;
  }
  // Split along rows: keep the rows inside [source_start, source_start + length).
  const std::int64_t lo = std::max(row0, pl.source_start);
  const std::int64_t hi = std::min(row0 + rows, pl.source_start + pl.source_length);
  if (hi <= lo) return std::nullopt;
  w.src_offset += static_cast<std::uint64_t>(lo - row0) * pitch;
  w.dest_row = pl.dest_row + lo - pl.source_start;
  w.rows = hi - lo;
  return w;
}

RowWrite kernel_row_write(const ShardingRules& rules, ParamSlot slot, DType src, std::int64_t row0,
                          std::int64_t rows, std::uint64_t offset) {
  const ParamSpec& param = rules.params().at(slot);
  // Kernel tensors move in rows of their first dimension; the parameter is
  // written in rows of its last: each of the former is `per` of the latter.
  const std::int64_t first = shape_rows(param.shape);
  const std::int64_t per = first > 0 ? param_rows(param.shape) / first : 1;
  return {slot,
          src == param.dtype ? WriteKind::kCopy : WriteKind::kConvert,
          src,
          offset,
          param_row_bytes(param.shape, src),
          row0 * per,
          rows * per};
}

std::optional<RowZero> padding_rows(const ShardingRules& rules, const Placement& pl) {
  if (pl.zero_rows_from < 0 || !pl.held) return std::nullopt;
  const std::int64_t end = param_rows(rules.params().at(pl.slot).shape);
  if (pl.zero_rows_from >= end) return std::nullopt;
  return RowZero{pl.slot, pl.zero_rows_from, end};
}

}  // namespace tpreload
