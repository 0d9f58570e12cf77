// The distributed in-place reload: the native counterpart of vLLM's
// reload_weights(vllm_config, model, weights_iterator, weights_path,
// is_checkpoint_format) and get_parameter_for_reload(model, name).
//
// COLLECTIVE: every rank of `world` calls reload_weights() with the same options
// and request (a WeightSource is needed on the reader rank only). The reader rank
// lists the source and broadcasts the tensor list; every rank derives the same
// plan; a preflight checks every planned tensor against every rank's parameters
// before the first byte is written (all ranks raise the same ValidationError if
// any rank objects); buckets then flow through a pipeline that overlaps reading,
// transferring and applying; finally an allreduce of loaded-name bitsets finds
// names no rank or only some ranks loaded.
//
// World = replicas x tp: world rank w holds tensor-parallel rank w % tp of
// replica w / tp, and every replica receives the weights.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tpreload/model/model.h"
#include "tpreload/reload/plan.h"

namespace tpreload {

class Communicator;
class WeightSource;

struct ReloadOptions {
  ReloadFormat format = ReloadFormat::kCheckpoint;
  // Defaults chosen by scripts/sweep.sh (docs/PERFORMANCE.md, "Defaults"): on the
  // 2-core reference machine scatter with 16 MiB buckets and one buffer in flight
  // was fastest; sweep again on a machine with cores to spare for the pipeline.
  Distribution distribution = Distribution::kScatter;
  std::uint64_t bucket_bytes = std::uint64_t{16} << 20;
  int pipeline_depth = 1;   // buffers per rank in flight (>= 1)
  int reader_rank = 0;      // world rank that opens and reads the source
  // Broadcast a bucket straight from a memory-mapped source when it is one run of
  // the file. Off by default: a checkpoint opened for this reload is a fresh
  // mapping, and faulting it in page by page cost more than reading it into the
  // send buffer (2.7x the reload time for 2.2 GB; docs/PERFORMANCE.md).
  bool zero_copy = false;
  // The reader rank aborts the job when filling one bucket takes longer (a hung
  // file system); peers would otherwise wait on it forever.
  std::chrono::seconds read_stall_timeout{300};
};

namespace detail {
struct CachedPlan;
}

// What a reload keeps for the next one:
//  - staging buffers, so that a reload does not pay for fresh pages (first-touch
//    faults made a 10 MB bucket 10x slower than the transport); at most
//    pipeline_depth x (send + receive) buckets;
//  - the last plan: the tensor list, the buckets and the preflight verdict. The
//    next reload reuses it when every rank holds a plan for the same listing (a
//    64-bit hash of the reader's serialized metadata, the model layout and the
//    options), which spares a checkpoint of 20,000 small tensors its per-reload
//    metadata exchange, planning and preflight.
// release() frees both. Not thread-safe: one reload at a time per workspace.
class ReloadWorkspace {
 public:
  ReloadWorkspace();
  ~ReloadWorkspace();
  ReloadWorkspace(ReloadWorkspace&&) noexcept;
  ReloadWorkspace& operator=(ReloadWorkspace&&) noexcept;

  std::uint64_t bytes() const;
  void release();

  // A buffer of at least `size` bytes for slot `index` (0 = send, 1 = receive per
  // slot); grows, never shrinks, until release().
  std::byte* buffer(std::size_t index, std::uint64_t size);

  // The plan kept by the last reload (null when none); replaced by keep_plan().
  // Its key (0 when none) names the listing, model and options it was made for.
  const detail::CachedPlan* cached_plan() const { return plan_.get(); }
  std::uint64_t cached_plan_key() const;
  void keep_plan(std::unique_ptr<detail::CachedPlan> plan);

 private:
  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    std::uint64_t size = 0;
  };
  std::vector<Buffer> buffers_;
  std::unique_ptr<detail::CachedPlan> plan_;
};

struct PhaseSeconds {
  double total = 0, read = 0, transfer = 0, apply = 0, finish = 0, validate = 0;
};

struct ReloadResult {
  std::string source;                      // the source's description
  ReloadFormat format = ReloadFormat::kCheckpoint;
  Distribution distribution = Distribution::kBroadcast;
  std::vector<std::string> loaded;         // expected names this rank loaded
  std::vector<std::string> not_loaded_on_all_ranks;
  std::map<std::string, std::vector<int>> not_loaded_on_some_ranks;  // name -> ranks missing it
  std::vector<std::string> skipped;        // source names with no parameter
  std::uint64_t bytes_read = 0;            // by the reader rank
  std::uint64_t bytes_transferred = 0;     // bytes the reader rank sent
  std::uint64_t bytes_copied_on_reader = 0;  // bytes the reader read or copied into send buffers
  std::uint64_t peak_staging_bytes = 0;    // max over ranks: bucket buffers (send + receive)
  std::size_t buckets = 0;
  PhaseSeconds seconds;                    // max over ranks

  bool complete() const {
    return not_loaded_on_all_ranks.empty() && not_loaded_on_some_ranks.empty();
  }
};

// Reload `model` in place. `source` must be non-null on options.reader_rank and
// is ignored elsewhere. Throws, on every rank alike: UsageError (ranks disagree
// on the model or options), ValidationError (preflight, wrong source kind; no
// weight was written), CheckpointError (the source cannot be opened, or a read
// failed mid-way: earlier buckets were already written), ModelError (applying or
// post-processing failed). A failed or stalled collective aborts the job (see
// CommOptions::abort_on_failure). Names that did not load are not an error: they
// are in the result (complete() is false).
// `workspace` (optional) keeps staging buffers for the next reload.
ReloadResult reload_weights(TensorParallelModel& model, Communicator& world,
                            WeightSource* source, const ReloadOptions& options,
                            ReloadWorkspace* workspace = nullptr);

// Where the model's weights come from, as the serving config records it.
struct WeightLocation {
  std::string path;        // checkpoint directory or file
  std::string revision;    // e.g. a hub revision; belongs to `path`
  std::string remote_uri;  // a remote weights location; belongs to `path`
};

// A served model with its weight location and the caches derived from its
// weights. The seed's semantics: reload from an in-memory source, else from a
// given path, else from the model's own path; after a reload from a new path
// that path becomes the model's path, and settings that belonged to the old
// location (revision, remote_uri) are dropped.
class ReloadableModel {
 public:
  ReloadableModel(TensorParallelModel& model, WeightLocation location);

  TensorParallelModel& model() { return model_; }
  // Staging kept between reloads (bounded by pipeline depth x bucket size).
  ReloadWorkspace& workspace() { return workspace_; }
  const WeightLocation& location() const { return location_; }

  // Run after every successful reload, in registration order (e.g. to drop LoRA,
  // encoder or multimodal caches built from the old weights).
  void on_reloaded(std::function<void(const ReloadResult&)> callback);

  // COLLECTIVE. Reload from the model's current location, or from `path` (which
  // then becomes the model's location). Kernel format needs a kernel-format
  // directory (ValidationError otherwise, on every rank).
  ReloadResult reload(Communicator& world, const ReloadOptions& options,
                      const std::string& path = "");

  // COLLECTIVE. Reload from tensors handed over in memory (vLLM's
  // weights_iterator): `source` on the reader rank, nullptr on the others. The
  // model's location does not change.
  ReloadResult reload_from(Communicator& world, const ReloadOptions& options,
                           WeightSource* source);

 private:
  TensorParallelModel& model_;
  WeightLocation location_;
  ReloadWorkspace workspace_;
  std::vector<std::function<void(const ReloadResult&)>> callbacks_;
};

}  // namespace tpreload
