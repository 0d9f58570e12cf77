// A tensor-parallel model on LibTorch, of any family model_families() lists:
// the parameters one rank holds under vLLM's in-model names, their weight
// loaders, LoRA wrapping and int8 weight-only kernel format. (The reference
// forward pass over these parameters is tpreload/reference/forward.h.)
//
// Names. Parameters are named as vLLM names them ("model.layers.0.self_attn.
// qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight", "lm_head.weight").
// With LoRA, linear layers keep their parameters under "...<module>.base_layer.
// <leaf>" beside "...<module>.lora_a"/"lora_b"; parameter_for_reload() reaches the
// base layer without changing the module tree (vLLM's get_parameter_for_reload).
//
// Storage. Every parameter tensor is allocated once, in the constructor, in host
// memory or on ModelOptions::device; loads write into it through the model's
// ParameterSink, so pointers, shapes, strides and dtypes never change. A tied LM
// head is the embedding tensor itself. Parameters in the memory of a CUDA device
// are CUDA tensors (their bytes are written by the sink, not by ATen, so a
// LibTorch without CUDA can hold them too; the reference forward pass then
// needs a CUDA LibTorch to read them back).
//
// int8. With quantization "int8", every dense decoder linear weight is int8 (MoE
// experts stay in the model's dtype) with a float32 weight_scale [rows], computed
// per output row of the rank's shard:
// scale = max|w| / 127 (1 where max|w| == 0), q = clamp(round_half_even(w /
// scale), -127, 127). Each output row of a shard comes whole from one checkpoint
// tensor (column-parallel rows from q/k/v/gate/up, row-parallel rows as one
// column window), so checkpoint-format loads quantize rows as they arrive,
// straight into the int8 storage: no staging, and the same bytes as quantizing
// the whole shard afterwards.
//
// fp8, fp8-block. With quantization "fp8" or "fp8-block" (vLLM's online FP8,
// a scale per weight or per 128 x 128 block), every decoder linear weight and
// expert is float8_e4m3fn with float32 scales, quantized once its layer (with
// blocks, each band of 128 rows) arrived (docs/CHECKPOINTS.md, "Online FP8").
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <memory>

#include "tpreload/comm/memory.h"
#include "tpreload/core/span.h"
#include "tpreload/model/config.h"
#include "tpreload/model/parameter_sink.h"
#include "tpreload/model/sharding.h"
#include "tpreload/model/target.h"

namespace tpreload {

class Device;
class WeightSource;

struct ModelOptions {
  int tp_size = 1;
  int tp_rank = 0;
  std::string quantization;  // "" or a scheme of quantization_schemes() (core/quantization.h)
  bool lora = false;         // wrap the decoder linear layers with LoRA adapters
  std::int64_t lora_rank = 8;
  // Mixture-of-experts models: whole experts split over the tensor-parallel ranks
  // (vLLM's --enable-expert-parallel) instead of every expert split by tp.
  bool expert_parallel = false;
  // Where the parameters live: null for host memory, else this device's memory.
  std::shared_ptr<Device> device;
};

class TensorParallelModel : public ReloadTarget {
 public:
  // Allocates every parameter (zeros). Throws ModelError if the config cannot be
  // split options.tp_size ways or tp_rank is out of range.
  TensorParallelModel(ModelConfig config, ModelOptions options);
  // Not copyable or movable: the sink refers to the rules, and callers keep
  // pointers to the parameters.
  TensorParallelModel(const TensorParallelModel&) = delete;
  TensorParallelModel& operator=(const TensorParallelModel&) = delete;

  const ModelConfig& config() const { return rules_.config(); }
  const ModelOptions& options() const { return options_; }

  // --- ReloadTarget ---
  const ShardingRules& rules() const override { return rules_; }
  int tp_rank() const override { return options_.tp_rank; }
  ParameterSink& sink() override { return *sink_; }
  using ReloadTarget::sink;
  bool lora() const override { return options_.lora; }
  // Every parameter under its module-tree name, LoRA adapters included.
  std::vector<Stored> stored_parameters() const override;

  // Every parameter as named in the module tree (with ".base_layer." and LoRA
  // adapters when wrapped), sorted by name. A tied LM head is not listed twice.
  const std::map<std::string, at::Tensor>& named_parameters() const { return params_; }

  // The parameter an in-model name refers to, trying "<module>.base_layer.<leaf>"
  // when the plain name is absent. An undefined tensor when neither exists.
  at::Tensor parameter_for_reload(const std::string& name) const;

  // The names a reload in `format` must load, sorted: ".base_layer." stripped,
  // LoRA adapters excluded, weight_scale only in kernel format.
  std::vector<std::string> expected_names(WeightFormat format) const;

  // --- loading (every call is local to this rank; blocks are host tensors) ---

  // Start tracking which names load.
  void begin_load();

  // Checkpoint format: copy the slice `placement` describes from `source` (the
  // whole checkpoint tensor, or exactly the slice when `presliced`) into the
  // target parameter (quantizing int8 rows), zeroing vocab padding rows. Throws
  // ModelError naming tensor, expected and actual shape/dtype on a mismatch.
  void load_checkpoint_tensor(const Placement& placement, const at::Tensor& source, bool presliced);

  // The same for a block of rows: `block` holds rows [row0, row0 + block.size(0))
  // of the whole checkpoint tensor (or of this rank's slice when `presliced`); a
  // tensor may arrive in several blocks, in order, `last` marking the final one
  // (only then does the parameter count as loaded). 1-D tensors count elements
  // as rows.
  void load_checkpoint_rows(const Placement& placement, const at::Tensor& block, std::int64_t row0,
                            bool presliced, bool last);

  // Check, without writing, that load_checkpoint_tensor() would accept a tensor
  // of this shape and dtype. Returns "" if so, else the reason.
  std::string check_checkpoint_tensor(const Placement& placement,
                                      const std::vector<std::int64_t>& shape, DType dtype,
                                      bool presliced) const;

  // Kernel format: copy `source` straight into the parameter `name` resolves to
  // (converting a floating dtype other than the parameter's).
  void load_kernel_tensor(const std::string& name, const at::Tensor& source);
  void load_kernel_rows(const std::string& name, const at::Tensor& block, std::int64_t row0,
                        bool last);
  std::string check_kernel_tensor(const std::string& name, const std::vector<std::int64_t>& shape,
                                  DType dtype) const;

  // Post-load processing of one decoder layer, or of everything at the end. The
  // processing implemented today (int8) happens per row on arrival, so these are
  // hooks with no work; the engine calls them as each layer completes.
  void finish_layer(std::int64_t layer) override;
  void finish() override;

  // Expected names loaded since begin_load(): a stacked parameter (qkv_proj,
  // gate_up_proj) counts once all of its shards loaded.
  std::vector<std::string> loaded_names(WeightFormat format) const;

  // vLLM-style local load of every tensor of `source` (checkpoint or kernel
  // format, by source): loaders, then finish(). Returns the names loaded; fills
  // `skipped` with checkpoint names that have no parameter.
  std::set<std::string> load_weights(WeightSource& source,
                                     std::set<std::string>* skipped = nullptr);

 private:
  // The dtype of the parameter in `slot` (float32 for kNoSlot: no FP8 reading).
  DType param_dtype(ParamSlot slot) const {
    return slot == kNoSlot ? DType::kFloat32 : rules_.params()[slot].dtype;
  }
  at::Tensor allocate(const std::vector<std::int64_t>& shape, DType dtype);
  // Run `writes` whose source is the host block `bytes` (staged on the device first).
  void apply_block(const std::vector<RowWrite>& writes, ConstBytes bytes);
  std::string storage_name(const std::string& name) const;

  ShardingRules rules_;
  ModelOptions options_;
  std::vector<Buffer> device_memory_;  // owns device parameters (empty on the host)
  std::map<std::string, at::Tensor> params_;
  std::unique_ptr<ParameterSink> sink_;
};

// A tensor viewing `bytes` (no copy; the bytes must outlive it). Shape x dtype
// must equal the byte count (UsageError otherwise).
at::Tensor tensor_view(ConstBytes bytes, DType dtype, const std::vector<std::int64_t>& shape);

// The bytes of a contiguous tensor.
ConstBytes tensor_bytes(const at::Tensor& tensor);

}  // namespace tpreload
