// The distributed in-place reload: the native counterpart of vLLM's
// reload_weights(vllm_config, model, weights_iterator, weights_path,
// is_checkpoint_format) and get_parameter_for_reload(model, name).
//
// COLLECTIVE: every rank of `world` calls reload_weights() with the same options
// and request (a WeightSource is needed on the reader rank only, or on every
// rank with Readers::kAll). The reader rank
// lists the source and broadcasts the tensor list; every rank derives the same
// plan and resolves, once, which rows of which parameter slot each bucket fills;
// a preflight checks every planned tensor against every rank's parameters before
// the first byte is written (all ranks raise the same ValidationError if any rank
// objects); buckets then flow through a pipeline that overlaps reading,
// transferring and applying; finally an allreduce of loaded-name bitsets finds
// names no rank or only some ranks loaded.
//
// Two planes. The control plane (a Communicator on host memory: the listing,
// read status, agreement, preflight verdicts, validation) and the data plane (a
// DataTransport moving bucket bytes in its memory space: MPI on host buffers,
// NCCL on device buffers). Parameters live where the model's ParameterSink says
// (host or device memory); staging follows:
//   parameters | transport | the reader reads into  | ranks receive into | apply reads
//   host       | host      | host buffer (pageable) | host               | host
//   device     | host      | pinned host            | pinned host        | device copy of its view
//   device     | device    | pinned host -> device  | device             | device
//
// World = replicas x tp: world rank w holds tensor-parallel rank w % tp of
// replica w / tp, and every replica receives the weights.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpreload/model/config.h"

#include "tpreload/model/target.h"
#include "tpreload/reload/plan.h"
#include "tpreload/reload/workspace.h"

namespace tpreload {

class Communicator;
class DataTransport;
class WeightSource;
class WeightStream;
class ShardedSource;

// How far a reload has come, on the reader rank (see ReloadOptions::progress).
struct ReloadProgress {
  std::uint64_t bytes_done = 0, bytes_total = 0;  // bucket bytes sent / to send
  std::size_t buckets_done = 0, buckets_total = 0;
  double seconds = 0;     // since the transfers began
  bool finished = false;  // the last call of a reload
};

// Who reads the checkpoint.
//   kOne: the reader rank reads every byte and sends each rank its part over the
//         data plane (the only choice when one host sees the files).
//   kAll: every rank opens the same checkpoint and reads exactly its own slices
//         (one preadv per run of them); nothing moves over the data plane and
//         no transfer is checksummed. The reader rank still lists the source for
//         everyone, every rank checks that its own listing is the same, and
//         preflight and validation run as for kOne. Buckets are laid out as for
//         scatter whatever `distribution` says (each rank reads no byte it does
//         not keep). For nodes that all see the files, and a warm page cache.
//   kNode: one reader per node (ranks that share memory: MPI_COMM_TYPE_SHARED,
//         or ReloadOptions::ranks_per_node), the node's lowest rank (the reader
//         rank on its own node); it reads what the ranks of its node need and
//         scatters or broadcasts it to them over a data transport of the node
//         (DataTransport::split), so that no byte is read twice on a node and
//         none crosses nodes. Each rank passes a source, as for kAll (only the
//         node readers read from theirs); the reader rank lists it for everyone
//         and every rank checks its listing. A node where some rank cannot open
//         the source (no source, or one that cannot list) is served by the next
//         node in turn whose ranks all could: its ranks join that node's group
//         and transport, and only their bytes cross nodes (a warning names
//         them). The reader rank's own node must read (else the reload fails on
//         every rank, as for kOne).
//         On one node it reads and sends as kOne does (every rank still
//         opens the checkpoint, and the node's planes are split once). With
//         ReloadOptions::rotate_broadcast_roots the node readers take turns
//         reading broadcast buckets for the whole world instead.
enum class Readers { kOne, kAll, kNode };

std::string_view readers_name(Readers r);
// "one", "node", "all" (nullopt for another name).
std::optional<Readers> parse_readers(std::string_view name);

struct ReloadOptions;
// Whether world rank `rank` must pass a WeightSource to reload_weights(): the
// reader rank, or every rank when more than one reads.
bool opens_source(const ReloadOptions& options, int rank);
// COLLECTIVE when options.ranks_per_node is 0. Readers::kNode's grouping: the
// lowest world rank of this rank's node (Communicator::node_leader(), or the
// first rank of its block of ranks_per_node).
int node_of(Communicator& world, const ReloadOptions& options);

// The pipeline depth that ReloadOptions::pipeline_depth 0 chooses for a rank
// that may run on `usable_cores` cores (its CPU affinity) of a host with
// `host_cores` online cores shared by `ranks_on_host` ranks: 2 when its share,
// the smaller of the two counts (usable, host / ranks), is at least 2 cores,
// else 1. Counts below 1 count as 1.
int auto_pipeline_depth(int usable_cores, int host_cores, int ranks_on_host);

struct ReloadOptions {
  WeightFormat format = WeightFormat::kCheckpoint;
  // Defaults chosen by scripts/sweep.sh (docs/PERFORMANCE.md, "Defaults"): on the
  // 2-core reference machines scatter with 8 MiB buckets was fastest, and one
  // buffer in flight wherever ranks share cores (the depth is chosen per rank);
  // sweep again on a machine with cores to spare for the pipeline.
  Distribution distribution = Distribution::kScatter;
  std::uint64_t bucket_bytes = std::uint64_t{8} << 20;
  // Scatter: replicated tensors whose copies for the whole world come to at most
  // this many bytes (norm weights) travel in the scatter buckets, each rank
  // receiving its copy, so that the reader reads them with the sliced tensors
  // around them in the file instead of one read each (PlanOptions); 0 broadcasts
  // every replicated tensor.
  std::uint64_t scatter_replicated_bytes = PlanOptions::kScatterReplicatedBytes;
  // Buffers per rank in flight. With 1 a bucket is read, moved and applied
  // before the next one is read; with 2 the read of bucket k+1, the transfer of
  // k and the apply of k-1 overlap on three threads. 0 (the default) chooses per
  // rank (auto_pipeline_depth): 2 where the rank has two cores of its own, else
  // 1 (on shared cores the threads only compete: docs/PERFORMANCE.md, "Defaults").
  int pipeline_depth = 0;
  int reader_rank = 0;  // world rank that opens and reads the source (kOne)
  // Who reads the checkpoint (see Readers): the reader rank alone, one rank per
  // node, or every rank its own slices (with kNode and kAll each rank needs a
  // source of the same files: opens_source()).
  Readers readers = Readers::kOne;
  // Readers::kNode: ranks per node, world ranks [k * n, (k + 1) * n) forming
  // node k; 0 (the default) asks the communicator which ranks share memory.
  int ranks_per_node = 0;
  // Readers::kNode only: each broadcast bucket is read by one node reader, in
  // turn (the k-th broadcast bucket by the (k mod nodes)-th node's reader, nodes
  // in world order), and broadcast from it to every rank of the world, so that
  // each node reader reads a share of the broadcast bytes instead of all of
  // them; scatter buckets stay within their node. For storage that throttles
  // per client; the bytes then cross between nodes. Off: every node's reader
  // reads every broadcast bucket for its own node.
  bool rotate_broadcast_roots = false;
  // Broadcast a bucket straight from a memory-mapped source when it is one run of
  // the file. Off by default: a checkpoint opened for this reload is a fresh
  // mapping, and faulting it in page by page cost more than reading it into the
  // send buffer (2.7x the reload time for 2.2 GB; docs/PERFORMANCE.md).
  bool zero_copy = false;
  // The reader rank aborts the job when filling one bucket takes longer (a hung
  // file system); peers would otherwise wait on it forever.
  std::chrono::seconds read_stall_timeout{300};
  // Longest wait for device work (a staging copy, a bucket's writes) before the
  // reload fails with CommTimeoutError naming the device.
  std::chrono::milliseconds device_timeout{std::chrono::minutes(5)};
  // Called on the reader rank, on the reloading thread, after each bucket's
  // transfer (and once more, finished, after the last). Must be quick; if it
  // throws, the error is logged and it is not called again in that reload
  // (which goes on). Null for none.
  std::function<void(const ReloadProgress&)> progress;
  // All or nothing: every rank receives its whole shard into a second copy of
  // its parameters (in the parameters' memory: host, or the device), the ranks
  // agree that every rank has it, and only then is it copied over the
  // parameters. A failure before that leaves every parameter on every rank as it
  // was. Costs that second copy (ParameterSink::total_bytes() per rank) and one
  // local copy pass; refused on every rank, before any transfer, when a rank
  // cannot allocate it. Post-load processing (ReloadTarget::finish) runs after
  // the commit.
  bool atomic = false;
  // Refuse, in preflight and before any write, a source that lacks a parameter
  // some rank needs (naming them); by default such names are reported
  // (ReloadResult::not_loaded_*) and the reload goes on, as vLLM's does.
  bool require_complete = false;
  // The reader sends the CRC-32C of what each rank receives of every bucket, and
  // every receiver checks its bytes against it before applying any of them: a
  // mismatch fails the reload (CommError naming the bucket, its tensors and the
  // rank) with nothing of that bucket written. Nothing is summed where nothing
  // is sent: a world of one rank, the reader's own share, Readers::kAll.
  bool checksums = true;
  // When the world holds several replicas (world size > tp size), the ranks that
  // hold the same tp rank compare a CRC-32C of every parameter after the reload;
  // a difference fails the reload on every rank (ValidationError naming the
  // parameters and ranks). One read pass over each rank's parameters.
  bool compare_replicas = true;
  // Sharded sources: the world ranks that serve the model, [0, serving_ranks)
  // (replicas x tp). The ranks from serving_ranks on hold no parameters: they
  // only send the boxes they hold (push_shards), as a trainer's ranks placed
  // after the serving ranks in one MPI job do. 0: every rank serves.
  int serving_ranks = 0;
};

struct PhaseSeconds {
  double total = 0, read = 0, transfer = 0, apply = 0, finish = 0, validate = 0;
  double checksum = 0;  // bucket CRC-32Cs: computed by the reader, verified by receivers
  // Before the first bucket: the ranks' agreement on the options, the listing
  // shared, the plan made (or reused), the atomic mode's second copy.
  double prepare = 0;
};

// Staging bytes per memory space (buffers of the pipeline, not parameters).
struct StagingBytes {
  std::uint64_t host = 0, pinned = 0, device = 0;
  std::uint64_t total() const { return host + pinned + device; }
};

struct ReloadResult {
  std::string source;  // the source's description
  WeightFormat format = WeightFormat::kCheckpoint;
  Distribution distribution = Distribution::kBroadcast;
  Readers readers = Readers::kOne;
  bool rotated_broadcast_roots = false;  // ReloadOptions::rotate_broadcast_roots was set
  // Buffers in flight on this rank (chosen when the option was 0); 0 where it
  // ran no pipeline: with Readers::kAll and parameters in host memory each write
  // is read straight into its parameter.
  int pipeline_depth = 0;
  int nodes_served = 0;  // Readers::kNode: nodes that could not read, served by another's reader
  std::vector<std::string> loaded;  // expected names this rank loaded
  std::vector<std::string> not_loaded_on_all_ranks;
  std::map<std::string, std::vector<int>> not_loaded_on_some_ranks;  // name -> ranks missing it
  std::vector<std::string> skipped;     // source names with no parameter
  std::uint64_t bytes_read = 0;         // by the reader rank (kNode, kAll: the most any rank read)
  std::uint64_t bytes_transferred = 0;  // bytes the reader rank sent (kNode: the most a node's
                                        // reader sent to the other ranks of its node)
  // bytes the reader read or copied into send buffers (its own scatter rows: into its parameters)
  std::uint64_t bytes_copied_on_reader = 0;
  // Sharded sources: the bytes each world rank sent to and received from the
  // others (messages with their checksums); empty for other sources.
  std::vector<std::uint64_t> bytes_sent_by_rank, bytes_received_by_rank;
  std::uint64_t peak_staging_bytes = 0;  // max over ranks of staging.total()
  StagingBytes staging;                  // per memory space, each the max over ranks
  // Held by the parameters' sink for FP8 processing (ParameterSink::
  // processing_staging_bytes), the max over ranks: not in peak_staging_bytes.
  std::uint64_t processing_staging_bytes = 0;
  std::string transport;         // the data plane's backend ("mpi", "nccl", ...)
  std::string parameter_memory;  // "host" or the device's description
  std::size_t buckets = 0;
  PhaseSeconds seconds;  // max over ranks

  bool atomic = false;  // ReloadOptions::atomic was set
  // A failed reload (what ReloadableModel hands its callbacks before it
  // rethrows): the error, and this rank's parameters that may hold a mix of old
  // and new bytes (none after an atomic reload failed before its commit: they
  // are as they were; those written after one failed in or after its commit).
  std::string error;
  std::vector<std::string> possibly_mixed;

  bool complete() const {
    return error.empty() && not_loaded_on_all_ranks.empty() && not_loaded_on_some_ranks.empty();
  }
};

// A result that records how a reload with `options` runs: format, the
// distribution as run (--readers all lays buckets out as scatter), readers,
// rotated roots, atomic. What a reload's result starts from, and what a failed
// one reports (ReloadableModel's callbacks, the runner's --report).
ReloadResult result_for(const ReloadOptions& options);

// COLLECTIVE (one allreduce). The parameters (by name, sorted) that appear in
// `mine` on at least one rank: e.g. what some rank wrote before a failure.
std::vector<std::string> names_on_some_rank(Communicator& world, const ShardingRules& rules,
                                            const std::vector<std::string>& mine);

// Reload `model` (a TensorParallelModel, or any ReloadTarget) in place. `control` carries the
// control plane, `data` the bucket bytes; both span the same ranks in the same order. `source` must
// be non-null on options.reader_rank and is ignored elsewhere. Throws, on every rank alike:
// UsageError (ranks disagree on the model, options or data plane; a device transport for host
// parameters), ValidationError (preflight, wrong source kind; no weight was written),
// CheckpointError (the source cannot be opened, or a read failed mid-way: earlier buckets were
// already written), ModelError (applying or post-processing failed). A failed or stalled transfer
// throws CommError / CommTimeoutError (or aborts the job first, by the
// transport's policy; MPI's default). Names that did not load are not an error:
// they are in the result (complete() is false).
// `workspace` (optional) keeps staging buffers and the plan for the next reload.
ReloadResult reload_weights(ReloadTarget& model, Communicator& control, DataTransport& data,
                            WeightSource* source, const ReloadOptions& options,
                            ReloadWorkspace* workspace = nullptr);

// The same with the data carried by `world`'s own collectives, in host memory.
ReloadResult reload_weights(ReloadTarget& model, Communicator& world, WeightSource* source,
                            const ReloadOptions& options, ReloadWorkspace* workspace = nullptr);

// Reload from sharded sources: every rank of `world` passes what it holds of
// the checkpoint (an empty ShardedSource where it holds nothing); no rank
// reads a file. The ranks gather their boxes (name, dtype, full shape, box),
// plan every tensor as scattered slices and, per bucket of at most
// options.bucket_bytes per rank, which rank sends each box a rank needs:
// point to point over the data plane (DataTransport::exchange), among the
// ranks that hold the same bytes the one that has sent least so far, the
// rank itself where it holds what it needs. No rank receives a byte it does
// not keep. Before any write, every rank raises the same ValidationError
// for a needed range no rank holds (naming the tensor, the range and the
// rank) and for ranks whose overlapping boxes hold different bytes
// (compared by CRC-32C: tensor, range, ranks). Checkpoint format, readers
// kOne only (UsageError otherwise, before anything moves); parameters on a
// device take each view through pinned memory, and a transport that moves
// device memory (NCCL's grouped send/recv) moves the messages between device
// buffers, packed and unpacked in pinned memory;
// `distribution`, `zero_copy` and `reader_rank` do not apply. Atomic mode,
// checksums (each message carries its CRC-32C), validation, replica
// comparison and the result are as for any source; bytes_transferred is the
// most any rank sent. The plan is kept in `workspace` for the next reload
// with the same boxes.
ReloadResult reload_weights(ReloadTarget& model, Communicator& control, DataTransport& data,
                            const ShardedSource& held, const ReloadOptions& options,
                            ReloadWorkspace* workspace = nullptr);
ReloadResult reload_weights(ReloadTarget& model, Communicator& world, const ShardedSource& held,
                            const ReloadOptions& options, ReloadWorkspace* workspace = nullptr);

// COLLECTIVE, on a world rank from options.serving_ranks on, while the
// serving ranks (those before it) call reload_weights() with their
// ShardedSource and the same options: sends the boxes `held` holds to the
// serving ranks that need them, as the shared plan says, and receives
// nothing. For a trainer's ranks in the serving job's world (`mpirun -np S
// server : -np T trainer`, MPI_COMM_WORLD). `serving_rules` and `lora`: the
// serving model's (config, tp size, quantization, expert layout, and whether
// it holds the family's derived parameters: ShardingRules(..., derived); the
// ranks agree on them, and the plan is made from them on every rank). Returns the
// reload's result as every rank agrees on it (what this rank sent in
// bytes_sent_by_rank; nothing loaded here); raises what the serving ranks
// raise, alike.
ReloadResult push_shards(Communicator& world, DataTransport& data, const ShardedSource& held,
                         const ShardingRules& serving_rules, const ReloadOptions& options,
                         ReloadWorkspace* workspace = nullptr, bool lora = false);

// COLLECTIVE. reload_weights() from a stream of tensors (vLLM's
// weights_iterator taken lazily, as a trainer yields gathered temporaries):
// `stream` on the reader rank, nullptr on the others. The reader takes the
// stream's tensors until it holds 4 x bucket_bytes x pipeline depth (the tensor
// that crosses it included), the ranks plan and move that segment as an
// in-memory source, and the next segment follows: the reader holds one
// segment at a time, never the model. Each layer is processed (checkpoint
// processing, the family's derived tensors) once this reload has brought all
// of its parameters, as vLLM's layerwise reload does, and the layers brought
// in part after the stream ends. Each segment is preflighted before its own
// writes, not before the reload's first: an error after the first segment
// (the stream throws, a tensor comes twice or does not fit its parameter)
// names what may hold a mix of old and new weights, unless the reload is
// atomic. Readers kOne only; require_complete needs atomic (checked before
// the commit). Both formats (a stream of kernel-format tensors says so with
// WeightStream::kernel_format()). The result's `source` names the tensors and
// segments; bytes_read is what the reader took from the stream.
ReloadResult reload_from_stream(ReloadTarget& model, Communicator& world, DataTransport& data,
                                WeightStream* stream, const ReloadOptions& options,
                                ReloadWorkspace* workspace = nullptr);
ReloadResult reload_from_stream(ReloadTarget& model, Communicator& world, WeightStream* stream,
                                const ReloadOptions& options, ReloadWorkspace* workspace = nullptr);

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
  // `data` (optional, must outlive this object): the data plane for every reload;
  // without one, data goes over the control communicator in host memory.
  ReloadableModel(ReloadTarget& model, WeightLocation location, DataTransport* data = nullptr);

  ReloadTarget& model() { return model_; }
  // Staging kept between reloads (bounded by pipeline depth x bucket size).
  ReloadWorkspace& workspace() { return workspace_; }
  const WeightLocation& location() const { return location_; }

  // Run after every reload that returns, in registration order (e.g. to drop
  // LoRA, encoder or multimodal caches built from the old weights), and after a
  // failed one that changed parameters, with the result's `error` and
  // `possibly_mixed` (this rank's) set, before the error is rethrown: after an
  // error every rank raised alike (an AgreedError), on every rank when any rank
  // changed parameters (so a callback may itself be collective); after an
  // error of this rank alone, on this rank when it changed parameters. With
  // ranks that serve nothing (ReloadOptions::serving_ranks), on the ranks
  // that changed parameters only (push_shards has no callbacks to run).
  void on_reloaded(std::function<void(const ReloadResult&)> callback);

  // COLLECTIVE. Reload from the model's current location, or from `path` (which
  // then becomes the model's location once a reload from it completes). Only the
  // ranks that open the weights (opens_source()) use either; one of them with
  // neither is a CheckpointError on every rank. Kernel format needs a
  // kernel-format directory (ValidationError otherwise, on every rank).
  ReloadResult reload(Communicator& world, const ReloadOptions& options,
                      const std::string& path = "");

  // COLLECTIVE. Reload from tensors handed over in memory (vLLM's
  // weights_iterator): `source` on the reader rank, nullptr on the others. The
  // model's location does not change.
  ReloadResult reload_from(Communicator& world, const ReloadOptions& options, WeightSource* source);
  // COLLECTIVE. Reload from what every rank holds (reload_weights() with a
  // ShardedSource, an empty one on a rank that holds nothing). The model's
  // location does not change.
  ReloadResult reload_from(Communicator& world, const ReloadOptions& options,
                           const ShardedSource& held);
  // COLLECTIVE. Reload from a stream of tensors (reload_from_stream): `stream`
  // on the reader rank, nullptr on the others. The model's location does not
  // change.
  ReloadResult reload_from_stream(Communicator& world, const ReloadOptions& options,
                                  WeightStream* stream);

 private:
  // `reload` over this model's data plane, with the callbacks of a failure.
  ReloadResult run(Communicator& world, const ReloadOptions& options,
                   const std::function<ReloadResult(DataTransport&)>& reload);

  ReloadTarget& model_;
  WeightLocation location_;
  DataTransport* data_;
  ReloadWorkspace workspace_;
  std::vector<std::function<void(const ReloadResult&)>> callbacks_;
};

}  // namespace tpreload
