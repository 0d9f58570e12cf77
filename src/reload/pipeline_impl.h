// The bucket pipeline's internals (pipeline.h runs it): buffer slots and the
// Pipeline class, whose methods live in pipeline.cpp (threads, transfer,
// apply, the run) and pipeline_reads.cpp (the reader's fill with its
// checksums, verification, and the read-status announcements). Only those two
// files include this. No torch here.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bucket_reader.h"
#include "clock.h"
#include "pipeline.h"
#include "sync.h"
#include "tpreload/comm/device.h"
#include "tpreload/core/crc32c.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload::detail::pipeline_internal {

// A bucket whose bytes do not match the reader's CRC-32C (only verify() raises it,
// so that other CommErrors of the apply, a device's, stay apply errors).
class CorruptedBucket final : public CommError {
 public:
  using CommError::CommError;
};

// A broadcast bucket moved in device memory is summed in blocks of this many
// bytes (a multiple of kCrc32cBlock, so that a device's raw block CRCs combine
// into them): a receiver verifies only the blocks its writes read, not the whole
// bucket it received (docs/PERFORMANCE.md, "Why it is fast"). In host memory it is
// summed in chains, exactly the bytes each tp rank reads (verify_chains.h).
constexpr std::uint64_t kVerifyBlock = std::uint64_t{64} << 10;
static_assert(kVerifyBlock % kCrc32cBlock == 0, "verify blocks combine from device blocks");

inline std::size_t verify_blocks(std::uint64_t bytes) {
  return static_cast<std::size_t>((bytes + kVerifyBlock - 1) / kVerifyBlock);
}

inline std::string hex(std::uint32_t v) {
  char text[11];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

// Where the buffers of each staging role live, from the transport's memory space
// and the parameters'. See the table in reload.h.
struct Spaces {
  Device* device = nullptr;       // the parameters' device (null: host parameters)
  bool device_transport = false;  // the transport moves device memory
  bool device_params = false;
  // Host buffers are pinned when a device copies them.
  Allocator& host() const { return device ? device->pinned_memory() : host_allocator(); }
  Allocator& transport() const { return device_transport ? device->memory() : host(); }
};

// Staging roles of one slot, as workspace buffer indices.
enum Role : std::size_t { kSend, kRecv, kReadStage, kApplyStage, kBlockSums, kRoles };

// A buffer slot: what the reader filled (send) and what this rank receives (recv).
struct Slot {
  std::size_t bucket = 0;
  std::byte* send = nullptr;         // transport space (reader)
  std::byte* recv = nullptr;         // transport space (other ranks)
  std::byte* read_stage = nullptr;   // pinned host: the reader's file reads, device transport only
  std::byte* apply_stage = nullptr;  // device: this rank's view, host transport + device params
  ConstBytes payload;                // reader rank, broadcast: the bytes to send (a view or `send`)
  std::optional<std::string> read_error;
  // CRC-32Cs the reader computed from the bytes it read: scatter, one of what
  // each rank of the group receives; broadcast, one per chain (host) or per
  // kVerifyBlock of the bucket (device; `summed`: the bytes summed so far, in
  // order).
  std::vector<std::uint32_t> sums;
  std::uint64_t summed = 0;
  // A receiver's: what the reader sent (scatter: its view's CRC; broadcast: the
  // bucket's chain or block CRCs). Empty: nothing to verify.
  std::vector<std::uint32_t> expected;
  std::uint32_t* block_sums = nullptr;  // pinned: raw block CRCs of a device view
};

class Pipeline {
 public:
  Pipeline(const CachedPlan& planned, ReloadTarget& model, Communicator& control,
           DataTransport& data, WeightSource* source, const ReloadOptions& options,
           ReloadWorkspace& workspace, NodePlanes* node)
      : plan_(planned.plan),
        metadata_(planned.metadata),
        applies_(planned.applies),
        direct_applies_(planned.direct_applies),
        own_(planned.own),
        chains_(planned.chains),
        chains_read_(planned.chains_read),
        chains_checked_(planned.chains_checked),
        model_(model),
        sink_(model.sink()),
        control_(control),
        group_(node ? *node->control : control),
        data_(node ? *node->transport : data),
        world_data_(data),
        source_(source),
        options_(options),
        workspace_(workspace),
        rank_(control.rank()),
        group_rank_(group_.rank()),
        root_(node ? 0 : options.reader_rank),
        members_(node ? node->members : std::vector<int>()),
        reader_(group_rank_ == root_),
        all_read_(options.readers == Readers::kAll),
        node_read_(node != nullptr),
        reads_(reader_ || all_read_) {
    spaces_.device = sink_.device();
    spaces_.device_params = sink_.memory() == MemoryKind::kDevice;
    // Every rank reading its own bytes moves nothing over the data plane.
    spaces_.device_transport = data.memory() == MemoryKind::kDevice && !all_read_;
    if (node_read_) {
      group_ranks_.assign(static_cast<std::size_t>(control.size()), -1);
      for (std::size_t g = 0; g < members_.size(); ++g)
        group_ranks_.at(static_cast<std::size_t>(members_[g])) = static_cast<int>(g);
      for (const Bucket& b : plan_.buckets) {
        auto& ranges = node_ranges_.emplace_back();
        if (b.scatter)
          for (int w : members_) ranges.push_back(b.ranges[static_cast<std::size_t>(w)]);
      }
    }
    if (node_read_ && options.rotate_broadcast_roots) {
      std::size_t turn = 0;  // the node readers take the broadcast buckets in turn
      for (const Bucket& b : plan_.buckets) {
        // A node's own failure stops only that node; it must come after every
        // world bucket, or the other nodes would wait for it at the next one.
        // make_plan puts broadcast tensors first
        // (Plan.BroadcastBucketsFollowTheFileAndKindsDoNotAlternate).
        // (The plan is the same on every rank: so is this error, before any
        // collective of the pipeline.)
        if (!b.scatter && !world_roots_.empty() && world_roots_.back() < 0)
          raise<Agreed<Error>>("reload plan: a broadcast bucket after a scatter bucket (",
                               world_roots_.size() + 1, " of ", plan_.buckets.size(),
                               "); rotated broadcast roots need every broadcast bucket first");
        world_roots_.push_back(b.scatter ? -1 : node->readers[turn++ % node->readers.size()]);
      }
    }
    if (reads_) {
      // A device copies from pinned staging only: never from a file's mapping
      // (pageable: a bounce through the driver, or pages faulted in mid-copy).
      const bool zero_copy = options.zero_copy && !spaces_.device;
      if (options.zero_copy && !zero_copy)
        log().info(
            "zero_copy: off for parameters on {}; buckets are read into pinned staging, not sent "
            "from the file mapping",
            spaces_.device->describe());
      files_ = std::make_unique<BucketReader>(plan_, planned.metadata, *source, control.size(),
                                              model.rules().tp_size(), zero_copy);
    }
    // The reader's own region of a scatter bucket never leaves it: its plain
    // copies into host parameters are read straight into them (no staging copy
    // and no apply copy for those bytes).
    if (reader_ && !all_read_ && !spaces_.device_transport && !spaces_.device_params &&
        !own_.empty()) {
      for (ParamSlot slot = 0; slot < sink_.size(); ++slot)
        storage_.push_back(sink_.storage(slot).data);
      placing_.assign(plan_.buckets.size(), kNotPlaced);
    }
  }

  ~Pipeline() { stop(); }

  PipelineStats run();
  void stop();
  bool device_stuck() const { return device_stuck_; }

 private:
  // Readers::kNode with rotated roots: the world rank of the node reader that
  // reads a broadcast bucket and sends it to the whole world; -1 for a bucket
  // that stays within each node (and in every other mode).
  int world_root(std::size_t bucket) const {
    return world_roots_.empty() ? -1 : world_roots_[bucket];
  }
  // Whether this rank reads `bucket` (and sends it, unless every rank reads).
  bool reads(std::size_t bucket) const {
    const int root = world_root(bucket);
    return root < 0 ? reads_ : root == rank_;
  }
  // A bucket's CRC-32Cs are computed and checked: asked for, and something is
  // sent (a group of one rank sends nothing).
  bool summed(std::size_t bucket) const {
    return options_.checksums && (world_root(bucket) < 0 ? group_.size() : control_.size()) > 1;
  }
  // A broadcast bucket summed in chains (moved in host memory), not in blocks.
  // (The plan holds chains exactly when they are used: checksums, a host data
  // plane; reload.cpp decides it once.)
  bool chained(std::size_t bucket) const {
    return !plan_.buckets[bucket].scatter && !chains_.empty();
  }
  // Progress goes to the world's reader rank.
  bool reports() const {
    return rank_ == options_.reader_rank && options_.progress != nullptr && !progress_threw_;
  }
  // A scatter bucket's ranges for the ranks of the group, in group order.
  const std::vector<ByteRange>& group_ranges(std::size_t bucket) const {
    return node_read_ ? node_ranges_[bucket] : plan_.buckets[bucket].ranges;
  }
  // World rank w's rank in the group, -1 outside it.
  int group_rank_of(int w) const {
    return node_read_ ? group_ranks_[static_cast<std::size_t>(w)] : w;
  }
  std::uint64_t view_bytes(const Bucket& b) const {
    return b.scatter ? b.ranges[rank_].length : b.bytes;
  }
  void allocate_slots();
  void reader_loop();
  void apply_loop();
  void fill(Slot& slot);
  void transfer(Slot& slot);
  const std::byte* apply_source(Slot& slot);
  void apply(Slot& slot);
  // `placed`: which of a's writes the fill read into place (skipped here).
  void apply_writes(std::size_t bucket, const BucketApply& a, const std::byte* src, bool direct,
                    const std::vector<char>* placed = nullptr);
  bool can_apply_direct() const;
  void run_direct();
  void write_in_chunks(const RowWrite& w, const WriteSource& from);
  // A node bucket's status (announce_read_status): read, its reader's read
  // failed, or a rank of the node failed to transfer the bucket before.
  static constexpr std::int64_t kReadFailed = 1, kTransferFailed = 2;
  bool announce_read_status(Slot& slot);
  void announce_failed_transfer(std::size_t bucket);
  bool announce_world_status(Slot& slot);
  void agree_on_read_status(std::size_t bucket, const std::optional<std::string>& error);
  [[noreturn]] void raise_read_failure(std::size_t bucket, int rank,
                                       const std::optional<std::string>& mine);
  void verify(Slot& slot, const std::byte* view, bool device_memory);
  void verify_chains(Slot& slot, const std::byte* view);
  // Bytes [begin, end) of this rank's view of a bucket, checked against
  // Slot::expected[sum] before the bucket is applied.
  struct Check {
    std::uint64_t begin, end;
    std::size_t sum;
  };
  const std::vector<Check>& checks(std::size_t bucket);
  // CRC-32Cs announced for `bucket`: one per rank of the group (scatter), per
  // chain (broadcast in host memory) or per kVerifyBlock of it (broadcast in
  // device memory); none when it is not summed.
  std::size_t sum_count(std::size_t bucket) const {
    if (!summed(bucket)) return 0;
    const Bucket& b = plan_.buckets[bucket];
    if (b.scatter) return static_cast<std::size_t>(group_.size());
    return chained(bucket) ? static_cast<std::size_t>(chains_.at(bucket).chains)
                           : verify_blocks(b.bytes);
  }
  // `where`: which bytes of this rank's view failed ("" for all of them).
  [[noreturn]] void raise_corrupted(const Slot& slot, const std::string& where, std::uint32_t got,
                                    std::uint32_t sent) const;
  std::string bucket_tensors(std::size_t bucket) const;
  std::optional<std::unique_ptr<Slot>> next_filled();
  // Ends the job when the reader thread has been filling one bucket for longer
  // than read_stall_timeout: a read stuck in the file system cannot be cancelled.
  void abort_if_read_stalled();
  void report_progress(std::size_t buckets_done, bool finished);

  const Plan& plan_;
  const SourceMetadata& metadata_;
  const std::vector<BucketApply>& applies_;
  const std::vector<BucketApply>& direct_applies_;
  // Per scatter bucket, this rank's writes it reads straight into the
  // parameters when it reads the bucket (CachedPlan::own).
  const std::vector<DirectReads>& own_;
  const std::vector<ChainLayout>& chains_;  // CachedPlan::chains and chains_read
  const std::vector<std::vector<char>>& chains_read_;
  const std::vector<std::vector<char>>& chains_checked_;
  std::vector<std::byte> chunk_;  // direct applies: full rows read for a write
  ReloadTarget& model_;
  ParameterSink& sink_;
  Communicator& control_;      // the world's control plane
  Communicator& group_;        // the reader's group: the world, or (kNode) this rank's node
  DataTransport& data_;        // the group's data plane
  DataTransport& world_data_;  // the world's (kNode with rotated roots: broadcast buckets)
  WeightSource* source_;       // the reader's
  const ReloadOptions& options_;
  ReloadWorkspace& workspace_;
  const int rank_;                  // in the world
  const int group_rank_;            // in the group
  const int root_;                  // the group's reader, a group rank
  const std::vector<int> members_;  // kNode: the group's world ranks (else the world's, in order)
  std::vector<int> group_ranks_;    // kNode: per world rank, its rank in the group (-1 outside)
  const bool reader_;               // the group's reader (Readers::kOne: the only one that reads)
  const bool all_read_;   // Readers::kAll: every rank reads its own region, nothing is sent
  const bool node_read_;  // Readers::kNode: a reader per node, transfers within the node
  const bool reads_;      // this rank reads the source
  // kNode: each scatter bucket's ranges of the node's ranks, in node order.
  std::vector<std::vector<ByteRange>> node_ranges_;
  std::vector<int> world_roots_;  // kNode, rotated roots: per bucket (see world_root())
  Spaces spaces_;
  // Where each parameter's rows are, for the writes this rank reads straight
  // into them (own_); empty: nothing is placed on this rank.
  std::vector<std::byte*> storage_;
  // Per bucket: whether its fill began with placed writes, which may have
  // landed from then on (the reader thread), and whether they were counted as
  // written since (the apply, else stop() once the threads are joined).
  enum Placing : char { kNotPlaced, kPlaced, kCounted };
  std::vector<Placing> placing_;
  std::atomic<bool> apply_stopped_{false};  // the apply thread met an error: nothing more is placed
  bool placed_in_fill(std::size_t bucket) const {
    return bucket < placing_.size() && placing_[bucket] != kNotPlaced;
  }
  // (Only scatter buckets have direct spans; a rotated root sends broadcast buckets only.)
  Placed placed(std::size_t bucket) const {
    if (storage_.empty() || bucket >= own_.size() || own_[bucket].spans.empty()) return {};
    return {rank_, &own_[bucket].spans, storage_.data()};
  }
  std::unique_ptr<BucketReader> files_;
  std::unique_ptr<DeviceStream> read_stream_, apply_stream_;  // owned by their threads
  PipelineStats stats_;
  // Per bucket, found at its first verify (apply thread): what is checked.
  std::vector<std::optional<std::vector<Check>>> checks_;
  // The reader thread's time in CRC-32C, added to stats_.checksum once the
  // threads are joined (a node reader with rotated roots also verifies, on the
  // apply thread).
  double reader_checksum_ = 0;
  // Device work timed out on either thread (the reader's copy of a bucket to
  // the device, an apply): the staging buffers it may still touch are
  // abandoned after the run, never freed.
  std::atomic<bool> device_stuck_{false};
  BlockingQueue<std::unique_ptr<Slot>> free_, filled_, to_apply_;
  std::thread reader_thread_, apply_thread_;
  std::atomic<bool> stopping_{false};
  // When the reader thread started filling the current bucket (steady-clock
  // nanoseconds), 0 while it is not filling: only time spent reading counts as
  // a stalled read, not time spent waiting for a slot the apply still holds.
  std::atomic<std::int64_t> fill_started_{0};
  std::atomic<std::size_t> filling_{0};  // the bucket it fills (or last filled)
  std::atomic<bool> reader_finished_{false};
  Clock::time_point started_ = Clock::now();
  bool progress_threw_ = false;  // the caller's progress callback threw: no more reports
};

}  // namespace tpreload::detail::pipeline_internal
