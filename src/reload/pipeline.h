// The bucket pipeline of one reload (internal): the reader rank fills bucket k+1
// on a reader thread while the main thread transfers bucket k over the data
// plane and an apply thread writes bucket k-1 into the parameters. Buffers:
// `pipeline_depth` slots per rank, each sized for the largest bucket this rank
// sends or receives, in the memory spaces the transport and the parameters need.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bucket_reader.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/data_transport.h"
#include "tpreload/model/target.h"
#include "tpreload/reload/plan.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/transfer_plan.h"
#include "verify_chains.h"

namespace tpreload::detail {

struct PipelineStats {
  double read = 0, transfer = 0, apply = 0, finish = 0;
  double checksum = 0;               // computing (reader) and verifying (receivers) bucket CRC-32Cs
  std::uint64_t bytes_sent = 0;      // reader rank (sharded sources: every rank)
  std::uint64_t bytes_received = 0;  // sharded sources: from other ranks
  std::uint64_t bytes_copied = 0;    // reader rank: as ReloadResult::bytes_copied_on_reader
  StagingBytes staging;              // staging buffers this rank used, per memory space
  std::optional<std::string> apply_error;  // first apply failure on this rank
  std::optional<std::string> corrupted;    // a bucket that failed its checksum here
  bool device_stuck = false;  // device work timed out: its staging buffers are abandoned
  // Buffer slots this rank ran with; 0 for none (Readers::kAll with parameters in
  // host memory: each write read straight into its parameter, one bucket after
  // another, with no staging).
  int depth = 0;
};

// Where a box of checkpoint tensor `name` lies in one rank's view of a bucket
// (its scatter region): `bytes` from `offset`, the box's elements row-major.
struct ViewPart {
  std::string name;
  Box box;
  std::uint64_t offset = 0, bytes = 0;
};

// A region of checkpoint tensor `name` that several ranks hold.
struct SharedRegion {
  std::string name;
  Box box;
  std::vector<int> ranks;
};

// A plan a ReloadWorkspace keeps for the next reload (see ReloadWorkspace).
struct CachedPlan {
  std::uint64_t key = 0;          // listing hash, model layout, options, this rank's place
  std::int64_t listing_hash = 0;  // of `metadata` (63 bits), what the reader broadcast
  SourceMetadata metadata;
  // On a rank that opened the source: the source's own listing, equal to
  // `metadata`'s (WeightSource::known_listing(); null for sources without one).
  std::shared_ptr<const KnownListing> known;
  Plan plan;
  std::vector<BucketApply> applies;  // this rank's writes, per bucket
  // Readers::kAll: the same writes straight out of the source's tensors, for a
  // source with views and parameters in host memory (no bucket buffer at all).
  std::vector<BucketApply> direct_applies;
  // Per bucket, on a rank that may read for others (the reader rank; any rank
  // with Readers::kNode), this rank's writes it reads straight into its
  // parameters when it reads a scatter bucket with host parameters.
  std::vector<DirectReads> own;
  // With checksums, per bucket (broadcast ones; empty for scatter): which of
  // its bytes each tp rank reads, as the reader sums them (verify_chains.h);
  // the chains this rank's writes read, which it verifies; and the chains any
  // rank verifies, which the reader sums (the same on every rank).
  std::vector<ChainLayout> chains;
  std::vector<std::vector<char>> chains_read, chains_checked;
  // Sharded sources (sharded.h): per bucket, what moves between the ranks and
  // where each box lies in this rank's view; and the regions several ranks
  // hold, whose bytes are compared before every reload.
  std::vector<TransferPlan> exchanges;
  std::vector<std::vector<ViewPart>> views;
  std::vector<SharedRegion> shared;
};

// Readers::kNode: this rank's node, as a control communicator and a data
// transport of its own (ranks in node order, the node's reader first), kept in
// a ReloadWorkspace while it was made for the same planes and grouping.
struct NodePlanes {
  // What it was made for: the world and the data plane (the transport object,
  // except for a transport over the control plane's own collectives, which
  // reload_weights() without one makes anew for every call).
  const Communicator* world = nullptr;
  const DataTransport* data = nullptr;  // null for a control-plane transport
  std::string data_backend;             // (tells control-plane transports of other backends apart)
  int ranks_per_node = 0, reader_rank = 0;
  // Per world rank, the node whose reader serves it when some node cannot read
  // the files (its ranks then join that reader's group); empty when every node reads.
  std::vector<int> served_by;
  std::unique_ptr<Communicator> control;  // (declared first: outlives `transport`)
  std::unique_ptr<DataTransport> transport;
  std::vector<int> members;  // world ranks, in node order
  std::vector<int> readers;  // every node's reader (world ranks, ascending)
  std::uint64_t serial = 0;  // which making of planes in this process (tests tell them apart)
};

// COLLECTIVE (control and data). Runs every bucket of `planned`. A read failure
// on the reader rank is announced with the bucket it hit and raised as the same
// CheckpointError on every rank (Readers::kNode, kAll: once every rank has run
// what it could, the lowest failing rank's); a transfer failure throws from the
// transport; apply failures are returned (for the caller to agree on), never
// thrown. `node` (Readers::kNode only) carries the node's transfers.
// Calls options.progress (which must be set) with `buckets_done` of `plan`'s
// buckets done; false when it threw (logged; the caller calls it no more).
bool report_progress(const ReloadOptions& options, const Plan& plan, std::size_t buckets_done,
                     bool finished, double seconds);

// The end of applying a bucket whose writes were issued (`start`: when its
// apply began): the padding rows zeroed, the writes waited for, the shards it
// completes marked loaded, the layers it completes processed and (except in
// an atomic reload, whose commit does it) finished. Adds to stats.apply and
// stats.finish.
void complete_bucket(ReloadTarget& model, const Bucket& bucket, const BucketApply& a,
                     const ReloadOptions& options, PipelineStats& stats,
                     std::chrono::steady_clock::time_point start);

PipelineStats run_pipeline(const CachedPlan& planned, ReloadTarget& model, Communicator& control,
                           DataTransport& data, WeightSource* source, const ReloadOptions& options,
                           ReloadWorkspace& workspace, NodePlanes* node = nullptr);

}  // namespace tpreload::detail
