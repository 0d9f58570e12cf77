#include "tpreload/reload/plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "tpreload/core/error.h"

namespace tpreload {
namespace {

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) {
  return (v + a - 1) / a * a;
}
constexpr std::uint64_t kRegionAlignment = 8;  // the largest element size

// Per-tensor decisions: which tensors move, how, and to whom.
void plan_tensors(const SourceMetadata& md, const ShardingRules& rules, const PlanOptions& o,
                  Plan& plan) {
  const bool scatter = o.distribution == Distribution::kScatter;
  for (std::size_t i = 0; i < md.tensors.size(); ++i) {
    const TensorInfo& info = md.tensors[i];
    PlannedTensor t;
    t.index = i;
    t.rows = shape_rows(info.shape);
    if (o.format == WeightFormat::kKernel) {
      const ParamSlot slot = rules.find_slot(info.name);
      if (slot == kNoSlot || info.tp_rank < 0 || info.tp_rank >= o.tp_size) {
        plan.skipped.push_back(info.name);
        continue;
      }
      t.format = WeightFormat::kKernel;
      t.owner_tp_rank = info.tp_rank;
      t.slot = slot;
      t.scatter = scatter;
      t.layer = layer_of(info.name);
      t.rejected = info.shape != rules.params()[slot].shape;
    } else {
      bool sliced = false, everywhere = true;
      t.placements.reserve(static_cast<std::size_t>(o.tp_size));
      for (int r = 0; r < o.tp_size; ++r) {
        auto pl = rules.place(info.name, r, nullptr, /*names=*/r == 0);
        if (!pl) break;
        sliced = sliced || pl->source_dim >= 0;
        everywhere = everywhere && pl->held;
        t.placements.push_back(std::move(*pl));
      }
      if (t.placements.empty()) {
        plan.skipped.push_back(info.name);
        continue;
      }
      t.layer = layer_of(t.placements[0].param);
      // Replicated tensors are broadcast, except small ones when scattering (see
      // PlanOptions::scatter_replicated_bytes); a tensor that some ranks do not
      // hold (an expert under expert parallelism) is always scattered, so that it
      // never reaches them.
      const bool small =
          o.scatter_replicated_bytes > 0 &&
          info.nbytes * static_cast<std::uint64_t>(o.world_size) <= o.scatter_replicated_bytes;
      t.scatter = (scatter && (sliced || small)) || !everywhere;
      t.rejected = info.shape != t.placements[0].source_shape;
      if (t.scatter && !t.rejected) {
        t.rows = 0;
        for (int r = 0; r < o.tp_size; ++r) t.rows = std::max(t.rows, t.rows_for(r));
      }
    }
    plan.tensors.push_back(std::move(t));
  }
  // Broadcast tensors first, then scattered ones, each in file order: broadcast
  // buckets are then contiguous runs of the mapped file (sent without a copy), and
  // the two kinds never alternate (which would cut buckets short: one collective
  // per norm weight). No per-layer grouping is needed: nothing is staged per layer
  // (int8 rows are quantized as they arrive); finish_layer() still runs after the
  // bucket holding a layer's last piece.
  std::stable_sort(plan.tensors.begin(), plan.tensors.end(),
                   [&md](const PlannedTensor& a, const PlannedTensor& b) {
                     if (a.scatter != b.scatter) return !a.scatter;
                     const TensorInfo& x = md.tensors[a.index];
                     const TensorInfo& y = md.tensors[b.index];
                     return std::tie(x.file, x.file_offset) < std::tie(y.file, y.file_offset);
                   });
}

// Bytes one row of `t` costs in a bucket (scatter: summed over receiving ranks).
std::uint64_t row_cost(const PlannedTensor& t, const TensorInfo& info, const PlanOptions& o) {
  if (!t.scatter) return shape_row_bytes(info.shape, info.dtype);
  std::uint64_t cost = 0;
  for (int w = 0; w < o.world_size; ++w) {
    const int tp = w % o.tp_size;
    if (t.rows_for(tp) > 0) cost += t.row_bytes_for(tp, info);
  }
  return cost;
}

// A scatter bucket gives each world rank one region: every piece starts at a
// multiple of its element size and every region at a multiple of 8, so that
// kernels reading elements in place (conversion, int8) never see a misaligned
// address when a checkpoint mixes dtypes.
//
// Grows each world rank's region by rows [a, b) of `t`; with `starts`, records
// where each rank's part of them starts.
void grow_regions(const PlannedTensor& t, const TensorInfo& info, std::int64_t a, std::int64_t b,
                  const PlanOptions& o, std::vector<std::uint64_t>& region,
                  std::vector<std::uint64_t>* starts = nullptr) {
  if (starts) starts->assign(o.world_size, 0);
  for (int w = 0; w < o.world_size; ++w) {
    const int tp = w % o.tp_size;
    const std::int64_t rows = std::max<std::int64_t>(0, std::min(b, t.rows_for(tp)) - a);
    if (rows > 0) region[w] = align_up(region[w], dtype_size(info.dtype));
    if (starts) (*starts)[w] = region[w];
    region[w] += static_cast<std::uint64_t>(rows) * t.row_bytes_for(tp, info);
  }
}

// The ranks' regions placed one after the other; returns the bucket's bytes.
std::uint64_t place_regions(const std::vector<std::uint64_t>& region,
                            std::vector<ByteRange>* ranges = nullptr) {
  std::uint64_t at = 0;
  for (std::size_t w = 0; w < region.size(); ++w) {
    at = align_up(at, kRegionAlignment);
    if (ranges) ranges->push_back({at, region[w]});
    at += region[w];
  }
  return at;
}

void layout_scatter(const Plan& plan, const SourceMetadata& md, const PlanOptions& o, Bucket& b) {
  std::vector<std::uint64_t> region(o.world_size, 0);
  for (Piece& p : b.pieces) {
    const PlannedTensor& t = plan.tensors[p.planned];
    grow_regions(t, md.tensors[t.index], p.row_begin, p.row_end, o, region, &p.rank_offset);
  }
  b.ranges.clear();
  b.bytes = place_regions(region, &b.ranges);
}

void close_bucket(Plan& plan, const SourceMetadata& md, const PlanOptions& o, Bucket& b) {
  if (b.pieces.empty()) return;
  if (b.scatter) layout_scatter(plan, md, o, b);
  plan.largest_bucket = std::max(plan.largest_bucket, b.bytes);
  plan.buckets.push_back(std::move(b));
  b = Bucket{};
}

// Buckets of at most o.bucket_bytes each, alignment padding included (a single
// row larger than that is a bucket of its own).
void plan_buckets(const SourceMetadata& md, const PlanOptions& o, Plan& plan) {
  Bucket open;
  std::vector<std::uint64_t> region(o.world_size, 0);  // scatter: the open bucket's regions
  std::vector<std::uint64_t> grown;                    // (scratch: regions with rows added)
  auto close = [&] {
    close_bucket(plan, md, o, open);
    region.assign(o.world_size, 0);
  };
  for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
    const PlannedTensor& t = plan.tensors[i];
    if (t.rejected) continue;
    if (!open.pieces.empty() && open.scatter != t.scatter) close();
    const TensorInfo& info = md.tensors[t.index];
    const std::uint64_t cost = std::max<std::uint64_t>(1, row_cost(t, info, o));
    std::int64_t row = 0;
    // The open bucket's bytes with rows [row, row + n) of `t` added.
    auto bytes_with = [&](std::int64_t n) {
      if (!t.scatter)  // broadcast pieces start at a multiple of their element size
        return align_up(open.bytes, dtype_size(info.dtype)) + static_cast<std::uint64_t>(n) * cost;
      grown = region;
      grow_regions(t, info, row, row + n, o, grown);
      return place_regions(grown);
    };
    do {
      if (!open.pieces.empty() && bytes_with(1) > o.bucket_bytes) close();
      open.scatter = t.scatter;
      const std::uint64_t used = bytes_with(0);
      // Clamped while unsigned (a bucket of 2^63 bytes or more must not wrap).
      std::uint64_t fit = std::min<std::uint64_t>(
          static_cast<std::uint64_t>(t.rows - row),
          std::max<std::uint64_t>(1, (o.bucket_bytes > used ? o.bucket_bytes - used : 0) / cost));
      // Padding the estimate did not count: fewer rows until they fit.
      for (std::uint64_t over;
           fit > 1 && (over = bytes_with(static_cast<std::int64_t>(fit))) > o.bucket_bytes;)
        fit -= std::min<std::uint64_t>(
            fit - 1, std::max<std::uint64_t>(1, (over - o.bucket_bytes + cost - 1) / cost));
      const std::int64_t end = row + static_cast<std::int64_t>(fit);
      if (!t.scatter) open.bytes = align_up(open.bytes, dtype_size(info.dtype));
      Piece piece{i, row, end, end == t.rows, open.bytes, {}};
      if (t.scatter) {
        grow_regions(t, info, row, end, o, region);
        open.bytes = place_regions(region);
      } else {
        open.bytes += fit * cost;
      }
      open.pieces.push_back(std::move(piece));
      row = end;
    } while (row < t.rows);
  }
  close();
}

void mark_finished_layers(Plan& plan) {
  std::map<std::int64_t, std::size_t> last;
  for (std::size_t b = 0; b < plan.buckets.size(); ++b)
    for (const Piece& p : plan.buckets[b].pieces) last[plan.tensors[p.planned].layer] = b;
  for (const auto& [layer, b] : last)
    if (layer >= 0) plan.buckets[b].finished_layers.push_back(layer);
}

}  // namespace

std::string_view distribution_name(Distribution d) {
  return d == Distribution::kBroadcast ? "broadcast" : "scatter";
}

std::int64_t PlannedTensor::rows_for(int tp_rank) const {
  if (!held_by(tp_rank)) return 0;
  if (kernel()) return rows;
  return placements[static_cast<std::size_t>(tp_rank)].slice_rows();
}

std::uint64_t PlannedTensor::row_bytes_for(int tp_rank, const TensorInfo& info) const {
  if (kernel()) return shape_row_bytes(info.shape, info.dtype);
  return placements.at(static_cast<std::size_t>(tp_rank)).slice_row_bytes(info.dtype);
}

namespace {

// A kernel-format source is the processed weights of one model: its
// kernel_format.json config and dtype must be the model's, or the bytes (same
// shapes or not) belong to another model.
void check_kernel_model(const SourceMetadata& md, const ShardingRules& rules) {
  const ModelConfig& model = rules.config();
  ModelConfig made_for;
  try {
    made_for = parse_model_config(md.kernel->config_json, "its kernel_format.json 'config'");
  } catch (const ModelError& e) {
    raise<ValidationError>("kernel-format source (", md.description, "): ", e.what());
  }
  std::vector<std::string> differences =
      config_differences(made_for, model, ConfigFields::kWeights);
  if (md.kernel->dtype != model.dtype)
    differences.push_back(
        detail::concat("dtype ", dtype_name(md.kernel->dtype), " vs ", dtype_name(model.dtype)));
  if (differences.empty()) return;
  std::string listed;
  for (const std::string& d : differences) listed += (listed.empty() ? "" : ", ") + d;
  raise<ValidationError>("kernel-format source (", md.description,
                         ") was made for another model (its kernel_format.json vs the model's "
                         "config): ",
                         listed, "; nothing was reloaded");
}

}  // namespace

void check_source_format(const SourceMetadata& md, const ShardingRules& rules,
                         WeightFormat format) {
  if (format == WeightFormat::kKernel) {
    if (!md.kernel)
      raise<ValidationError>("kernel-format reload from (", md.description,
                             "), which is a checkpoint-format source (no kernel_format.json): "
                             "reload it in checkpoint format");
    // "tp 2, quantization none, expert parallel"
    const auto layout = [](int tp, const std::string& quantization, bool expert_parallel) {
      return detail::concat("tp ", tp, ", quantization ",
                            quantization.empty() ? "none" : quantization,
                            expert_parallel ? ", expert parallel" : ", not expert parallel");
    };
    if (md.kernel->tp_size != rules.tp_size() || md.kernel->quantization != rules.quantization() ||
        md.kernel->expert_parallel != rules.expert_parallel())
      raise<ValidationError>(
          "kernel-format source (", md.description, ") was made for ",
          layout(md.kernel->tp_size, md.kernel->quantization, md.kernel->expert_parallel),
          "; the model is ", layout(rules.tp_size(), rules.quantization(), rules.expert_parallel()),
          " (kernel-format shards fit one layout: shard the checkpoint for this one, e.g. "
          "reload_ckpt shard IN OUT --tp ",
          rules.tp_size(), rules.quantization().empty() ? "" : " --quantization int8",
          rules.expert_parallel() ? " --expert-parallel" : "",
          ", or give the model the shards' layout); nothing was reloaded");
    check_kernel_model(md, rules);
  } else if (md.kernel) {
    raise<ValidationError>("checkpoint-format reload from (", md.description,
                           "), which holds kernel-format shards: reload it in kernel format "
                           "(reload_runner --kernel-format, ReloadOptions::format kKernel)");
  }
}

Plan make_plan(const SourceMetadata& md, const ShardingRules& rules, const PlanOptions& o) {
  if (o.tp_size < 1 || o.world_size < 1 || o.world_size % o.tp_size != 0)
    raise<UsageError>("world size ", o.world_size, " is not a multiple of tp size ", o.tp_size);
  if (o.tp_size != rules.tp_size())
    raise<UsageError>("plan tp size ", o.tp_size, " differs from the model's ", rules.tp_size());
  if (o.bucket_bytes == 0) raise<UsageError>("bucket size must be positive");
  check_source_format(md, rules, o.format);
  Plan plan;
  plan_tensors(md, rules, o, plan);
  plan_buckets(md, o, plan);
  mark_finished_layers(plan);
  return plan;
}

namespace {

// This rank's part of one piece: the write, the padding and the completion mark.
// `direct`: the write reads the tensor itself (rows in the tensor's coordinates,
// offsets from its first byte) rather than the bucket buffer.
void resolve_piece(const Plan& plan, const SourceMetadata& md, const ShardingRules& rules,
                   const Bucket& bucket, const Piece& p, int world_rank, int tp_rank, bool direct,
                   BucketApply& out) {
  const PlannedTensor& t = plan.tensors[p.planned];
  if (!t.held_by(tp_rank)) return;
  const TensorInfo& info = md.tensors[t.index];
  std::int64_t row0 = p.row_begin;
  std::int64_t rows = p.row_end - p.row_begin;
  std::uint64_t offset = p.offset;
  bool presliced = bucket.scatter;
  if (bucket.scatter) {
    rows = std::max<std::int64_t>(0, std::min(p.row_end, t.rows_for(tp_rank)) - p.row_begin);
    offset = p.rank_offset[world_rank];
  }
  WriteSource source;
  if (direct) {
    // A scattered slice's rows start at its placement's first row (a sliced
    // column window spans every row).
    if (bucket.scatter && !t.kernel() && t.placements[tp_rank].source_dim == 0)
      row0 += t.placements[tp_rank].source_start;
    const std::uint64_t row_bytes = shape_row_bytes(info.shape, info.dtype);
    offset = static_cast<std::uint64_t>(row0) * row_bytes;
    presliced = false;
    source = {t.index,
              {offset, static_cast<std::uint64_t>(std::max<std::int64_t>(rows, 0)) * row_bytes}};
  }
  auto add = [&](const RowWrite& w) {
    out.writes.push_back(w);
    if (direct) out.sources.push_back(source);
  };
  if (t.kernel()) {
    if (rows > 0) add(kernel_row_write(rules, t.slot, info.dtype, row0, rows, offset));
    if (p.last) out.completed.emplace_back(t.slot, ParameterSink::kAllShards);
    return;
  }
  const Placement& pl = t.placements[tp_rank];
  if (auto w = checkpoint_row_write(rules, pl, info.dtype, row0, rows, presliced, offset)) add(*w);
  if (!p.last) return;
  if (auto z = padding_rows(rules, pl)) out.zeros.push_back(*z);
  out.completed.emplace_back(pl.slot, pl.shard);
}

std::vector<BucketApply> resolve_all(const Plan& plan, const SourceMetadata& md,
                                     const ShardingRules& rules, const PlanOptions& o,
                                     int world_rank, bool direct) {
  if (world_rank < 0 || world_rank >= o.world_size)
    raise<UsageError>("world rank ", world_rank, " is outside a world of ", o.world_size);
  const int tp_rank = world_rank % o.tp_size;
  std::vector<BucketApply> out(plan.buckets.size());
  for (std::size_t b = 0; b < plan.buckets.size(); ++b)
    for (const Piece& p : plan.buckets[b].pieces)
      resolve_piece(plan, md, rules, plan.buckets[b], p, world_rank, tp_rank, direct, out[b]);
  return out;
}

}  // namespace

std::vector<BucketApply> resolve_applies(const Plan& plan, const SourceMetadata& md,
                                         const ShardingRules& rules, const PlanOptions& o,
                                         int world_rank) {
  return resolve_all(plan, md, rules, o, world_rank, false);
}

std::vector<BucketApply> resolve_direct_applies(const Plan& plan, const SourceMetadata& md,
                                                const ShardingRules& rules, const PlanOptions& o,
                                                int world_rank) {
  return resolve_all(plan, md, rules, o, world_rank, true);
}

}  // namespace tpreload
