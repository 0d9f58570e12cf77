// Sharded sources in a reload (internal): the ranks' boxes gathered, the
// listing and per-bucket transfer plans made from them, the bytes held twice
// compared, and every bucket moved point to point into each rank's view and
// applied. reload.cpp runs these in place of the reader's listing and the
// bucket pipeline; the agreement, preflight, atomic mode, validation and the
// report are the same as for any source. No torch here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipeline.h"
#include "tpreload/reload/sharded_source.h"

namespace tpreload::detail {

// COLLECTIVE (one allreduce, then one broadcast per rank that holds anything).
// Every rank's boxes (no bytes) with its rank, in rank order and each rank's
// own order; `hash` of all of them (what picks a kept plan).
std::vector<HeldBox> gather_held(Communicator& world, const ShardedSource& mine,
                                 std::uint64_t& hash);

// The listing a sharded reload is planned from: each tensor some rank holds,
// once, in the order of its first box (rank order), with its full shape and no
// file. Holders that disagree on a tensor's dtype or shape: ValidationError.
SourceMetadata sharded_metadata(const std::vector<HeldBox>& held, const std::string& description);

// Per world rank, where the boxes of the pieces of scatter bucket `bucket`
// lie in its region: a piece's rows of the rank's slice of the tensor (its
// placement), as a box of the full tensor.
std::vector<std::vector<ViewPart>> bucket_views(const Plan& plan, const SourceMetadata& md,
                                                const Bucket& bucket, int world_size, int tp_size);

// Fills planned.exchanges and planned.views (this rank's; none on a rank that
// serves nothing) for every bucket of planned.plan, and planned.shared: the
// `world_size` ranks hold boxes, world ranks [0, serving) receive their views
// (planned.plan's world). Throws ValidationError naming tensor, range and
// rank for a needed range no rank holds.
void plan_exchanges(CachedPlan& planned, const std::vector<HeldBox>& held, int world_size,
                    int serving, int tp_size, int rank, std::uint64_t piece_bytes);

// COLLECTIVE (two allreduces). This rank's bytes of every region several
// ranks hold, summed (CRC-32C) and compared with the other holders': the
// regions that differ, named with their tensor, range and ranks (the same on
// every rank), else nullopt.
std::optional<std::string> compare_shared(Communicator& world, const CachedPlan& planned,
                                          const ShardedSource& mine);

// COLLECTIVE (data plane, host memory). Every bucket: each rank packs the
// boxes it sends out of what it holds, the ranks exchange them point to point
// (DataTransport::exchange; with checksums each message carries its CRC-32C,
// checked before any of it is unpacked), each rank copies what it holds of its
// own view and unpacks what it received, and applies the bucket. Apply
// failures are returned, a corrupted message reported, as run_pipeline does.
PipelineStats run_exchanges(const CachedPlan& planned, ReloadTarget& model, Communicator& control,
                            DataTransport& data, const ShardedSource& mine,
                            const ReloadOptions& options);

}  // namespace tpreload::detail
