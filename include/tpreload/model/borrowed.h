// Parameters a caller owns (a Python process's torch tensors, a serving engine's
// buffers) as a ReloadTarget: the reload writes into them in place and never
// reallocates them. No torch here: a tensor is its pointer, shape, strides, dtype
// and device, so one build works with whatever framework holds the memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tpreload/comm/device.h"
#include "tpreload/model/target.h"

namespace tpreload {

// One parameter as the caller holds it.
struct BorrowedTensor {
  std::string name;  // as the caller's module tree names it
  std::byte* data = nullptr;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // in elements
  DType dtype = DType::kFloat32;
  // The caller's dtype when tpreload does not know it (int16, float8, complex):
  // such a tensor is fine where it is ignored, and refused as a parameter.
  std::string unknown_dtype;
  std::string device = "cpu";  // "cpu" or "cuda:N" for a parameter; others are refused
};

// Row-major with no gaps (size-1 dimensions may have any stride).
bool is_contiguous(const BorrowedTensor& t);

struct BorrowedOptions {
  int tp_size = 1;
  int tp_rank = 0;
  std::string quantization;      // "" or a scheme of quantization_schemes()
  bool lora = false;             // linear layers named "<module>.base_layer.<leaf>"
  bool expert_parallel = false;  // MoE: whole experts per rank
  // The model holds the family's derived parameters (DeepSeek's W_UK_T and
  // W_UV) itself, as views of their unquantized weights (vLLM's bfloat16
  // kv_b_proj), which the reload writes: they are not given, nor computed.
  bool derived_views = false;
};

// What is wrong with `tensors` as this rank's parameters, one line per problem:
// a parameter the rules expect that is missing (under its name, with
// ".base_layer." when `lora`, or for FusedMoE's experts.w13_* and w2_* under
// experts.routed_experts., as newer vLLM nests them) or given twice, a shape or dtype other than
// the rules', a non-contiguous tensor, a device other than "cpu" or "cuda:N", parameters on
// different devices. Empty when they fit. Tensors the rules do not know (LoRA adapters, buffers)
// are ignored, whatever their dtype or device. With derived_views (`rules`
// built without the derived parameters), a derived parameter of a quantized
// weight, or one given all the same, is a problem.
std::vector<std::string> borrowed_problems(const ShardingRules& rules,
                                           const BorrowedOptions& options,
                                           const std::vector<BorrowedTensor>& tensors);

// Used in two steps: construction matches the tensors to the rules (so the
// caller learns which device to open), attach() gives the sink that device.
class BorrowedTarget final : public ReloadTarget {
 public:
  // Throws ModelError when the config does not fit the options (tp size, heads)
  // and ValidationError listing every problem of borrowed_problems().
  BorrowedTarget(ModelConfig config, BorrowedOptions options, std::vector<BorrowedTensor> tensors);

  // Where the parameters live: "cpu" or "cuda:N" ("cpu" when the rules have none).
  const std::string& device_name() const { return device_name_; }
  // Writes will go through `device` (null for host memory). Throws
  // ValidationError when it is not device_name()'s.
  void attach(std::shared_ptr<Device> device);

  const ShardingRules& rules() const override { return rules_; }
  int tp_rank() const override { return options_.tp_rank; }
  ParameterSink& sink() override;
  using ReloadTarget::sink;
  bool lora() const override { return options_.lora; }
  // The rules' parameters under the caller's names.
  std::vector<Stored> stored_parameters() const override;

 private:
  ShardingRules rules_;
  BorrowedOptions options_;
  std::vector<BorrowedTensor> tensors_;  // in slot order
  std::string device_name_ = "cpu";
  std::unique_ptr<ParameterSink> sink_;  // after attach()
};

}  // namespace tpreload
