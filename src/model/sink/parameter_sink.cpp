#include "tpreload/model/parameter_sink.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "tpreload/core/crc32c.h"
#include "tpreload/core/error.h"
#include "tpreload/core/float8.h"
#include "tpreload/core/quantization.h"
#include "tpreload/model/convert.h"
#include "tpreload/model/quantize.h"

namespace tpreload {

ParameterSink::Bands ParameterSink::bands_of(const ParamSpec& param, std::int64_t block) {
  const std::int64_t experts = param.shape.size() == 3 ? param.shape[0] : 1;
  const std::int64_t per = param_rows(param.shape) / experts;
  return {experts, per, (per + block - 1) / block, block};
}

namespace {

std::uint64_t spec_bytes(const ParamSpec& spec) {
  return static_cast<std::uint64_t>(param_rows(spec.shape)) *
         param_row_bytes(spec.shape, spec.dtype);
}

std::uint32_t crc_update(std::uint32_t crc, const std::byte* data, std::uint64_t n) {
  for (std::uint64_t at = 0; at < n;) {  // zlib takes 32-bit lengths
    const auto len = static_cast<uInt>(std::min<std::uint64_t>(n - at, 1u << 30));
    crc = static_cast<std::uint32_t>(crc32(crc, reinterpret_cast<const Bytef*>(data + at), len));
    at += len;
  }
  return crc;
}

}  // namespace

ParameterSink::ParameterSink(const ShardingRules& rules, std::vector<ParamStorage> storage,
                             std::shared_ptr<Device> device)
    : ParameterSink(rules, std::move(storage), std::move(device), true) {}

ParameterSink::ParameterSink(const ShardingRules& rules, NoParameters)
    : ParameterSink(rules, std::vector<ParamStorage>(rules.params().size()), nullptr, false) {}

ParameterSink::ParameterSink(const ShardingRules& rules, std::vector<ParamStorage> storage,
                             std::shared_ptr<Device> device, bool holds_parameters)
    : rules_(rules),
      holds_parameters_(holds_parameters),
      storage_(std::move(storage)),
      device_(std::move(device)) {
  if (storage_.size() != rules_.params().size())
    raise<ModelError>("parameter sink: ", storage_.size(), " storages for ", rules_.params().size(),
                      " parameters");
  for (std::size_t i = 0; holds_parameters_ && i < storage_.size(); ++i) {
    const ParamSpec& spec = rules_.params()[i];
    if (storage_[i].bytes != spec_bytes(spec) || (!storage_[i].data && storage_[i].bytes))
      raise<ModelError>("parameter '", spec.name, "' has ", storage_[i].bytes,
                        " bytes of storage, its shape and dtype need ", spec_bytes(spec));
  }
  params_ = storage_;
  touched_.assign(storage_.size(), false);
  first_bit_.push_back(0);
  for (const ParamSpec& spec : rules_.params())
    first_bit_.push_back(first_bit_.back() + spec.shards);
  loaded_.assign((first_bit_.back() + 63) / 64, 0);
  std::uint64_t staged = 0;
  for (const ParamSpec& spec : rules_.params()) {
    staged_at_.push_back(staged);
    if (spec.staged) staged += spec.shards;
  }
  if (staged) staging_ = (device_ ? device_->memory() : host_allocator()).allocate(staged * 4);
  staged_amax_.resize(storage_.size());
  unit_rows_.resize(storage_.size());
}

ParameterSink::~ParameterSink() {
  discard_shadow();
}

DeviceStream& ParameterSink::stream() {
  if (!stream_) stream_ = device_->make_stream();
  return *stream_;
}

// Checks the write's rows against its parameter and marks what it touches.
void ParameterSink::begin_write(const RowWrite& w, const ParamSpec& param) {
  if (!holds_parameters_)
    raise<ModelError>("write into parameter '", param.name,
                      "' on a rank that holds no parameters (it only sends sharded sources)");
  const bool staged = w.kind == WriteKind::kStageScale;
  const std::int64_t rows = staged ? param.shards : param_rows(param.shape);
  if (w.dest_row < 0 || w.dest_row + w.rows > rows)
    raise<ModelError>("write of rows [", w.dest_row, ", ", w.dest_row + w.rows,
                      ") into parameter '", param.name, "' of ", rows,
                      staged ? " staged scales" : " rows");
  if (w.kind == WriteKind::kQuantizeInt8 && param.scale_slot == kNoSlot)
    raise<ModelError>("int8 write into parameter '", param.name, "', which has no weight_scale");
  if (staged && !param.staged)
    raise<ModelError>("a staged scale write into parameter '", param.name,
                      "', which stages no scales");
  if (w.kind == WriteKind::kStageRows && !param.quantize_fp8)
    raise<ModelError>("staged rows written into parameter '", param.name,
                      "', which is not quantized to FP8 on load");
  // (a staged parameter is written when its layer is processed)
  if (staged || w.kind == WriteKind::kStageRows) return;
  touched_[w.slot] = true;
  if (w.kind == WriteKind::kQuantizeInt8) touched_[param.scale_slot] = true;
}

std::optional<MutableBytes> ParameterSink::host_rows(const RowWrite& w) {
  const ParamSpec& param = rules_.params().at(w.slot);
  if (device_ || !plain_row_copy(w, param)) return std::nullopt;
  begin_write(w, param);
  const std::uint64_t width = param_row_bytes(param.shape, param.dtype);
  return MutableBytes(storage_[w.slot].data + static_cast<std::uint64_t>(w.dest_row) * width,
                      static_cast<std::uint64_t>(w.rows) * width);
}

void ParameterSink::count_placed(const RowWrite& w) {
  begin_write(w, rules_.params().at(w.slot));
}

void ParameterSink::write(const RowWrite& w, const std::byte* src) {
  const ParamSpec& param = rules_.params().at(w.slot);
  if (w.rows <= 0) return;
  begin_write(w, param);
  if (w.kind == WriteKind::kStageScale)
    stage(w, param, src);
  else if (w.kind == WriteKind::kStageRows)
    stage_rows(w, param, src);
  else if (device_)
    write_device(w, param, src);
  else
    write_host(w, param, src);
}

void ParameterSink::stage(const RowWrite& w, const ParamSpec& param, const std::byte* src) {
  float* dst = reinterpret_cast<float*>(staging_.data()) + staged_at_[w.slot] + w.dest_row;
  const std::byte* in = src + w.src_offset;
  const std::int64_t stride = static_cast<std::int64_t>(w.src_pitch / dtype_size(w.src_dtype));
  if (!dtype_is_floating(w.src_dtype))
    raise<ModelError>("scale of '", param.name, "' in ", dtype_name(w.src_dtype),
                      ": a floating dtype is needed");
  if (device_ && w.src_dtype == DType::kFloat32)
    stream().copy_rows(dst, 4, in, w.src_pitch, 4, static_cast<std::uint64_t>(w.rows),
                       CopyKind::kDeviceToDevice);
  else if (device_)
    stream().convert(in, w.src_dtype, stride, dst, DType::kFloat32, w.rows, 1);
  else
    convert_rows(in, w.src_dtype, stride, dst, DType::kFloat32, w.rows, 1);
}

bool ParameterSink::any_loaded(ParamSlot slot) const {
  for (std::uint64_t b = first_bit_.at(slot); b < first_bit_.at(slot + 1); ++b)
    if (loaded_[b / 64] >> (b % 64) & 1) return true;
  return false;
}

// A staging buffer of at least `bytes` for online FP8 rows: the smallest spare
// one that holds them (units complete mostly one after another, so a few
// buffers serve a whole model; fresh memory costs its first touch, about 1.4 s
// per GB on these machines), else a new one.
Buffer ParameterSink::rows_buffer(std::uint64_t bytes) {
  auto best = spare_rows_.end();
  for (auto it = spare_rows_.begin(); it != spare_rows_.end(); ++it)
    if (it->size() >= bytes && (best == spare_rows_.end() || it->size() < best->size())) best = it;
  if (best == spare_rows_.end())
    return (device_ ? device_->memory() : host_allocator()).allocate(bytes);
  Buffer b = std::move(*best);
  spare_rows_.erase(best);
  return b;
}

// Online FP8: the rows in the model's dtype (vLLM loads them into a parameter
// of that dtype, then quantizes it: values of another dtype are rounded to it
// first), quantized in units of rows (units_of) as soon as a unit's last rows
// land. A unit that one write brings whole, in the model's dtype and row after
// row, is quantized straight from it on the host; one that comes in parts (and
// every unit on a device) is staged in a buffer of its own until then. Per
// tensor on the host the amax of a staged unit is taken row by row as it lands.
void ParameterSink::stage_rows(const RowWrite& w, const ParamSpec& param, const std::byte* src) {
  const std::int64_t cols = static_cast<std::int64_t>(param_row_bytes(param.shape, param.dtype) /
                                                      dtype_size(param.dtype));
  const DType model = rules_.config().dtype;
  const std::uint64_t size = dtype_size(model);
  const bool per_tensor = !online_fp8_block(rules_.quantization());
  const Bands units = units_of(param);
  if (unit_rows_[w.slot].empty()) {  // (this load's first write of the weight)
    staged_amax_[w.slot].assign(units.experts, 0.0f);
    unit_rows_[w.slot].assign(units.count(), 0);
  }
  const std::byte* in = src + w.src_offset;
  const std::uint64_t width = static_cast<std::uint64_t>(cols) * size;
  const std::int64_t stride = static_cast<std::int64_t>(w.src_pitch / dtype_size(w.src_dtype));
  // Rows [first, end) of the write into `dst` (its first row's place): on a
  // device one copy; on the host a row at a time, per tensor with the amax of
  // each row taken while it is in the cache, into its expert's.
  float* amax = per_tensor && !device_ ? staged_amax_[w.slot].data() : nullptr;
  auto stage = [&](std::int64_t first, std::int64_t end, std::byte* dst) {
    const std::byte* from = in + first * w.src_pitch;
    if (device_ && w.src_dtype == model)
      return stream().copy_rows(dst, width, from, w.src_pitch, width,
                                static_cast<std::uint64_t>(end - first), CopyKind::kDeviceToDevice);
    if (device_) return stream().convert(from, w.src_dtype, stride, dst, model, end - first, cols);
    for (std::int64_t r = first; r < end; ++r) {
      std::byte* row = dst + (r - first) * width;
      if (w.src_dtype == model)
        std::memcpy(row, in + r * w.src_pitch, width);
      else
        convert_rows(in + r * w.src_pitch, w.src_dtype, stride, row, model, 1, cols);
      if (!amax) continue;
      float& m = amax[(w.dest_row + r) / units.per_expert];
      const float a = fp8_amax_host(row, model, static_cast<std::uint64_t>(cols));
      m = a > m ? a : m;  // (NaNs ignored, as in the amax)
    }
  };
  const bool direct = !device_ && w.src_dtype == model && w.src_pitch == width;
  auto& counts = unit_rows_[w.slot];
  for (std::int64_t r = w.dest_row; r < w.dest_row + w.rows;) {
    const std::int64_t unit = units.of_row(r), end = std::min(units.end(unit), w.dest_row + w.rows);
    const std::int64_t first = units.first(unit), height = units.end(unit) - first;
    if (direct && r == first && end - r == height && counts[unit] == 0) {
      quantize_unit(w.slot, units, unit, in + (r - w.dest_row) * w.src_pitch, false);
    } else {
      auto it = partial_units_.find({w.slot, unit});
      if (it == partial_units_.end())  // (allocated before it is entered: nothing empty kept)
        it = partial_units_
                 .emplace(std::make_pair(w.slot, unit),
                          rows_buffer(static_cast<std::uint64_t>(height) * width))
                 .first;
      Buffer& part = it->second;
      stage(r - w.dest_row, end - w.dest_row,
            part.data() + static_cast<std::uint64_t>(r - first) * width);
      if (counts[unit] + (end - r) == height) {
        quantize_unit(w.slot, units, unit, part.data(), true);
        // (on a device the stream orders the next copy into it after the kernel)
        spare_rows_.push_back(std::move(part));
        partial_units_.erase(it);
      }
    }
    counts[unit] += end - r;
    r = end;
  }
}

// The units online FP8 stages and quantizes a weight in: its experts (the
// whole weight without experts), and per block on the host its bands of 128
// rows (each expert's apart; on a device an expert is one kernel, not one per
// band).
ParameterSink::Bands ParameterSink::units_of(const ParamSpec& param) const {
  const std::int64_t block = online_fp8_block(rules_.quantization());
  if (block && !device_) return bands_of(param, block);
  const std::int64_t experts = param.shape.size() == 3 ? param.shape[0] : 1;
  return bands_of(param, param_rows(param.shape) / experts);
}

// A step's expert at processing: every unit was quantized as its rows landed
// (a weight this load brought only in part is refused before this).
void ParameterSink::check_units_quantized(const ScaleStep& step, int tp_rank) const {
  const ParamSpec& param = rules_.params()[step.weight];
  const Bands units = units_of(param);
  const std::int64_t expert = step.row / units.per_expert;
  for (std::int64_t unit = expert * units.per_band_row; unit < (expert + 1) * units.per_band_row;
       ++unit) {
    // (empty: this load wrote none of the weight)
    const auto& counts = unit_rows_[step.weight];
    const std::int64_t height = units.end(unit) - units.first(unit),
                       got = counts.empty() ? 0 : counts[unit];
    if (got != height)
      raise<ModelError>("online FP8 of '", param.name, "' on tp rank ", tp_rank, ": rows [",
                        units.first(unit), ", ", units.end(unit), ") got ", got, " of their ",
                        height, " rows in this load (they are quantized once all arrived)");
  }
}

// One unit of an online FP8 weight's rows, in the model's dtype at `x` (staged,
// or as a write brought them), into its codes and its scale: per tensor the
// expert's (on the host from the amax taken as a staged unit landed, else of
// `x`), per block its row of the grid (ScaleStep::block's arithmetic).
void ParameterSink::quantize_unit(ParamSlot slot, const Bands& units, std::int64_t unit,
                                  const std::byte* x, bool staged) {
  const ParamSpec& param = rules_.params()[slot];
  const ParamSpec& scale = rules_.params()[param.scale_slot];
  const DType model = rules_.config().dtype;
  const auto cols = static_cast<std::int64_t>(param_row_bytes(param.shape, param.dtype));
  const std::int64_t first = units.first(unit), rows = units.end(unit) - first;
  const auto n = static_cast<std::uint64_t>(rows * cols);
  auto* codes = reinterpret_cast<std::uint8_t*>(storage_[slot].data) + first * cols;
  // (its first scale row: of the grid, the expert's grid rows then the band's;
  // per tensor, the expert's one float)
  const std::int64_t block = online_fp8_block(rules_.quantization());
  const std::int64_t expert = first / units.per_expert, within = first % units.per_expert;
  const std::int64_t scale_row =
      block ? expert * ((units.per_expert + block - 1) / block) + within / block : expert;
  auto* out = reinterpret_cast<float*>(storage_[param.scale_slot].data) +
              scale_row * (param_row_bytes(scale.shape, DType::kFloat32) / 4);
  if (device_ && !block)
    stream().quantize_fp8(x, model, n, codes, out);
  else if (device_)
    stream().quantize_fp8_block(x, model, rows, cols, block, codes, out);
  else if (!block)
    quantize_fp8_with_amax_host(x, model, n,
                                staged ? staged_amax_[slot].at(expert) : fp8_amax_host(x, model, n),
                                codes, out);
  else
    quantize_fp8_blocks_host(x, model, rows, cols, block, codes, out);
  touched_[slot] = true;
  touched_[param.scale_slot] = true;
}

void ParameterSink::process_layer(std::int64_t layer, int tp_rank) {
  const bool online = online_fp8(rules_.quantization());
  if (!staging_ && !online && rules_.derived_steps().empty()) return;
  if (std::find(processed_.begin(), processed_.end(), layer) != processed_.end()) return;
  processed_.push_back(layer);
  if (steps_rank_ != tp_rank) {
    steps_ = rules_.scale_steps(tp_rank);
    steps_rank_ = tp_rank;
  }
  const auto& params = rules_.params();
  auto* staged = reinterpret_cast<float*>(staging_.data());
  for (const ScaleStep& step : steps_) {
    if (step.layer != layer) continue;
    const bool weight = step.weight != kNoSlot;
    // (online FP8: the weight alone says what this load brought)
    const Brought scale = step.quantize ? brought(step.weight) : brought(step.scale);
    const std::string problem =
        scale_step_problem(rules_, step, tp_rank, scale, weight ? brought(step.weight) : scale);
    if (!problem.empty()) raise<ModelError>(problem);
    if (scale == Brought::kNone) continue;  // (not in this load)
    const ParamSpec& w = weight ? params[step.weight] : params[step.scale];
    const std::uint64_t width = param_row_bytes(w.shape, w.dtype);  // (1-byte codes: columns)
    auto* codes = weight ? reinterpret_cast<std::uint8_t*>(storage_[step.weight].data) +
                               static_cast<std::uint64_t>(step.row) * width
                         : nullptr;
    const std::uint64_t n = weight ? static_cast<std::uint64_t>(step.rows) * width : 0;
    // (the scale's rows: one float each, or a grid's rows)
    const std::uint64_t out_width = param_row_bytes(params[step.scale].shape, DType::kFloat32) / 4;
    auto* out = reinterpret_cast<float*>(storage_[step.scale].data) + step.out_row * out_width;
    if (step.quantize) {  // (quantized unit by unit as the rows landed)
      check_units_quantized(step, tp_rank);
    } else {
      const float* from = staged + staged_at_[step.scale];
      if (device_)
        stream().requantize_fp8(codes, n, from, step.from, step.first, step.count, out);
      else
        fp8::requantize_step(codes, n, from, step.from, step.first, step.count, out);
    }
    touched_[step.scale] = true;
    if (weight) touched_[step.weight] = true;
  }
  derive_layer(layer, tp_rank);  // (from the weights as processed above)
  flush();
  // (online FP8: the layer's weights start again at their next load's first write)
  for (const ScaleStep& step : steps_)
    if (step.layer == layer && step.quantize) unit_rows_[step.weight].clear();
}

Brought ParameterSink::brought(ParamSlot slot) const {
  return loaded(slot) ? Brought::kAll : any_loaded(slot) ? Brought::kPart : Brought::kNone;
}

// The family's post-reload steps of `layer` (ShardingRules::derived_steps)
// whose weight this load brought, each from all of it and its scale.
void ParameterSink::derive_layer(std::int64_t layer, int tp_rank) {
  const auto& params = rules_.params();
  for (const DerivedStep& d : rules_.derived_steps()) {
    if (d.layer != layer) continue;
    const Brought weight = brought(d.from);
    // (a scale no checkpoint holds comes with its weight: int8's, online FP8's)
    const Brought scale =
        d.scale == kNoSlot || !params[d.scale].from_checkpoint ? weight : brought(d.scale);
    if (weight == Brought::kNone && scale == Brought::kNone) continue;
    if (weight != Brought::kAll || scale != Brought::kAll) {
      auto part = [](Brought b) {
        return b == Brought::kAll    ? "all of '"
               : b == Brought::kPart ? "only part of '"
                                     : "none of '";
      };
      raise<ModelError>("layer ", layer, " on tp rank ", tp_rank, ": this load brings ",
                        part(weight), params[d.from].name, "'",
                        d.scale == kNoSlot
                            ? std::string()
                            : detail::concat(" and ", part(scale), params[d.scale].name, "'"),
                        ": '", params[d.out].name,
                        "' is computed from all of them, so a load must bring all of them or none");
    }
    HeadRows a = d.window;  // (the geometry; the bytes are this sink's)
    a.w = storage_[d.from].data;
    a.w_dtype = params[d.from].dtype;
    if (d.scale != kNoSlot) {
      a.scale = reinterpret_cast<const float*>(storage_[d.scale].data);
      a.grid_cols = params[d.scale].shape.empty() ? 1 : params[d.scale].shape.back();
    }
    a.out = storage_[d.out].data;
    a.out_dtype = params[d.out].dtype;
    if (device_)
      stream().head_rows(a);
    else
      head_rows_host(a);
    touched_[d.out] = true;
  }
}

void ParameterSink::process_all(int tp_rank) {
  std::vector<std::int64_t> layers;
  for (const ParamSpec& spec : rules_.params())
    if ((spec.staged || spec.quantize_fp8) &&
        std::find(layers.begin(), layers.end(), spec.layer) == layers.end())
      layers.push_back(spec.layer);
  for (const DerivedStep& d : rules_.derived_steps())
    if (std::find(layers.begin(), layers.end(), d.layer) == layers.end()) layers.push_back(d.layer);
  for (std::int64_t layer : layers) process_layer(layer, tp_rank);
}

namespace {

// Where a row write's rows go and come from: the parameter's row width in
// bytes, its first row, the source's first row, and the columns and source
// stride in elements.
struct WriteRows {
  std::uint64_t width;
  std::byte* dst;
  const std::byte* in;
  std::int64_t cols, stride;
};

WriteRows rows_of(const RowWrite& w, const ParamSpec& param, std::byte* storage,
                  const std::byte* src) {
  const std::uint64_t width = param_row_bytes(param.shape, param.dtype);
  return {width, storage + static_cast<std::uint64_t>(w.dest_row) * width, src + w.src_offset,
          static_cast<std::int64_t>(width / dtype_size(param.dtype)),
          static_cast<std::int64_t>(w.src_pitch / dtype_size(w.src_dtype))};
}

}  // namespace

void ParameterSink::write_host(const RowWrite& w, const ParamSpec& param, const std::byte* src) {
  const auto [width, dst, in, cols, stride] = rows_of(w, param, storage_[w.slot].data, src);
  if (w.kind == WriteKind::kCopy) {
    if (w.src_pitch == width) {
      std::memcpy(dst, in, static_cast<std::uint64_t>(w.rows) * width);
    } else {
      for (std::int64_t r = 0; r < w.rows; ++r)
        std::memcpy(dst + r * width, in + r * w.src_pitch, width);
    }
    return;
  }
  if (w.kind == WriteKind::kConvert) {
    convert_rows(in, w.src_dtype, stride, dst, param.dtype, w.rows, cols);
    return;
  }
  auto* q = reinterpret_cast<std::int8_t*>(dst);
  auto* scale = reinterpret_cast<float*>(storage_[param.scale_slot].data) + w.dest_row;
  switch (w.src_dtype) {
    case DType::kBFloat16:
      quantize_rows_bf16(reinterpret_cast<const std::uint16_t*>(in), w.rows, cols, stride, q,
                         scale);
      break;
    case DType::kFloat16:
      quantize_rows_f16(reinterpret_cast<const std::uint16_t*>(in), w.rows, cols, stride, q, scale);
      break;
    case DType::kFloat32:
      quantize_rows_f32(reinterpret_cast<const float*>(in), w.rows, cols, stride, q, scale);
      break;
    default:
      raise<ModelError>("int8 quantization of '", param.name, "': unsupported source dtype ",
                        dtype_name(w.src_dtype), " (bfloat16, float16 or float32)");
  }
}

void ParameterSink::write_device(const RowWrite& w, const ParamSpec& param, const std::byte* src) {
  const auto [width, dst, in, cols, stride] = rows_of(w, param, storage_[w.slot].data, src);
  if (w.kind == WriteKind::kCopy) {
    if (w.src_pitch == width)
      stream().copy(dst, in, static_cast<std::uint64_t>(w.rows) * width, CopyKind::kDeviceToDevice);
    else
      stream().copy_rows(dst, width, in, w.src_pitch, width, static_cast<std::uint64_t>(w.rows),
                         CopyKind::kDeviceToDevice);
    return;
  }
  if (w.kind == WriteKind::kConvert) {
    stream().convert(in, w.src_dtype, stride, dst, param.dtype, w.rows, cols);
    return;
  }
  auto* scale = reinterpret_cast<float*>(storage_[param.scale_slot].data) + w.dest_row;
  stream().quantize_int8(in, w.src_dtype, w.rows, cols, stride, reinterpret_cast<std::int8_t*>(dst),
                         scale);
}

void ParameterSink::zero(const RowZero& z) {
  const ParamSpec& param = rules_.params().at(z.slot);
  const std::uint64_t width = param_row_bytes(param.shape, param.dtype);
  if (z.row_begin < 0 || z.row_end > param_rows(param.shape) || z.row_end < z.row_begin)
    raise<ModelError>("zeroing rows [", z.row_begin, ", ", z.row_end, ") of parameter '",
                      param.name, "' of ", param_rows(param.shape), " rows");
  std::byte* dst = storage_[z.slot].data + static_cast<std::uint64_t>(z.row_begin) * width;
  const std::uint64_t n = static_cast<std::uint64_t>(z.row_end - z.row_begin) * width;
  touched_[z.slot] = true;
  if (device_)
    stream().zero(dst, n);
  else
    std::memset(dst, 0, n);
}

void ParameterSink::flush(std::chrono::milliseconds timeout) {
  if (device_ && stream_)
    synchronize(*stream_, timeout, "writing parameters on " + device_->describe());
}

std::uint64_t ParameterSink::processing_staging_bytes() const {
  std::uint64_t bytes = staging_.size();
  for (const Buffer& b : spare_rows_) bytes += b.size();
  for (const auto& [unit, b] : partial_units_) bytes += b.size();
  return bytes;
}

void ParameterSink::begin_load() {
  std::fill(loaded_.begin(), loaded_.end(), 0);
  processed_.clear();
  // (rows an earlier load staged and never processed, as a load that failed
  // leaves them: spare, their amaxes started again when next taken)
  for (auto& [unit, rows] : partial_units_) spare_rows_.push_back(std::move(rows));
  partial_units_.clear();
  for (auto& counts : unit_rows_) counts.clear();
  touched_.assign(storage_.size(), false);
  commit_began_ = false;
}

std::vector<std::string> ParameterSink::touched_names() const {
  std::vector<std::string> names;
  for (ParamSlot s = 0; s < storage_.size(); ++s)
    if (touched_[s]) names.push_back(rules_.params()[s].name);
  std::sort(names.begin(), names.end());
  return names;
}

std::uint64_t ParameterSink::total_bytes() const {
  std::uint64_t n = 0;
  for (const auto& s : params_) n += (s.bytes + 255) / 256 * 256;  // each 256-byte aligned
  return n;
}

void ParameterSink::copy_all(const std::vector<ParamStorage>& from,
                             const std::vector<ParamStorage>& to) {
  for (std::size_t i = 0; i < from.size(); ++i) {
    if (!from[i].bytes) continue;
    if (device_)
      stream().copy(to[i].data, from[i].data, from[i].bytes, CopyKind::kDeviceToDevice);
    else
      std::memcpy(to[i].data, from[i].data, from[i].bytes);
  }
}

void ParameterSink::begin_shadow(std::chrono::milliseconds timeout) {
  if (shadow_) raise<UsageError>("parameter sink: a shadow copy is already open");
  Allocator& memory = device_ ? device_->memory() : host_allocator();
  Buffer shadow = memory.allocate(total_bytes());  // throws CommError naming the memory
  std::vector<ParamStorage> copy;
  std::uint64_t at = 0;
  for (const auto& s : params_) {
    copy.push_back({shadow.data() + at, s.bytes});
    at += (s.bytes + 255) / 256 * 256;
  }
  try {
    copy_all(params_, copy);
    flush(timeout);
  } catch (const CommTimeoutError&) {
    shadow.release();  // copies into it may still be running on the stuck device
    throw;
  } catch (const std::exception& e) {
    // A copy that could not be queued: those queued before it must land before
    // the shadow is freed, or it is abandoned.
    try {
      flush(timeout);
    } catch (...) {
      shadow.release();
    }
    raise<ModelError>("copying the parameters into their second copy on ",
                      device_ ? device_->describe() : std::string("the host"),
                      " failed: ", e.what());
  }
  shadow_ = std::move(shadow);
  storage_ = std::move(copy);
}

void ParameterSink::commit_shadow(std::chrono::milliseconds timeout) {
  if (!shadow_) raise<UsageError>("parameter sink: commit without a shadow copy");
  flush(timeout);  // every write into the shadow landed
  commit_began_ = true;
  copy_all(storage_, params_);
  flush(timeout);
  storage_ = params_;
  shadow_.reset();
}

void ParameterSink::discard_shadow(std::chrono::milliseconds timeout) noexcept {
  if (!shadow_) return;
  try {
    flush(timeout);  // device writes still queued into the shadow must land before it is freed
    storage_ = params_;
    shadow_.reset();
  } catch (...) {  // the device is stuck: leak the shadow rather than free memory in use
    storage_ = params_;
    shadow_.release();
  }
}

void ParameterSink::mark_loaded(ParamSlot slot, std::uint32_t shard) {
  const std::uint64_t begin = first_bit_.at(slot), end = first_bit_.at(slot + 1);
  if (shard != kAllShards && begin + shard >= end)
    raise<ModelError>("shard ", shard, " of parameter '", rules_.params()[slot].name,
                      "', which has ", end - begin);
  for (std::uint64_t b = shard == kAllShards ? begin : begin + shard;
       b < (shard == kAllShards ? end : begin + shard + 1); ++b)
    loaded_[b / 64] |= std::uint64_t{1} << (b % 64);
}

bool ParameterSink::loaded(ParamSlot slot) const {
  for (std::uint64_t b = first_bit_.at(slot); b < first_bit_.at(slot + 1); ++b)
    if (!(loaded_[b / 64] >> (b % 64) & 1)) return false;
  return true;
}

Brought ParameterSink::layer_brought(std::int64_t layer, WeightFormat format) const {
  bool all = true, any = false;
  for (ParamSlot s : expected_slots(format)) {
    if (rules_.params()[s].layer != layer) continue;
    all = all && loaded(s);
    any = any || any_loaded(s);
  }
  return any ? (all ? Brought::kAll : Brought::kPart) : Brought::kNone;
}

std::vector<ParamSlot> ParameterSink::expected_slots(WeightFormat format) const {
  std::vector<ParamSlot> slots;
  for (ParamSlot s = 0; s < storage_.size(); ++s)
    if (format == WeightFormat::kKernel || rules_.params()[s].from_checkpoint) slots.push_back(s);
  return slots;
}

std::vector<std::string> ParameterSink::expected_names(WeightFormat format) const {
  std::vector<std::string> names;
  for (ParamSlot s : expected_slots(format)) names.push_back(rules_.params()[s].name);
  return names;
}

std::vector<std::string> ParameterSink::loaded_names(WeightFormat format) const {
  std::vector<std::string> names;
  for (ParamSlot s : expected_slots(format))
    if (loaded(s)) names.push_back(rules_.params()[s].name);
  return names;
}

std::uint32_t ParameterSink::crc32(ParamSlot slot, std::uint64_t chunk_bytes,
                                   std::chrono::milliseconds timeout) {
  const ParamStorage& s = storage_.at(slot);
  return crc32(s.data, s.bytes, "'" + rules_.params()[slot].name + "'", chunk_bytes, timeout);
}

std::uint32_t ParameterSink::crc32(const std::byte* data, std::uint64_t bytes,
                                   const std::string& what, std::uint64_t chunk_bytes,
                                   std::chrono::milliseconds timeout) {
  std::uint32_t crc = static_cast<std::uint32_t>(::crc32(0L, Z_NULL, 0));
  if (!device_) return crc_update(crc, data, bytes);
  flush(timeout);
  const std::uint64_t step = std::min(std::max<std::uint64_t>(chunk_bytes, 1), bytes);
  Buffer& pinned = readback(step);
  for (std::uint64_t at = 0; at < bytes; at += step) {
    const std::uint64_t n = std::min(step, bytes - at);
    stream().copy(pinned.data(), data + at, n, CopyKind::kDeviceToHost);
    wait_or_abandon(pinned, [&] {
      synchronize(stream(), timeout,
                  detail::concat("reading back ", what, " from ", device_->describe()));
    });
    crc = crc_update(crc, pinned.data(), n);
  }
  return crc;
}

std::uint32_t ParameterSink::crc32c(const std::byte* data, std::uint64_t bytes,
                                    const std::string& what, std::chrono::milliseconds timeout) {
  std::vector<std::uint32_t> chunks;
  for (std::uint64_t at = 0; at < bytes || at == 0; at += kDigestChunk) {
    const std::uint64_t n = std::min(kDigestChunk, bytes - at);
    if (!device_ || n == 0) {
      chunks.push_back(tpreload::crc32c(n ? data + at : nullptr, n));
    } else {
      flush(timeout);
      // pinned: one raw CRC per 4 KiB block of a chunk
      Buffer& blocks = readback(crc32c_blocks(n) * sizeof(std::uint32_t));
      auto* raw = reinterpret_cast<std::uint32_t*>(blocks.data());
      stream().crc32c_blocks(data + at, n, raw);
      wait_or_abandon(blocks, [&] {
        synchronize(stream(), timeout,
                    detail::concat("checksumming ", what, " on ", device_->describe()));
      });
      chunks.push_back(crc32c_from_blocks(raw, n));
    }
    if (bytes <= kDigestChunk) break;
  }
  if (chunks.size() == 1) return chunks.front();
  return tpreload::crc32c(chunks.data(), chunks.size() * sizeof(std::uint32_t));
}

Buffer& ParameterSink::readback(std::uint64_t bytes) {
  if (readback_.size() < bytes) {
    readback_ = Buffer();  // (freed first: never both at once)
    readback_ = device_->pinned_memory().allocate(bytes);
  }
  return readback_;
}

}  // namespace tpreload
