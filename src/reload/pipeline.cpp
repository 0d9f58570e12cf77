#include "pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "sync.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload::detail {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::uint64_t row_bytes(const std::vector<std::int64_t>& shape, DType dtype) {
  std::uint64_t n = dtype_size(dtype);
  for (std::size_t d = 1; d < shape.size(); ++d) n *= static_cast<std::uint64_t>(shape[d]);
  return n;
}

std::vector<std::int64_t> block_shape(std::vector<std::int64_t> shape, std::int64_t rows) {
  if (!shape.empty()) shape[0] = rows;
  return shape;
}

// A buffer slot: what the reader filled (send) and what this rank receives (recv).
struct Slot {
  std::size_t bucket = 0;
  std::byte* send = nullptr;  // buffers owned by the ReloadWorkspace
  std::byte* recv = nullptr;
  ConstBytes payload;  // reader rank, broadcast: the bytes to send (a view or `send`)
  std::optional<std::string> read_error;
};

class Pipeline {
 public:
  Pipeline(const Plan& plan, const SourceMetadata& md, TensorParallelModel& model,
           Communicator& world, WeightSource* source, const ReloadOptions& options,
           ReloadWorkspace& workspace)
      : plan_(plan), md_(md), model_(model), world_(world), source_(source), options_(options),
        workspace_(workspace),
        rank_(world.rank()), tp_rank_(model.options().tp_rank),
        reader_(world.rank() == options.reader_rank) {}

  ~Pipeline() { stop(); }

  PipelineStats run();

 private:
  void allocate_slots();
  void reader_loop();
  void apply_loop();
  void fill(Slot& slot);
  void fill_broadcast(const Bucket& bucket, Slot& slot);
  bool read_row_windows(const Bucket& bucket, const Piece& p, const PlannedTensor& t, Slot& slot);
  ByteRange piece_range(const Piece& p) const;
  bool send_mapped(const Bucket& bucket, Slot& slot);
  void fill_scatter(const Bucket& bucket, Slot& slot);
  ConstBytes full_rows(std::size_t index, std::int64_t a, std::int64_t b,
                       std::vector<std::byte>& scratch);
  void transfer(Slot& slot);
  void apply(const Slot& slot);
  void apply_piece(const Bucket& bucket, const Piece& piece, const std::byte* base);
  void announce_read_status(const Slot& slot);
  void stop();

  const Plan& plan_;
  const SourceMetadata& md_;
  TensorParallelModel& model_;
  Communicator& world_;
  WeightSource* source_;
  const ReloadOptions& options_;
  ReloadWorkspace& workspace_;
  const int rank_, tp_rank_;
  const bool reader_;
  PipelineStats stats_;
  BlockingQueue<std::unique_ptr<Slot>> free_, filled_, to_apply_;
  std::thread reader_thread_, apply_thread_;
  std::atomic<bool> stopping_{false};
};

void Pipeline::allocate_slots() {
  std::uint64_t send = 0, recv = 0;
  for (const Bucket& b : plan_.buckets) {
    if (reader_) send = std::max(send, b.bytes);
    // The reader receives its own scatter range in place, inside its send buffer.
    if (!reader_) recv = std::max(recv, b.scatter ? b.ranges[rank_].length : b.bytes);
  }
  const int depth = std::max(1, options_.pipeline_depth);
  for (int i = 0; i < depth; ++i) {
    auto slot = std::make_unique<Slot>();
    if (send) slot->send = workspace_.buffer(2 * i, send);
    if (recv) slot->recv = workspace_.buffer(2 * i + 1, recv);
    free_.push(std::move(slot));
  }
  stats_.buffer_bytes = static_cast<std::uint64_t>(depth) * (send + recv);
}

ConstBytes Pipeline::full_rows(std::size_t index, std::int64_t a, std::int64_t b,
                               std::vector<std::byte>& scratch) {
  const TensorInfo& info = md_.tensors[index];
  const std::uint64_t rb = row_bytes(info.shape, info.dtype);
  const ByteRange range{static_cast<std::uint64_t>(a) * rb, static_cast<std::uint64_t>(b - a) * rb};
  if (auto view = source_->view(index, range)) return *view;
  scratch.resize(range.length);
  source_->read(index, range, MutableBytes(scratch.data(), scratch.size()));
  return ConstBytes(scratch.data(), scratch.size());
}

ByteRange Pipeline::piece_range(const Piece& p) const {
  const TensorInfo& info = md_.tensors[plan_.tensors[p.planned].index];
  const std::uint64_t rb = row_bytes(info.shape, info.dtype);
  return {static_cast<std::uint64_t>(p.row_begin) * rb,
          static_cast<std::uint64_t>(p.row_end - p.row_begin) * rb};
}

// zero_copy: a bucket whose pieces follow each other in one file is sent straight
// from the source's mapping. False when it is not one run or the source has no views.
bool Pipeline::send_mapped(const Bucket& bucket, Slot& slot) {
  if (bucket.pieces.empty()) return false;
  for (std::size_t i = 1; i < bucket.pieces.size(); ++i) {
    const TensorInfo& a = md_.tensors[plan_.tensors[bucket.pieces[i - 1].planned].index];
    const TensorInfo& b = md_.tensors[plan_.tensors[bucket.pieces[i].planned].index];
    const ByteRange ra = piece_range(bucket.pieces[i - 1]), rb = piece_range(bucket.pieces[i]);
    if (a.file != b.file || a.file_offset + ra.end() != b.file_offset + rb.offset) {
      log().debug("bucket {}: piece {} ('{}') does not follow the previous one in the file; reading",
                  slot.bucket, i, b.name);
      return false;
    }
  }
  std::optional<ConstBytes> first, last;
  for (const Piece& p : bucket.pieces) {
    const auto v = source_->view(plan_.tensors[p.planned].index, piece_range(p));
    if (!v) return false;  // sources without views have none for any tensor
    if (last && last->data + last->size != v->data) return false;  // not one run after all
    if (!first) first = v;
    last = v;
  }
  slot.payload = ConstBytes(first->data, bucket.bytes);
  return true;
}

void Pipeline::fill_broadcast(const Bucket& bucket, Slot& slot) {
  if (options_.zero_copy && send_mapped(bucket, slot)) return;
  std::vector<ReadRequest> reads;
  reads.reserve(bucket.pieces.size());
  for (const Piece& p : bucket.pieces) {
    const ByteRange range = piece_range(p);
    reads.push_back({plan_.tensors[p.planned].index, range, MutableBytes(slot.send + p.offset, range.length)});
    stats_.bytes_copied += range.length;
  }
  source_->read_many(reads);
  slot.payload = ConstBytes(slot.send, bucket.bytes);
}

// Row-parallel: each full row is [one rank's window | the next rank's | ...]. When
// the windows tile the row, one split read cuts every rank's slice out of the file
// straight into the send buffer. False (nothing read) when they do not.
bool Pipeline::read_row_windows(const Bucket& bucket, const Piece& p, const PlannedTensor& t,
                                Slot& slot) {
  const TensorInfo& info = md_.tensors[t.index];
  const int tp = model_.options().tp_size;
  std::vector<int> order(tp);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return t.placements[a].source_start < t.placements[b].source_start;
  });
  std::int64_t col = 0;
  for (int r : order) {
    if (t.rows_for(r) < p.row_end || t.placements[r].source_start != col) return false;
    col += t.placements[r].source_length;
  }
  if (col != info.shape[1]) return false;
  const std::uint64_t full = row_bytes(info.shape, info.dtype);
  const std::uint64_t inner = full / static_cast<std::uint64_t>(info.shape[1]);
  const std::int64_t rows = p.row_end - p.row_begin;
  std::vector<MutableBytes> parts;
  parts.reserve(static_cast<std::size_t>(rows) * tp);
  for (std::int64_t i = 0; i < rows; ++i)
    for (int r : order) {
      const std::uint64_t width = static_cast<std::uint64_t>(t.placements[r].source_length) * inner;
      parts.emplace_back(slot.send + bucket.ranges[r].offset + p.rank_offset[r] + i * width, width);
    }
  source_->read_split(t.index, {static_cast<std::uint64_t>(p.row_begin) * full,
                                static_cast<std::uint64_t>(rows) * full}, parts);
  return true;
}

void Pipeline::fill_scatter(const Bucket& bucket, Slot& slot) {
  std::vector<std::byte> scratch;
  std::vector<ReadRequest> reads;  // contiguous rows, merged by the source where adjacent
  struct Replica {
    std::byte* dst;
    const std::byte* src;
    std::uint64_t n;
  };
  std::vector<Replica> replicas;  // copied once the rows they repeat are read
  const int tp = model_.options().tp_size;
  for (const Piece& p : bucket.pieces) {
    const PlannedTensor& t = plan_.tensors[p.planned];
    const TensorInfo& info = md_.tensors[t.index];
    // (A row of zero columns has no bytes to cut: treated as contiguous rows.)
    const bool row_parallel = t.kernel_tp_rank < 0 && t.placements[0].source_dim == 1 &&
                              info.shape.size() >= 2 && info.shape[1] > 0;
    const bool split = row_parallel && read_row_windows(bucket, p, t, slot);
    // Otherwise row-parallel slices all come from the same full rows: read them once.
    ConstBytes shared_rows;
    if (row_parallel && !split) shared_rows = full_rows(t.index, p.row_begin, p.row_end, scratch);
    for (int w = 0; w < world_.size(); ++w) {
      const int r = w % tp;
      const std::int64_t end = std::min(p.row_end, t.rows_for(r));
      if (end <= p.row_begin) continue;
      std::byte* dst = slot.send + bucket.ranges[w].offset + p.rank_offset[w];
      const std::uint64_t n = static_cast<std::uint64_t>(end - p.row_begin) * t.row_bytes_for(r, info);
      if (w >= tp) {  // a replica: same bytes as world rank r
        replicas.push_back({dst, slot.send + bucket.ranges[r].offset + p.rank_offset[r], n});
      } else if (split) {  // read above
      } else if (row_parallel) {  // each full row contributes its column window
        const Placement& pl = t.placements[r];
        const std::uint64_t full = row_bytes(info.shape, info.dtype);
        const std::uint64_t inner = full / static_cast<std::uint64_t>(info.shape[1]);
        const std::uint64_t width = static_cast<std::uint64_t>(pl.source_length) * inner;
        for (std::int64_t i = 0; i < end - p.row_begin; ++i)
          std::memcpy(dst + i * width, shared_rows.data + i * full + pl.source_start * inner, width);
      } else {  // column-parallel or kernel format: contiguous full rows
        const std::int64_t shift = t.kernel_tp_rank < 0 ? t.placements[r].source_start : 0;
        const std::uint64_t rb = row_bytes(info.shape, info.dtype);
        reads.push_back({t.index, {static_cast<std::uint64_t>(shift + p.row_begin) * rb, n},
                         MutableBytes(dst, n)});
      }
      stats_.bytes_copied += n;
    }
  }
  source_->read_many(reads);
  for (const Replica& c : replicas) std::memcpy(c.dst, c.src, c.n);
}

void Pipeline::fill(Slot& slot) {
  const Bucket& bucket = plan_.buckets[slot.bucket];
  const auto start = Clock::now();
  if (bucket.scatter)
    fill_scatter(bucket, slot);
  else
    fill_broadcast(bucket, slot);
  stats_.read += since(start);
}

void Pipeline::reader_loop() {
  for (std::size_t k = 0; k < plan_.buckets.size(); ++k) {
    auto slot = free_.pop();
    if (!slot || stopping_) return;
    (*slot)->bucket = k;
    try {
      fill(**slot);
    } catch (const std::exception& e) {
      (*slot)->read_error = e.what();
    }
    const bool failed = (*slot)->read_error.has_value();
    filled_.push(std::move(*slot));
    if (failed) return;
  }
}

void Pipeline::announce_read_status(const Slot& slot) {
  std::optional<std::string> problem;
  if (reader_) problem = slot.read_error;
  std::int64_t status = problem ? 1 : 0;
  world_.broadcast(MutableBytes(&status, sizeof status), options_.reader_rank);
  if (status == 0) return;
  std::int64_t length = problem ? static_cast<std::int64_t>(problem->size()) : 0;
  world_.broadcast(MutableBytes(&length, sizeof length), options_.reader_rank);
  std::string message(static_cast<std::size_t>(length), '\0');
  if (reader_) message = *problem;
  world_.broadcast(MutableBytes(message.data(), message.size()), options_.reader_rank);
  raise<CheckpointError>("reading bucket ", slot.bucket + 1, " of ", plan_.buckets.size(),
                         " failed on reader rank ", options_.reader_rank, ": ", message,
                         "; weights of earlier buckets were already replaced");
}

void Pipeline::transfer(Slot& slot) {
  const Bucket& bucket = plan_.buckets[slot.bucket];
  const auto start = Clock::now();
  if (bucket.scatter) {
    const ConstBytes send = reader_ ? ConstBytes(slot.send, bucket.bytes) : ConstBytes();
    std::byte* into = reader_ ? slot.send + bucket.ranges[rank_].offset : slot.recv;
    world_.scatterv(send, bucket.ranges, MutableBytes(into, bucket.ranges[rank_].length),
                    options_.reader_rank);
  } else if (reader_) {
    world_.broadcast(MutableBytes(const_cast<std::byte*>(slot.payload.data), slot.payload.size),
                     options_.reader_rank);
  } else {
    world_.broadcast(MutableBytes(slot.recv, bucket.bytes), options_.reader_rank);
  }
  if (reader_) stats_.bytes_sent += bucket.bytes;
  stats_.transfer += since(start);
}

void Pipeline::apply_piece(const Bucket& bucket, const Piece& piece, const std::byte* base) {
  const PlannedTensor& t = plan_.tensors[piece.planned];
  const TensorInfo& info = md_.tensors[t.index];
  const bool mine = t.kernel_tp_rank < 0 || t.kernel_tp_rank == tp_rank_;
  if (!mine) return;
  std::int64_t rows = piece.row_end - piece.row_begin;
  const std::byte* at = base + piece.offset;
  std::vector<std::int64_t> shape = info.shape;
  if (bucket.scatter) {
    rows = std::max<std::int64_t>(0, std::min(piece.row_end, t.rows_for(tp_rank_)) - piece.row_begin);
    at = base + piece.rank_offset[rank_];
    if (t.kernel_tp_rank < 0) shape = t.placements[tp_rank_].slice_shape();
  }
  shape = block_shape(shape, rows);
  const std::uint64_t bytes = shape.empty() ? dtype_size(info.dtype)
                                            : static_cast<std::uint64_t>(rows) * row_bytes(shape, info.dtype);
  const at::Tensor block = tensor_view(ConstBytes(at, bytes), info.dtype, shape);
  if (t.kernel_tp_rank >= 0)
    model_.load_kernel_rows(info.name, block, piece.row_begin, piece.last);
  else
    model_.load_checkpoint_rows(t.placements[tp_rank_], block, piece.row_begin, bucket.scatter,
                                piece.last);
}

void Pipeline::apply(const Slot& slot) {
  const Bucket& bucket = plan_.buckets[slot.bucket];
  const std::byte* base = !reader_        ? slot.recv
                          : bucket.scatter ? slot.send + bucket.ranges[rank_].offset
                                           : slot.payload.data;
  auto start = Clock::now();
  for (const Piece& piece : bucket.pieces) apply_piece(bucket, piece, base);
  stats_.apply += since(start);
  start = Clock::now();
  for (std::int64_t layer : bucket.finished_layers) model_.finish_layer(layer);
  stats_.finish += since(start);
}

void Pipeline::apply_loop() {
  while (auto slot = to_apply_.pop()) {
    if (!stats_.apply_error) {
      try {
        apply(**slot);
      } catch (const std::exception& e) {
        stats_.apply_error = e.what();
      }
    }
    free_.push(std::move(*slot));
  }
}

void Pipeline::stop() {
  stopping_ = true;
  free_.close();
  filled_.close();
  to_apply_.close();
  if (reader_thread_.joinable()) reader_thread_.join();
  if (apply_thread_.joinable()) apply_thread_.join();
}

PipelineStats Pipeline::run() {
  allocate_slots();
  if (reader_) reader_thread_ = std::thread([this] { reader_loop(); });
  apply_thread_ = std::thread([this] { apply_loop(); });
  for (std::size_t k = 0; k < plan_.buckets.size(); ++k) {
    std::optional<std::unique_ptr<Slot>> slot;
    if (reader_) {
      bool stalled = false;
      slot = filled_.pop_for(options_.read_stall_timeout, &stalled);
      if (stalled) {  // a read that never returns cannot be cancelled: end the job
        log().critical("reading bucket {} of {} made no progress for {} s; aborting the job", k + 1,
                       plan_.buckets.size(), options_.read_stall_timeout.count());
        world_.abort(125);
      }
    } else {
      slot = free_.pop();
    }
    if (!slot)
      raise<Error>("rank ", rank_, "/", world_.size(), ": reload pipeline stopped before bucket ",
                   k + 1, " of ", plan_.buckets.size());
    (*slot)->bucket = k;
    announce_read_status(**slot);
    transfer(**slot);
    to_apply_.push(std::move(*slot));
  }
  to_apply_.close();
  if (apply_thread_.joinable()) apply_thread_.join();
  stop();
  return stats_;
}

}  // namespace

PipelineStats run_pipeline(const Plan& plan, const SourceMetadata& metadata,
                           TensorParallelModel& model, Communicator& world, WeightSource* source,
                           const ReloadOptions& options, ReloadWorkspace& workspace) {
  Pipeline pipeline(plan, metadata, model, world, source, options, workspace);
  return pipeline.run();
}

}  // namespace tpreload::detail

namespace tpreload {

ReloadWorkspace::ReloadWorkspace() = default;
ReloadWorkspace::~ReloadWorkspace() = default;
ReloadWorkspace::ReloadWorkspace(ReloadWorkspace&&) noexcept = default;
ReloadWorkspace& ReloadWorkspace::operator=(ReloadWorkspace&&) noexcept = default;

void ReloadWorkspace::release() {
  buffers_.clear();
  plan_.reset();
}

std::uint64_t ReloadWorkspace::cached_plan_key() const { return plan_ ? plan_->key : 0; }

void ReloadWorkspace::keep_plan(std::unique_ptr<detail::CachedPlan> plan) { plan_ = std::move(plan); }

std::uint64_t ReloadWorkspace::bytes() const {
  std::uint64_t total = 0;
  for (const Buffer& b : buffers_) total += b.size;
  return total;
}

std::byte* ReloadWorkspace::buffer(std::size_t index, std::uint64_t size) {
  if (buffers_.size() <= index) buffers_.resize(index + 1);
  Buffer& b = buffers_[index];
  if (b.size < size) {
    b.data.reset();  // free before allocating: never hold both
    b.data.reset(new std::byte[size]);
    b.size = size;
  }
  return b.data.get();
}

}  // namespace tpreload
