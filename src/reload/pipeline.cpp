#include "pipeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "bucket_reader.h"
#include "pipeline_impl.h"
#include "sync.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/device.h"
#include "tpreload/core/crc32c.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/model/row_writes.h"

namespace tpreload::detail {
namespace pipeline_internal {

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

}  // namespace pipeline_internal

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

namespace pipeline_internal {

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

}  // namespace pipeline_internal

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
    pipeline_internal::Pipeline pipeline(planned, model, control, data, source, options, workspace,
                                         node);
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
