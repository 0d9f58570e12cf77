#include "tpreload/model/model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/device.h"
#include "tpreload/core/error.h"
#include "tpreload/model/torch_dtype.h"

namespace tpreload {
namespace {

bool is_linear(const ParamSpec& spec) {
  return spec.layer >= 0 && (spec.kind == ShardKind::kColumn || spec.kind == ShardKind::kRow);
}

at::TensorOptions options_for(DType dtype) {
  return at::TensorOptions().dtype(dtype_to_torch(dtype)).device(at::kCPU);
}

std::uint64_t numel_bytes(const std::vector<std::int64_t>& shape, DType dtype) {
  std::uint64_t n = dtype_size(dtype);
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

}  // namespace

at::Tensor tensor_view(ConstBytes bytes, DType dtype, const std::vector<std::int64_t>& shape) {
  const std::uint64_t want = numel_bytes(shape, dtype);
  if (want != bytes.size)
    raise<UsageError>("tensor_view: shape ", shape_string(shape), " x ", dtype_name(dtype),
                      " needs ", want, " bytes, got ", bytes.size);
  return at::from_blob(const_cast<std::byte*>(bytes.data), shape, options_for(dtype));
}

ConstBytes tensor_bytes(const at::Tensor& tensor) {
  if (!tensor.is_contiguous()) raise<UsageError>("tensor_bytes: tensor is not contiguous");
  return ConstBytes(tensor.data_ptr(), tensor.numel() * tensor.element_size());
}

TensorParallelModel::TensorParallelModel(ModelConfig config, ModelOptions options)
    : rules_(std::move(config), options.tp_size, options.quantization, options.expert_parallel),
      options_(options) {
  if (options_.tp_rank < 0 || options_.tp_rank >= options_.tp_size)
    raise<ModelError>("tensor-parallel rank ", options_.tp_rank, " is outside [0, ",
                      options_.tp_size, ")");
  if (!options_.quantization.empty() && rules_.config().dtype != DType::kBFloat16 &&
      rules_.config().dtype != DType::kFloat16 && rules_.config().dtype != DType::kFloat32)
    raise<ModelError>("quantization ", options_.quantization,
                      " needs bfloat16, float16 or float32 weights; the config's dtype is ",
                      dtype_name(rules_.config().dtype));
  std::vector<ParamStorage> storage;
  for (const ParamSpec& spec : rules_.params()) {
    at::Tensor t = allocate(spec.shape, spec.dtype);
    storage.push_back({static_cast<std::byte*>(t.data_ptr()), numel_bytes(spec.shape, spec.dtype)});
    params_[storage_name(spec.name)] = t;
    if (options_.lora && is_linear(spec) && spec.from_checkpoint && spec.shape.size() == 2) {
      const std::string module = spec.name.substr(0, spec.name.rfind('.'));
      params_[module + ".lora_a"] = allocate({options_.lora_rank, spec.shape[1]}, DType::kFloat32);
      params_[module + ".lora_b"] = allocate({spec.shape[0], options_.lora_rank}, DType::kFloat32);
    }
  }
  sink_ = std::make_unique<ParameterSink>(rules_, std::move(storage), options_.device);
  if (options_.device) {  // device memory starts as garbage: zero it as at::zeros would
    auto stream = options_.device->make_stream();
    for (const Buffer& b : device_memory_) stream->zero(b.data(), b.size());
    synchronize(*stream, std::chrono::minutes(5),
                "zeroing new parameters on " + options_.device->describe());
  }
}

at::Tensor TensorParallelModel::allocate(const std::vector<std::int64_t>& shape, DType dtype) {
  if (!options_.device) return at::zeros(shape, options_for(dtype));
  device_memory_.push_back(options_.device->memory().allocate(numel_bytes(shape, dtype)));
  // A device the host can address (the tests' emulated one) holds CPU tensors.
  const at::Device where =
      options_.device->host_addressable()
          ? at::Device(at::kCPU)
          : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(options_.device->ordinal()));
  return at::for_blob(device_memory_.back().data(), shape)
      .options(at::TensorOptions().dtype(dtype_to_torch(dtype)).device(where))
      .target_device(where)
      .make_tensor();
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

std::vector<std::string> TensorParallelModel::expected_names(WeightFormat format) const {
  return sink_->expected_names(format);
}

void TensorParallelModel::begin_load() {
  sink_->begin_load();
}

std::vector<std::string> TensorParallelModel::loaded_names(WeightFormat format) const {
  return sink_->loaded_names(format);
}

std::string TensorParallelModel::check_checkpoint_tensor(const Placement& pl,
                                                         const std::vector<std::int64_t>& shape,
                                                         DType dtype, bool presliced) const {
  return checkpoint_tensor_problem(rules_, options_.tp_rank, pl, shape, dtype, presliced);
}

void TensorParallelModel::load_checkpoint_tensor(const Placement& pl, const at::Tensor& source,
                                                 bool presliced) {
  const std::string problem = check_checkpoint_tensor(
      pl, source.sizes().vec(), dtype_from_torch(source.scalar_type(), param_dtype(pl.slot)),
      presliced);
  if (!problem.empty()) raise<ModelError>(problem);
  load_checkpoint_rows(pl, source, 0, presliced, true);
}

void TensorParallelModel::apply_block(const std::vector<RowWrite>& writes, ConstBytes bytes) {
  if (!options_.device) {
    for (const RowWrite& w : writes) sink_->write(w, bytes.data);
    return;
  }
  Buffer staged = options_.device->memory().allocate(bytes.size);
  auto stream = options_.device->make_stream();
  if (bytes.size) stream->copy(staged.data(), bytes.data, bytes.size, CopyKind::kHostToDevice);
  wait_or_abandon(staged, [&] {
    synchronize(*stream, std::chrono::minutes(5),
                "staging a tensor on " + options_.device->describe());
  });
  for (const RowWrite& w : writes) sink_->write(w, staged.data());
  wait_or_abandon(staged, [&] { sink_->flush(); });  // (the writes from it)
}

void TensorParallelModel::load_checkpoint_rows(const Placement& pl, const at::Tensor& block,
                                               std::int64_t row0, bool presliced, bool last) {
  if (!pl.held)
    raise<ModelError>("tensor '", pl.checkpoint_name, "' is not held by tp rank ", options_.tp_rank,
                      "/", options_.tp_size, " (another rank holds this expert)");
  const std::vector<std::int64_t> whole = presliced ? pl.slice_shape() : pl.source_shape;
  std::vector<std::int64_t> got = block.sizes().vec();
  const std::int64_t n = got.empty() ? 1 : got[0];
  const DType from = dtype_from_torch(block.scalar_type(), param_dtype(pl.slot));
  const bool fits = got.size() == whole.size() && row0 >= 0 &&
                    (whole.empty() || n == 0 || row0 + n <= whole[0]) &&
                    std::equal(got.begin() + (got.empty() ? 0 : 1), got.end(),
                               whole.begin() + (whole.empty() ? 0 : 1)) &&
                    convertible(from, rules_.params().at(pl.slot).dtype,
                                rules_.params().at(pl.slot).quantized_on_load()) &&
                    block.device().is_cpu();
  if (!fits)
    raise<ModelError>("tensor '", pl.checkpoint_name, "' on tp rank ", options_.tp_rank, "/",
                      options_.tp_size, ": block of ", shape_string(got), " ",
                      c10::toString(block.scalar_type()), " at row ", row0, " does not fit ",
                      presliced ? "slice " : "", shape_string(whole), " ",
                      dtype_name(checkpoint_dtype(rules_, pl.slot)));
  const at::Tensor rows = block.contiguous();
  std::vector<RowWrite> writes;
  if (auto w = checkpoint_row_write(rules_, pl, from, row0, n, presliced, 0)) writes.push_back(*w);
  apply_block(writes, tensor_bytes(rows));
  if (!last) return;
  if (auto z = padding_rows(rules_, pl)) {
    sink_->zero(*z);
    sink_->flush();
  }
  sink_->mark_loaded(pl.slot, pl.shard);
}

std::string TensorParallelModel::check_kernel_tensor(const std::string& name,
                                                     const std::vector<std::int64_t>& shape,
                                                     DType dtype) const {
  return kernel_tensor_problem(rules_, options_.tp_rank, name, shape, dtype);
}

std::vector<ReloadTarget::Stored> TensorParallelModel::stored_parameters() const {
  std::vector<Stored> out;
  for (const auto& [name, t] : params_)
    out.push_back({name,
                   t.sizes().vec(),
                   dtype_from_torch(t.scalar_type(), param_dtype(rules_.find_slot(name))),
                   {static_cast<std::byte*>(t.data_ptr()),
                    static_cast<std::uint64_t>(t.numel() * t.element_size())}});
  return out;
}

void TensorParallelModel::load_kernel_tensor(const std::string& name, const at::Tensor& source) {
  const std::string problem = check_kernel_tensor(
      name, source.sizes().vec(),
      dtype_from_torch(source.scalar_type(), param_dtype(rules_.find_slot(name))));
  if (!problem.empty()) raise<ModelError>(problem);
  load_kernel_rows(name, source, 0, true);
}

void TensorParallelModel::load_kernel_rows(const std::string& name, const at::Tensor& block,
                                           std::int64_t row0, bool last) {
  const ParamSlot slot = rules_.find_slot(name);
  const ParamSpec* spec = slot == kNoSlot ? nullptr : &rules_.params()[slot];
  const DType from = dtype_from_torch(block.scalar_type(), param_dtype(slot));
  // Whole rows of the parameter: every dimension after the first is its own.
  const std::vector<std::int64_t> got = block.sizes().vec();
  if (!spec || !convertible(from, spec->dtype, false) ||
      (from == DType::kInt8) != (spec->dtype == DType::kInt8) || spec->shape.size() != got.size() ||
      !std::equal(got.begin() + (got.empty() ? 0 : 1), got.end(),
                  spec->shape.begin() + (spec->shape.empty() ? 0 : 1)) ||
      row0 < 0 || (!got.empty() && row0 + got[0] > spec->shape[0]) || !block.device().is_cpu())
    raise<ModelError>("kernel-format tensor '", name, "' on tp rank ", options_.tp_rank, "/",
                      options_.tp_size, ": block ", shape_string(got), " ", dtype_name(from),
                      " at row ", row0, " does not fit the parameter",
                      spec ? detail::concat(" (", shape_string(spec->shape), " ",
                                            dtype_name(spec->dtype), ": whole rows inside it)")
                           : std::string(" (no such parameter)"));
  const at::Tensor rows = block.contiguous();
  const std::int64_t n = block.dim() == 0 ? 1 : block.size(0);
  apply_block({kernel_row_write(rules_, slot, from, row0, n, 0)}, tensor_bytes(rows));
  if (last) sink_->mark_loaded(slot, ParameterSink::kAllShards);
}

void TensorParallelModel::finish_layer(std::int64_t /*layer*/) {
  // Nothing to do for the processing this model supports: int8 rows are
  // quantized as they arrive. The hook stays for processing that needs a whole
  // layer (e.g. per-tensor scales).
}

void TensorParallelModel::finish() {}

std::set<std::string> TensorParallelModel::load_weights(WeightSource& source,
                                                        std::set<std::string>* skipped) {
  begin_load();
  // (stacked tensors, Phi-3's q/k/v and gate/up or GraniteMoE's experts, read
  // as the tensors the loaders take)
  const auto split = loader_view(source, config());
  WeightSource& from = split ? *split : source;
  const bool kernel = from.kernel_format().has_value();
  const auto& infos = from.tensors();
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const TensorInfo& info = infos[i];
    if (kernel && info.tp_rank != options_.tp_rank) continue;
    std::optional<Placement> pl;
    if (!kernel && !(pl = rules_.place(info.name, options_.tp_rank))) {
      if (skipped) skipped->insert(info.name);
      continue;
    }
    if (pl && !pl->held) continue;  // another rank's expert
    // The file's shape is checked before it sizes anything (a corrupt file can
    // declare any shape).
    const std::string problem = kernel
                                    ? check_kernel_tensor(info.name, info.shape, info.dtype)
                                    : check_checkpoint_tensor(*pl, info.shape, info.dtype, false);
    if (!problem.empty()) raise<ModelError>("loading from ", from.describe(), ": ", problem);
    at::Tensor tensor;
    if (auto view = from.view(i, {0, info.nbytes})) {
      tensor = tensor_view(*view, info.dtype, info.shape);
    } else {
      tensor = at::empty(info.shape, options_for(info.dtype));
      from.read(i, {0, info.nbytes}, MutableBytes(tensor.data_ptr(), info.nbytes));
    }
    if (kernel)
      load_kernel_tensor(info.name, tensor);
    else
      load_checkpoint_tensor(*pl, tensor, false);
  }
  from.check_mapped_reads();  // views of a file cut short since open read as zeros
  if (!kernel) sink_->process_all(options_.tp_rank);  // (per-tensor FP8)
  finish();
  const auto names = loaded_names(kernel ? WeightFormat::kKernel : WeightFormat::kCheckpoint);
  return {names.begin(), names.end()};
}

}  // namespace tpreload
