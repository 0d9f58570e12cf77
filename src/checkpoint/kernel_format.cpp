// Kernel-format shards (see kernel_format.h).
#include "tpreload/checkpoint/kernel_format.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "../core/json_depth.h"
#include "file_util.h"
#include "safetensors_source.h"
#include "tpreload/core/error.h"
#include "tpreload/core/quantization.h"
#include "writer_util.h"

namespace tpreload {
namespace {

using nlohmann::json;

template <typename... Args>
[[noreturn]] void info_fail(const std::string& file, Args&&... args) {
  raise<CheckpointError>("kernel format '", file, "': ", std::forward<Args>(args)...);
}

json parse_info_json(const std::string& file) {
  if (!detail::is_regular_file(file)) info_fail(file, "no such file");
  if (detail::file_size(file) > 100'000'000) info_fail(file, "file exceeds 100000000 bytes");
  try {
    json j = detail::parse_json(detail::read_text_file(file));
    if (!j.is_object()) info_fail(file, "not a JSON object");
    return j;
  } catch (const json::exception& e) {
    info_fail(file, "not valid JSON: ", e.what());
  }
}

void check_header_fields(const json& j, const std::string& file) {
  const std::string format =
      j.contains("format") && j["format"].is_string() ? j["format"].get<std::string>() : "";
  if (format != kKernelFormatName)
    info_fail(file, "'format' is ", j.value("format", json()).dump(), ", expected \"",
              kKernelFormatName, "\"");
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<std::int64_t>() != kKernelFormatVersion)
    info_fail(file, "'version' ", j.value("version", json()).dump(), " is not supported (expected ",
              kKernelFormatVersion, ")");
}

KernelFormatInfo info_from_json(const json& j, const std::string& file) {
  check_header_fields(j, file);
  KernelFormatInfo info;
  if (!j.contains("tp_size") || !j["tp_size"].is_number_integer() ||
      j["tp_size"].get<std::int64_t>() < 1 || j["tp_size"].get<std::int64_t>() > 99999)
    info_fail(file, "'tp_size' ", j.value("tp_size", json()).dump(),
              " is not an integer in [1, 99999]");
  info.tp_size = j["tp_size"].get<int>();
  const auto dtype = j.contains("dtype") && j["dtype"].is_string()
                         ? dtype_from_name(j["dtype"].get<std::string>())
                         : std::nullopt;
  if (!dtype) info_fail(file, "'dtype' ", j.value("dtype", json()).dump(), " is not a known dtype");
  info.dtype = *dtype;
  const json q = j.value("quantization", json());
  if (!q.is_null() &&
      !(q.is_string() && !q.get<std::string>().empty() && known_quantization(q.get<std::string>())))
    info_fail(file, "'quantization' ", q.dump(), " is not null, ", quantization_list());
  info.quantization = q.is_null() ? "" : q.get<std::string>();
  const json ep = j.value("expert_parallel", json(false));
  if (!ep.is_boolean()) info_fail(file, "'expert_parallel' ", ep.dump(), " is not true or false");
  info.expert_parallel = ep.get<bool>();
  if (!j.contains("config") || !j["config"].is_object())
    info_fail(file, "'config' is missing or not an object");
  info.config_json = j["config"].dump(2);
  return info;
}

void check_rank_files(const std::string& dir, const std::string& file, int tp_size) {
  std::set<std::string> expected;
  for (int r = 0; r < tp_size; ++r) {
    expected.insert(kernel_format_shard_name(r, tp_size));
    if (!detail::is_regular_file(detail::join_path(dir, kernel_format_shard_name(r, tp_size))))
      info_fail(file, "rank ", r, " file '", kernel_format_shard_name(r, tp_size),
                "' is missing (tp_size ", tp_size, ")");
  }
  for (const auto& name : detail::list_files(dir, ".safetensors"))
    if (expected.count(name) == 0)
      info_fail(file, "unexpected file '", name, "' in the directory (tp_size ", tp_size, ")");
}

}  // namespace

std::string kernel_format_shard_name(int rank, int tp_size) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank-%05d-of-%05d.safetensors", rank, tp_size);
  return name;
}

std::string kernel_format_json(const KernelFormatInfo& info) {
  json config;
  try {
    config = detail::parse_json(info.config_json);
  } catch (const json::exception& e) {
    raise<UsageError>("kernel format: config_json is not valid JSON: ", e.what());
  }
  if (!config.is_object()) raise<UsageError>("kernel format: config_json is not a JSON object");
  if (info.tp_size < 1) raise<UsageError>("kernel format: tp_size ", info.tp_size, " < 1");
  if (!known_quantization(info.quantization))
    raise<UsageError>("kernel format: quantization '", info.quantization, "' is not '', ",
                      quantization_list());
  nlohmann::ordered_json j = {
      {"format", kKernelFormatName}, {"version", kKernelFormatVersion},
      {"tp_size", info.tp_size},     {"dtype", std::string(dtype_name(info.dtype))},
      {"quantization", nullptr},     {"config", config}};
  if (!info.quantization.empty()) j["quantization"] = info.quantization;
  if (info.expert_parallel) j["expert_parallel"] = true;
  return j.dump(2) + "\n";
}

KernelFormatInfo read_kernel_format_info(const std::string& dir) {
  const std::string file = detail::join_path(dir, kKernelFormatFile);
  return info_from_json(parse_info_json(file), file);
}

std::unique_ptr<WeightSource> open_kernel_format(const std::string& dir,
                                                 std::shared_ptr<const KnownListing> known) {
  const KernelFormatInfo info = read_kernel_format_info(dir);
  const std::string file = detail::join_path(dir, kKernelFormatFile);
  check_rank_files(dir, file, info.tp_size);
  std::vector<detail::SafetensorsShard> shards;
  for (int r = 0; r < info.tp_size; ++r)
    shards.push_back({detail::join_path(dir, kernel_format_shard_name(r, info.tp_size)), r});
  return detail::make_safetensors_source(
      shards,
      {detail::concat("kernel format '", dir, "' (tp_size ", info.tp_size, ", ",
                      dtype_name(info.dtype),
                      info.quantization.empty() ? "" : ", " + info.quantization,
                      info.expert_parallel ? ", expert parallel" : "", ")"),
       {},
       info},
      known);
}

void write_kernel_format(const std::string& dir, const KernelFormatInfo& info,
                         const std::vector<std::vector<TensorSpec>>& per_rank,
                         const RankFillFn& fill) {
  const std::string text = kernel_format_json(info);
  if (per_rank.size() != static_cast<std::size_t>(info.tp_size))
    raise<UsageError>("writing kernel format '", dir, "': ", per_rank.size(),
                      " rank tensor lists for tp_size ", info.tp_size);
  detail::make_directories(dir);
  for (int r = 0; r < info.tp_size; ++r) {
    const Metadata metadata = {{"format", kKernelFormatName},
                               {"tp_rank", std::to_string(r)},
                               {"tp_size", std::to_string(info.tp_size)}};
    write_safetensors(
        detail::join_path(dir, kernel_format_shard_name(r, info.tp_size)), per_rank[r],
        [&](std::size_t i, MutableBytes dst) { fill(r, i, dst); }, metadata);
  }
  detail::AtomicFile out(detail::join_path(dir, kKernelFormatFile));
  out.write(text.data(), text.size());
  out.commit();
}

void write_kernel_format(const std::string& dir, const KernelFormatInfo& info,
                         const std::vector<std::vector<InMemoryTensor>>& per_rank) {
  std::vector<std::vector<TensorSpec>> specs;
  std::vector<FillFn> fills;
  for (const auto& rank : per_rank) {
    specs.push_back(detail::specs_from_memory(rank));
    fills.push_back(detail::fill_from_memory(rank));
  }
  write_kernel_format(dir, info, specs,
                      [&](int r, std::size_t i, MutableBytes dst) { fills[r](i, dst); });
}

}  // namespace tpreload
