// How the rows of a checkpoint tensor (or a kernel-format tensor) land in a
// parameter, as data: the weight loaders of vLLM's parallel layers reduced to
// strided row copies, resolved once from a Placement, with the parameter already
// named by its slot. The reload engine resolves every bucket's writes when it
// plans (no name lookups while bytes flow), and the model's local loads use the
// same function, so the two cannot disagree. No torch here.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tpreload/model/sharding.h"

namespace tpreload {

enum class WriteKind : std::uint8_t {
  kCopy,          // bytes as they are (same dtype)
  kConvert,       // floating values into another floating dtype (round to nearest even)
  kQuantizeInt8,  // bfloat16/float16/float32 rows into an int8 weight and its weight_scale rows
  kStageScale,    // a per-tensor FP8 scale into the staging of its parameter (ParamSpec::staged):
                  // row dest_row of the staging, converted to float32 where it is not
  kStageRows,     // floating rows of an online FP8 weight (ParamSpec::quantize_fp8) into its
                  // staging in the model's dtype, quantized when its layer is processed
};

// Rows [dest_row, dest_row + rows) of parameter `slot` (whole rows of the
// parameter) from source rows starting `src_offset` bytes into the source buffer,
// `src_pitch` bytes apart.
struct RowWrite {
  ParamSlot slot = kNoSlot;
  WriteKind kind = WriteKind::kCopy;
  DType src_dtype = DType::kFloat32;
  std::uint64_t src_offset = 0;
  std::uint64_t src_pitch = 0;
  std::int64_t dest_row = 0;
  std::int64_t rows = 0;

  bool operator==(const RowWrite& o) const {
    return slot == o.slot && kind == o.kind && src_dtype == o.src_dtype &&
           src_offset == o.src_offset && src_pitch == o.src_pitch && dest_row == o.dest_row &&
           rows == o.rows;
  }
};

// Rows [row_begin, row_end) of parameter `slot` to zero (vocab padding).
struct RowZero {
  ParamSlot slot = kNoSlot;
  std::int64_t row_begin = 0, row_end = 0;
};

// Rows of a shape (its first dimension; 1 for a scalar) and bytes per row.
std::int64_t shape_rows(const std::vector<std::int64_t>& shape);
std::uint64_t shape_row_bytes(const std::vector<std::int64_t>& shape, DType dtype);

// A parameter as the rows that writes fill: rows of its last dimension (every
// dimension but the last multiplied; a 1-D parameter's elements; 1 for a
// scalar), each param_row_bytes long. For 2-D parameters the same as shape_rows
// and shape_row_bytes; a 3-D expert tensor [E, R, C] is E x R rows of C.
std::int64_t param_rows(const std::vector<std::int64_t>& shape);
std::uint64_t param_row_bytes(const std::vector<std::int64_t>& shape, DType dtype);

// Bytes of one source row of a write into `param`: the parameter row's
// elements in the write's src_dtype.
std::uint64_t write_source_row_bytes(const RowWrite& w, const ParamSpec& param);
// One past the last source byte a write into `param` reads: its rows lie
// src_pitch apart from src_offset, each write_source_row_bytes long, so it reads
// only [w.src_offset, write_source_end(w, param)) (nothing for a write of no
// rows: src_offset itself). What a receiver must have verified before the write.
std::uint64_t write_source_end(const RowWrite& w, const ParamSpec& param);
// A plain copy of contiguous rows into `param`: its source is the parameter's
// rows byte for byte, [src_offset, src_offset + rows x row bytes).
bool plain_row_copy(const RowWrite& w, const ParamSpec& param);

// Whether values of `from` may be written into a parameter of `to`: the same
// dtype, or both floating (converted, round to nearest even, as torch's .to()
// does). Integer and other dtypes are never converted. Into an int8 (quantized)
// parameter: bfloat16, float16 or float32 sources.
bool convertible(DType from, DType to, bool quantized);

// The write that lands rows [row0, row0 + rows) of a checkpoint tensor's unit in
// its parameter on the placement's rank, or nullopt when none of those rows is
// this rank's. The unit is the whole tensor (`presliced` false: a broadcast, a
// local load) or this rank's slice of it (`presliced` true: what a scatter
// delivers); its row row0 starts at byte `offset` of the source buffer.
std::optional<RowWrite> checkpoint_row_write(const ShardingRules& rules, const Placement& placement,
                                             DType src_dtype, std::int64_t row0, std::int64_t rows,
                                             bool presliced, std::uint64_t offset);

// Kernel format: rows [row0, row0 + rows) of parameter `slot`, source row row0 at
// byte `offset`.
RowWrite kernel_row_write(const ShardingRules& rules, ParamSlot slot, DType src_dtype,
                          std::int64_t row0, std::int64_t rows, std::uint64_t offset);

// The vocab padding rows of the placement's parameter on its rank, if any.
std::optional<RowZero> padding_rows(const ShardingRules& rules, const Placement& placement);

}  // namespace tpreload
