// What a reload writes into: the parameters of one rank. TensorParallelModel is
// one (it owns its parameters as LibTorch tensors); parameters borrowed from a
// caller (the Python module's, a serving engine's) are another. The reload engine
// sees only this interface, so it needs no LibTorch. No torch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpreload/model/parameter_sink.h"
#include "tpreload/model/sharding.h"

namespace tpreload {

class ReloadTarget {
 public:
  virtual ~ReloadTarget() = default;

  // The rules of this rank's model: config, tp size, quantization, expert layout.
  virtual const ShardingRules& rules() const = 0;
  virtual int tp_rank() const = 0;
  // Where every parameter lives, by slot, and how bytes are written into it.
  virtual ParameterSink& sink() = 0;
  const ParameterSink& sink() const { return const_cast<ReloadTarget*>(this)->sink(); }
  // Whether the linear layers are LoRA-wrapped (ranks must agree on it).
  virtual bool lora() const { return false; }

  // Post-load processing: after the bucket that completes decoder layer `layer`,
  // and after the whole load; in an atomic reload every finish_layer (in layer
  // order) and then finish() after the commit, when the parameters hold the
  // new weights. Local to this rank; may throw.
  virtual void finish_layer(std::int64_t /*layer*/) {}
  virtual void finish() {}

  // A parameter as stored, under the module tree's name (with ".base_layer." when
  // LoRA-wrapped), in the sink's memory space.
  struct Stored {
    std::string name;
    std::vector<std::int64_t> shape;
    DType dtype = DType::kFloat32;
    ParamStorage storage;
  };
  // Every parameter as stored, in any order (reports sort them by name, list and
  // fingerprint them). The default: the rules' parameters from the sink.
  virtual std::vector<Stored> stored_parameters() const;
};

// Whether a tensor fits where the rules put it on tp rank `tp_rank`: "" if so,
// else the reason, naming the tensor, the parameter, the rank, expected and
// actual shape and dtype. Floating dtypes other than the parameter's are fine
// (converted on load); integer ones are not; int8 (quantized) parameters take
// bfloat16, float16 or float32. `presliced`: the tensor is the rank's slice.
// `name`: the tensor's, where the placement carries none (a plan's, but rank
// 0's: ShardingRules::place without names).
std::string checkpoint_tensor_problem(const ShardingRules& rules, int tp_rank,
                                      const Placement& placement,
                                      const std::vector<std::int64_t>& shape, DType dtype,
                                      bool presliced, const std::string& name = "");
// The dtype a checkpoint tensor for parameter `slot` is said to be expected in:
// the parameter's (GLM-4.5's router float32 in a bfloat16 model), or for an int8
// (quantized) parameter the model's.
DType checkpoint_dtype(const ShardingRules& rules, ParamSlot slot);
// The same for a kernel-format tensor named as the model names its parameter
// (".base_layer." accepted): its exact shape; int8 stays int8.
std::string kernel_tensor_problem(const ShardingRules& rules, int tp_rank, const std::string& name,
                                  const std::vector<std::int64_t>& shape, DType dtype);

}  // namespace tpreload
