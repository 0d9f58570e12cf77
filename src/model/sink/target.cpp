#include "tpreload/model/target.h"

#include <sstream>

#include "tpreload/core/error.h"

namespace tpreload {
namespace {

// "" when `from` may land in a parameter of `to`, else why not.
// `quantized`: checkpoint rows quantized on load (ParamSpec::quantized_on_load).
std::string dtype_problem(const std::string& who, DType from, DType to, bool quantized) {
  if (convertible(from, to, quantized)) return "";
  if (quantized)
    return detail::concat(who, ": ", dtype_name(to),
                          " quantization takes bfloat16, float16 or float32 weights, got ",
                          dtype_name(from));
  return detail::concat(
      who, ": ", dtype_name(from), " values are not converted to ", dtype_name(to),
      dtype_is_float8(from)
          ? " (FP8 values land only in FP8 parameters, beside their scales: a checkpoint "
            "whose config.json has an fp8 quantization_config)"
          : " (only floating dtypes are converted; integer and other dtypes must match)");
}

}  // namespace

DType checkpoint_dtype(const ShardingRules& rules, ParamSlot slot) {
  const ParamSpec& param = rules.params().at(slot);
  return param.quantized_on_load() ? rules.config().dtype : param.dtype;
}

std::vector<ReloadTarget::Stored> ReloadTarget::stored_parameters() const {
  std::vector<Stored> out;
  const auto& params = rules().params();
  for (ParamSlot s = 0; s < params.size(); ++s)
    out.push_back({params[s].name, params[s].shape, params[s].dtype, sink().storage(s)});
  return out;
}

std::string checkpoint_tensor_problem(const ShardingRules& rules, int tp_rank, const Placement& pl,
                                      const std::vector<std::int64_t>& shape, DType dtype,
                                      bool presliced, const std::string& name) {
  const std::vector<std::int64_t> want = presliced ? pl.slice_shape() : pl.source_shape;
  const ParamSpec& param = rules.params().at(pl.slot);
  // (named only where there is a problem: a plan checks every tensor)
  const bool fits =
      pl.held && shape == want && convertible(dtype, param.dtype, param.quantized_on_load());
  if (fits) return "";
  const std::string who = detail::concat(
      "tensor '", pl.checkpoint_name.empty() ? name : pl.checkpoint_name, "' for parameter '",
      param.name, "' on tp rank ", tp_rank, "/", rules.tp_size());
  if (!pl.held) return who + ": not held by this rank (another rank holds this expert)";
  if (shape != want)
    return detail::concat(who, ": expected ", presliced ? "slice " : "", shape_string(want), " ",
                          dtype_name(checkpoint_dtype(rules, pl.slot)), ", got ",
                          shape_string(shape), " ", dtype_name(dtype));
  return dtype_problem(who, dtype, param.dtype, param.quantized_on_load());
}

std::string kernel_tensor_problem(const ShardingRules& rules, int tp_rank, const std::string& name,
                                  const std::vector<std::int64_t>& shape, DType dtype) {
  const std::string who = detail::concat("kernel-format tensor '", name, "' on tp rank ", tp_rank,
                                         "/", rules.tp_size());
  const ParamSlot slot = rules.find_slot(name);
  if (slot == kNoSlot) return who + " has no parameter";
  const ParamSpec& spec = rules.params()[slot];
  if (spec.shape != shape)
    return detail::concat(who, ": expected ", shape_string(spec.shape), " ", dtype_name(spec.dtype),
                          ", got ", shape_string(shape), " ", dtype_name(dtype));
  // Kernel format is processed already: an int8 weight stays int8.
  if (spec.dtype == DType::kInt8 || dtype == DType::kInt8)
    return dtype == spec.dtype ? ""
                               : detail::concat(who, ": expected ", dtype_name(spec.dtype),
                                                " weights, got ", dtype_name(dtype));
  return dtype_problem(who, dtype, spec.dtype, false);
}

}  // namespace tpreload
