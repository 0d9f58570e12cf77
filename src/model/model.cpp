#include "tpreload/model/model.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <sstream>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"
#include "tpreload/model/quantize.h"
#include "tpreload/model/torch_dtype.h"

namespace tpreload {
namespace {

const std::string kBaseLayer = ".base_layer.";

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

// "a.b.weight" -> "a.b.base_layer.weight"
std::string with_base_layer(const std::string& name) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return name;
  return name.substr(0, dot) + kBaseLayer + name.substr(dot + 1);
}

std::string strip_base_layer(std::string name) {
  const auto at = name.find(kBaseLayer);
  if (at != std::string::npos) name.replace(at, kBaseLayer.size(), ".");
  return name;
}

bool is_linear(const ParamSpec& spec) {
  return spec.layer >= 0 && (spec.kind == ShardKind::kColumn || spec.kind == ShardKind::kRow);
}

std::string scale_name(const std::string& weight_name) { return weight_name + "_scale"; }

at::TensorOptions options_for(DType dtype) {
  return at::TensorOptions().dtype(dtype_to_torch(dtype)).device(at::kCPU);
}

}  // namespace

at::Tensor tensor_view(ConstBytes bytes, DType dtype, const std::vector<std::int64_t>& shape) {
  std::uint64_t want = dtype_size(dtype);
  for (auto d : shape) want *= static_cast<std::uint64_t>(d);
  if (want != bytes.size)
    raise<UsageError>("tensor_view: shape ", shape_str(shape), " x ", dtype_name(dtype),
                      " needs ", want, " bytes, got ", bytes.size);
  return at::from_blob(const_cast<std::byte*>(bytes.data), shape, options_for(dtype));
}

ConstBytes tensor_bytes(const at::Tensor& tensor) {
  if (!tensor.is_contiguous()) raise<UsageError>("tensor_bytes: tensor is not contiguous");
  return ConstBytes(tensor.data_ptr(), tensor.numel() * tensor.element_size());
}

TensorParallelModel::TensorParallelModel(ModelConfig config, ModelOptions options)
    : rules_(std::move(config), options.tp_size, options.quantization), options_(options) {
  if (options_.tp_rank < 0 || options_.tp_rank >= options_.tp_size)
    raise<ModelError>("tensor-parallel rank ", options_.tp_rank, " is outside [0, ",
                      options_.tp_size, ")");
  for (const ParamSpec& spec : rules_.params()) {
    params_[storage_name(spec.name)] = at::zeros(spec.shape, options_for(spec.dtype));
    if (options_.lora && is_linear(spec) && spec.from_checkpoint && spec.shape.size() == 2) {
      const std::string module = spec.name.substr(0, spec.name.rfind('.'));
      params_[module + ".lora_a"] =
          at::zeros({options_.lora_rank, spec.shape[1]}, options_for(DType::kFloat32));
      params_[module + ".lora_b"] =
          at::zeros({spec.shape[0], options_.lora_rank}, options_for(DType::kFloat32));
    }
  }
}

std::string TensorParallelModel::storage_name(const std::string& name) const {
  if (!options_.lora) return name;
  const ParamSpec* spec = rules_.find_param(name);
  return spec && is_linear(*spec) ? with_base_layer(name) : name;
}

at::Tensor TensorParallelModel::parameter_for_reload(const std::string& name) const {
  auto it = params_.find(name);
  if (it == params_.end()) it = params_.find(with_base_layer(name));
  return it == params_.end() ? at::Tensor() : it->second;
}

std::vector<std::string> TensorParallelModel::expected_names(LoadFormat format) const {
  std::vector<std::string> names;
  for (const ParamSpec& spec : rules_.params())
    if (format == LoadFormat::kKernel || spec.from_checkpoint) names.push_back(spec.name);
  return names;
}

void TensorParallelModel::begin_load() { loaded_.clear(); }

std::string TensorParallelModel::check_checkpoint_tensor(const Placement& pl,
                                                         const std::vector<std::int64_t>& shape,
                                                         DType dtype, bool presliced) const {
  const std::vector<std::int64_t> want = presliced ? pl.slice_shape() : pl.source_shape;
  if (shape == want && dtype == config().dtype) return "";
  return detail::concat("tensor '", pl.checkpoint_name, "' for parameter '", pl.param,
                        "' on tp rank ", options_.tp_rank, "/", options_.tp_size, ": expected ",
                        presliced ? "slice " : "", shape_str(want), " ",
                        dtype_name(config().dtype), ", got ", shape_str(shape), " ",
                        dtype_name(dtype));
}

void TensorParallelModel::load_checkpoint_tensor(const Placement& pl, const at::Tensor& source,
                                                 bool presliced) {
  const std::string problem = check_checkpoint_tensor(
      pl, source.sizes().vec(), dtype_from_torch(source.scalar_type()), presliced);
  if (!problem.empty()) raise<ModelError>(problem);
  load_checkpoint_rows(pl, source, 0, presliced, true);
}

void TensorParallelModel::load_checkpoint_rows(const Placement& pl, const at::Tensor& block,
                                               std::int64_t row0, bool presliced, bool last) {
  const std::vector<std::int64_t> whole = presliced ? pl.slice_shape() : pl.source_shape;
  std::vector<std::int64_t> got = block.sizes().vec();
  const std::int64_t n = got.empty() ? 1 : got[0];
  const bool fits = got.size() == whole.size() && row0 >= 0 &&
                    (whole.empty() || n == 0 || row0 + n <= whole[0]) &&
                    std::equal(got.begin() + (got.empty() ? 0 : 1), got.end(),
                               whole.begin() + (whole.empty() ? 0 : 1)) &&
                    dtype_from_torch(block.scalar_type()) == config().dtype;
  if (!fits)
    raise<ModelError>("tensor '", pl.checkpoint_name, "' on tp rank ", options_.tp_rank, "/",
                      options_.tp_size, ": block of ", shape_str(got), " ",
                      c10::toString(block.scalar_type()), " at row ", row0, " does not fit ",
                      presliced ? "slice " : "", shape_str(whole), " ", dtype_name(config().dtype));
  if (presliced || pl.source_dim != 0) {
    // Block rows map one to one onto rows of the slice.
    const at::Tensor part = presliced || pl.source_dim < 0
                                ? block
                                : block.narrow(pl.source_dim, pl.source_start, pl.source_length);
    write_rows(pl.param, pl.dest_row + row0, part);
  } else {
    // Full-tensor rows: keep those inside [source_start, source_start + length).
    const std::int64_t lo = std::max(row0, pl.source_start);
    const std::int64_t hi = std::min(row0 + n, pl.source_start + pl.source_length);
    if (hi > lo)
      write_rows(pl.param, pl.dest_row + lo - pl.source_start, block.narrow(0, lo - row0, hi - lo));
  }
  at::Tensor& dst = params_.at(storage_name(pl.param));
  if (pl.zero_rows_from >= 0)
    dst.narrow(0, pl.zero_rows_from, dst.size(0) - pl.zero_rows_from).zero_();
  if (last) loaded_[pl.param].insert(pl.shard_id);
}

std::string TensorParallelModel::check_kernel_tensor(const std::string& name,
                                                     const std::vector<std::int64_t>& shape,
                                                     DType dtype) const {
  const at::Tensor param = parameter_for_reload(name);
  if (!param.defined())
    return detail::concat("kernel-format tensor '", name, "' has no parameter on tp rank ",
                          options_.tp_rank, "/", options_.tp_size);
  const DType have = dtype_from_torch(param.scalar_type());
  if (param.sizes().vec() == shape && have == dtype) return "";
  return detail::concat("kernel-format tensor '", name, "' on tp rank ", options_.tp_rank, "/",
                        options_.tp_size, ": expected ", shape_str(param.sizes().vec()), " ",
                        dtype_name(have), ", got ", shape_str(shape), " ", dtype_name(dtype));
}

void TensorParallelModel::load_kernel_tensor(const std::string& name, const at::Tensor& source) {
  const std::string problem = check_kernel_tensor(name, source.sizes().vec(),
                                                  dtype_from_torch(source.scalar_type()));
  if (!problem.empty()) raise<ModelError>(problem);
  load_kernel_rows(name, source, 0, true);
}

void TensorParallelModel::load_kernel_rows(const std::string& name, const at::Tensor& block,
                                           std::int64_t row0, bool last) {
  at::Tensor param = parameter_for_reload(name);
  if (!param.defined() || param.scalar_type() != block.scalar_type() ||
      param.dim() != block.dim())
    raise<ModelError>("kernel-format tensor '", name, "' on tp rank ", options_.tp_rank, "/",
                      options_.tp_size, ": block ", shape_str(block.sizes().vec()),
                      " does not fit the parameter");
  if (param.dim() == 0)
    param.copy_(block);
  else if (block.size(0) > 0)
    param.narrow(0, row0, block.size(0)).copy_(block);
  if (last) loaded_[strip_base_layer(name)].insert("*");
}

namespace {

// dst rows [row, row + part.size(0)) = part. Plain memcpy when the rows are
// contiguous (ATen's copy_ costs microseconds of dispatch per call, which
// dominates a checkpoint of 20,000 small tensors); ATen otherwise.
void copy_rows(at::Tensor& dst, std::int64_t row, const at::Tensor& part) {
  const bool simple = dst.is_contiguous() && dst.scalar_type() == part.scalar_type() &&
                      part.dim() >= 1 && part.dim() <= 2 &&
                      (part.dim() == 1 || part.stride(1) == 1) &&
                      (part.dim() == 1 ? part.stride(0) == 1 : true);
  if (!simple) {
    dst.narrow(0, row, part.size(0)).copy_(part);
    return;
  }
  const std::int64_t elem = part.element_size();
  const std::int64_t width = (part.dim() == 2 ? part.size(1) : 1) * elem;
  auto* out = static_cast<std::byte*>(dst.data_ptr()) + row * width;
  const auto* in = static_cast<const std::byte*>(part.data_ptr());
  if (part.dim() == 1 || part.stride(0) == part.size(1)) {
    std::memcpy(out, in, part.size(0) * width);
    return;
  }
  for (std::int64_t r = 0; r < part.size(0); ++r)
    std::memcpy(out + r * width, in + r * part.stride(0) * elem, width);
}

}  // namespace

void TensorParallelModel::write_rows(const std::string& param, std::int64_t row,
                                     const at::Tensor& part) {
  at::Tensor& dst = params_.at(storage_name(param));
  if (dst.dim() == 0) {
    dst.copy_(part);
    return;
  }
  if (part.size(0) == 0) return;
  if (dst.scalar_type() != at::kChar || part.scalar_type() == at::kChar) {
    copy_rows(dst, row, part);
    return;
  }
  // int8 kernel format: every output row arrives whole in one block, so it is
  // quantized straight into the int8 storage (no staging of the layer).
  // Row-parallel shards of a broadcast tensor arrive as strided views: the kernel
  // reads them in place (ATen's contiguous() would run on its own thread pool).
  at::Tensor w = part;
  if (w.scalar_type() != at::kBFloat16 && w.scalar_type() != at::kFloat) {
    if (w.scalar_type() != at::kHalf && w.scalar_type() != at::kDouble)
      raise<ModelError>("int8 quantization of '", param, "': unsupported dtype ",
                        c10::toString(w.scalar_type()));
    w = w.to(at::kFloat);  // exact for half; double rounds as the formula's per-element cast
  }
  const std::int64_t rows = w.size(0), cols = w.numel() / rows;
  if (w.dim() != 2 || w.stride(1) != 1) w = w.contiguous();
  const std::int64_t row_stride = w.dim() == 2 && rows > 1 ? w.stride(0) : cols;
  auto* out = dst.data_ptr<std::int8_t>() + row * cols;
  auto* scales = params_.at(storage_name(scale_name(param))).data_ptr<float>() + row;
  if (w.scalar_type() == at::kBFloat16)
    quantize_rows_bf16(static_cast<const std::uint16_t*>(w.data_ptr()), rows, cols, row_stride,
                       out, scales);
  else
    quantize_rows_f32(w.data_ptr<float>(), rows, cols, row_stride, out, scales);
}

bool TensorParallelModel::shards_complete(const std::string& param) const {
  const ParamSpec* spec = rules_.find_param(param);
  const auto it = loaded_.find(param);
  if (!spec || it == loaded_.end()) return false;
  if (it->second.count("*")) return true;
  for (const auto& id : spec->shard_ids)
    if (!it->second.count(id)) return false;
  return true;
}

void TensorParallelModel::finish_layer(std::int64_t /*layer*/) {
  // Nothing to do for the processing this model supports: int8 rows are
  // quantized as they arrive (write_rows). The hook stays for processing that
  // needs a whole layer (e.g. per-tensor scales).
}

void TensorParallelModel::finish() {}

std::vector<std::string> TensorParallelModel::loaded_names(LoadFormat format) const {
  std::vector<std::string> names;
  for (const ParamSpec& spec : rules_.params()) {
    if (format == LoadFormat::kCheckpoint && !spec.from_checkpoint) continue;
    if (shards_complete(spec.name)) names.push_back(spec.name);
  }
  return names;
}

std::set<std::string> TensorParallelModel::load_weights(WeightSource& source,
                                                        std::set<std::string>* skipped) {
  begin_load();
  const bool kernel = source.kernel_format().has_value();
  const auto& infos = source.tensors();
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const TensorInfo& info = infos[i];
    if (kernel && info.tp_rank != options_.tp_rank) continue;
    std::optional<Placement> pl;
    if (!kernel && !(pl = rules_.place(info.name, options_.tp_rank))) {
      if (skipped) skipped->insert(info.name);
      continue;
    }
    at::Tensor tensor;
    if (auto view = source.view(i, {0, info.nbytes})) {
      tensor = tensor_view(*view, info.dtype, info.shape);
    } else {
      tensor = at::empty(info.shape, options_for(info.dtype));
      source.read(i, {0, info.nbytes}, MutableBytes(tensor.data_ptr(), info.nbytes));
    }
    if (kernel)
      load_kernel_tensor(info.name, tensor);
    else
      load_checkpoint_tensor(*pl, tensor, false);
  }
  finish();
  const auto names = loaded_names(kernel ? LoadFormat::kKernel : LoadFormat::kCheckpoint);
  return {names.begin(), names.end()};
}

}  // namespace tpreload
