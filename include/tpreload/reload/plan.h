// The reload plan: from the tensor list the reader rank broadcasts and the model's
// sharding rules (identical on every rank), every rank derives the same sequence
// of buckets on its own. No per-tensor round trips, and no rank can branch into a
// collective the others do not make. No torch here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/model/parameter_sink.h"
#include "tpreload/model/row_writes.h"
#include "tpreload/model/sharding.h"

namespace tpreload {

enum class Distribution { kBroadcast, kScatter };

std::string_view distribution_name(Distribution d);

// What the reader rank tells everyone before any weight moves.
struct SourceMetadata {
  std::string description;                 // WeightSource::describe()
  std::vector<TensorInfo> tensors;         // WeightSource::tensors()
  std::optional<KernelFormatInfo> kernel;  // set for kernel-format sources
};

// Serialise / parse for the metadata broadcast. parse throws CommError on a
// malformed payload. The second form serializes a source's listing in place
// (no copy of its tensor list).
std::vector<std::uint8_t> serialize_metadata(const SourceMetadata& metadata);
std::vector<std::uint8_t> serialize_metadata(const std::string& description,
                                             const std::vector<TensorInfo>& tensors,
                                             const std::optional<KernelFormatInfo>& kernel);
SourceMetadata parse_metadata(const std::vector<std::uint8_t>& bytes);

// A 64-bit hash of a listing, field by field (no serialization): what the ranks
// compare to agree that they list the same checkpoint, and what picks a kept plan.
std::uint64_t listing_hash(const std::string& description, const std::vector<TensorInfo>& tensors,
                           const std::optional<KernelFormatInfo>& kernel);
// Whether `metadata` is exactly that listing (every field of every tensor).
bool same_listing(const SourceMetadata& metadata, const std::string& description,
                  const std::vector<TensorInfo>& tensors,
                  const std::optional<KernelFormatInfo>& kernel);

struct PlanOptions {
  WeightFormat format = WeightFormat::kCheckpoint;
  Distribution distribution = Distribution::kScatter;  // for sharded tensors
  std::uint64_t bucket_bytes = std::uint64_t{16} << 20;
  int world_size = 1;
  int tp_size = 1;  // world rank w has tensor-parallel rank w % tp_size
  // Scatter: a replicated tensor whose copies for every rank (its bytes times the
  // world size) come to at most this many bytes joins the scatter buckets, read
  // with the sliced tensors around it in the file, rather than a broadcast bucket
  // where each such tensor is a read of its own (a model's norm weights). 0: every
  // replicated tensor is broadcast.
  std::uint64_t scatter_replicated_bytes = kScatterReplicatedBytes;

  static constexpr std::uint64_t kScatterReplicatedBytes = std::uint64_t{64} << 10;
};

// One checkpoint (or kernel-format) tensor that moves.
struct PlannedTensor {
  std::size_t index = 0;  // into SourceMetadata::tensors
  WeightFormat format = WeightFormat::kCheckpoint;
  bool scatter = false;   // scattered per rank, else broadcast whole
  std::int64_t rows = 0;  // rows of the unit sent: tensor rows, or max slice rows
  std::int64_t layer = -1;
  // Checkpoint format: the placement on each tensor-parallel rank.
  std::vector<Placement> placements;
  // Kernel format: the tensor-parallel rank that holds it and its parameter.
  int owner_tp_rank = 0;
  ParamSlot slot = kNoSlot;
  // Declared shape differs from what the parameter needs: never bucketed (an
  // untrusted shape must not size the plan); preflight reports it.
  bool rejected = false;

  bool kernel() const { return format == WeightFormat::kKernel; }
  // Whether tensor-parallel rank `tp_rank` takes any of it.
  bool held_by(int tp_rank) const {
    return kernel() ? owner_tp_rank == tp_rank : placements.at(tp_rank).held;
  }
  // Rows of the unit tensor-parallel rank `tp_rank` receives (scatter) and bytes
  // per such row.
  std::int64_t rows_for(int tp_rank) const;
  std::uint64_t row_bytes_for(int tp_rank, const TensorInfo& info) const;
};

// Rows [row_begin, row_end) of one planned tensor inside a bucket.
struct Piece {
  std::size_t planned = 0;
  std::int64_t row_begin = 0, row_end = 0;
  bool last = false;                       // the tensor's final piece
  std::uint64_t offset = 0;                // broadcast: offset in the bucket
  std::vector<std::uint64_t> rank_offset;  // scatter: offset inside each world rank's region
};

struct Bucket {
  bool scatter = false;
  std::vector<Piece> pieces;
  std::uint64_t bytes = 0;        // broadcast: bucket size; scatter: root buffer size
  std::vector<ByteRange> ranges;  // scatter: each world rank's region of the root buffer
  std::vector<std::int64_t> finished_layers;  // layers complete after this bucket (in order)
};

struct Plan {
  std::vector<PlannedTensor> tensors;
  std::vector<Bucket> buckets;
  std::vector<std::string> skipped;  // checkpoint names with no parameter
  std::uint64_t largest_bucket = 0;  // staging bytes per buffer, on any rank
};

// Whether `metadata` can be loaded into the model of `rules` in `format`: a
// kernel-format load needs kernel-format shards made for the rules' tp size,
// quantization and expert parallelism, config and dtype; a checkpoint-format
// load a source that is not kernel-format shards. Throws ValidationError naming
// what differs and what to do (make_plan() checks it first; a program can check
// a source it will load later before it starts the first).
void check_source_format(const SourceMetadata& metadata, const ShardingRules& rules,
                         WeightFormat format);

// Build the plan. Throws ValidationError for a source check_source_format()
// refuses, UsageError for bad options.
Plan make_plan(const SourceMetadata& metadata, const ShardingRules& rules,
               const PlanOptions& options);

// Where a write of a direct apply reads: bytes `range` of tensors()[tensor] (its
// rows), and the write's src_offset counts from the tensor's first byte.
struct WriteSource {
  std::size_t tensor = 0;
  ByteRange range;
};

// What one rank does with one bucket once its bytes arrived, resolved when the
// reload is planned: row writes into its parameter slots (source offsets count
// from the start of this rank's view of the bucket: the whole bucket when it is
// broadcast, this rank's region when it is scattered), vocab padding to zero,
// and the shards it completes.
struct BucketApply {
  std::vector<RowWrite> writes;
  // Direct applies only (resolve_direct_applies): writes[i] reads sources[i].
  std::vector<WriteSource> sources;
  std::vector<RowZero> zeros;
  // Shards completed: (slot, shard index), or ParameterSink::kAllShards (kernel format).
  std::vector<std::pair<ParamSlot, std::uint32_t>> completed;
};

// Every bucket of `plan` for world rank `world_rank` (tensor-parallel rank
// world_rank % tp). Rejected tensors are in no bucket. Pure: the apply makes no
// name or map look-ups afterwards.
std::vector<BucketApply> resolve_applies(const Plan& plan, const SourceMetadata& metadata,
                                         const ShardingRules& rules, const PlanOptions& options,
                                         int world_rank);

// The same writes read straight out of the source's tensors instead of a bucket
// buffer (Readers::kAll from a source with views): each write's src_offset
// counts from its tensor's first byte and `sources` says which rows it reads.
std::vector<BucketApply> resolve_direct_applies(const Plan& plan, const SourceMetadata& metadata,
                                                const ShardingRules& rules,
                                                const PlanOptions& options, int world_rank);

}  // namespace tpreload
