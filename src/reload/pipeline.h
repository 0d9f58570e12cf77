// The bucket pipeline of one reload (internal): the reader rank fills bucket k+1
// on a reader thread while the main thread transfers bucket k and an apply thread
// loads bucket k-1 into the model. Buffers: `depth` slots per rank, each sized for
// the largest bucket this rank sends or receives.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tpreload/comm/communicator.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/plan.h"
#include "tpreload/reload/reload.h"

namespace tpreload::detail {

struct PipelineStats {
  double read = 0, transfer = 0, apply = 0, finish = 0;
  std::uint64_t bytes_sent = 0;         // reader rank
  std::uint64_t bytes_copied = 0;       // reader rank: bytes read or copied into send buffers
  std::uint64_t buffer_bytes = 0;       // staging buffers this rank allocated
  std::optional<std::string> apply_error;  // first apply failure on this rank
};

// A plan a ReloadWorkspace keeps for the next reload (see ReloadWorkspace).
struct CachedPlan {
  std::uint64_t key = 0;  // listing hash, model layout, options, this rank's place
  std::vector<std::uint8_t> listing;  // the reader's serialized metadata (reader only)
  SourceMetadata metadata;
  Plan plan;
};

// COLLECTIVE. Runs every bucket of `plan`. A read failure on the reader rank is
// announced with the bucket it hit and raised as the same CheckpointError on every
// rank; apply failures are returned (for the caller to agree on), never thrown.
PipelineStats run_pipeline(const Plan& plan, const SourceMetadata& metadata,
                           TensorParallelModel& model, Communicator& world, WeightSource* source,
                           const ReloadOptions& options, ReloadWorkspace& workspace);

}  // namespace tpreload::detail
