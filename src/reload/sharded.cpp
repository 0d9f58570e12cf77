#include "sharded.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

#include "clock.h"
#include "sync.h"
#include "tpreload/comm/device.h"
#include "tpreload/core/crc32c.h"
#include "tpreload/core/error.h"
#include "tpreload/core/fnv.h"
#include "tpreload/model/parameter_sink.h"

namespace tpreload::detail {
namespace {

// ------------------------------------------------------------- held lists

void put(std::vector<std::uint8_t>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

void put_u64(std::vector<std::uint8_t>& out, std::uint64_t v) {
  put(out, &v, sizeof v);
}

void put_ints(std::vector<std::uint8_t>& out, const std::vector<std::int64_t>& v) {
  put(out, v.data(), v.size() * sizeof(std::int64_t));
}

std::vector<std::uint8_t> serialize_held(const ShardedSource& source) {
  std::vector<std::uint8_t> out;
  put_u64(out, source.held().size());
  for (const HeldTensor& h : source.held()) {
    put_u64(out, h.name.size());
    put(out, h.name.data(), h.name.size());
    put_u64(out, static_cast<std::uint64_t>(h.dtype));
    put_u64(out, h.shape.size());
    put_ints(out, h.shape);
    put_ints(out, h.box.offset);
    put_ints(out, h.box.size);
  }
  return out;
}

class Reader {
 public:
  Reader(const std::vector<std::uint8_t>& bytes, int rank) : bytes_(bytes), rank_(rank) {}
  std::uint64_t u64() {
    std::uint64_t v = 0;
    take(&v, sizeof v);
    return v;
  }
  std::vector<std::int64_t> ints(std::uint64_t n) {
    if (n > bytes_.size()) fail();
    std::vector<std::int64_t> v(n);
    take(v.data(), n * sizeof(std::int64_t));
    return v;
  }
  std::string text(std::uint64_t n) {
    if (n > bytes_.size()) fail();
    std::string s(n, '\0');
    take(s.data(), n);
    return s;
  }
  bool done() const { return at_ == bytes_.size(); }
  [[noreturn]] void fail() const {
    raise<CommError>("sharded sources: rank ", rank_, "'s list of boxes is malformed (",
                     bytes_.size(), " bytes)");
  }

 private:
  void take(void* p, std::size_t n) {
    if (bytes_.size() - at_ < n) fail();
    std::memcpy(p, bytes_.data() + at_, n);
    at_ += n;
  }
  const std::vector<std::uint8_t>& bytes_;
  int rank_;
  std::size_t at_ = 0;
};

void parse_held(const std::vector<std::uint8_t>& bytes, int rank, std::vector<HeldBox>& out) {
  Reader in(bytes, rank);
  const std::uint64_t count = in.u64();
  for (std::uint64_t i = 0; i < count; ++i) {
    HeldBox h;
    h.rank = rank;
    h.name = in.text(in.u64());
    const std::uint64_t dtype = in.u64();
    if (dtype >= std::size(kAllDTypes)) in.fail();
    h.dtype = static_cast<DType>(dtype);
    const std::uint64_t dims = in.u64();
    h.shape = in.ints(dims);
    h.box.offset = in.ints(dims);
    h.box.size = in.ints(dims);
    out.push_back(std::move(h));
  }
  if (!in.done()) in.fail();
}

// This rank's boxes by tensor name.
std::map<std::string, std::vector<const HeldTensor*>> by_name(const ShardedSource& mine) {
  std::map<std::string, std::vector<const HeldTensor*>> out;
  for (const HeldTensor& h : mine.held()) out[h.name].push_back(&h);
  return out;
}

// The elements of `box` (which this rank holds, in one box or across several)
// into `dst`, row-major.
void gather_box(const std::vector<const HeldTensor*>& held, const Box& box, MutableBytes dst) {
  for (const HeldTensor* h : held)
    if (auto part = intersect(h->box, box))
      copy_region(h->bytes, h->box, dst, box, *part, dtype_size(h->dtype));
}

}  // namespace

std::vector<HeldBox> gather_held(Communicator& world, const ShardedSource& mine,
                                 std::uint64_t& hash) {
  const std::vector<std::uint8_t> own = serialize_held(mine);
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(world.size()), 0);
  sizes[static_cast<std::size_t>(world.rank())] = static_cast<std::int64_t>(own.size());
  allreduce_ints(world, sizes, IntOp::kSum);
  std::vector<HeldBox> held;
  hash = kFnvOffsetBasis;
  std::vector<std::uint8_t> payload;
  for (int r = 0; r < world.size(); ++r) {
    const auto n = static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)]);
    if (r == world.rank())
      payload = own;
    else
      payload.assign(n, 0);
    world.broadcast(MutableBytes(payload.data(), payload.size()), r);
    hash = fnv1a_bytes(payload.data(), payload.size(), fnv1a_word(hash, n));
    parse_held(payload, r, held);
  }
  return held;
}

SourceMetadata sharded_metadata(const std::vector<HeldBox>& held, const std::string& description) {
  SourceMetadata md;
  md.description = description;
  std::map<std::string, std::size_t> index;
  for (const HeldBox& h : held) {
    const auto [it, fresh] = index.emplace(h.name, md.tensors.size());
    if (!fresh) {
      const TensorInfo& t = md.tensors[it->second];
      if (t.dtype != h.dtype || t.shape != h.shape)
        raise<ValidationError>("sharded sources: '", h.name, "' is held as ", dtype_name(t.dtype),
                               " ", shape_string(t.shape), " and by rank ", h.rank, " as ",
                               dtype_name(h.dtype), " ", shape_string(h.shape));
      continue;
    }
    TensorInfo t;
    t.name = h.name;
    t.dtype = h.dtype;
    t.shape = h.shape;
    std::uint64_t elements = 1;
    for (std::int64_t s : h.shape)
      elements *= static_cast<std::uint64_t>(std::max<std::int64_t>(s, 0));
    t.nbytes = elements * dtype_size(h.dtype);
    md.tensors.push_back(std::move(t));
  }
  return md;
}

std::vector<std::vector<ViewPart>> bucket_views(const Plan& plan, const SourceMetadata& md,
                                                const Bucket& bucket, int world_size, int tp_size) {
  std::vector<std::vector<ViewPart>> views(static_cast<std::size_t>(world_size));
  if (!bucket.scatter)  // (an internal invariant: make_plan scatters every tensor here)
    raise<Error>(
        "sharded sources: the plan broadcasts a bucket (of ", bucket.pieces.size(),
        " pieces, the first of '",
        bucket.pieces.empty() ? "" : md.tensors[plan.tensors[bucket.pieces[0].planned].index].name,
        "'), but every tensor of a sharded reload is scattered");
  for (const Piece& p : bucket.pieces) {
    const PlannedTensor& t = plan.tensors[p.planned];
    const TensorInfo& info = md.tensors[t.index];
    for (int w = 0; w < world_size; ++w) {
      const int tp = w % tp_size;
      const std::int64_t rows =
          std::max<std::int64_t>(0, std::min(p.row_end, t.rows_for(tp)) - p.row_begin);
      if (rows == 0) continue;
      const Placement& pl = t.placements.at(static_cast<std::size_t>(tp));
      Box box = Box::whole(pl.source_shape);
      if (pl.source_dim >= 0) {
        box.offset[static_cast<std::size_t>(pl.source_dim)] = pl.source_start;
        box.size[static_cast<std::size_t>(pl.source_dim)] = pl.source_length;
      }
      if (!box.offset.empty()) {
        box.offset[0] += p.row_begin;
        box.size[0] = rows;
      }
      const std::uint64_t bytes = static_cast<std::uint64_t>(rows) * t.row_bytes_for(tp, info);
      views[static_cast<std::size_t>(w)].push_back(
          {info.name, std::move(box), p.rank_offset[static_cast<std::size_t>(w)], bytes});
    }
  }
  return views;
}

void plan_exchanges(CachedPlan& planned, const std::vector<HeldBox>& held, int world_size,
                    int serving, int tp_size, int rank, std::uint64_t piece_bytes) {
  const Plan& plan = planned.plan;
  const SourceMetadata& md = planned.metadata;
  // Every region held twice, whether or not a rank needs it.
  const TransferPlan everything = plan_transfers(held, {}, world_size, piece_bytes);
  planned.shared.clear();
  for (const TransferPlan::Shared& s : everything.shared)
    planned.shared.push_back({everything.tensors[s.tensor].name, s.box, s.ranks});
  std::map<std::string, std::vector<const HeldBox*>> holders;
  for (const HeldBox& h : held) holders[h.name].push_back(&h);
  planned.exchanges.clear();
  planned.views.clear();
  for (const Bucket& b : plan.buckets) {
    std::vector<std::vector<ViewPart>> views = bucket_views(plan, md, b, serving, tp_size);
    std::vector<NeededBox> needed;
    std::vector<HeldBox> bucket_held;
    for (const Piece& p : b.pieces)
      for (const HeldBox* h : holders[md.tensors[plan.tensors[p.planned].index].name])
        bucket_held.push_back(*h);
    for (int w = 0; w < serving; ++w)
      for (const ViewPart& v : views[static_cast<std::size_t>(w)])
        needed.push_back({v.name, v.box, w});
    planned.exchanges.push_back(
        plan_transfers(std::move(bucket_held), std::move(needed), world_size, piece_bytes));
    planned.views.push_back(rank < serving ? std::move(views[static_cast<std::size_t>(rank)])
                                           : std::vector<ViewPart>{});
  }
}

std::optional<std::string> compare_shared(Communicator& world, const CachedPlan& planned,
                                          const ShardedSource& mine) {
  if (planned.shared.empty()) return std::nullopt;
  const auto held = by_name(mine);
  const std::size_t n = planned.shared.size();
  std::vector<std::int64_t> high(n, -1), low(n, std::numeric_limits<std::int64_t>::max());
  std::vector<std::byte> scratch;
  for (std::size_t i = 0; i < n; ++i) {
    const SharedRegion& s = planned.shared[i];
    if (!std::binary_search(s.ranks.begin(), s.ranks.end(), world.rank())) continue;
    const std::vector<const HeldTensor*>& boxes = held.at(s.name);
    scratch.resize(static_cast<std::size_t>(s.box.elements()) * dtype_size(boxes.front()->dtype));
    gather_box(boxes, s.box, MutableBytes(scratch.data(), scratch.size()));
    high[i] = low[i] = crc32c(scratch.data(), scratch.size());
  }
  allreduce_ints(world, high, IntOp::kMax);
  allreduce_ints(world, low, IntOp::kMin);
  std::string differ;
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (high[i] == low[i]) continue;
    if (++count > 4) continue;
    const SharedRegion& s = planned.shared[i];
    std::string ranks;
    for (int r : s.ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    differ += concat(differ.empty() ? "" : "; ", s.box.describe(), " of '", s.name,
                     "' held by ranks ", ranks);
  }
  if (count == 0) return std::nullopt;
  return concat("sharded sources: ranks hold different bytes where their boxes overlap: ", differ,
                count > 4 ? concat(" (and ", count - 4, " more regions)") : std::string());
}

PipelineStats run_exchanges(const CachedPlan& planned, ReloadTarget& model, Communicator& control,
                            DataTransport& data, const ShardedSource& mine,
                            const ReloadOptions& options) {
  PipelineStats stats;
  stats.depth = 1;
  const Plan& plan = planned.plan;
  ParameterSink& sink = model.sink();
  const int me = control.rank(), n = control.size();
  const auto ranks = static_cast<std::size_t>(n);
  const auto held = by_name(mine);
  // Each message between two ranks ends with its CRC-32C.
  const std::uint64_t trailer = options.checksums && n > 1 ? sizeof(std::uint32_t) : 0;
  // Where the view and the messages are staged: in host memory (8-byte
  // aligned, as a scatter region is) where no device copies them. Parameters
  // on a device: the view is assembled in pinned memory and copied to the
  // device. A transport that moves device memory (the parameters' device):
  // the messages are packed and unpacked in pinned memory and move between
  // device buffers.
  Device* device = sink.device();
  const bool device_transport = data.memory() == MemoryKind::kDevice;
  std::unique_ptr<Device::Scope> current;
  std::unique_ptr<DeviceStream> copies;
  struct Staged {
    std::vector<std::uint64_t> pageable;
    Buffer pinned, on_device;
  } view, send, recv;
  auto words = [](std::uint64_t bytes) { return static_cast<std::size_t>((bytes + 7) / 8); };
  // At least `bytes` of `s` in host memory, pinned where a device copies them.
  auto host = [&](Staged& s, std::uint64_t bytes, bool pinned) {
    if (!pinned) {
      if (s.pageable.size() < words(bytes)) s.pageable.resize(words(bytes));
      return reinterpret_cast<std::byte*>(s.pageable.data());
    }
    if (s.pinned.size() < bytes) {
      s.pinned = Buffer();  // (freed before the larger one is had)
      s.pinned = device->pinned_memory().allocate(bytes);
    }
    return s.pinned.data();
  };
  auto on_device = [&](Staged& s, std::uint64_t bytes) {
    if (s.on_device.size() < bytes) {
      s.on_device = Buffer();
      s.on_device = device->memory().allocate(bytes);
    }
    return s.on_device.data();
  };
  // `bytes` from `from` to `to` on the device's stream, waited for.
  auto copy = [&](std::byte* to, const std::byte* from, std::uint64_t bytes, CopyKind kind,
                  const std::string& what) {
    if (bytes == 0) return;
    copies->copy(to, from, bytes, kind);
    synchronize(*copies, options.device_timeout,
                concat("copying ", what, " (", bytes, " bytes) ",
                       kind == CopyKind::kHostToDevice ? "to " : "from ", device->describe()));
  };
  // Progress goes to the reader rank, as for the other sources.
  bool reports = me == options.reader_rank && options.progress != nullptr;
  // What bucket k moves between every two ranks (each message with its
  // trailer), and what this rank sends, receives and keeps of it.
  struct Moves {
    std::vector<std::uint64_t> counts;
    std::uint64_t out = 0, in = 0, view = 0;
  };
  auto moves_of = [&](std::size_t k) {
    Moves m;
    m.counts.assign(ranks * ranks, 0);
    for (const TransferPlan::Transfer& t : planned.exchanges[k].transfers)
      if (t.from != t.to)
        m.counts[static_cast<std::size_t>(t.from) * ranks + static_cast<std::size_t>(t.to)] +=
            t.bytes;
    for (std::uint64_t& c : m.counts)
      if (c) c += trailer;
    for (std::size_t r = 0; r < ranks; ++r) {
      m.out += m.counts[static_cast<std::size_t>(me) * ranks + r];
      m.in += m.counts[r * ranks + static_cast<std::size_t>(me)];
    }
    // (a rank past the serving ranks has no view: it only sends)
    const auto& ranges = plan.buckets[k].ranges;
    if (static_cast<std::size_t>(me) < ranges.size())
      m.view = ranges[static_cast<std::size_t>(me)].length;
    return m;
  };
  // Every bucket's staging, had before the first exchange: a rank that cannot
  // have it stops every rank alike, and none is left waiting in an exchange.
  {
    Moves most;
    for (std::size_t k = 0; k < plan.buckets.size(); ++k) {
      const Moves m = moves_of(k);
      most.out = std::max(most.out, m.out);
      most.in = std::max(most.in, m.in);
      most.view = std::max(most.view, m.view);
    }
    std::optional<std::string> problem;
    try {
      if (device) {
        current = device->make_current();
        copies = device->make_stream();
        on_device(view, most.view);
      }
      if (device_transport) {
        on_device(send, most.out);
        on_device(recv, most.in);
      }
      host(view, most.view, device != nullptr);
      host(send, most.out, device_transport);
      host(recv, most.in, device_transport);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    agree_on_problem<CommError>(control, problem,
                                "allocating the sharded reload's staging (nothing was reloaded)");
  }
  const auto began = Clock::now();
  for (std::size_t k = 0; k < plan.buckets.size(); ++k) {
    const Bucket& bucket = plan.buckets[k];
    const TransferPlan& x = planned.exchanges[k];
    const std::vector<ViewPart>& parts = planned.views[k];
    auto start = Clock::now();
    const Moves m = moves_of(k);
    const std::vector<std::uint64_t>& counts = m.counts;
    const std::uint64_t out = m.out, in = m.in, view_bytes = m.view;
    const bool serves = static_cast<std::size_t>(me) < bucket.ranges.size();
    std::byte* view_at = host(view, view_bytes, device != nullptr);
    std::byte* send_at = host(send, out, device_transport);
    std::byte* recv_at = host(recv, in, device_transport);
    std::byte* device_view = device ? on_device(view, view_bytes) : nullptr;
    std::byte* device_send = device_transport ? on_device(send, out) : nullptr;
    std::byte* device_recv = device_transport ? on_device(recv, in) : nullptr;
    StagingBytes& staged = stats.staging;
    staged.host = std::max<std::uint64_t>(
        staged.host, 8 * (view.pageable.size() + send.pageable.size() + recv.pageable.size()));
    staged.pinned =
        std::max(staged.pinned, view.pinned.size() + send.pinned.size() + recv.pinned.size());
    staged.device = std::max(staged.device,
                             view.on_device.size() + send.on_device.size() + recv.on_device.size());
    // Pack: by destination, each message its transfers in plan order. A rank
    // that cannot still sends (its peers wait for the bytes): zeros, each
    // message with a CRC-32C that cannot match, so that no receiver applies it.
    std::uint64_t at = 0;
    try {
      for (int to = 0; to < n; ++to) {
        const std::uint64_t begin = at;
        for (const TransferPlan::Transfer& t : x.transfers) {
          if (t.from != me || t.to != to || to == me) continue;
          gather_box(held.at(x.tensors[t.tensor].name), t.box, MutableBytes(send_at + at, t.bytes));
          at += t.bytes;
        }
        if (at != begin && trailer) {
          const auto summing = Clock::now();
          const std::uint32_t sum = crc32c(send_at + begin, at - begin);
          stats.checksum += since(summing);
          std::memcpy(send_at + at, &sum, sizeof sum);
          at += trailer;
        }
      }
    } catch (const std::exception& e) {
      if (!stats.apply_error)
        stats.apply_error = concat("packing bucket ", k + 1, " on rank ", me, ": ", e.what());
      std::memset(send_at, 0, out);
      at = 0;
      for (int to = 0; to < n; ++to) {
        const std::uint64_t length =
            counts[static_cast<std::size_t>(me) * ranks + static_cast<std::size_t>(to)];
        if (length >= trailer && length > 0 && trailer) {
          const std::uint32_t sum = ~crc32c(send_at + at, length - trailer);
          std::memcpy(send_at + at + length - trailer, &sum, sizeof sum);
        }
        at += length;
      }
    }
    stats.read += since(start);
    start = Clock::now();
    // Posted, then this rank's own bytes copied while the messages move.
    // (a copy that fails still posts the exchange: the peers wait for it)
    if (device_transport) try {
        copy(device_send, send_at, out, CopyKind::kHostToDevice, "messages");
      } catch (const std::exception& e) {
        if (!stats.apply_error)
          stats.apply_error = concat("bucket ", k + 1, " on rank ", me, ": ", e.what());
      }
    std::unique_ptr<Transfer> moving =
        device_transport
            ? data.exchange(ConstBytes(device_send, out), MutableBytes(device_recv, in), counts)
            : data.exchange(ConstBytes(send_at, out), MutableBytes(recv_at, in), counts);
    stats.transfer += since(start);
    stats.bytes_sent += out;
    stats.bytes_received += in;
    start = Clock::now();
    // A tensor may have several parts in one view (pieces the plan cut), and a
    // transfer's box may span them: each part takes what lies in it.
    std::map<std::string, std::vector<const ViewPart*>> parts_of;
    for (const ViewPart& p : parts) parts_of[p.name].push_back(&p);
    auto unpack = [&](const std::string& name, ConstBytes from, const Box& box,
                      std::size_t element) {
      for (const ViewPart* p : parts_of[name])
        if (auto region = intersect(box, p->box))
          copy_region(from, box, MutableBytes(view_at + p->offset, p->bytes), p->box, *region,
                      element);
    };
    try {  // (the transfer is waited for whatever happens here: it uses the buffers)
      // What this rank holds of its own view: straight from its boxes.
      for (const TransferPlan::Transfer& t : x.transfers) {
        if (t.from != me || t.to != me) continue;
        const std::string& name = x.tensors[t.tensor].name;
        const std::size_t element = dtype_size(x.tensors[t.tensor].dtype);
        for (const ViewPart* p : parts_of[name])
          if (const auto in_view = intersect(t.box, p->box))
            for (const HeldTensor* h : held.at(name))
              if (const auto region = intersect(*in_view, h->box))
                copy_region(h->bytes, h->box, MutableBytes(view_at + p->offset, p->bytes), p->box,
                            *region, element);
      }
    } catch (const std::exception& e) {
      if (!stats.apply_error)
        stats.apply_error = concat("copying bucket ", k + 1, " on rank ", me, ": ", e.what());
    }
    stats.read += since(start);
    start = Clock::now();
    moving->wait();
    if (device_transport) try {
        copy(recv_at, device_recv, in, CopyKind::kDeviceToHost, "messages");
      } catch (const std::exception& e) {
        if (!stats.apply_error)
          stats.apply_error = concat("bucket ", k + 1, " on rank ", me, ": ", e.what());
      }
    stats.transfer += since(start);
    start = Clock::now();
    try {
      at = 0;
      for (int from = 0; from < n; ++from) {
        const std::uint64_t length =
            counts[static_cast<std::size_t>(from) * ranks + static_cast<std::size_t>(me)];
        if (length == 0) continue;
        if (trailer) {
          std::uint32_t sent = 0;
          std::memcpy(&sent, recv_at + at + length - trailer, sizeof sent);
          const auto summing = Clock::now();
          const std::uint32_t got = crc32c(recv_at + at, length - trailer);
          stats.checksum += since(summing);
          if (got != sent && !stats.corrupted)
            stats.corrupted =
                concat("rank ", me, " received ", length - trailer, " bytes of bucket ", k + 1,
                       " of ", plan.buckets.size(), " from rank ", from, " with CRC-32C ", got,
                       ", sent as ", sent);
        }
        std::uint64_t within = at;
        for (const TransferPlan::Transfer& t : x.transfers) {
          if (t.from != from || t.to != me) continue;
          unpack(x.tensors[t.tensor].name, ConstBytes(recv_at + within, t.bytes), t.box,
                 dtype_size(x.tensors[t.tensor].dtype));
          within += t.bytes;
        }
        at += length;
      }
    } catch (const std::exception& e) {
      if (!stats.apply_error)
        stats.apply_error = concat("unpacking bucket ", k + 1, " on rank ", me, ": ", e.what());
    }
    stats.read += since(start);
    if (reports) reports = report_progress(options, plan, k + 1, false, since(began));
    // Nothing more is written on this rank after a failure or a corrupted
    // message; the exchanges go on (the peers wait for them) and the caller
    // agrees on the failure.
    if (stats.corrupted || stats.apply_error || !serves) continue;
    start = Clock::now();
    try {
      const BucketApply& a = planned.applies[k];
      if (device) copy(device_view, view_at, view_bytes, CopyKind::kHostToDevice, "a view");
      for (const RowWrite& w : a.writes) sink.write(w, device ? device_view : view_at);
      complete_bucket(model, bucket, a, options, stats, start);
    } catch (const std::exception& e) {
      stats.apply_error = e.what();
    }
  }
  if (reports) report_progress(options, plan, plan.buckets.size(), true, since(began));
  // Writes a failed bucket queued from the device view land before it is freed.
  if (device) try {
      sink.flush(options.device_timeout);
    } catch (const std::exception& e) {
      if (!stats.apply_error) stats.apply_error = e.what();
    }
  return stats;
}

}  // namespace tpreload::detail
