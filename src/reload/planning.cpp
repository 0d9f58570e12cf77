#include "planning.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>

#include "sharded.h"
#include "sync.h"
#include "tpreload/comm/agreement.h"
#include "tpreload/core/error.h"
#include "tpreload/core/fnv.h"
#include "tpreload/core/log.h"
#include "tpreload/reload/plan.h"

namespace tpreload::detail {

std::string name_list(const std::vector<std::string>& names, std::size_t most) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < most; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > most) out += detail::concat(" and ", names.size() - most, " more");
  return out;
}

namespace {

// COLLECTIVE. Which chains of each broadcast bucket some rank checks
// (CachedPlan::chains_checked): the union of every rank's chains_read but the
// single reader's, which checks nothing. The reader sums only those: with one
// rank per tp rank, its own chain is nobody's to check.
void gather_checked_chains(Communicator& world, const ReloadOptions& options, CachedPlan& plan) {
  const bool checks = options.readers != Readers::kOne || world.rank() != options.reader_rank;
  std::vector<std::int64_t> checked;
  for (std::size_t k = 0; k < plan.chains.size(); ++k)
    if (!plan.plan.buckets[k].scatter)
      for (char c : plan.chains_read[k]) checked.push_back(checks && c ? 1 : 0);
  if (checked.empty()) return;  // (no broadcast bucket: the same plan on every rank)
  allreduce_ints(world, checked, IntOp::kMax);
  plan.chains_checked.resize(plan.chains.size());
  std::size_t at = 0;
  for (std::size_t k = 0; k < plan.chains.size(); ++k) {
    const std::size_t n = plan.chains_read[k].size();
    plan.chains_checked[k].assign(checked.begin() + at, checked.begin() + at + n);
    at += n;
  }
}

// This rank's objection to the plan, if any: every tensor it will receive must fit.
std::optional<std::string> preflight_problem(const Plan& plan, const SourceMetadata& md,
                                             const ReloadTarget& model, int world_rank) {
  const int tp = model.rules().tp_size();
  if (model.tp_rank() != world_rank % tp)
    return detail::concat("world rank ", world_rank, " must hold tp rank ", world_rank % tp, " of ",
                          tp, " but its model is tp rank ", model.tp_rank());
  // A kernel-format parameter of this rank's given twice (under two spellings:
  // ".base_layer.", ".experts.routed_experts."): which would land is arbitrary.
  std::vector<const TensorInfo*> kernel_given(model.rules().params().size(), nullptr);
  for (const PlannedTensor& t : plan.tensors) {
    const TensorInfo& info = md.tensors[t.index];
    std::string problem;
    if (t.kernel()) {
      if (t.held_by(model.tp_rank())) {
        problem = kernel_tensor_problem(model.rules(), model.tp_rank(), info.name, info.shape,
                                        info.dtype);
        const TensorInfo*& first = kernel_given[t.slot];
        if (problem.empty() && first)
          problem =
              detail::concat("parameter '", model.rules().params()[t.slot].name, "' of tp rank ",
                             model.tp_rank(), " is given twice: as '", first->name, "' (in ",
                             first->file, ") and as '", info.name, "'");
        first = &info;
      }
    } else if (t.held_by(model.tp_rank())) {
      problem =
          checkpoint_tensor_problem(model.rules(), model.tp_rank(), t.placements[model.tp_rank()],
                                    info.shape, info.dtype, false, info.name);
    }
    if (!problem.empty()) return problem + " (in " + info.file + ")";
  }
  return std::nullopt;
}

// Which shards of each parameter of this rank the plan fills.
std::vector<std::vector<bool>> planned_shards(const Plan& plan, const ReloadTarget& model) {
  const auto& params = model.rules().params();
  const int tp_rank = model.tp_rank();
  std::vector<std::vector<bool>> filled(params.size());
  for (ParamSlot s = 0; s < params.size(); ++s) filled[s].assign(params[s].shards, false);
  for (const PlannedTensor& t : plan.tensors) {
    if (!t.held_by(tp_rank)) continue;
    if (t.kernel()) {
      if (t.slot != kNoSlot) filled[t.slot].assign(params[t.slot].shards, true);
    } else {
      const Placement& pl = t.placements[tp_rank];
      if (pl.slot != kNoSlot && pl.shard < filled[pl.slot].size()) filled[pl.slot][pl.shard] = true;
    }
  }
  return filled;
}

// A per-tensor FP8 layer the plan brings in part (ShardingRules::scale_steps):
// refused before any write, as processing it would be.
std::optional<std::string> part_layer_problem(const Plan& plan, const ReloadTarget& model) {
  const std::vector<ScaleStep> steps = model.rules().scale_steps(model.tp_rank());
  if (steps.empty()) return std::nullopt;
  const auto filled = planned_shards(plan, model);
  auto brought = [&](ParamSlot slot) {
    const auto& f = filled[slot];
    const auto n = std::count(f.begin(), f.end(), true);
    return n == 0                                       ? Brought::kNone
           : n == static_cast<std::ptrdiff_t>(f.size()) ? Brought::kAll
                                                        : Brought::kPart;
  };
  for (const ScaleStep& step : steps) {
    // (online FP8: the weight alone; its scale is computed, not loaded)
    const Brought scale = step.quantize ? brought(step.weight) : brought(step.scale);
    const std::string problem =
        scale_step_problem(model.rules(), step, model.tp_rank(), scale,
                           step.weight != kNoSlot ? brought(step.weight) : scale);
    if (!problem.empty()) return problem;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> unplanned_problem(const Plan& plan, const ReloadTarget& model,
                                             WeightFormat format, const std::string& description) {
  const auto& params = model.rules().params();
  const int tp_rank = model.tp_rank();
  const auto filled = planned_shards(plan, model);
  std::vector<std::string> missing;
  for (ParamSlot s = 0; s < params.size(); ++s)
    if ((format == WeightFormat::kKernel || params[s].from_checkpoint) &&
        std::find(filled[s].begin(), filled[s].end(), false) != filled[s].end())
      missing.push_back(params[s].name);
  if (missing.empty()) return std::nullopt;
  std::sort(missing.begin(), missing.end());
  return detail::concat("the source (", description, ") lacks ", missing.size(), " of the ",
                        params.size(), " parameters of tp rank ", tp_rank, ": ",
                        name_list(missing, 12));
}

Distribution effective_distribution(const ReloadOptions& o) {
  return o.readers == Readers::kAll ? Distribution::kScatter : o.distribution;
}

namespace {

// COLLECTIVE. Readers::kNode: the NodeService of this rank (`failed`: it could
// not open the source).
NodeService serving_nodes(Communicator& world, const ReloadOptions& o, int own_node, bool failed) {
  const int n = world.size();
  std::vector<std::int64_t> v(2 * static_cast<std::size_t>(n), 0);
  v[static_cast<std::size_t>(world.rank())] = own_node;
  v[static_cast<std::size_t>(n + world.rank())] = failed ? 1 : 0;
  allreduce_ints(world, v, IntOp::kSum);
  std::map<int, bool> able;  // node -> every rank of it opened the source
  for (int r = 0; r < n; ++r) {
    const auto node = static_cast<int>(v[static_cast<std::size_t>(r)]);
    able.emplace(node, true);
    if (v[static_cast<std::size_t>(n + r)] != 0) able[node] = false;
  }
  std::vector<int> capable;
  for (const auto& [node, ok] : able)
    if (ok) capable.push_back(node);
  NodeService out;
  out.own_node = own_node;
  if (capable.size() == able.size()) return out;
  if (!able.at(static_cast<int>(v[static_cast<std::size_t>(o.reader_rank)]))) {
    if (!capable.empty()) out.reader_could_be = capable.front();
    return out;
  }
  std::map<int, int> serve;
  std::size_t turn = 0;
  for (const auto& [node, ok] : able) serve[node] = ok ? node : capable[turn++ % capable.size()];
  out.served_by.resize(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    out.served_by[static_cast<std::size_t>(r)] =
        serve.at(static_cast<int>(v[static_cast<std::size_t>(r)]));
  out.nodes_served = static_cast<int>(able.size() - capable.size());
  return out;
}

}  // namespace

const CachedPlan& plan_reload(Communicator& world, WeightSource* source, const ReloadTarget& model,
                              const ReloadOptions& options, std::int64_t fingerprint,
                              bool host_transport, ReloadWorkspace& workspace, NodeService& service,
                              PlanScope scope) {
  const int reader = options.reader_rank;
  const bool all_read = options.readers == Readers::kAll;
  const bool many = options.readers != Readers::kOne;  // every rank opens the source
  std::optional<std::string> problem;
  // The listing is hashed field by field where it is (a copy or serialization
  // of 20,000 tensors costs more than the rest of a small reload); it is
  // serialized and sent only when no kept plan matches it.
  std::int64_t own_hash = 0, own_count = 0;
  const CachedPlan* cached = workspace.cached_plan();
  bool same_as_kept = false;  // this rank's listing is, field by field, the kept plan's
  std::shared_ptr<const KnownListing> known;  // this rank's source's, when it opened one
  if (opens_source(options, world.rank())) {
    try {
      if (!source)
        raise<UsageError>("no weight source was given to ",
                          many ? detail::concat("rank ", world.rank(), " (--readers ",
                                                readers_name(options.readers),
                                                ": every rank opens the checkpoint)")
                               : std::string("the reader rank"));
      // A source that took the kept plan's own listing (its files unchanged)
      // lists as the plan's metadata; any other is compared field by field.
      // Either gives the listing's hash without hashing it.
      known = source->known_listing();
      if (cached && known && known == cached->known)
        same_as_kept = cached->metadata.description == source->describe() &&
                       cached->metadata.kernel == source->kernel_format();
      else
        same_as_kept = cached && same_listing(cached->metadata, source->describe(),
                                              source->tensors(), source->kernel_format());
      own_hash = same_as_kept
                     ? cached->listing_hash
                     : static_cast<std::int64_t>(listing_hash(source->describe(), source->tensors(),
                                                              source->kernel_format()) >>
                                                 1);
      own_count = static_cast<std::int64_t>(source->tensors().size());
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  // A reader per node: a node that cannot read the files is served by another
  // node's reader (its ranks neither read nor compare listings).
  bool served = false;
  std::int64_t some_failed = problem ? 1 : 0;  // (node_of is collective: only then)
  if (options.readers == Readers::kNode) world.allreduce_ints(&some_failed, 1, IntOp::kMax);
  if (options.readers == Readers::kNode && some_failed) {
    const int own_node = node_of(world, options);
    service = serving_nodes(world, options, own_node, problem.has_value());
    const std::vector<int>& served_by = service.served_by;
    served = !served_by.empty() && served_by[static_cast<std::size_t>(world.rank())] != own_node;
    const std::vector<std::string> hosts = host_names(world);  // (where to fix the mount)
    const int serving = served ? served_by[static_cast<std::size_t>(world.rank())] : -1;
    if (served && problem)
      log().warn(
          "--readers node: rank {} (host {}) cannot read the weights ({}); its node is served "
          "by the reader of the node of rank {} (host {}) over the data plane",
          world.rank(), hosts[static_cast<std::size_t>(world.rank())], *problem, serving,
          hosts[static_cast<std::size_t>(serving)]);
    if (served) problem.reset();
    if (problem && service.reader_could_be >= 0)
      *problem += detail::concat(
          "; with a reader per node the reader rank's node must read the weights, and the node "
          "of rank ",
          service.reader_could_be, " can: make it the reader rank (--reader-rank ",
          service.reader_could_be, ")");
  }
  agree_on_problem<CheckpointError>(
      world, problem, "opening the weight source",
      all_read ? "; with --readers all every rank opens the weights: where only some ranks can, "
                 "use --readers node (a node that cannot is served by another node's reader) "
                 "or --readers one"
               : "");
  std::int64_t listing[2] = {world.rank() == reader ? own_hash : 0,
                             world.rank() == reader ? own_count : 0};
  world.broadcast(MutableBytes(listing, sizeof listing), reader);
  if (many) {  // ranks read by the reader's tensor indices: same listing everywhere
    std::optional<std::string> differs;  // (a served rank read nothing to compare)
    if (!served && (listing[0] != own_hash || listing[1] != own_count))
      differs =
          detail::concat("rank ", world.rank(), " opened ", source->describe(), " (",
                         source->tensors().size(), " tensors), which lists differently from ",
                         "reader rank ", reader, "'s (", listing[1], " tensors): with --readers ",
                         readers_name(options.readers), " every rank must open the same files");
    agree_on_problem<CheckpointError>(world, differs, "comparing the ranks' listings");
  }
  std::uint64_t key = fnv1a_word(fnv1a_word(static_cast<std::uint64_t>(listing[0]), listing[1]),
                                 static_cast<std::uint64_t>(fingerprint));
  key = fnv1a_word(fnv1a_word(fnv1a_word(key, world.size()), world.rank()), model.tp_rank());
  if (scope == PlanScope::kSegment) key = fnv1a_word(key, fnv1a("segment"));  // (no layer ends)
  // The hash picks the plan; the reader, which holds both listings, compared
  // them field by field above, so that no listing can pass for another.
  std::int64_t all_cached = cached && cached->key == key;
  if (world.rank() == reader) all_cached = all_cached && same_as_kept;
  world.allreduce_ints(&all_cached, 1, IntOp::kMin);
  if (all_cached) {
    if (same_as_kept && known != cached->known) workspace.keep_known_listing(known);
    return *cached;
  }

  workspace.keep_plan(nullptr);  // a plan that fails preflight is not kept
  std::vector<std::uint8_t> payload;
  if (world.rank() == reader) try {
      payload = serialize_metadata(source->describe(), source->tensors(), source->kernel_format());
    } catch (const std::exception& e) {
      problem = e.what();
    }
  agree_on_problem<CheckpointError>(world, problem, "listing the weight source");
  std::int64_t payload_bytes = static_cast<std::int64_t>(payload.size());
  world.broadcast(MutableBytes(&payload_bytes, sizeof payload_bytes), reader);
  payload.resize(static_cast<std::size_t>(payload_bytes));
  world.broadcast(MutableBytes(payload.data(), payload.size()), reader);
  auto fresh = std::make_unique<CachedPlan>();
  fresh->key = key;
  fresh->listing_hash = listing[0];
  fresh->known = std::move(known);
  const PlanOptions plan_options{options.format,          effective_distribution(options),
                                 options.bucket_bytes,    world.size(),
                                 model.rules().tp_size(), options.scatter_replicated_bytes};
  // The same listing and rules on every rank: the same verdict everywhere for
  // what they decide; anything else (memory) is this rank's problem, agreed on
  // with preflight's.
  try {  // (`problem` is empty here: the listing was agreed on above)
    fresh->metadata = parse_metadata(payload);
    fresh->plan = make_plan(fresh->metadata, model.rules(), plan_options);
    if (scope == PlanScope::kSegment)  // (layers complete as the stream goes: see PlanScope)
      for (Bucket& b : fresh->plan.buckets) b.finished_layers.clear();
  } catch (const ValidationError& e) {
    throw Agreed<ValidationError>(e.what());
  } catch (const UsageError& e) {
    throw Agreed<UsageError>(e.what());
  } catch (const CheckpointError& e) {  // (a listing that does not parse)
    throw Agreed<CheckpointError>(e.what());
  } catch (const std::exception& e) {
    problem = detail::concat("planning the reload: ", e.what());
  }
  if (!problem) problem = preflight_problem(fresh->plan, fresh->metadata, model, world.rank());
  if (!problem && options.format == WeightFormat::kCheckpoint && scope == PlanScope::kWhole)
    problem = part_layer_problem(fresh->plan, model);
  if (!problem) try {  // this rank's writes
      fresh->applies =
          resolve_applies(fresh->plan, fresh->metadata, model.rules(), plan_options, world.rank());
      if (all_read)
        fresh->direct_applies = resolve_direct_applies(fresh->plan, fresh->metadata, model.rules(),
                                                       plan_options, world.rank());
      else if (options.readers == Readers::kNode || world.rank() == options.reader_rank)
        fresh->own = detail::place_own_writes(fresh->plan, fresh->applies, model.rules().params(),
                                              world.rank());
      if (options.checksums && !all_read && host_transport) {  // (else blocks: pipeline.cpp)
        fresh->chains =
            detail::chain_layouts(fresh->plan, fresh->metadata, model.rules().tp_size());
        fresh->chains_read.resize(fresh->chains.size());
        for (std::size_t k = 0; k < fresh->chains.size(); ++k)
          if (!fresh->plan.buckets[k].scatter) try {
              fresh->chains_read[k] = detail::chains_read(
                  fresh->chains[k], fresh->applies[k].writes, model.rules().params());
            } catch (const Error& e) {
              raise<Error>("bucket ", k + 1, " of ", fresh->chains.size(), ": ", e.what());
            }
      }
    } catch (const std::exception& e) {
      problem = detail::concat("resolving this rank's writes: ", e.what());
    }
  agree_on_problem<ValidationError>(world, problem, "preflight (nothing was reloaded)");
  if (!fresh->chains.empty()) gather_checked_chains(world, options, *fresh);
  workspace.keep_plan(std::move(fresh));
  return *workspace.cached_plan();
}

const CachedPlan& plan_sharded(Communicator& world, const ShardedSource& mine,
                               const ReloadTarget& model, const ReloadOptions& options,
                               std::int64_t fingerprint, ReloadWorkspace& workspace) {
  std::uint64_t hash = 0;
  const std::vector<HeldBox> held = detail::gather_held(world, mine, hash);
  std::uint64_t key =
      fnv1a_word(fnv1a_word(hash, static_cast<std::uint64_t>(fingerprint)), fnv1a("sharded"));
  key = fnv1a_word(fnv1a_word(fnv1a_word(key, world.size()), world.rank()), model.tp_rank());
  const CachedPlan* cached = workspace.cached_plan();
  std::int64_t all_cached = cached && cached->key == key;
  world.allreduce_ints(&all_cached, 1, IntOp::kMin);
  if (all_cached) return *cached;

  workspace.keep_plan(nullptr);  // a plan that fails preflight is not kept
  auto fresh = std::make_unique<CachedPlan>();
  fresh->key = key;
  fresh->listing_hash = static_cast<std::int64_t>(hash >> 1);
  const int tp = model.rules().tp_size();
  // The ranks that receive: the serving ranks (every rank sends what it holds).
  const int serving = options.serving_ranks ? options.serving_ranks : world.size();
  const bool serves = world.rank() < serving;
  const PlanOptions plan_options{WeightFormat::kCheckpoint,
                                 Distribution::kScatter,
                                 options.bucket_bytes,
                                 serving,
                                 tp,
                                 std::numeric_limits<std::uint64_t>::max()};
  std::optional<std::string> problem;
  try {  // (the same boxes and rules on every rank: the same verdict everywhere)
    std::size_t holders = 0;
    for (std::size_t i = 0; i < held.size(); ++i)
      if (i == 0 || held[i].rank != held[i - 1].rank) ++holders;
    fresh->metadata = detail::sharded_metadata(held, "");
    fresh->metadata.description = detail::concat(
        "sharded sources: ", fresh->metadata.tensors.size(), " tensors in ", held.size(),
        " boxes on ", holders, " of ", world.size(), " ranks",
        serving < world.size() ? detail::concat(", into the ", serving, " serving ranks")
                               : std::string());
    fresh->plan = make_plan(fresh->metadata, model.rules(), plan_options);
    detail::plan_exchanges(*fresh, held, world.size(), serving, tp, world.rank(),
                           options.bucket_bytes);
  } catch (const ValidationError& e) {
    throw Agreed<ValidationError>(detail::concat(e.what(), " (nothing was reloaded)"));
  } catch (const UsageError& e) {
    throw Agreed<UsageError>(e.what());
  } catch (const std::exception& e) {
    problem = detail::concat("planning the reload: ", e.what());
  }
  // (a rank that serves nothing writes nothing: it has no preflight)
  if (!problem && serves)
    problem = preflight_problem(fresh->plan, fresh->metadata, model, world.rank());
  if (!problem && serves) problem = part_layer_problem(fresh->plan, model);
  if (!problem) try {
      fresh->applies = serves ? resolve_applies(fresh->plan, fresh->metadata, model.rules(),
                                                plan_options, world.rank())
                              : std::vector<BucketApply>(fresh->plan.buckets.size());
    } catch (const std::exception& e) {
      problem = detail::concat("resolving this rank's writes: ", e.what());
    }
  agree_on_problem<ValidationError>(world, problem, "preflight (nothing was reloaded)");
  workspace.keep_plan(std::move(fresh));
  return *workspace.cached_plan();
}

}  // namespace tpreload::detail
