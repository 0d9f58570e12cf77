#include "tpreload/model/borrowed.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload {
namespace {

// A tensor of `given` holds a parameter of `want`: the same dtype, or uint8
// bytes for an FP8 one (a torch without float8 types holds FP8 as uint8).
bool same_dtype(DType given, DType want) {
  return given == want || (given == DType::kUInt8 && dtype_is_float8(want));
}

// N of "cuda:N".
std::optional<int> cuda_ordinal(const std::string& device) {
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5 || device.size() > 11)
    return std::nullopt;
  for (std::size_t i = 5; i < device.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(device[i]))) return std::nullopt;
  return std::stoi(device.substr(5));
}

// The caller's tensor for a parameter, by the rules' name, its LoRA spelling,
// or its RoutedExperts spelling.
const BorrowedTensor* lookup(const std::map<std::string, const BorrowedTensor*>& by_name,
                             const std::string& name, bool lora) {
  auto it = by_name.find(name);
  if (it == by_name.end() && lora) it = by_name.find(with_base_layer(name));
  if (const std::string routed = with_routed_experts(name); it == by_name.end() && !routed.empty())
    it = by_name.find(routed);
  return it == by_name.end() ? nullptr : it->second;
}

// Why a derived parameter (computed from `from`, quantized or not) must be
// given, contiguous, or may be left to the model.
std::string derived_note(const std::string& from, bool quantized) {
  if (quantized)
    return detail::concat("; it is computed from the quantized '", from,
                          "' after each reload, into a tensor of its own that the reload must "
                          "rewrite in place: give it, contiguous");
  return detail::concat("; it is computed from '", from,
                        "' after each reload: give it, contiguous, or, where the model holds "
                        "every such parameter as a view of its weight (which the reload writes), "
                        "set derived_views");
}

}  // namespace

bool is_contiguous(const BorrowedTensor& t) {
  if (t.strides.size() != t.shape.size()) return false;
  std::int64_t expect = 1;
  for (std::size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] != 1 && t.strides[d] != expect) return false;
    expect *= t.shape[d];
  }
  return true;
}

std::vector<std::string> borrowed_problems(const ShardingRules& rules, const BorrowedOptions& o,
                                           const std::vector<BorrowedTensor>& tensors) {
  std::vector<std::string> problems;
  std::map<std::string, const BorrowedTensor*> by_name;
  std::set<std::string> twice;
  for (const auto& t : tensors)
    if (!by_name.emplace(t.name, &t).second) twice.insert(t.name);
  std::map<std::string, std::vector<std::string>> by_device;  // device -> parameters
  std::map<ParamSlot, std::string> notes;                     // (the derived parameters')
  for (const DerivedStep& d : rules.derived_steps())
    notes[d.out] =
        derived_note(rules.params()[d.from].name, d.window.scale_kind != HeadRows::Scale::kNone);
  // (derived from quantized weights: one line for all, naming the first)
  const ShardingRules::LeftOut* quantized = nullptr;
  std::size_t n_quantized = 0;
  for (const ShardingRules::LeftOut& d : rules.derived_left_out()) {
    if (d.quantized && n_quantized++ == 0) quantized = &d;
    if (!d.quantized && lookup(by_name, d.name, o.lora))
      problems.push_back(detail::concat("parameter '", d.name,
                                        "' is given, but derived_views leaves it to the model"));
  }
  if (quantized) {
    const ParamSpec* from = rules.find_param(quantized->from);
    problems.push_back(detail::concat(
        "derived_views: ", n_quantized, " derived parameter", n_quantized > 1 ? "s" : "", " ('",
        quantized->name, "'", n_quantized > 1 ? ", ..." : "", ") ", n_quantized > 1 ? "are" : "is",
        " computed from the quantized '", quantized->from, "' (",
        from ? dtype_name(from->dtype) : std::string_view("?"),
        ") into a tensor of the model's own, which only the reload rewrites; give ",
        n_quantized > 1 ? "them" : "it", " instead"));
  }
  for (ParamSlot slot = 0; slot < rules.params().size(); ++slot) {
    const ParamSpec& spec = rules.params()[slot];
    const auto noted = notes.find(slot);
    const std::string note = noted == notes.end() ? std::string() : noted->second;
    const BorrowedTensor* t = lookup(by_name, spec.name, o.lora);
    if (!t) {
      problems.push_back(detail::concat("missing parameter '", spec.name, "' (",
                                        shape_string(spec.shape), " ", dtype_name(spec.dtype), ")",
                                        note));
      continue;
    }
    if (twice.count(t->name)) problems.push_back("parameter '" + t->name + "' is given twice");
    const std::string dtype =
        t->unknown_dtype.empty() ? std::string(dtype_name(t->dtype)) : t->unknown_dtype;
    if (t->shape != spec.shape || !t->unknown_dtype.empty() || !same_dtype(t->dtype, spec.dtype))
      problems.push_back(detail::concat("parameter '", t->name, "': expected ",
                                        shape_string(spec.shape), " ", dtype_name(spec.dtype),
                                        ", got ", shape_string(t->shape), " ", dtype));
    else if (!is_contiguous(*t))
      problems.push_back(detail::concat("parameter '", t->name, "' is not contiguous (strides ",
                                        shape_string(t->strides),
                                        "); in-place writes need row-major storage", note));
    if (!cuda_ordinal(t->device) && t->device != "cpu")
      problems.push_back(detail::concat("parameter '", t->name, "' is on ", t->device,
                                        "; tpreload writes host (cpu) and cuda memory"));
    else
      by_device[t->device].push_back(t->name);
  }
  if (by_device.size() > 1) {  // one line: which device holds which (a few names each)
    std::string text = "the parameters are on several devices:";
    for (const auto& [device, names] : by_device) {
      text += (text.back() == ':' ? " " : ", ") + device + " (";
      if (names.size() > 3) {
        text += std::to_string(names.size()) + " parameters)";
        continue;
      }
      for (std::size_t i = 0; i < names.size(); ++i) text += (i ? ", '" : "'") + names[i] + "'";
      text += ")";
    }
    problems.push_back(text + "; they must all be on one");
  }
  return problems;
}

BorrowedTarget::BorrowedTarget(ModelConfig config, BorrowedOptions options,
                               std::vector<BorrowedTensor> tensors)
    : rules_(std::move(config), options.tp_size, options.quantization, options.expert_parallel,
             !options.derived_views),
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
  if (!rules_.derived_left_out().empty())
    log().debug("tp rank {}: {} derived parameters left to the model (derived_views)",
                options_.tp_rank, rules_.derived_left_out().size());
  std::map<std::string, const BorrowedTensor*> by_name;
  for (const auto& t : tensors) by_name.emplace(t.name, &t);
  for (const ParamSpec& spec : rules_.params()) {
    tensors_.push_back(*lookup(by_name, spec.name, options_.lora));
    tensors_.back().dtype = spec.dtype;  // (uint8 bytes of an FP8 parameter: that FP8 dtype)
  }
  if (!tensors_.empty()) device_name_ = tensors_.front().device;
}

void BorrowedTarget::attach(std::shared_ptr<Device> device) {
  const std::string given = device ? "cuda:" + std::to_string(device->ordinal()) : "cpu";
  if (given != device_name_)
    raise<ValidationError>("the parameters of tp rank ", options_.tp_rank, " are on ", device_name_,
                           " but the data plane writes ", given);
  std::vector<ParamStorage> storage;
  for (const auto& t : tensors_) {
    std::uint64_t bytes = dtype_size(t.dtype);
    for (auto d : t.shape) bytes *= static_cast<std::uint64_t>(d);
    storage.push_back({t.data, bytes});
  }
  sink_ = std::make_unique<ParameterSink>(rules_, std::move(storage), std::move(device));
}

ParameterSink& BorrowedTarget::sink() {
  if (!sink_) raise<UsageError>("BorrowedTarget::sink() before attach()");
  return *sink_;
}

std::vector<ReloadTarget::Stored> BorrowedTarget::stored_parameters() const {
  if (!sink_) raise<UsageError>("BorrowedTarget::stored_parameters() before attach()");
  std::vector<Stored> out;
  for (ParamSlot s = 0; s < tensors_.size(); ++s)
    out.push_back({tensors_[s].name, tensors_[s].shape, tensors_[s].dtype, sink_->storage(s)});
  return out;
}

}  // namespace tpreload
