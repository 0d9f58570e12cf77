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
  std::string device = "cpu";  // "cpu" or "cuda:N"
};

struct BorrowedOptions {
  int tp_size = 1;
  int tp_rank = 0;
  std::string quantization;      // "" or "int8"
  bool lora = false;             // linear layers named "<module>.base_layer.<leaf>"
  bool expert_parallel = false;  // MoE: whole experts per rank
};

// What is wrong with `tensors` as this rank's parameters, one line per problem:
// a parameter the rules expect that is missing (under its name, or with
// ".base_layer." when `lora`), a shape or dtype other than the rules', a
// non-contiguous tensor, tensors on different devices. Empty when they fit.
// Tensors the rules do not know (LoRA adapters, buffers) are ignored.
std::vector<std::string> borrowed_problems(const ShardingRules& rules,
                                           const BorrowedOptions& options,
                                           const std::vector<BorrowedTensor>& tensors);

class BorrowedTarget final : public ReloadTarget {
 public:
  // `device` is the device every tensor lives on (null for host memory). Throws
  // ValidationError listing every problem of borrowed_problems().
  BorrowedTarget(ModelConfig config, BorrowedOptions options, std::vector<BorrowedTensor> tensors,
                 std::shared_ptr<Device> device = nullptr);

  const ShardingRules& rules() const override { return rules_; }
  int tp_rank() const override { return options_.tp_rank; }
  ParameterSink& sink() override { return *sink_; }
  using ReloadTarget::sink;
  bool lora() const override { return options_.lora; }
  // The rules' parameters under the caller's names.
  std::vector<Stored> stored_parameters() const override;

 private:
  ShardingRules rules_;
  BorrowedOptions options_;
  std::vector<BorrowedTensor> tensors_;  // in slot order
  std::unique_ptr<ParameterSink> sink_;
};

}  // namespace tpreload
