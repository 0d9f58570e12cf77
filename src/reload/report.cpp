#include "tpreload/reload/report.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "tpreload/comm/agreement.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/core/fnv.h"

namespace tpreload {

std::vector<ParamFingerprint> gather_fingerprints(ReloadTarget& model, Communicator& world,
                                                  std::chrono::milliseconds device_timeout) {
  auto params = model.stored_parameters();
  std::sort(params.begin(), params.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  // The CRCs are summed slot by slot: every rank must list the same names.
  std::uint64_t names = kFnvOffsetBasis;
  for (const auto& p : params) names = fnv1a(p.name + '\n', names);
  std::int64_t lo = static_cast<std::int64_t>(names >> 1), hi = lo;
  world.allreduce_ints(&lo, 1, IntOp::kMin);
  world.allreduce_ints(&hi, 1, IntOp::kMax);
  if (lo != hi)
    raise<Agreed<UsageError>>("the ranks hold differently named parameters (this rank ",
                              world.rank(), ": ", params.size(),
                              "), so their fingerprints cannot be gathered");
  const int n = world.size();
  std::vector<std::int64_t> crcs(params.size() * n, 0);
  std::vector<ParamFingerprint> out;
  std::optional<std::string> problem;  // reading back can fail on one rank (a stuck device)
  try {
    for (std::size_t i = 0; i < params.size(); ++i) {
      // Read where they live (device memory in bounded chunks).
      const auto& p = params[i];
      crcs[i * n + world.rank()] = static_cast<std::int64_t>(
          model.sink().crc32(p.storage.data, p.storage.bytes, "'" + p.name + "'",
                             std::uint64_t{16} << 20, device_timeout));
      out.push_back({p.name, p.shape, p.dtype, {}});
    }
  } catch (const std::exception& e) {
    problem = e.what();
  }
  agree_on_problem<CommError>(world, problem, "reading the parameters back for their fingerprints");
  allreduce_ints(world, crcs, IntOp::kSum);
  for (std::size_t k = 0; k < out.size(); ++k)
    for (int r = 0; r < n; ++r)
      out[k].crc32_by_rank.push_back(static_cast<std::uint32_t>(crcs[k * n + r]));
  return out;
}

std::string model_fingerprint(const std::vector<ParamFingerprint>& fingerprints) {
  std::uint64_t h = kFnvOffsetBasis;
  const std::size_t ranks = fingerprints.empty() ? 0 : fingerprints.front().crc32_by_rank.size();
  for (std::size_t r = 0; r < ranks; ++r)
    for (const auto& f : fingerprints) {
      h = fnv1a(f.name, h);
      const std::uint32_t crc = f.crc32_by_rank.at(r);
      const unsigned char le[4] = {
          static_cast<unsigned char>(crc), static_cast<unsigned char>(crc >> 8),
          static_cast<unsigned char>(crc >> 16), static_cast<unsigned char>(crc >> 24)};
      h = fnv1a_bytes(le, sizeof le, h);
    }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

std::string report_json(const ReloadResult& r, const ReportContext& ctx,
                        const std::vector<ParamFingerprint>& fingerprints) {
  using nlohmann::json;
  json some = json::object();
  for (const auto& [name, ranks] : r.not_loaded_on_some_ranks) some[name] = ranks;
  json ranks = json::array();
  for (int w = 0; w < ctx.world_size; ++w) {
    json params = json::object();
    for (const auto& f : fingerprints)
      params[f.name] = {
          {"shape", f.shape}, {"dtype", dtype_name(f.dtype)}, {"crc32", f.crc32_by_rank.at(w)}};
    ranks.push_back({{"rank", w}, {"tp_rank", w % ctx.tp_size}, {"params", params}});
  }
  json doc = {
      {"world_size", ctx.world_size},
      {"tp_size", ctx.tp_size},
      {"format", format_name(r.format)},
      {"transport", r.transport.empty() ? ctx.transport : r.transport},
      {"distribution", distribution_name(r.distribution)},
      {"readers", readers_name(r.readers)},
      {"rotated_broadcast_roots", r.rotated_broadcast_roots},
      {"atomic", r.atomic},
      {"pipeline_depth", r.pipeline_depth},
      {"nodes_served", r.nodes_served},
      {"source", r.source},
      {"bytes_read", r.bytes_read},
      {"bytes_transferred", r.bytes_transferred},
      {"bytes_copied_on_reader", r.bytes_copied_on_reader},
      {"buckets", r.buckets},
      {"seconds",
       {{"total", r.seconds.total},
        {"read", r.seconds.read},
        {"transfer", r.seconds.transfer},
        {"apply", r.seconds.apply},
        {"finish", r.seconds.finish},
        {"validate", r.seconds.validate},
        {"checksum", r.seconds.checksum},
        {"prepare", r.seconds.prepare}}},
      {"peak_staging_bytes", r.peak_staging_bytes},
      {"processing_staging_bytes", r.processing_staging_bytes},
      {"staging_bytes",
       {{"host", r.staging.host}, {"pinned_host", r.staging.pinned}, {"device", r.staging.device}}},
      {"parameter_memory", r.parameter_memory},
      {"skipped", r.skipped},
      {"not_loaded", {{"on_all_ranks", r.not_loaded_on_all_ranks}, {"on_some_ranks", some}}},
      {"fingerprint", model_fingerprint(fingerprints)},
      {"ranks", ranks}};
  if (!r.bytes_sent_by_rank.empty()) {  // sharded sources: point to point, per rank
    doc["bytes_sent_by_rank"] = r.bytes_sent_by_rank;
    doc["bytes_received_by_rank"] = r.bytes_received_by_rank;
  }
  if (!r.error.empty()) {  // a failed reload: what happened, what may have changed
    doc["error"] = r.error;
    doc["possibly_changed"] = r.possibly_mixed;
  }
  // Paths and errors may hold bytes that are not UTF-8 (a file name): replaced
  // with U+FFFD, as JSON must be UTF-8, instead of failing the report.
  return doc.dump(2, ' ', false, json::error_handler_t::replace);
}

std::string summary_text(const ReloadResult& r) {
  std::ostringstream out;
  // Every rank reading: nothing is transferred; the busiest rank's read share.
  const double gb =
      static_cast<double>(r.readers == Readers::kAll ? r.bytes_read : r.bytes_transferred) / 1e9;
  out.setf(std::ios::fixed);
  out.precision(3);
  out << "reloaded " << r.loaded.size() << " parameters from " << r.source << " ("
      << format_name(r.format) << " format, " << distribution_name(r.distribution) << ", "
      << (r.readers == Readers::kAll ? "every rank reading, "
          : r.readers == Readers::kNode
              ? detail::concat(
                    "a reader per node, ",
                    r.nodes_served > 0
                        ? detail::concat(r.nodes_served,
                                         " node(s) that cannot read served by another's, ")
                        : std::string(),
                    r.rotated_broadcast_roots ? "broadcast roots rotated, " : "")
              : "")
      << r.buckets << (r.buckets == 1 ? " bucket)\n" : " buckets)\n") << "  bytes read "
      << r.bytes_read << ", transferred " << r.bytes_transferred << " ("
      << (r.seconds.total > 0 ? gb / r.seconds.total : 0.0)
      << (r.readers == Readers::kAll ? " GB/s read by the busiest rank) over "
                                     : " GB/s end to end) over ")
      << (r.transport.empty() ? "?" : r.transport) << " into "
      << (r.parameter_memory.empty() ? "?" : r.parameter_memory) << " memory\n  peak staging "
      << r.peak_staging_bytes << " bytes per rank (host " << r.staging.host << ", pinned "
      << r.staging.pinned << ", device " << r.staging.device << ")"
      << (r.processing_staging_bytes
              ? ", FP8 processing " + std::to_string(r.processing_staging_bytes) + " bytes"
              : std::string())
      << ", "
      << (r.pipeline_depth > 0
              ? "pipeline depth " + std::to_string(r.pipeline_depth) + " on this rank"
              : std::string("no pipeline on this rank (no bucket buffers: each write read from the "
                            "source for its parameter)"))
      << "\n"
      << "  seconds: total " << r.seconds.total << ", prepare " << r.seconds.prepare << ", read "
      << r.seconds.read << ", transfer " << r.seconds.transfer << ", apply " << r.seconds.apply
      << ", finish " << r.seconds.finish << ", validate " << r.seconds.validate << " (checksums "
      << r.seconds.checksum << ")\n";
  if (!r.bytes_sent_by_rank.empty()) {  // sharded sources
    auto most_and_mean = [](const std::vector<std::uint64_t>& v) {
      std::uint64_t most = 0, sum = 0;
      for (std::uint64_t b : v) most = std::max(most, b), sum += b;
      return detail::concat(most, " most, ", v.empty() ? 0 : sum / v.size(), " mean");
    };
    out << "  point to point: sent " << most_and_mean(r.bytes_sent_by_rank) << ", received "
        << most_and_mean(r.bytes_received_by_rank) << " bytes per rank\n";
  }
  if (!r.skipped.empty()) {
    out << "  " << r.skipped.size() << " source tensors have no parameter (skipped):";
    for (const auto& n : r.skipped) out << " " << n;
    out << "\n";
  }
  if (r.complete()) {
    out << "  every expected parameter loaded on every rank\n";
  } else {
    for (const auto& n : r.not_loaded_on_all_ranks)
      out << "  NOT LOADED on any rank: " << n << "\n";
    for (const auto& [n, ranks] : r.not_loaded_on_some_ranks) {
      out << "  NOT LOADED on ranks";
      for (int k : ranks) out << " " << k;
      out << ": " << n << "\n";
    }
  }
  return out.str();
}

}  // namespace tpreload
