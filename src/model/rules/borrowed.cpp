#include "tpreload/model/borrowed.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "tpreload/core/error.h"

namespace tpreload {
namespace {

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

bool contiguous(const BorrowedTensor& t) {
  if (t.strides.size() != t.shape.size()) return false;
  std::int64_t expect = 1;
  for (std::size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] != 1 && t.strides[d] != expect) return false;
    expect *= t.shape[d];
  }
  return true;
}

// The caller's tensor for a parameter, by the rules' name or its LoRA spelling.
const BorrowedTensor* lookup(const std::map<std::string, const BorrowedTensor*>& by_name,
                             const std::string& name, bool lora) {
  auto it = by_name.find(name);
  if (it == by_name.end() && lora) it = by_name.find(with_base_layer(name));
  return it == by_name.end() ? nullptr : it->second;
}

}  // namespace

std::vector<std::string> borrowed_problems(const ShardingRules& rules, const BorrowedOptions& o,
                                           const std::vector<BorrowedTensor>& tensors) {
  std::vector<std::string> problems;
  std::map<std::string, const BorrowedTensor*> by_name;
  for (const auto& t : tensors)
    if (!by_name.emplace(t.name, &t).second)
      problems.push_back("parameter '" + t.name + "' is given twice");
  std::string device;
  for (const ParamSpec& spec : rules.params()) {
    const BorrowedTensor* t = lookup(by_name, spec.name, o.lora);
    if (!t) {
      problems.push_back(detail::concat("missing parameter '", spec.name, "' (",
                                        shape_str(spec.shape), " ", dtype_name(spec.dtype), ")"));
      continue;
    }
    if (t->shape != spec.shape || t->dtype != spec.dtype)
      problems.push_back(detail::concat("parameter '", t->name, "': expected ",
                                        shape_str(spec.shape), " ", dtype_name(spec.dtype),
                                        ", got ", shape_str(t->shape), " ", dtype_name(t->dtype)));
    else if (!contiguous(*t))
      problems.push_back(detail::concat("parameter '", t->name, "' is not contiguous (strides ",
                                        shape_str(t->strides),
                                        "); in-place writes need row-major storage"));
    if (device.empty()) device = t->device;
    if (t->device != device)
      problems.push_back(detail::concat("parameter '", t->name, "' is on ", t->device,
                                        ", the others on ", device));
  }
  return problems;
}

BorrowedTarget::BorrowedTarget(ModelConfig config, BorrowedOptions options,
                               std::vector<BorrowedTensor> tensors, std::shared_ptr<Device> device)
    : rules_(std::move(config), options.tp_size, options.quantization, options.expert_parallel),
      options_(options) {
  if (options_.tp_rank < 0 || options_.tp_rank >= options_.tp_size)
    raise<UsageError>("tp rank ", options_.tp_rank, " is outside [0, ", options_.tp_size, ")");
  const auto problems = borrowed_problems(rules_, options_, tensors);
  if (!problems.empty()) {
    std::string text;
    for (const auto& p : problems) text += "\n  " + p;
    raise<ValidationError>(problems.size(), " problem", problems.size() > 1 ? "s" : "",
                           " with the parameters of tp rank ", options_.tp_rank, "/",
                           options_.tp_size, ":", text);
  }
  std::map<std::string, const BorrowedTensor*> by_name;
  for (const auto& t : tensors) by_name.emplace(t.name, &t);
  std::vector<ParamStorage> storage;
  for (const ParamSpec& spec : rules_.params()) {
    const BorrowedTensor* t = lookup(by_name, spec.name, options_.lora);
    tensors_.push_back(*t);
    std::uint64_t bytes = dtype_size(spec.dtype);
    for (auto d : spec.shape) bytes *= static_cast<std::uint64_t>(d);
    storage.push_back({t->data, bytes});
  }
  sink_ = std::make_unique<ParameterSink>(rules_, std::move(storage), std::move(device));
}

std::vector<ReloadTarget::Stored> BorrowedTarget::stored_parameters() const {
  std::vector<Stored> out;
  for (ParamSlot s = 0; s < tensors_.size(); ++s)
    out.push_back({tensors_[s].name, tensors_[s].shape, tensors_[s].dtype, sink_->storage(s)});
  std::sort(out.begin(), out.end(),
            [](const Stored& a, const Stored& b) { return a.name < b.name; });
  return out;
}

}  // namespace tpreload
