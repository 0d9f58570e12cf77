#include "pipeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "bucket_reader.h"
#include "sync.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/device.h"
#include "tpreload/core/crc32c.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/model/row_writes.h"

namespace tpreload::detail {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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

std::size_t verify_blocks(std::uint64_t bytes) {
  return static_cast<std::size_t>((bytes + kVerifyBlock - 1) / kVerifyBlock);
}

std::string hex(std::uint32_t v) {
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

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

void Pipeline::allocate_slots() {
  std::uint64_t send = 0, recv = 0, view = 0;
  for (const Bucket& b : plan_.buckets) {
    if (reader_ && !all_read_) send = std::max(send, b.bytes);
    // The reader receives its own scatter range in place, inside its send buffer;
    // with every rank reading, each reads its own range into `recv`.
    if (!reader_ || all_read_) recv = std::max(recv, view_bytes(b));
    view = std::max(view, view_bytes(b));
  }
  const bool read_stage = reader_ && !all_read_ && spaces_.device_transport;
  const bool apply_stage = spaces_.device_params && !spaces_.device_transport;
  const int depth = std::max(1, options_.pipeline_depth);
  stats_.depth = depth;
  auto take = [&](int i, Role role, std::uint64_t bytes, Allocator& allocator) -> std::byte* {
    if (bytes == 0) return nullptr;
    std::byte* p = workspace_.buffer(i * kRoles + role, bytes, allocator);
    auto& counter = allocator.kind() == MemoryKind::kDevice       ? stats_.staging.device
                    : allocator.kind() == MemoryKind::kPinnedHost ? stats_.staging.pinned
                                                                  : stats_.staging.host;
    counter += bytes;
    return p;
  };
  for (int i = 0; i < depth; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->send = take(i, kSend, send, spaces_.transport());
    slot->recv = take(i, kRecv, recv, spaces_.transport());
    if (read_stage) slot->read_stage = take(i, kReadStage, send, spaces_.host());
    if (apply_stage) slot->apply_stage = take(i, kApplyStage, view, spaces_.device->memory());
    // (with rotated roots a node reader also receives: the other readers' buckets)
    if (options_.checksums && spaces_.device_transport && (!reader_ || !world_roots_.empty()))
      slot->block_sums = reinterpret_cast<std::uint32_t*>(
          take(i, kBlockSums, crc32c_blocks(view) * sizeof(std::uint32_t), spaces_.host()));
    free_.push(std::move(slot));
  }
}

// Reader thread: the file into host memory, then (device transport) to the device.
void Pipeline::fill(Slot& slot) {
  const auto start = Clock::now();
  const Bucket& bucket = plan_.buckets[slot.bucket];
  // Summed as read, a step at a time while the step is in the core's cache:
  // what each rank of the group receives (its running CRC-32C in slot.sums).
  slot.sums.clear();
  slot.summed = 0;
  BucketReader::Filled sum;
  const bool sums = !all_read_ && summed(slot.bucket);
  if (sums) {
    slot.sums.assign(sum_count(slot.bucket), 0);
    sum = [&](int region, ConstBytes span) {
      const auto t = Clock::now();
      if (region < 0 && chained(slot.bucket)) {  // broadcast: the spans tile the bucket in order
        extend_chains(chains_.at(slot.bucket), slot.summed, span, &chains_checked_.at(slot.bucket),
                      slot.sums);
        slot.summed += span.size;
      } else if (region < 0) {  // (device memory: cut into blocks)
        for (std::uint64_t done = 0; done < span.size;) {
          const std::size_t k = static_cast<std::size_t>(slot.summed / kVerifyBlock);
          const std::uint64_t n = std::min(span.size - done, (k + 1) * kVerifyBlock - slot.summed);
          slot.sums.at(k) = crc32c_extend(slot.sums[k], span.data + done, n);
          done += n;
          slot.summed += n;
        }
      } else if (const int g = group_rank_of(region); g >= 0 && g != group_rank_) {
        std::uint32_t& crc = slot.sums[static_cast<std::size_t>(g)];
        crc = crc32c_extend(crc, span.data, span.size);  // (not sent to the group: not summed)
      }
      reader_checksum_ += since(t);
    };
  }
  if (all_read_) {  // nothing is sent, so nothing is summed
    slot.payload = files_->fill_own(slot.bucket, rank_, slot.recv);
  } else if (!spaces_.device_transport) {
    // Once the apply stopped (a failed write, a corrupted bucket), nothing more
    // goes into the parameters.
    const Placed own = apply_stopped_ ? Placed{} : placed(slot.bucket);
    if (own.spans) placing_.at(slot.bucket) = kPlaced;  // (its parameters may change from here on)
    slot.payload = node_read_ ? files_->fill_ranks(slot.bucket, members_, slot.send, sum, own)
                              : files_->fill(slot.bucket, slot.send, sum, own);
  } else {
    const ConstBytes host = node_read_
                                ? files_->fill_ranks(slot.bucket, members_, slot.read_stage, sum)
                                : files_->fill(slot.bucket, slot.read_stage, sum);
    if (!read_stream_) read_stream_ = spaces_.device->make_stream();
    if (host.size) read_stream_->copy(slot.send, host.data, host.size, CopyKind::kHostToDevice);
    synchronize(*read_stream_, options_.device_timeout,
                concat("copying bucket ", slot.bucket + 1, " (", bucket.bytes, " bytes) to ",
                       spaces_.device->describe()));
    slot.payload = ConstBytes(slot.send, bucket.bytes);
  }
  if (sums && !bucket.scatter && slot.summed != bucket.bytes)  // (the reader's own invariant)
    raise<Error>("bucket ", slot.bucket + 1, ": the reader summed ", slot.summed, " of its ",
                 bucket.bytes, " bytes in order (a broadcast bucket's spans must tile it)");
  // Bytes read through the file's mapping (zero-copy payloads, full rows) that
  // the file no longer backs read as zeros: this bucket is not sent.
  source_->check_mapped_reads();
  stats_.read += since(start);
}

std::string Pipeline::bucket_tensors(std::size_t bucket) const {
  std::string names;
  std::size_t listed = 0;
  const auto& pieces = plan_.buckets[bucket].pieces;
  for (const Piece& p : pieces) {
    if (listed == 6) {
      names += concat(" and ", pieces.size() - listed, " more");
      break;
    }
    names += (listed++ ? ", " : "") + metadata_.tensors[plan_.tensors[p.planned].index].name;
  }
  return names;
}

// What this rank checks of `bucket`, computed once per reload: its whole view
// of a scatter bucket; of a broadcast bucket in device memory, the kVerifyBlock
// blocks its writes read (from each write's src_offset to write_source_end), in
// order. (Chained broadcast buckets: verify_chains.)
const std::vector<Pipeline::Check>& Pipeline::checks(std::size_t bucket) {
  if (checks_.empty()) checks_.resize(plan_.buckets.size());
  auto& list = checks_[bucket];
  if (list) return *list;
  list.emplace();
  const Bucket& b = plan_.buckets[bucket];
  const std::uint64_t n = view_bytes(b);
  if (b.scatter) {
    list->push_back({0, n, 0});
    return *list;
  }
  std::vector<char> read(verify_blocks(n), 0);
  const auto& params = model_.rules().params();
  for (const RowWrite& w : applies_[bucket].writes) {
    const std::uint64_t end = std::min(n, write_source_end(w, params.at(w.slot)));
    for (std::uint64_t k = w.src_offset / kVerifyBlock; k * kVerifyBlock < end; ++k) read[k] = 1;
  }
  for (std::size_t k = 0; k < read.size(); ++k)
    if (read[k]) list->push_back({k * kVerifyBlock, std::min(n, (k + 1) * kVerifyBlock), k});
  return *list;
}

[[noreturn]] void Pipeline::raise_corrupted(const Slot& slot, const std::string& where,
                                            std::uint32_t got, std::uint32_t sent) const {
  const Bucket& bucket = plan_.buckets[slot.bucket];
  raise<CorruptedBucket>("bucket ", slot.bucket + 1, " of ", plan_.buckets.size(), " (",
                         view_bytes(bucket), " bytes of ", bucket_tensors(slot.bucket),
                         ") arrived corrupted on rank ", rank_, "/", control_.size(), where,
                         ": CRC-32C ", hex(got), ", the reader sent ", hex(sent),
                         "; none of it was applied");
}

// Apply thread, before anything of the bucket is written: the bytes this rank
// applies must be exactly the bytes the reader read (checks(): a bit flipped in
// broadcast bytes only other ranks use changes nothing here).
void Pipeline::verify(Slot& slot, const std::byte* view, bool device_memory) {
  if (slot.expected.empty()) return;
  if (chained(slot.bucket)) return verify_chains(slot, view);
  const auto& list = checks(slot.bucket);
  if (list.empty()) return;  // (nothing of it is applied here)
  const auto start = Clock::now();
  const std::uint64_t n = view_bytes(plan_.buckets[slot.bucket]);
  if (device_memory) {
    if (!apply_stream_) apply_stream_ = spaces_.device->make_stream();
    apply_stream_->crc32c_blocks(view, n, slot.block_sums);
    synchronize(
        *apply_stream_, options_.device_timeout,
        concat("checksumming bucket ", slot.bucket + 1, " on ", spaces_.device->describe()));
  }
  for (const Check& c : list) {
    const std::uint32_t got =
        device_memory
            ? crc32c_from_blocks(slot.block_sums + c.begin / kCrc32cBlock, c.end - c.begin)
            : crc32c(view + c.begin, c.end - c.begin);
    if (got == slot.expected.at(c.sum)) continue;
    stats_.checksum += since(start);
    raise_corrupted(slot,
                    c.begin == 0 && c.end == n
                        ? std::string()
                        : concat(" in its bytes [", c.begin, ", ", c.end, ")"),
                    got, slot.expected[c.sum]);
  }
  stats_.checksum += since(start);
}

// verify() of a broadcast bucket in host memory: the chains this rank's writes
// read, each summed over the whole view in one pass.
void Pipeline::verify_chains(Slot& slot, const std::byte* view) {
  const std::vector<char>& wanted = chains_read_.at(slot.bucket);
  if (std::find(wanted.begin(), wanted.end(), 1) == wanted.end()) return;
  const auto start = Clock::now();
  const ChainLayout& layout = chains_.at(slot.bucket);
  std::vector<std::uint32_t> got(wanted.size(), 0);
  extend_chains(layout, 0, ConstBytes(view, plan_.buckets[slot.bucket].bytes), &wanted, got);
  stats_.checksum += since(start);
  for (std::size_t c = 0; c < wanted.size(); ++c) {
    if (!wanted[c] || got[c] == slot.expected.at(c)) continue;
    const int chain = static_cast<int>(c);
    raise_corrupted(
        slot,
        concat(" in the ", chain_bytes(layout, chain), " bytes that ",
               chain + 1 == layout.chains ? std::string("several tensor-parallel ranks read")
                                          : concat("tensor-parallel rank ", chain, " reads")),
        got[c], slot.expected[c]);
  }
}

void Pipeline::reader_loop() {
  for (std::size_t k = 0; k < plan_.buckets.size(); ++k) {
    auto slot = free_.pop();
    if (!slot || stopping_) return;
    (*slot)->bucket = k;
    if (!reads(k)) {  // another node reader's turn: this rank receives it
      filled_.push(std::move(*slot));
      continue;
    }
    filling_ = k;
    fill_started_ = now_ns();
    try {
      fill(**slot);
    } catch (const CommTimeoutError& e) {  // (only the device copy waits with a timeout)
      (*slot)->read_error = concat("the device did not finish staging it: ", e.what());
      device_stuck_ = true;
    } catch (const std::exception& e) {
      (*slot)->read_error = e.what();
    }
    fill_started_ = 0;
    const bool failed = (*slot)->read_error.has_value();
    filled_.push(std::move(*slot));
    if (failed) return;
  }
}

// COLLECTIVE over the group. Whether the group's reader read the bucket, with
// the CRC-32Cs of what each rank receives. A failed read is raised at once
// (Readers::kOne), or (kNode) false is returned on every rank of the node and
// the failure is agreed on over the world once every node has run.
bool Pipeline::announce_read_status(Slot& slot) {
  std::optional<std::string> problem;
  if (reader_) problem = slot.read_error;
  // [status, then the CRC-32C of what each rank receives]: one broadcast.
  const Bucket& bucket = plan_.buckets[slot.bucket];
  const std::size_t sums = sum_count(slot.bucket);
  std::vector<std::int64_t> message_head(1 + sums, 0);
  message_head[0] = problem ? kReadFailed : 0;
  if (reader_ && !problem)
    for (std::size_t i = 0; i < sums; ++i) message_head[1 + i] = slot.sums.at(i);
  // Within a node, an allreduce (the reader's values are the only ones not
  // zero): a rank whose transfer of the bucket before failed says so in it.
  if (node_read_)
    allreduce_ints(group_, message_head, IntOp::kMax);
  else
    group_.broadcast(MutableBytes(message_head.data(), message_head.size() * sizeof(std::int64_t)),
                     root_);
  const std::int64_t status = message_head[0];
  slot.expected.clear();
  if (status == 0 && sums && !reader_) {
    if (bucket.scatter)
      slot.expected.push_back(static_cast<std::uint32_t>(message_head[1 + group_rank_]));
    else
      for (std::size_t k = 0; k < sums; ++k)
        slot.expected.push_back(static_cast<std::uint32_t>(message_head[1 + k]));
  }
  if (status != 0 && !node_read_) raise_read_failure(slot.bucket, options_.reader_rank, problem);
  return status == 0;
}

// COLLECTIVE over the node (Readers::kNode), in place of the announcement of
// `bucket` by a rank whose transfer of the bucket before it failed: its node's
// ranks learn there that they stop (announce_read_status returns false), where
// they would otherwise wait for it.
void Pipeline::announce_failed_transfer(std::size_t bucket) {
  std::vector<std::int64_t> message_head(1 + sum_count(bucket), 0);
  message_head[0] = kTransferFailed;
  allreduce_ints(group_, message_head, IntOp::kMax);
}

// COLLECTIVE over the world, for a bucket one node reader sends to the world
// (rotated roots): whether its root read it, with the CRC-32C of what it sends,
// in one allreduce (the root's values are the only ones not zero). Returns
// whether the bucket goes out.
bool Pipeline::announce_world_status(Slot& slot) {
  const int root = world_root(slot.bucket);
  const std::size_t sums = sum_count(slot.bucket);  // (a broadcast bucket's chains or blocks)
  // [failed, the CRC-32Cs]: the world's maximum
  std::vector<std::int64_t> head(1 + sums, 0);
  if (rank_ == root) {
    if (slot.read_error)
      head[0] = 1;
    else
      for (std::size_t k = 0; k < sums; ++k) head[1 + k] = slot.sums.at(k);
  }
  allreduce_ints(control_, head, IntOp::kMax);
  slot.expected.clear();
  if (head[0] == 0 && rank_ != root)
    for (std::size_t k = 0; k < sums; ++k)
      slot.expected.push_back(static_cast<std::uint32_t>(head[1 + k]));
  return head[0] == 0;
}

// COLLECTIVE, Readers::kAll and kNode, once every rank has applied what it
// read: ranks (nodes) read on their own, with no world collective per bucket,
// so a failed read stops only the rank (node) that hit it. Every rank then
// raises the lowest failing reader's error (none: returns).
void Pipeline::agree_on_read_status(std::size_t bucket, const std::optional<std::string>& error) {
  const int n = control_.size();
  std::int64_t lowest = error ? n - rank_ : 0;
  control_.allreduce_ints(&lowest, 1, IntOp::kMax);
  if (lowest != 0) raise_read_failure(bucket, n - static_cast<int>(lowest), error);
}

// COLLECTIVE. `rank`'s failed read of `bucket` (known there), with its error
// (`mine` there), reaches every rank, which raises it.
void Pipeline::raise_read_failure(std::size_t bucket, int rank,
                                  const std::optional<std::string>& mine) {
  // [bucket, the error's length, whether the failing rank reads its own rows of
  // the bucket straight into its parameters]
  std::int64_t head[3] = {static_cast<std::int64_t>(bucket),
                          rank_ == rank ? static_cast<std::int64_t>(mine->size()) : 0,
                          rank_ == rank && !options_.atomic && placed_in_fill(bucket) ? 1 : 0};
  control_.broadcast(MutableBytes(head, sizeof head), rank);
  std::string message(static_cast<std::size_t>(head[1]), '\0');
  if (rank_ == rank) message = *mine;
  control_.broadcast(MutableBytes(message.data(), message.size()), rank);
  // Every rank raises this after the same broadcasts, with no transfer in flight.
  const bool world_bucket = world_root(static_cast<std::size_t>(head[0])) >= 0;
  // What had been applied: in atomic mode only to the second copy (the caller
  // adds that every parameter is as it was).
  const char* applied =
      options_.atomic ? ""
      : all_read_ ? "; every rank had applied the buckets it read before this failure (the others "
                    "all of theirs)"
      : world_bucket ? "; every rank stopped at this bucket: weights of earlier buckets were "
                       "already replaced"
      : node_read_   ? "; the ranks of that node had applied the buckets before it, the ranks of "
                       "every other node all of theirs"
      : head[0] > 0  ? "; weights of earlier buckets were already replaced"
                     : "";
  raise<Agreed<CheckpointError>>(
      "reading bucket ", head[0] + 1, " of ", plan_.buckets.size(),
      all_read_ ? " failed on rank " : " failed on reader rank ", rank,
      all_read_ ? " (--readers all: each rank reads its own slices)"
      : world_bucket
          ? " (--readers node, rotated broadcast roots: its turn to read a broadcast bucket for "
            "every rank)"
      : node_read_ ? " (--readers node: each node's reader reads for the ranks of its node)"
                   : "",
      ": ", message, applied,
      head[2] ? concat("; rank ", rank,
                       "'s own rows of this bucket may have changed too (it reads them straight "
                       "into its parameters)")
              : std::string());
}

void Pipeline::transfer(Slot& slot) {
  const Bucket& bucket = plan_.buckets[slot.bucket];
  const auto start = Clock::now();
  std::unique_ptr<Transfer> t;
  std::uint64_t sent = bucket.bytes;
  if (const int root = world_root(slot.bucket); root >= 0) {  // one node reader to the world
    if (rank_ == root) {
      t = world_data_.broadcast(
          MutableBytes(const_cast<std::byte*>(slot.payload.data), slot.payload.size), root);
      if (control_.size() > 1) stats_.bytes_sent += bucket.bytes;
    } else {  // (a node reader receives into its send buffer, idle this bucket)
      std::byte* into = reader_ ? slot.send : slot.recv;
      t = world_data_.broadcast(MutableBytes(into, bucket.bytes), root);
      slot.payload = ConstBytes(into, bucket.bytes);
    }
    t->wait();
    stats_.transfer += since(start);
    return;
  }
  if (bucket.scatter) {
    const std::vector<ByteRange>& ranges = group_ranges(slot.bucket);
    const ConstBytes send = reader_ ? ConstBytes(slot.send, bucket.bytes) : ConstBytes();
    std::byte* into = reader_ ? slot.send + bucket.ranges[rank_].offset : slot.recv;
    t = data_.scatter(send, ranges, MutableBytes(into, bucket.ranges[rank_].length), root_);
    if (node_read_) {  // what left the reader for the other ranks of its node
      sent = 0;
      for (std::size_t g = 0; g < ranges.size(); ++g)
        if (static_cast<int>(g) != group_rank_) sent += ranges[g].length;
    }
  } else if (reader_) {
    t = data_.broadcast(MutableBytes(const_cast<std::byte*>(slot.payload.data), slot.payload.size),
                        root_);
    if (node_read_ && group_.size() == 1) sent = 0;
  } else {
    t = data_.broadcast(MutableBytes(slot.recv, bucket.bytes), root_);
  }
  t->wait();
  if (reader_) stats_.bytes_sent += sent;
  stats_.transfer += since(start);
}

// This rank's view of the bucket, in the parameters' memory space.
const std::byte* Pipeline::apply_source(Slot& slot) {
  const Bucket& bucket = plan_.buckets[slot.bucket];
  const std::byte* view = all_read_        ? slot.payload.data
                          : !reader_       ? slot.recv
                          : bucket.scatter ? slot.send + bucket.ranges[rank_].offset
                                           : slot.payload.data;
  verify(slot, view, spaces_.device_transport);
  if (!slot.apply_stage) return view;
  if (!apply_stream_) apply_stream_ = spaces_.device->make_stream();
  const std::uint64_t n = view_bytes(bucket);
  if (n) apply_stream_->copy(slot.apply_stage, view, n, CopyKind::kHostToDevice);
  synchronize(*apply_stream_, options_.device_timeout,
              concat("copying bucket ", slot.bucket + 1, " (", n, " bytes) to ",
                     spaces_.device->describe()));
  return slot.apply_stage;
}

void Pipeline::apply(Slot& slot) {
  const bool placed = placed_in_fill(slot.bucket);
  apply_writes(slot.bucket, applies_[slot.bucket], apply_source(slot), false,
               placed ? &own_[slot.bucket].placed : nullptr);
  if (placed) placing_[slot.bucket] = kCounted;
}

}  // namespace

bool report_progress(const ReloadOptions& options, const Plan& plan, std::size_t buckets_done,
                     bool finished, double seconds) {
  ReloadProgress p;
  p.buckets_done = buckets_done;
  p.buckets_total = plan.buckets.size();
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    p.bytes_total += plan.buckets[b].bytes;
    if (b < buckets_done) p.bytes_done += plan.buckets[b].bytes;
  }
  p.seconds = seconds;
  p.finished = finished;
  // The caller's callback, between collectives: what it throws must not leave
  // this rank's peers waiting, and costs only the progress reports.
  try {
    options.progress(p);
    return true;
  } catch (const std::exception& e) {
    log().warn("the progress callback threw ({}); it is not called again in this reload", e.what());
  } catch (...) {
    log().warn("the progress callback threw; it is not called again in this reload");
  }
  return false;
}

void complete_bucket(ReloadTarget& model, const Bucket& bucket, const BucketApply& a,
                     const ReloadOptions& options, PipelineStats& stats, Clock::time_point start) {
  ParameterSink& sink = model.sink();
  for (const RowZero& z : a.zeros) sink.zero(z);
  // The slot is reused only once every write from it has landed.
  sink.flush(options.device_timeout);
  for (const auto& [param, shards] : a.completed) sink.mark_loaded(param, shards);
  // Checkpoint processing of the layers this bucket completed, into the
  // parameters or, in an atomic reload, their second copy before the commit.
  if (options.format == WeightFormat::kCheckpoint)
    for (std::int64_t layer : bucket.finished_layers) sink.process_layer(layer, model.tp_rank());
  stats.apply += since(start);
  // An atomic reload's layers are in the second copy until the commit, which
  // processes them after it (the model's own storage still holds the old ones).
  if (options.atomic) return;
  start = Clock::now();
  for (std::int64_t layer : bucket.finished_layers) model.finish_layer(layer);
  stats.finish += since(start);
}

namespace {

// Bucket `bucket`'s writes from `src` (a bucket buffer), or, for a direct apply,
// each from the source tensor's rows it names: a plain copy of contiguous rows
// is read straight into the parameter (the source merges reads that follow each
// other in a file into one preadv); any other write (a row-parallel window out
// of full rows, a conversion, int8) reads its full rows a chunk at a time into
// an aligned scratch buffer and writes from there. Reading the rows, even at tp
// times the bytes for a window, cost less than copying out of a freshly opened
// mapping (docs/PERFORMANCE.md, "Why it is fast").
void Pipeline::apply_writes(std::size_t bucket, const BucketApply& a, const std::byte* src,
                            bool direct, const std::vector<char>* placed) {
  auto start = Clock::now();
  std::vector<ReadRequest> reads;
  for (std::size_t i = 0; i < a.writes.size(); ++i) {
    const RowWrite& w = a.writes[i];
    if (placed && (*placed)[i]) {  // read into place with the bucket
      sink_.count_placed(w);
      continue;
    }
    if (!direct) {
      sink_.write(w, src);
      continue;
    }
    const WriteSource& from = a.sources.at(i);
    if (const auto rows = sink_.host_rows(w)) {
      reads.push_back({from.tensor, {w.src_offset, rows->size}, *rows});
      continue;
    }
    write_in_chunks(w, from);
  }
  if (!reads.empty()) source_->read_many(reads);
  complete_bucket(model_, plan_.buckets[bucket], a, options_, stats_, start);
}

// A direct write from full rows of its tensor: from.range is the write's
// w.rows full rows (resolve_direct_applies), read a chunk of about kChunkBytes
// at a time into `chunk_` (aligned for any element), each chunk's rows written
// from there. src_offset counts from the tensor's first byte.
void Pipeline::write_in_chunks(const RowWrite& w, const WriteSource& from) {
  constexpr std::uint64_t kChunkBytes = std::uint64_t{1} << 20;
  if (w.rows <= 0) return;
  const std::uint64_t pitch = from.range.length / static_cast<std::uint64_t>(w.rows);
  const auto per_chunk = static_cast<std::int64_t>(
      std::max<std::uint64_t>(1, kChunkBytes / std::max<std::uint64_t>(1, pitch)));
  for (std::int64_t r = 0; r < w.rows; r += per_chunk) {
    const std::int64_t n = std::min(per_chunk, w.rows - r);
    const std::uint64_t at = from.range.offset + static_cast<std::uint64_t>(r) * pitch;
    const std::uint64_t bytes = static_cast<std::uint64_t>(n) * pitch;
    if (chunk_.size() < bytes) chunk_.resize(bytes);
    source_->read(from.tensor, {at, bytes}, MutableBytes(chunk_.data(), bytes));
    RowWrite part = w;
    part.dest_row = w.dest_row + r;
    part.rows = n;
    part.src_offset = w.src_offset + static_cast<std::uint64_t>(r) * pitch;
    sink_.write(part, chunk_.data() - at);
  }
}

// Readers::kAll with parameters in host memory: every write takes its rows
// straight from the source (read into the parameter, or through a chunk of full
// rows), the one copy a local load makes, with no bucket buffer and no thread,
// whatever the source. Ranks only agree at the end.
bool Pipeline::can_apply_direct() const {
  return all_read_ && !spaces_.device_params && direct_applies_.size() == plan_.buckets.size();
}

void Pipeline::run_direct() {
  std::size_t k = 0;
  std::optional<std::string> read_error;  // the source's, as a staged read's would be
  for (; k < plan_.buckets.size(); ++k) {
    try {
      apply_writes(k, direct_applies_[k], nullptr, true);
    } catch (const CheckpointError& e) {
      read_error = e.what();
      break;
    } catch (const std::exception& e) {
      stats_.apply_error = e.what();
      break;
    }
    if (reports()) report_progress(k + 1, false);
  }
  if (reports() && k == plan_.buckets.size()) report_progress(plan_.buckets.size(), true);
  agree_on_read_status(k, read_error);
}

void Pipeline::apply_loop() {
  while (auto slot = to_apply_.pop()) {
    if (!stats_.apply_error && !stats_.corrupted) {
      try {
        apply(**slot);
      } catch (const CommTimeoutError& e) {
        // Device work that never finished may still touch the staging buffers:
        // they are abandoned after the run (never freed), and nothing more is
        // applied. The slot goes back so that the collectives stay in step.
        stats_.apply_error = e.what();
        device_stuck_ = true;
      } catch (const CorruptedBucket& e) {
        stats_.corrupted = e.what();
      } catch (const std::exception& e) {
        stats_.apply_error = e.what();
      }
      if (stats_.apply_error || stats_.corrupted) apply_stopped_ = true;
    }
    free_.push(std::move(*slot));
  }
}

// The reader's next filled slot. A read that makes no progress for
// read_stall_timeout cannot be cancelled, so the job ends (peers would wait on
// it forever); waiting for a slot that the apply holds is not a stalled read.
std::optional<std::unique_ptr<Slot>> Pipeline::next_filled() {
  const auto poll =
      std::min<std::chrono::milliseconds>(std::chrono::seconds(1), options_.read_stall_timeout);
  for (;;) {
    bool timed_out = false;
    auto slot = filled_.pop_for(poll, &timed_out);
    if (!timed_out) return slot;
    abort_if_read_stalled();
  }
}

void Pipeline::abort_if_read_stalled() {
  const std::int64_t started = fill_started_;
  if (!started ||
      now_ns() - started <=
          std::chrono::duration_cast<std::chrono::nanoseconds>(options_.read_stall_timeout).count())
    return;
  log().critical("reading bucket {} of {} made no progress for {} s; aborting the job",
                 filling_ + 1, plan_.buckets.size(), options_.read_stall_timeout.count());
  control_.abort(125);
}

void Pipeline::stop() {
  stopping_ = true;
  free_.close();
  filled_.close();
  to_apply_.close();
  if (reader_thread_.joinable()) {
    // A reader stuck in a read (the transfer or the apply failed meanwhile)
    // would keep the join, and the error, waiting: it gets the same deadline.
    while (!reader_finished_) {
      abort_if_read_stalled();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    reader_thread_.join();
  }
  if (apply_thread_.joinable()) apply_thread_.join();
  // Writes read into place with a bucket that was never applied (a failed
  // read, an apply that stopped) changed their parameters all the same.
  for (std::size_t b = 0; b < placing_.size(); ++b) {
    if (placing_[b] != kPlaced) continue;
    for (std::size_t i = 0; i < own_[b].placed.size(); ++i) {
      if (!own_[b].placed[i]) continue;
      // (stop() runs in the destructor too: a write the sink refuses to count,
      // which the placement checked and so cannot be, must not end the process)
      try {
        sink_.count_placed(applies_[b].writes[i]);
      } catch (const std::exception& e) {
        log().error("counting a write read into place with bucket {}: {}", b + 1, e.what());
      }
    }
    placing_[b] = kCounted;
  }
}

void Pipeline::report_progress(std::size_t buckets_done, bool finished) {
  progress_threw_ =
      !detail::report_progress(options_, plan_, buckets_done, finished, since(started_));
}

PipelineStats Pipeline::run() {
  // Staging may not fit on one rank (device or pinned memory): every rank stops alike.
  std::optional<std::string> problem;
  const bool direct = can_apply_direct();  // needs no staging
  try {
    if (!direct) allocate_slots();
  } catch (const std::exception& e) {
    problem = e.what();
  }
  agree_on_problem<CommError>(control_, problem, "allocating staging buffers");
  started_ = Clock::now();
  if (direct) {
    run_direct();
    return stats_;
  }
  if (reads_)
    reader_thread_ = std::thread([this] {
      reader_loop();
      reader_finished_ = true;
    });
  apply_thread_ = std::thread([this] { apply_loop(); });
  std::unique_ptr<Slot> failed_read;  // kAll: this rank's, kNode: its node's; agreed on at the end
  std::optional<std::string> node_error;  // kNode: this rank's failed node collective
  std::size_t k = 0;  // every bucket went through here when the loop ends at the last
  for (; k < plan_.buckets.size(); ++k) {
    std::optional<std::unique_ptr<Slot>> slot = reads_ ? next_filled() : free_.pop();
    if (!slot)
      raise<Error>("rank ", rank_, "/", control_.size(), ": reload pipeline stopped before bucket ",
                   k + 1, " of ", plan_.buckets.size());
    (*slot)->bucket = k;
    if (all_read_) {
      if ((*slot)->read_error) {
        failed_read = std::move(*slot);
        break;
      }
    } else if (!node_read_) {
      announce_read_status(**slot);
      transfer(**slot);
    } else if (world_root(k) >= 0) {
      // One node reader to the world: every rank learns at once whether it was
      // read, and stops there if not; a transfer that fails throws, as with
      // one reader.
      if (!announce_world_status(**slot)) {
        if ((*slot)->read_error) failed_read = std::move(*slot);
        break;
      }
      transfer(**slot);
    } else {
      // A node's announcement or transfer that fails stops that node only: the
      // other nodes run on, and the world agrees on the failure at the end. A
      // rank whose transfer failed (on it alone, maybe) joins its node's next
      // announcement to say so, and the whole node stops there together.
      bool announced = false;
      try {
        if (!announce_read_status(**slot)) {
          failed_read = std::move(*slot);  // (its read_error: the reader's own, or none)
          break;
        }
        announced = true;
        transfer(**slot);
      } catch (const std::exception& e) {
        node_error = e.what();
        if (announced && k + 1 < plan_.buckets.size()) try {
            announce_failed_transfer(k + 1);
          } catch (const std::exception& again) {
            log().error("rank {}: telling its node that a transfer failed also failed: {}", rank_,
                        again.what());
          }
        break;
      }
    }
    to_apply_.push(std::move(*slot));
    if (reports()) report_progress(k + 1, false);
  }
  if (reports() && k == plan_.buckets.size()) report_progress(plan_.buckets.size(), true);
  to_apply_.close();
  if (apply_thread_.joinable()) apply_thread_.join();
  stop();
  stats_.checksum += reader_checksum_;
  if (node_read_)
    agree_on_problem<CommError>(control_, node_error,
                                "a transfer within a node (--readers node; ranks of that node "
                                "may hold a mix of old and new weights)");
  if (all_read_ || node_read_)  // (only the rank that failed to read holds the error)
    agree_on_read_status(failed_read ? failed_read->bucket : 0,
                         failed_read ? failed_read->read_error : std::nullopt);
  if (files_) stats_.bytes_copied = files_->bytes_copied();
  stats_.device_stuck = device_stuck_;
  return stats_;
}

}  // namespace

PipelineStats run_pipeline(const CachedPlan& planned, ReloadTarget& model, Communicator& control,
                           DataTransport& data, WeightSource* source, const ReloadOptions& options,
                           ReloadWorkspace& workspace, NodePlanes* node) {
  // Staging that device work which never finished may still touch is abandoned
  // (never freed), also when the run ends in an agreed error raised after it.
  auto abandon_if_stuck = [&](bool stuck) {
    if (!stuck) return;
    log().error(
        "the device did not finish a bucket's work in time; abandoning {} bytes of staging "
        "buffers it may still access (not freed)",
        workspace.bytes());
    workspace.abandon_buffers();
  };
  PipelineStats stats;
  {
    Pipeline pipeline(planned, model, control, data, source, options, workspace, node);
    try {
      stats = pipeline.run();
    } catch (...) {
      pipeline.stop();  // (joins the threads: the flag below is final)
      abandon_if_stuck(pipeline.device_stuck());
      throw;
    }
  }
  abandon_if_stuck(stats.device_stuck);
  return stats;
}

}  // namespace tpreload::detail
