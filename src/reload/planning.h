// A reload's plan (internal): the listing agreed on, the plan made or taken
// from the workspace, and its preflight, for a source the reader lists
// (plan_reload) or for sharded sources (plan_sharded). reload.cpp runs the
// plan; both functions are COLLECTIVE and raise the same error on every rank
// for a listing that cannot be planned, or any rank's objection to its writes.
// No torch here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipeline.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/sharded_source.h"
#include "tpreload/reload/workspace.h"

namespace tpreload::detail {

// "a, b, c and 9 more": the first `most` names.
std::string name_list(const std::vector<std::string>& names, std::size_t most);

// The distribution buckets are laid out for: scatter when every rank reads
// its own bytes (each rank's region is exactly what it keeps).
Distribution effective_distribution(const ReloadOptions& o);

// Readers::kNode: per world rank, the node (as node_of names it, `own_node`
// this rank's) whose reader serves it: its own, or, for a node where some rank
// could not open the source, the next node in turn whose ranks all could, and
// how many nodes are served. served_by is empty when every node could (nothing
// changes) or when the reader rank's node could not (the reload then fails as
// it would without node readers, naming a node that could read).
struct NodeService {
  std::vector<int> served_by;  // per world rank
  int own_node = -1;           // node_of this rank, where it was asked (some rank failed)
  int nodes_served = 0;
  int reader_could_be = -1;  // the reader rank's node could not read: a rank whose node could
};

// What a plan covers. kWhole: the whole reload (a bucket that completes a
// layer processes it). kSegment: one segment of a stream's tensors, of which
// more may follow: no bucket completes a layer, and a layer the segment
// brings in part is not refused (the caller processes layers as they
// complete).
enum class PlanScope { kWhole, kSegment };

// COLLECTIVE. The metadata and plan every rank uses, and its preflight. The
// reader serializes its listing and broadcasts the listing's hash; when every
// rank's workspace holds a plan made for that hash (and for the same model and
// options), it is used as is. Otherwise the listing is broadcast, each rank
// plans and preflights, and keeps the plan. Errors reach every rank alike:
// CheckpointError when the reader cannot list its source, ValidationError from
// preflight. `host_transport`: the data plane moves host memory (broadcast
// buckets are then checksummed in chains, kept with the plan).
const CachedPlan& plan_reload(Communicator& world, WeightSource* source, const ReloadTarget& model,
                              const ReloadOptions& options, std::int64_t fingerprint,
                              bool host_transport, ReloadWorkspace& workspace, NodeService& service,
                              PlanScope scope = PlanScope::kWhole);

// COLLECTIVE. plan_reload() for sharded sources: the listing is every rank's
// boxes, gathered; the plan scatters every tensor (each rank's view of a
// bucket is its slices of it), and each bucket's transfers say which rank
// sends each box. Kept and reused like any plan, keyed by the boxes' hash.
const CachedPlan& plan_sharded(Communicator& world, const ShardedSource& mine,
                               const ReloadTarget& model, const ReloadOptions& options,
                               std::int64_t fingerprint, ReloadWorkspace& workspace);

// The parameters this rank must fill that the plan gives it nothing (or not
// every shard) for, by name; what --require-complete refuses.
std::optional<std::string> unplanned_problem(const Plan& plan, const ReloadTarget& model,
                                             WeightFormat format, const std::string& description);

}  // namespace tpreload::detail
