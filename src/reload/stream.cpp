#include "stream.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <set>
#include <utility>

#include "clock.h"
#include "planning.h"
#include "sync.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/model/sharding.h"

namespace tpreload::detail {
namespace {

// The reader's next segment of `stream`: tensors until `budget` bytes are
// held (the one that crosses it included), none at its end. Throws
// CheckpointError for a tensor that came before (per tp rank in kernel
// format).
std::vector<InMemoryTensor> take_segment(WeightStream& stream, std::uint64_t budget,
                                         std::set<std::pair<int, std::string>>& seen) {
  std::vector<InMemoryTensor> segment;
  std::uint64_t held = 0;
  while (held < budget) {
    std::optional<InMemoryTensor> t = stream.next();
    if (!t) break;
    if (!seen.emplace(t->tp_rank, t->name).second)
      raise<CheckpointError>("tensor '", t->name, "'",
                             t->tp_rank >= 0 ? detail::concat(" of tp rank ", t->tp_rank) : "",
                             " comes a second time");
    held += t->bytes.size;
    segment.push_back(std::move(*t));
  }
  return segment;
}

// This rank's objection to a segment that fills a shard an earlier segment
// filled (the same parameter given again under another spelling that resolves
// to it: ".base_layer.", ".experts.routed_experts."), as a kernel-format
// source naming a parameter twice is refused (within a segment, the plan's
// preflight judges as for any source). `given` (each shard's tensor so far, ""
// for none) gains the segment's shards: it holds a name per shard the stream
// has filled on this rank (Kimi-K2 at tp 8: about 70,000 names a rank with
// its experts split, 9,400 with them whole).
std::optional<std::string> given_again_problem(const CachedPlan& planned, const ReloadTarget& model,
                                               std::vector<std::vector<std::string>>& given) {
  const auto& params = model.rules().params();
  const int tp_rank = model.tp_rank();
  if (given.empty()) given.resize(params.size());
  struct Fill {
    ParamSlot slot;
    std::size_t shard;
    const std::string* name;
  };
  std::vector<Fill> fills;
  for (const PlannedTensor& t : planned.plan.tensors) {
    if (!t.held_by(tp_rank)) continue;
    const ParamSlot slot = t.kernel() ? t.slot : t.placements[tp_rank].slot;
    if (slot == kNoSlot) continue;
    const std::size_t shards = params[slot].shards;
    std::size_t first = 0, end = shards;  // (a kernel-format tensor fills every shard)
    if (!t.kernel()) end = (first = t.placements[tp_rank].shard) + 1;
    std::vector<std::string>& names = given[slot];
    if (names.empty()) names.resize(shards);
    const std::string& name = planned.metadata.tensors[t.index].name;
    for (std::size_t k = first; k < end && k < shards; ++k) {
      if (!names[k].empty())
        return detail::concat("parameter '", params[slot].name, "' of tp rank ", tp_rank,
                              !t.kernel() && shards > 1 ? detail::concat(" (shard ", k, ")") : "",
                              " is given twice: as '", names[k],
                              "' in an earlier segment of the stream and as '", name, "'");
      fills.push_back({slot, k, &name});
    }
  }
  for (const Fill& f : fills) given[f.slot][f.shard] = *f.name;
  return std::nullopt;
}

void add(PipelineStats& total, const PipelineStats& s) {
  total.read += s.read;
  total.transfer += s.transfer;
  total.apply += s.apply;
  total.finish += s.finish;
  total.checksum += s.checksum;
  total.bytes_sent += s.bytes_sent;
  total.bytes_received += s.bytes_received;
  total.bytes_copied += s.bytes_copied;
  total.staging.host = std::max(total.staging.host, s.staging.host);
  total.staging.pinned = std::max(total.staging.pinned, s.staging.pinned);
  total.staging.device = std::max(total.staging.device, s.staging.device);
  total.depth = std::max(total.depth, s.depth);
  total.device_stuck = total.device_stuck || s.device_stuck;
}

// The progress of a segment's pipeline as the stream's: its buckets after
// those of the segments before; `finished` only once the stream has ended.
struct StreamProgress {
  const ReloadOptions& options;
  Clock::time_point start;
  ReloadProgress before;  // the segments so far
  bool gone = false;      // the callback threw: not called again in this reload

  void report(ReloadProgress p, bool finished) {
    if (!options.progress || gone) return;
    if (p.finished && !finished) return;  // (a segment's last call repeats its last bucket's)
    p.buckets_done += before.buckets_done;
    p.buckets_total += before.buckets_done;
    p.bytes_done += before.bytes_done;
    p.bytes_total += before.bytes_done;
    p.seconds = since(start);
    p.finished = finished;
    try {
      options.progress(p);
    } catch (...) {
      gone = true;
      throw;  // (the pipeline logs it)
    }
  }
};

}  // namespace

std::uint64_t stream_segment_bytes(const ReloadOptions& options) {
  const auto depth = static_cast<std::uint64_t>(std::max(options.pipeline_depth, 1));
  const std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  if (options.bucket_bytes > most / (kBucketsPerSegment * depth)) return most;  // (no overflow)
  return kBucketsPerSegment * options.bucket_bytes * depth;
}

StreamRun run_stream(Communicator& world, DataTransport& data, WeightStream* stream,
                     ReloadTarget& model, const ReloadOptions& options, std::int64_t fingerprint,
                     ReloadWorkspace& workspace) {
  const bool reader = world.rank() == options.reader_rank;
  const bool checkpoint = options.format == WeightFormat::kCheckpoint;
  ParameterSink& sink = model.sink();
  std::vector<std::int64_t> layers;  // every decoder layer, ascending
  for (const ParamSpec& p : model.rules().params())
    if (p.layer >= 0) layers.push_back(p.layer);
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  std::vector<bool> done(layers.size(), false);
  // A layer complete: processed, finished (unless atomic), recorded.
  StreamRun run;
  auto complete = [&](std::size_t i) {
    const auto t = Clock::now();
    if (checkpoint) sink.process_layer(layers[i], model.tp_rank());
    run.stats.apply += since(t);
    if (!options.atomic) {
      const auto f = Clock::now();
      model.finish_layer(layers[i]);
      run.stats.finish += since(f);
    }
    run.finished_layers.push_back(layers[i]);
    done[i] = true;
  };
  // COLLECTIVE. Every layer not yet complete that this reload brought as
  // `brought` says; a failure on any rank fails every rank.
  auto complete_layers = [&](Brought brought, const char* what) {
    std::optional<std::string> problem;
    try {
      for (std::size_t i = 0; i < layers.size(); ++i)
        if (!done[i] && sink.layer_brought(layers[i], options.format) == brought) complete(i);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    agree_on_problem<ModelError>(world, problem, what);
  };

  StreamProgress progress{options, Clock::now(), {}};
  ReloadOptions segment_options = options;
  if (options.progress)
    segment_options.progress = [&progress](const ReloadProgress& p) { progress.report(p, false); };
  std::set<std::pair<int, std::string>> seen;   // (the reader's)
  std::vector<std::vector<std::string>> given;  // (this rank's shards: given_again_problem)
  const std::uint64_t budget = stream_segment_bytes(options);
  for (;;) {
    std::optional<std::string> problem;
    std::unique_ptr<WeightSource> source, view;
    // (whether the reader took tensors, and its segment size, which its
    // pipeline depth sets: the size every rank reports)
    std::uint64_t more[2] = {0, budget};
    if (reader) try {
        if (!stream)
          raise<UsageError>("no weight stream was given to the reader rank ", world.rank());
        std::vector<InMemoryTensor> segment = take_segment(*stream, budget, seen);
        more[0] = segment.empty() ? 0 : 1;
        if (more[0]) source = make_in_memory_source(std::move(segment), stream->kernel_format());
      } catch (const std::exception& e) {
        std::string what = "the weight stream";
        try {
          if (stream) what = stream->describe();
        } catch (...) {  // (a caller's stream may throw anything)
        }
        problem = detail::concat(what, ": ", e.what());
      }
    agree_on_problem<CheckpointError>(world, problem, "taking the weight stream's next tensors");
    world.broadcast(MutableBytes(more, sizeof more), options.reader_rank);
    run.segment_bytes = more[1];
    if (!more[0]) break;
    WeightSource* from = source.get();
    if (from && checkpoint) try {  // (stacked tensors, as the loaders take them)
        view = loader_view(*from, model.rules().config());
        if (view) from = view.get();
      } catch (const std::exception& e) {
        problem = e.what();
      }
    agree_on_problem<CheckpointError>(world, problem, "reading the weight stream's tensors");
    NodeService service;
    const CachedPlan& planned =
        plan_reload(world, from, model, segment_options, fingerprint,
                    data.memory() != MemoryKind::kDevice, workspace, service, PlanScope::kSegment);
    try {
      problem = given_again_problem(planned, model, given);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    agree_on_problem<CheckpointError>(world, problem, "checking the weight stream's next tensors");
    const PipelineStats s =
        run_pipeline(planned, model, world, data, from, segment_options, workspace, nullptr);
    add(run.stats, s);
    agree_on_problem<CommError>(world, s.corrupted, "verifying the transferred bytes");
    agree_on_problem<ModelError>(world, s.apply_error, "applying weights");
    ++run.segments;
    run.tensors += planned.metadata.tensors.size();
    run.buckets += planned.plan.buckets.size();
    run.skipped.insert(run.skipped.end(), planned.plan.skipped.begin(), planned.plan.skipped.end());
    if (source) run.bytes_read += source->bytes_read();
    for (const Bucket& b : planned.plan.buckets) progress.before.bytes_done += b.bytes;
    progress.before.buckets_done += planned.plan.buckets.size();
    complete_layers(Brought::kAll, "processing the layers the stream completed");
    log().debug("weight stream: segment {} ({} tensors, {} buckets) applied", run.segments,
                planned.metadata.tensors.size(), planned.plan.buckets.size());
  }
  // The layers this reload brought in part: processed as a whole load would
  // process them (which refuses what cannot be processed in part).
  complete_layers(Brought::kPart, "processing the layers the stream brought in part");
  std::sort(run.skipped.begin(), run.skipped.end());
  if (reader) try {
      progress.report(ReloadProgress{}, true);
    } catch (const std::exception& e) {
      log().warn("the progress callback threw ({}); it is not called again in this reload",
                 e.what());
    } catch (...) {
      log().warn("the progress callback threw; it is not called again in this reload");
    }
  return run;
}

}  // namespace tpreload::detail
