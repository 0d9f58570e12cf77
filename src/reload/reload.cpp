#include "tpreload/reload/reload.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>

#include <sched.h>
#include <unistd.h>

#include "agreement.h"
#include "clock.h"
#include "pipeline.h"
#include "planning.h"
#include "sharded.h"
#include "stream.h"
#include "sync.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/agreement.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/data_transport.h"
#include "tpreload/comm/device.h"
#include "tpreload/comm/memory.h"
#include "tpreload/core/error.h"
#include "tpreload/core/fnv.h"
#include "tpreload/core/log.h"
#include "validation.h"

namespace tpreload {
namespace {

using detail::agree_on_problem;
using detail::CachedPlan;
using detail::Clock;
using detail::name_list;
using detail::NodeService;
using detail::since;

// Throws `e` again, as the same kind of error, with `extra` appended.
[[noreturn]] void rethrow_with(const std::exception& e, const std::string& extra) {
  const std::string text = e.what() + extra;
#define TPRELOAD_RETHROW_AS(T)                                   \
  if (dynamic_cast<const Agreed<T>*>(&e)) throw Agreed<T>(text); \
  if (dynamic_cast<const T*>(&e)) throw T(text);
  TPRELOAD_RETHROW_AS(CommTimeoutError)
  TPRELOAD_RETHROW_AS(CommError)
  TPRELOAD_RETHROW_AS(CheckpointError)
  TPRELOAD_RETHROW_AS(ValidationError)
  TPRELOAD_RETHROW_AS(ModelError)
  TPRELOAD_RETHROW_AS(UsageError)
#undef TPRELOAD_RETHROW_AS
  throw Error(text);
}

}  // namespace

std::vector<std::string> names_on_some_rank(Communicator& world, const ShardingRules& rules,
                                            const std::vector<std::string>& mine) {
  const auto& params = rules.params();
  std::vector<std::uint64_t> bits((params.size() + 63) / 64, 0);
  for (std::size_t i = 0; i < params.size(); ++i)
    if (std::find(mine.begin(), mine.end(), params[i].name) != mine.end())
      bits[i / 64] |= 1ull << (i % 64);
  allreduce_bits(world, bits, BitOp::kOr);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (bits[i / 64] >> (i % 64) & 1) out.push_back(params[i].name);
  std::sort(out.begin(), out.end());
  return out;
}

int auto_pipeline_depth(int usable_cores, int host_cores, int ranks_on_host) {
  const int share =
      std::min(std::max(usable_cores, 1), std::max(host_cores, 1) / std::max(ranks_on_host, 1));
  return share >= 2 ? 2 : 1;
}

namespace {

// COLLECTIVE when options.pipeline_depth is 0 (every rank agreed it is: one
// allreduce, host_names()). This rank's pipeline depth: the option, or the one
// auto_pipeline_depth() chooses from the cores this rank may run on and the
// ranks on its host.
int chosen_pipeline_depth(Communicator& world, const ReloadOptions& o) {
  if (o.pipeline_depth > 0) return o.pipeline_depth;
  const std::vector<std::string> hosts = host_names(world);
  const std::string& mine = hosts[static_cast<std::size_t>(world.rank())];
  const auto ranks_on_host = static_cast<int>(std::count(hosts.begin(), hosts.end(), mine));
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int host_cores = online > 0 ? static_cast<int>(online) : 1;
  // (a set sized for the host: a fixed cpu_set_t holds 1,024 CPUs)
  const int most = std::max(host_cores, CPU_SETSIZE);
  cpu_set_t* set = CPU_ALLOC(most);
  const std::size_t size = CPU_ALLOC_SIZE(most);
  int usable = host_cores;
  if (set) {
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0) usable = CPU_COUNT_S(size, set);
    CPU_FREE(set);
  }
  const int depth = auto_pipeline_depth(usable, host_cores, ranks_on_host);
  log().debug(
      "rank {}: pipeline depth {} (automatic: {} usable cores, {} on host {}, {} ranks there)",
      world.rank(), depth, usable, host_cores, mine, ranks_on_host);
  return depth;
}

// After a failure once writes began: says which parameters may now hold a mix of
// old and new bytes. An agreed error (every rank at the same point, nothing in
// flight) gathers every rank's list, so that the message stays the same on every
// rank; any other says this rank's.
[[noreturn]] void rethrow_after_writes(const std::exception& e, Communicator& world,
                                       const ParameterSink& sink) {
  std::vector<std::string> touched;
  std::string where = detail::concat("on rank ", world.rank(), "/", world.size());
  if (dynamic_cast<const AgreedError*>(&e)) {
    touched = names_on_some_rank(world, sink.rules(), sink.touched_names());
    where = "on some rank";
  } else {
    touched = sink.touched_names();
  }
  if (touched.empty()) rethrow_with(e, "; no parameter had been written (nothing was reloaded)");
  rethrow_with(
      e, detail::concat("; ", touched.size(), " of ", sink.rules().params().size(),
                        " parameters had been written ", where,
                        " and may hold a mix of old and new weights: ", name_list(touched, 8)));
}

}  // namespace

std::string_view readers_name(Readers r) {
  return r == Readers::kAll ? "all" : r == Readers::kNode ? "node" : "one";
}

std::optional<Readers> parse_readers(std::string_view name) {
  for (Readers r : {Readers::kOne, Readers::kNode, Readers::kAll})
    if (name == readers_name(r)) return r;
  return std::nullopt;
}

int node_of(Communicator& world, const ReloadOptions& options) {
  const int n = options.ranks_per_node;
  return n > 0 ? world.rank() / n * n : world.node_leader();
}

bool opens_source(const ReloadOptions& options, int rank) {
  return rank == options.reader_rank || options.readers != Readers::kOne;
}

namespace {

// COLLECTIVE. Readers::kNode: this rank's node planes. Ranks group by
// ranks_per_node, else by what the communicator says shares memory; the reader
// rank comes first on its node (key 0), the others in world order. Kept in the
// workspace for the next reload with the same planes and grouping (every rank
// must have kept them: splitting is collective).
detail::NodePlanes& node_planes(Communicator& world, DataTransport& data, const ReloadOptions& o,
                                ReloadWorkspace& workspace, const NodeService& service) {
  const std::vector<int>& served_by = service.served_by;
  const detail::NodePlanes* kept = workspace.node_planes();
  const DataTransport* identity = data.backend().rfind("control:", 0) == 0 ? nullptr : &data;
  std::int64_t all_kept = kept && kept->world == &world && kept->data == identity &&
                          kept->data_backend == data.backend() &&
                          kept->ranks_per_node == o.ranks_per_node &&
                          kept->reader_rank == o.reader_rank && kept->served_by == served_by;
  world.allreduce_ints(&all_kept, 1, IntOp::kMin);
  if (all_kept) return *workspace.node_planes();
  workspace.keep_node_planes(nullptr);
  // A served node's ranks join the group of the node serving it, after that
  // node's ranks (whose first is the group's reader).
  const int own = service.own_node >= 0 ? service.own_node : node_of(world, o);
  const int color = served_by.empty() ? own : served_by[static_cast<std::size_t>(world.rank())];
  const int key = world.rank() == o.reader_rank ? 0
                  : own == color                ? world.rank() + 1
                                                : world.size() + world.rank() + 1;
  auto planes = std::make_unique<detail::NodePlanes>();
  planes->world = &world;
  planes->data = identity;
  planes->data_backend = data.backend();
  planes->ranks_per_node = o.ranks_per_node;
  planes->reader_rank = o.reader_rank;
  planes->served_by = served_by;
  // A split that fails on one node (a transport that cannot be split, NCCL
  // failing to join) is agreed on over the world, not only within the node.
  std::optional<std::string> problem;
  try {
    planes->control = world.split(color, key);
    std::vector<std::int64_t> members(static_cast<std::size_t>(planes->control->size()), 0);
    members[static_cast<std::size_t>(planes->control->rank())] = world.rank();
    allreduce_ints(*planes->control, members, IntOp::kSum);
    planes->members.assign(members.begin(), members.end());
    // Last: a rank whose split fails goes on to the world agreement, and no
    // collective of its node is left after it.
    planes->transport = data.split(*planes->control, color, key);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  agree_on_problem<CommError>(world, problem,
                              "making the node planes for --readers node (nothing was reloaded)");
  std::vector<std::int64_t> is_reader(static_cast<std::size_t>(world.size()), 0);
  is_reader[static_cast<std::size_t>(world.rank())] = planes->members.front() == world.rank();
  allreduce_ints(world, is_reader, IntOp::kSum);
  for (int r = 0; r < world.size(); ++r)
    if (is_reader[static_cast<std::size_t>(r)]) planes->readers.push_back(r);
  static std::atomic<std::uint64_t> made{0};
  planes->serial = ++made;
  log().debug("--readers node: rank {} is rank {} of the {} ranks of its node (reader: rank {})",
              world.rank(), planes->control->rank(), planes->members.size(),
              planes->members.front());
  workspace.keep_node_planes(std::move(planes));
  return *workspace.node_planes();
}

void reduce_figures(Communicator& world, ReloadResult& r, const detail::PipelineStats& stats,
                    std::uint64_t read_bytes, std::uint64_t processing_bytes) {
  auto us = [](double s) { return static_cast<std::int64_t>(s * 1e6); };
  std::vector<std::int64_t> v = {us(r.seconds.total),
                                 us(r.seconds.read),
                                 us(r.seconds.transfer),
                                 us(r.seconds.apply),
                                 us(r.seconds.finish),
                                 us(r.seconds.validate),
                                 us(r.seconds.checksum),
                                 us(r.seconds.prepare),
                                 static_cast<std::int64_t>(read_bytes),
                                 static_cast<std::int64_t>(stats.bytes_sent),
                                 static_cast<std::int64_t>(stats.bytes_copied),
                                 static_cast<std::int64_t>(stats.staging.total()),
                                 static_cast<std::int64_t>(stats.staging.host),
                                 static_cast<std::int64_t>(stats.staging.pinned),
                                 static_cast<std::int64_t>(stats.staging.device),
                                 static_cast<std::int64_t>(processing_bytes)};
  allreduce_ints(world, v, IntOp::kMax);
  r.seconds = {v[0] / 1e6, v[1] / 1e6, v[2] / 1e6, v[3] / 1e6,
               v[4] / 1e6, v[5] / 1e6, v[6] / 1e6, v[7] / 1e6};
  r.bytes_read = v[8];
  r.bytes_transferred = v[9];
  r.bytes_copied_on_reader = v[10];
  r.peak_staging_bytes = v[11];
  r.staging = {static_cast<std::uint64_t>(v[12]), static_cast<std::uint64_t>(v[13]),
               static_cast<std::uint64_t>(v[14])};
  r.processing_staging_bytes = static_cast<std::uint64_t>(v[15]);
}

// What a reload reads: a source (on the ranks that open it), every rank's
// sharded source, or a stream (on the reader rank). Every rank must say the
// same kind: their collectives differ.
enum class SourceKind : std::int64_t { kSource, kSharded, kStream };
struct Inputs {
  SourceKind kind = SourceKind::kSource;
  WeightSource* source = nullptr;
  const ShardedSource* sharded = nullptr;
  WeightStream* stream = nullptr;
};

// This rank's objection to its options and planes, if any (the agreement names
// the rank): a reader rank in the world, a positive bucket and depth, a data
// transport over the same ranks, and
// a device transport only for parameters on that device. Agreed on before
// anything else, so that a rank that objects never leaves its peers waiting.
std::optional<std::string> local_problem(const ReloadOptions& o, const Communicator& control,
                                         const DataTransport& data, const ReloadTarget& model,
                                         SourceKind kind) {
  if (kind == SourceKind::kStream) {
    if (o.readers != Readers::kOne)
      return detail::concat("a weight stream is taken by the reader rank alone: --readers ",
                            readers_name(o.readers), " is for checkpoint files");
    if (o.require_complete && !o.atomic)
      return "--require-complete refuses a source that lacks parameters before any write, but a "
             "weight stream's tensors are known only once it has ended: reload atomically "
             "(the check then runs before the commit)";
  }
  const int serving = o.serving_ranks;
  if (serving < 0 || serving > control.size())
    return detail::concat("serving ranks ", serving, " is not in [0, ", control.size(),
                          "] (0: every rank serves)");
  if (serving > 0 && kind != SourceKind::kSharded)
    return detail::concat("ranks that serve nothing (serving ranks ", serving, " of ",
                          control.size(),
                          ") only send sharded sources: reload every rank from "
                          "its ShardedSource (push_shards on the ranks that serve nothing)");
  const int tp = model.rules().tp_size();
  if (serving % tp != 0)
    return detail::concat("the ", serving, " serving ranks are not a whole number of tp groups of ",
                          tp, " (the serving ranks are replicas x tp)");
  const bool should_serve = serving == 0 || control.rank() < serving;
  if (should_serve && !model.sink().holds_parameters())
    return detail::concat("rank ", control.rank(), " is one of the ",
                          serving ? serving : control.size(),
                          " serving ranks but holds no parameters (push_shards is for the ranks "
                          "from serving ranks on; set ReloadOptions::serving_ranks)");
  if (!should_serve && model.sink().holds_parameters())
    return detail::concat("rank ", control.rank(), " is past the ", serving,
                          " serving ranks (it only sends what it holds: push_shards), but was "
                          "given a model's parameters");
  if (kind == SourceKind::kSharded) {
    if (o.format != WeightFormat::kCheckpoint)
      return "sharded sources hold checkpoint tensors: a kernel-format reload reads "
             "kernel-format shards (a directory) instead";
    if (o.readers != Readers::kOne)
      return detail::concat("sharded sources are read by the ranks that hold them: --readers ",
                            readers_name(o.readers), " is for checkpoint files");
  }
  if (o.reader_rank < 0 || o.reader_rank >= control.size())
    return detail::concat("reader rank ", o.reader_rank, " is not a rank of the ", control.size(),
                          "-rank world");
  if (o.bucket_bytes == 0) return "bucket size must be positive";
  if (o.pipeline_depth < 0)
    return detail::concat("pipeline depth must be 0 (chosen per rank) or positive, not ",
                          o.pipeline_depth);
  if (o.ranks_per_node < 0)
    return detail::concat("ranks per node must be 0 (ask MPI) or positive, not ", o.ranks_per_node);
  if (o.rotate_broadcast_roots && o.readers != Readers::kNode)
    return detail::concat("rotating the broadcast roots takes turns among the node readers: ",
                          "it needs --readers node, not --readers ", readers_name(o.readers));
  if (data.size() != control.size() || data.rank() != control.rank())
    return detail::concat("the data transport is rank ", data.rank(), "/", data.size(),
                          " (it must span the control ranks in order)");
  const Device* params = model.sink().device();
  const Device* moved = data.device();
  const bool same_device = params && moved && params->backend() == moved->backend() &&
                           params->ordinal() == moved->ordinal();
  if (data.memory() == MemoryKind::kDevice && !same_device)
    return detail::concat("the ", data.backend(),
                          " transport moves device memory, but the "
                          "parameters are ",
                          params ? "on another device" : "in host memory",
                          " (give the model the transport's device)");
  return std::nullopt;
}

}  // namespace

ReloadResult reload_weights(ReloadTarget& model, Communicator& world, WeightSource* source,
                            const ReloadOptions& options, ReloadWorkspace* workspace) {
  const auto data = make_communicator_transport(world);
  return reload_weights(model, world, *data, source, options, workspace);
}

namespace {

// reload_weights() from a source, sharded sources or a stream.
ReloadResult reload_any(ReloadTarget& model, Communicator& world, DataTransport& data,
                        const Inputs& in, const ReloadOptions& options,
                        ReloadWorkspace* workspace) {
  WeightSource* source = in.source;
  const ShardedSource* sharded = in.sharded;
  ReloadWorkspace local;  // freed on return when the caller keeps none
  ReloadWorkspace& kept = workspace ? *workspace : local;
  const auto start = Clock::now();
  // (stacked tensors, Phi-3's q/k/v and gate/up or GraniteMoE's experts, read
  // as the tensors the loaders take)
  std::unique_ptr<WeightSource> view;
  if (source && options.format == WeightFormat::kCheckpoint)
    view = loader_view(*source, model.rules().config());
  if (view) source = view.get();
  ParameterSink& sink = model.sink();
  const bool serves = sink.holds_parameters();  // (else it only sends: push_shards)
  sink.begin_load();                            // from here, what this reload writes is tracked
  std::optional<std::string> refused = local_problem(options, world, data, model, in.kind);
  // Stacked checkpoint tensors (Phi-3's qkv_proj...): held as boxes of their
  // parts, as the weight loaders take them.
  std::optional<ShardedSource> parts;
  if (sharded && !refused && options.format == WeightFormat::kCheckpoint) try {
      const std::vector<RowSplit> stacked = stacked_checkpoint_tensors(model.rules().config());
      if (!stacked.empty()) sharded = &parts.emplace(split_stacked(*sharded, stacked));
    } catch (const std::exception& e) {
      refused = e.what();
    }
  agree_on_problem<UsageError>(world, refused,
                               "checking the reload options and planes (nothing was reloaded)");
  // Every rank reloads from the same kind of source: their collectives differ.
  std::int64_t mode[2] = {static_cast<std::int64_t>(in.kind), -static_cast<std::int64_t>(in.kind)};
  world.allreduce_ints(mode, 2, IntOp::kMax);
  if (mode[0] != -mode[1])
    raise<Agreed<UsageError>>(
        "the ranks reload from different kinds of source (a weight source, sharded sources, a "
        "weight stream): every rank must call the same reload (a ShardedSource on every rank, "
        "an empty one where it holds nothing; a stream on the reader rank and null elsewhere) "
        "(nothing was reloaded)");
  const std::int64_t fingerprint = detail::check_ranks_agree(world, model, options, data);
  ReloadOptions chosen = options;  // (the pipeline depth: the option, or chosen here)
  chosen.pipeline_depth = chosen_pipeline_depth(world, options);
  const bool reader = opens_source(options, world.rank());
  const std::uint64_t read_before = reader && source ? source->bytes_read() : 0;
  NodeService service;  // Readers::kNode: each rank's serving node, when some cannot read
  // The whole reload's plan (a stream plans each segment as it comes).
  const CachedPlan* planned = nullptr;
  if (sharded)
    planned = &detail::plan_sharded(world, *sharded, model, options, fingerprint, kept);
  else if (in.kind == SourceKind::kSource)
    planned = &detail::plan_reload(world, source, model, options, fingerprint,
                                   data.memory() != MemoryKind::kDevice, kept, service);
  if (sharded)  // bytes held twice must agree, whatever the plan (they change every time)
    agree_on_problem<ValidationError>(world, detail::compare_shared(world, *planned, *sharded),
                                      "comparing the sharded sources (nothing was reloaded)");
  ReloadResult result = result_for(options);
  std::vector<std::int64_t> finished_layers;  // (an atomic reload's, finished after the commit)
  if (planned) {
    const Plan& plan = planned->plan;
    log().debug("reload plan: {} tensors in {} buckets ({} bytes largest), {} skipped",
                plan.tensors.size(), plan.buckets.size(), plan.largest_bucket, plan.skipped.size());
    if (options.require_complete)  // (a rank that serves nothing needs nothing)
      agree_on_problem<ValidationError>(
          world,
          serves ? detail::unplanned_problem(plan, model, options.format,
                                             planned->metadata.description)
                 : std::nullopt,
          "--require-complete (nothing was reloaded)");
    result.source = planned->metadata.description;
    result.skipped = plan.skipped;
    result.buckets = plan.buckets.size();
    for (const Bucket& b : plan.buckets)
      finished_layers.insert(finished_layers.end(), b.finished_layers.begin(),
                             b.finished_layers.end());
  }
  result.nodes_served = service.nodes_served;
  result.transport = data.backend();
  result.parameter_memory = sink.device() ? sink.device()->describe() : "host";
  struct ShadowGuard {  // an atomic reload that does not commit leaves the parameters alone
    ParameterSink& sink;
    std::chrono::milliseconds timeout;
    ~ShadowGuard() { sink.discard_shadow(timeout); }
  } guard{sink, options.device_timeout};
  if (options.atomic) {
    std::optional<std::string> problem, stuck;
    try {
      if (serves) sink.begin_shadow(options.device_timeout);
    } catch (const CommTimeoutError& e) {
      stuck = e.what();  // the device, not the memory
    } catch (const ModelError& e) {
      stuck = e.what();
    } catch (const std::exception& e) {
      problem = detail::concat("--atomic needs a second copy of this rank's parameters (",
                               sink.total_bytes(), " bytes of ",
                               sink.device() ? sink.device()->describe() : "host memory",
                               "), which cannot be had: ", e.what());
    }
    agree_on_problem<ModelError>(world, stuck,
                                 "copying the parameters for the atomic reload (nothing was "
                                 "reloaded)");
    agree_on_problem<UsageError>(world, problem,
                                 "preparing the atomic reload (nothing was reloaded)");
  }
  result.seconds.prepare = since(start);
  detail::PipelineStats stats;
  std::uint64_t streamed_bytes = 0;  // (the reader's, from a stream)
  // Post-load processing: an atomic reload's per-layer processing too, which
  // waits for the commit (the pipeline processes each layer after the bucket
  // that completes it otherwise).
  auto run_finish = [&] {
    std::optional<std::string> finish_problem;
    try {
      if (options.atomic)
        for (std::int64_t layer : finished_layers) model.finish_layer(layer);
      model.finish();
    } catch (const std::exception& e) {
      finish_problem = e.what();
    }
    agree_on_problem<ModelError>(world, finish_problem, "post-load processing (finish)");
  };
  try {
    if (in.kind == SourceKind::kStream) {
      detail::StreamRun run =
          detail::run_stream(world, data, in.stream, model, chosen, fingerprint, kept);
      stats = run.stats;
      streamed_bytes = run.bytes_read;
      finished_layers = std::move(run.finished_layers);
      result.source = detail::concat("weight stream (", run.tensors, " tensors in ", run.segments,
                                     run.segments == 1 ? " segment" : " segments", " of at most ",
                                     run.segment_bytes, " bytes)");
      result.skipped = std::move(run.skipped);
      result.buckets = run.buckets;
    } else if (sharded) {
      stats = detail::run_exchanges(*planned, model, world, data, *sharded, chosen);
    } else {
      detail::NodePlanes* node = options.readers == Readers::kNode
                                     ? &node_planes(world, data, options, kept, service)
                                     : nullptr;
      stats = detail::run_pipeline(*planned, model, world, data, source, chosen, kept, node);
    }
    result.pipeline_depth = stats.depth;
    // Zero-copy buckets went out of the mapping during the transfer: were they
    // all still backed by the file?
    std::optional<std::string> mapping_problem;
    if (reader && source) try {
        source->check_mapped_reads();
      } catch (const std::exception& e) {  // (a source of the caller's may throw anything)
        mapping_problem = e.what();
      }
    agree_on_problem<CheckpointError>(world, mapping_problem, "reading the checkpoint");
    agree_on_problem<CommError>(world, stats.corrupted, "verifying the transferred bytes");
    agree_on_problem<ModelError>(world, stats.apply_error, "applying weights");
    auto t = Clock::now();
    if (!options.atomic) run_finish();
    result.seconds.finish = stats.finish + since(t);
    t = Clock::now();
    detail::validate(world, model, options.format, result);
    result.loaded = sink.loaded_names(options.format);
    // (a stream's extent is known at its end: atomic only, before the commit)
    if (in.kind == SourceKind::kStream && options.require_complete) {
      std::vector<std::string> missing = result.not_loaded_on_all_ranks;
      for (const auto& [name, ranks] : result.not_loaded_on_some_ranks) missing.push_back(name);
      std::sort(missing.begin(), missing.end());
      if (!missing.empty())
        raise<Agreed<ValidationError>>("--require-complete: the weight stream lacked ",
                                       missing.size(),
                                       missing.size() == 1 ? " parameter" : " parameters",
                                       " some rank needs: ", name_list(missing, 12));
    }
    // Replicas must hold the same bytes; in atomic mode what is compared is the
    // second copy, before the vote, so a difference changes nothing.
    if (options.compare_replicas)
      detail::compare_replicas(world, options.serving_ranks ? options.serving_ranks : world.size(),
                               model, options.device_timeout);
    result.seconds.validate = since(t);
  } catch (const std::exception& e) {
    // Node planes a failed transfer may have broken are made again next time
    // (every rank drops them: the next reload agrees none kept them).
    kept.keep_node_planes(nullptr);
    if (options.atomic)
      rethrow_with(e, "; atomic reload: every parameter is as it was before the reload");
    rethrow_after_writes(e, world, sink);
  }
  if (options.atomic) {
    // Every rank holds its whole shard: commit only if every rank says so.
    agree_on_problem<CommError>(world, std::nullopt, "the atomic reload's commit vote");
    const auto t = Clock::now();
    // Local copies: nothing in them can be refused, but a device can fail to
    // finish them in time, and post-load processing can fail. Either way the
    // new weights are in place (on that device's rank, maybe in part).
    std::optional<std::string> stuck;
    try {
      if (serves) sink.commit_shadow(options.device_timeout);
    } catch (const std::exception& e) {
      stuck = e.what();
    }
    try {
      agree_on_problem<CommError>(world, stuck, "committing the atomic reload");
    } catch (const std::exception& e) {
      rethrow_with(e,
                   "; atomic reload: every rank had voted to commit, so the ranks whose copies "
                   "did not finish may hold a mix of old and new weights and every other rank "
                   "holds the new ones");
    }
    try {
      run_finish();
    } catch (const std::exception& e) {
      rethrow_with(e, "; atomic reload: every rank had committed the new weights");
    }
    result.seconds.finish += since(t);
  }
  result.seconds.read = stats.read;
  result.seconds.transfer = stats.transfer;
  result.seconds.apply = stats.apply;
  result.seconds.checksum = stats.checksum;
  result.seconds.total = since(start);
  const std::uint64_t read_bytes =
      reader && source ? source->bytes_read() - read_before : streamed_bytes;
  reduce_figures(world, result, stats, read_bytes, sink.processing_staging_bytes());
  if (sharded) {
    const auto n = static_cast<std::size_t>(world.size());
    std::vector<std::int64_t> moved(2 * n, 0);
    moved[static_cast<std::size_t>(world.rank())] = static_cast<std::int64_t>(stats.bytes_sent);
    moved[n + static_cast<std::size_t>(world.rank())] =
        static_cast<std::int64_t>(stats.bytes_received);
    allreduce_ints(world, moved, IntOp::kSum);
    result.bytes_sent_by_rank.assign(moved.begin(), moved.begin() + static_cast<std::ptrdiff_t>(n));
    result.bytes_received_by_rank.assign(moved.begin() + static_cast<std::ptrdiff_t>(n),
                                         moved.end());
  }
  return result;
}

}  // namespace

ReloadResult reload_weights(ReloadTarget& model, Communicator& world, DataTransport& data,
                            WeightSource* source, const ReloadOptions& options,
                            ReloadWorkspace* workspace) {
  return reload_any(model, world, data, Inputs{SourceKind::kSource, source, nullptr, nullptr},
                    options, workspace);
}

ReloadResult reload_weights(ReloadTarget& model, Communicator& world, DataTransport& data,
                            const ShardedSource& held, const ReloadOptions& options,
                            ReloadWorkspace* workspace) {
  return reload_any(model, world, data, Inputs{SourceKind::kSharded, nullptr, &held, nullptr},
                    options, workspace);
}

ReloadResult reload_weights(ReloadTarget& model, Communicator& world, const ShardedSource& held,
                            const ReloadOptions& options, ReloadWorkspace* workspace) {
  const auto data = make_communicator_transport(world);
  return reload_weights(model, world, *data, held, options, workspace);
}

namespace {

// A rank past the serving ranks: the serving model's rules, no parameters.
class SourceOnlyTarget final : public ReloadTarget {
 public:
  SourceOnlyTarget(const ShardingRules& rules, bool lora)
      : rules_(rules), lora_(lora), sink_(rules, ParameterSink::NoParameters{}) {}
  const ShardingRules& rules() const override { return rules_; }
  int tp_rank() const override { return 0; }
  ParameterSink& sink() override { return sink_; }
  bool lora() const override { return lora_; }

 private:
  const ShardingRules& rules_;
  bool lora_;
  ParameterSink sink_;
};

}  // namespace

ReloadResult push_shards(Communicator& world, DataTransport& data, const ShardedSource& held,
                         const ShardingRules& serving_rules, const ReloadOptions& options,
                         ReloadWorkspace* workspace, bool lora) {
  SourceOnlyTarget target(serving_rules, lora);
  return reload_any(target, world, data, Inputs{SourceKind::kSharded, nullptr, &held, nullptr},
                    options, workspace);
}

ReloadResult reload_from_stream(ReloadTarget& model, Communicator& world, DataTransport& data,
                                WeightStream* stream, const ReloadOptions& options,
                                ReloadWorkspace* workspace) {
  return reload_any(model, world, data, Inputs{SourceKind::kStream, nullptr, nullptr, stream},
                    options, workspace);
}

ReloadResult reload_from_stream(ReloadTarget& model, Communicator& world, WeightStream* stream,
                                const ReloadOptions& options, ReloadWorkspace* workspace) {
  const auto data = make_communicator_transport(world);
  return reload_from_stream(model, world, *data, stream, options, workspace);
}

ReloadResult result_for(const ReloadOptions& options) {
  ReloadResult r;
  r.format = options.format;
  r.distribution = detail::effective_distribution(options);
  r.readers = options.readers;
  r.rotated_broadcast_roots = options.rotate_broadcast_roots;
  r.atomic = options.atomic;
  return r;
}

// ------------------------------------------------------------ ReloadableModel

ReloadableModel::ReloadableModel(ReloadTarget& model, WeightLocation location, DataTransport* data)
    : model_(model), location_(std::move(location)), data_(data) {}

ReloadResult ReloadableModel::run(Communicator& world, const ReloadOptions& options,
                                  const std::function<ReloadResult(DataTransport&)>& reload) {
  try {
    std::unique_ptr<DataTransport> own;
    DataTransport* data = data_;
    if (!data) data = (own = make_communicator_transport(world)).get();
    return reload(*data);
  } catch (const std::exception& e) {
    // Weights that changed before the failure: caches derived from them must go.
    ReloadResult failed = result_for(options);
    failed.error = e.what();
    if (!options.atomic || model_.sink().commit_began())
      failed.possibly_mixed = model_.sink().touched_names();
    // An error every rank raised alike leaves every rank here: the callbacks run
    // on every rank when any rank wrote (a callback may be collective itself),
    // each told its own parameters. After an error of this rank alone, here only.
    bool any_wrote = !failed.possibly_mixed.empty();
    // (not with ranks that serve nothing: push_shards has no callbacks to run)
    if (dynamic_cast<const AgreedError*>(&e) && options.serving_ranks == 0) try {
        std::int64_t wrote = any_wrote ? 1 : 0;
        world.allreduce_ints(&wrote, 1, IntOp::kMax);
        any_wrote = wrote != 0;
      } catch (const std::exception& again) {  // (the error to raise stays the first)
        log().error("rank {}: asking whether any rank wrote failed: {}", world.rank(),
                    again.what());
      }
    if (any_wrote) {
      log().warn(
          "reload failed after writing {} parameters of this rank; running {} invalidation "
          "callbacks",
          failed.possibly_mixed.size(), callbacks_.size());
      for (const auto& callback : callbacks_) callback(failed);
    }
    throw;
  }
}

void ReloadableModel::on_reloaded(std::function<void(const ReloadResult&)> callback) {
  callbacks_.push_back(std::move(callback));
}

namespace {

// Stands in for a source the reader rank failed to open, so that the failure
// reaches every rank through the metadata exchange.
class FailedSource final : public WeightSource {
 public:
  explicit FailedSource(std::string error) : error_(std::move(error)) {}
  std::string describe() const override { throw CheckpointError(error_); }
  const std::vector<TensorInfo>& tensors() const override { throw CheckpointError(error_); }
  std::optional<ConstBytes> view(std::size_t, ByteRange) override { throw CheckpointError(error_); }
  void read(std::size_t, ByteRange, MutableBytes) override { throw CheckpointError(error_); }
  std::uint64_t bytes_read() const override { return 0; }
  const std::map<std::string, std::string>& metadata() const override {
    throw CheckpointError(error_);
  }

 private:
  std::string error_;
};

}  // namespace

ReloadResult ReloadableModel::reload(Communicator& world, const ReloadOptions& options,
                                     const std::string& path) {
  const std::string from = path.empty() ? location_.path : path;
  std::unique_ptr<WeightSource> opened;
  // Only the ranks that open the weights need a path (the others may be given
  // none); a rank that has none fails as a rank that cannot open them does,
  // alike on every rank.
  if (opens_source(options, world.rank())) {
    const auto start = Clock::now();
    try {
      if (from.empty())
        raise<UsageError>("rank ", world.rank(),
                          " opens the weights but has none: no path was given and the model "
                          "has no location");
      opened = open_weight_source(from, workspace_.known_listing());
    } catch (const std::exception& e) {  // reaches every rank through the metadata exchange
      opened = std::make_unique<FailedSource>(e.what());
    }
    // (before the reload's own clock: the other ranks wait for it in `prepare`)
    log().debug("opening '{}' took {:.1f} ms", from, since(start) * 1e3);
  }
  ReloadResult result = run(world, options, [&](DataTransport& data) {
    return reload_weights(model_, world, data, opened.get(), options, &workspace_);
  });
  // A partial reload changed some weights (callbacks must still drop derived
  // caches) but does not make `from` the model's location.
  if (from != location_.path && result.complete()) {
    if (!location_.revision.empty() || !location_.remote_uri.empty())
      log().info(
          "weights now come from '{}'; dropping revision '{}' and remote location '{}' "
          "that belonged to '{}'",
          from, location_.revision, location_.remote_uri, location_.path);
    location_ = WeightLocation{from, "", ""};
  }
  for (const auto& callback : callbacks_) callback(result);
  return result;
}

ReloadResult ReloadableModel::reload_from(Communicator& world, const ReloadOptions& options,
                                          WeightSource* source) {
  ReloadResult result = run(world, options, [&](DataTransport& data) {
    return reload_weights(model_, world, data, source, options, &workspace_);
  });
  for (const auto& callback : callbacks_) callback(result);
  return result;
}

ReloadResult ReloadableModel::reload_from(Communicator& world, const ReloadOptions& options,
                                          const ShardedSource& held) {
  ReloadResult result = run(world, options, [&](DataTransport& data) {
    return reload_weights(model_, world, data, held, options, &workspace_);
  });
  for (const auto& callback : callbacks_) callback(result);
  return result;
}

ReloadResult ReloadableModel::reload_from_stream(Communicator& world, const ReloadOptions& options,
                                                 WeightStream* stream) {
  ReloadResult result = run(world, options, [&](DataTransport& data) {
    return tpreload::reload_from_stream(model_, world, data, stream, options, &workspace_);
  });
  for (const auto& callback : callbacks_) callback(result);
  return result;
}

}  // namespace tpreload
