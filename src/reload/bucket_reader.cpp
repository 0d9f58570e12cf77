#include "bucket_reader.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "row_windows.h"
#include "tpreload/core/log.h"

namespace tpreload::detail {
namespace {

// Row-parallel windows narrower than this on average are cut out of full rows read
// whole, and at most kNarrowRowsBytes of such rows per bucket (beyond, a request
// per window): a preadv part costs the kernel about as much as 500 bytes of copy
// (docs/PERFORMANCE.md, "Why it is fast").
constexpr std::uint64_t kNarrowWindow = 512;
constexpr std::uint64_t kNarrowRowsBytes = std::uint64_t{16} << 20;

// An interval [begin, end) of a group (`key`: a parameter slot, or one bucket's
// source bytes) with the index of what it belongs to.
struct Interval {
  std::uint64_t key, begin, end;
  std::size_t owner;
};

// Per owner (0..owners), whether none of its intervals overlaps another of the
// same key. Sorted by key and start, an interval overlaps an earlier one when
// it starts before the furthest end so far, a later one when the next starts
// before its end.
std::vector<char> alone(std::vector<Interval> v, std::size_t owners) {
  std::sort(v.begin(), v.end(), [](const Interval& x, const Interval& y) {
    return x.key != y.key ? x.key < y.key : x.begin < y.begin;
  });
  std::vector<char> out(owners, 1);
  std::uint64_t reach = 0;  // the furthest end so far within the key
  for (std::size_t k = 0; k < v.size(); ++k) {
    const Interval& i = v[k];
    if (k == 0 || v[k - 1].key != i.key) reach = 0;
    const bool before = reach > i.begin;
    const bool after = k + 1 < v.size() && v[k + 1].key == i.key && v[k + 1].begin < i.end;
    if ((before || after) && i.owner < owners) out[i.owner] = 0;
    reach = std::max(reach, i.end);
  }
  return out;
}

}  // namespace

std::vector<DirectReads> place_own_writes(const Plan& plan, const std::vector<BucketApply>& applies,
                                          const std::vector<ParamSpec>& params, int world_rank) {
  // Writes numbered across buckets (first[b] + i); the rows each writes (an
  // int8 write's scales too) and each zeroing (owner: none) on one list.
  std::vector<std::size_t> first(applies.size() + 1, 0);
  for (std::size_t b = 0; b < applies.size(); ++b)
    first[b + 1] = first[b] + applies[b].writes.size();
  const std::size_t writes = first.back();
  std::vector<Interval> rows;
  for (std::size_t b = 0; b < applies.size(); ++b) {
    for (std::size_t i = 0; i < applies[b].writes.size(); ++i) {
      const RowWrite& w = applies[b].writes[i];
      if (w.rows <= 0 || w.dest_row < 0) continue;
      const auto begin = static_cast<std::uint64_t>(w.dest_row);
      const auto end = begin + static_cast<std::uint64_t>(w.rows);
      rows.push_back({w.slot, begin, end, first[b] + i});
      if (w.kind == WriteKind::kQuantizeInt8)
        rows.push_back({params.at(w.slot).scale_slot, begin, end, first[b] + i});
    }
    for (const RowZero& z : applies[b].zeros)
      rows.push_back({z.slot, static_cast<std::uint64_t>(z.row_begin),
                      static_cast<std::uint64_t>(z.row_end), writes});
  }
  const std::vector<char> sole = alone(std::move(rows), writes);
  std::vector<DirectReads> reads(plan.buckets.size());
  std::vector<Interval> sources;
  for (std::size_t b = 0; b < plan.buckets.size() && b < applies.size(); ++b) {
    const Bucket& bucket = plan.buckets[b];
    if (!bucket.scatter) continue;
    const std::uint64_t region_bytes =
        bucket.ranges.at(static_cast<std::size_t>(world_rank)).length;
    const BucketApply& apply = applies[b];
    sources.clear();
    for (std::size_t i = 0; i < apply.writes.size(); ++i) {
      const RowWrite& w = apply.writes[i];
      const std::uint64_t end = write_source_end(w, params.at(w.slot));
      if (end > w.src_offset) sources.push_back({0, w.src_offset, end, i});
    }
    const std::vector<char> read_alone = alone(sources, apply.writes.size());
    DirectReads& out = reads[b];
    out.placed.assign(apply.writes.size(), 0);
    for (const Interval& src : sources) {  // (in write order; the spans sorted below)
      const RowWrite& w = apply.writes[src.owner];
      const ParamSpec& param = params[w.slot];
      if (!read_alone[src.owner] || !sole[first[b] + src.owner] || !plain_row_copy(w, param) ||
          w.dest_row < 0 || w.dest_row + w.rows > param_rows(param.shape) || src.end > region_bytes)
        continue;
      out.spans.push_back(
          {src.begin, src.end, w.slot,
           static_cast<std::uint64_t>(w.dest_row) * param_row_bytes(param.shape, param.dtype)});
      out.placed[src.owner] = 1;
    }
    std::sort(out.spans.begin(), out.spans.end(),
              [](const DirectSpan& x, const DirectSpan& y) { return x.begin < y.begin; });
  }
  return reads;
}

template <typename Each>
void BucketReader::locate(const Bucket& bucket, std::byte* send, int w, std::uint64_t at,
                          std::uint64_t n, Each&& each) {
  std::byte* region = send + bucket.ranges[w].offset;
  if (!placed_region(static_cast<std::size_t>(w))) {
    each(region + at, n);
    return;
  }
  const std::vector<DirectSpan>& spans = *placed_.spans;
  const std::uint64_t end = at + n;
  // The first span that ends after `at`: the one the last call ended in
  // when it still does (a piece's rows come in order), else searched for.
  auto s = spans.begin() + static_cast<std::ptrdiff_t>(std::min(placed_hint_, spans.size()));
  if (s == spans.end() || s->end <= at || (s != spans.begin() && std::prev(s)->end > at))
    s = std::upper_bound(spans.begin(), spans.end(), at,
                         [](std::uint64_t a, const DirectSpan& p) { return a < p.end; });
  placed_hint_ = static_cast<std::size_t>(s - spans.begin());
  while (at < end) {
    if (s == spans.end() || s->begin >= end) {
      each(region + at, end - at);
      return;
    }
    if (at < s->begin) {
      each(region + at, s->begin - at);
      at = s->begin;
    }
    const std::uint64_t stop = std::min(end, s->end);
    each(placed_.storage[s->slot] + s->offset + (at - s->begin), stop - at);
    at = stop;
    ++s;
  }
}

template <typename Each>
void BucketReader::for_each_window(const Bucket& bucket, const Piece& p, const WindowLayout& l,
                                   const std::vector<int>& home, std::byte* send, Each&& each) {
  for (std::int64_t i = 0; i < p.row_end - p.row_begin; ++i)
    for (int k = 0; k < l.tp_size; ++k) {
      const int r = l.order[k];
      const int w = home[r];
      if (w < 0)
        each(nullptr, l.width[r]);
      else
        locate(bucket, send, w, p.rank_offset[w] + i * l.width[r], l.width[r], each);
    }
}

void BucketReader::copy_region(const Bucket& bucket, std::byte* send, int to, std::uint64_t to_at,
                               int from, std::uint64_t from_at, std::uint64_t n) {
  locate(bucket, send, to, to_at, n, [&](std::byte* dst, std::uint64_t part) {
    locate(bucket, send, from, from_at, part, [&](std::byte* src, std::uint64_t bytes) {
      replicas_.push_back({dst, src, bytes});
      dst += bytes;
    });
    from_at += part;
  });
}

BucketReader::WindowLayout BucketReader::window_layout(std::size_t planned) {
  const auto tp = static_cast<std::size_t>(tp_size_);
  if (laid_out_.empty()) {  // (sized at first use: most plans have no row-parallel piece)
    laid_out_.assign(plan_.tensors.size(), false);
    order_.resize(plan_.tensors.size() * tp);
    width_.resize(plan_.tensors.size() * tp);
  }
  int* order = order_.data() + planned * tp;
  std::uint64_t* width = width_.data() + planned * tp;
  if (!laid_out_[planned]) {
    const PlannedTensor& t = plan_.tensors[planned];
    std::iota(order, order + tp, 0);
    std::sort(order, order + tp, [&](int a, int b) {
      return t.placements[a].source_start < t.placements[b].source_start;
    });
    for (int r = 0; r < tp_size_; ++r) width[r] = window_bytes(t, md_.tensors[t.index], r);
    laid_out_[planned] = true;
  }
  return {order, width, tp_size_};
}

ByteRange BucketReader::contiguous_rows(const PlannedTensor& t, int r, std::int64_t a,
                                        std::int64_t b) const {
  const std::int64_t shift = t.kernel() ? 0 : t.placements[r].source_start;
  return rows_range(t.index, shift + a, shift + b);
}

ByteRange BucketReader::rows_range(std::size_t tensor, std::int64_t a, std::int64_t b) const {
  const TensorInfo& info = md_.tensors[tensor];
  const std::uint64_t rb = shape_row_bytes(info.shape, info.dtype);
  return {static_cast<std::uint64_t>(a) * rb, static_cast<std::uint64_t>(b - a) * rb};
}

ConstBytes BucketReader::full_rows(std::size_t tensor, std::int64_t a, std::int64_t b,
                                   std::vector<std::byte>& scratch) {
  const ByteRange range = rows_range(tensor, a, b);
  if (auto view = source_.view(tensor, range)) return *view;
  scratch.resize(range.length);
  source_.read(tensor, range, MutableBytes(scratch.data(), scratch.size()));
  return ConstBytes(scratch.data(), scratch.size());
}

// zero_copy: a bucket whose pieces follow each other in one file is sent straight
// from the source's mapping. False when it is not one run or the source has no views.
bool BucketReader::send_mapped(std::size_t index, const Bucket& bucket, ConstBytes& payload) {
  if (bucket.pieces.empty()) return false;
  auto range_of = [&](const Piece& p) {
    return rows_range(plan_.tensors[p.planned].index, p.row_begin, p.row_end);
  };
  // The listing's file offsets say whether a run is possible at all (cheap); the
  // view pointers then confirm it (sources without file offsets).
  for (std::size_t i = 1; i < bucket.pieces.size(); ++i) {
    const TensorInfo& a = md_.tensors[plan_.tensors[bucket.pieces[i - 1].planned].index];
    const TensorInfo& b = md_.tensors[plan_.tensors[bucket.pieces[i].planned].index];
    if (a.file != b.file || a.file_offset + range_of(bucket.pieces[i - 1]).end() !=
                                b.file_offset + range_of(bucket.pieces[i]).offset) {
      log().debug(
          "bucket {}: piece {} ('{}') does not follow the previous one in the file; reading", index,
          i, b.name);
      return false;
    }
  }
  std::optional<ConstBytes> first, last;
  for (const Piece& p : bucket.pieces) {
    const auto v = source_.view(plan_.tensors[p.planned].index, range_of(p));
    if (!v) return false;  // sources without views have none for any tensor
    if (last && last->data + last->size != v->data) return false;  // not one run after all
    if (!first) first = v;
    // The bucket's layout must be the file's (alignment padding between pieces is not).
    if (static_cast<std::uint64_t>(v->data - first->data) != p.offset - bucket.pieces[0].offset)
      return false;
    last = v;
  }
  payload = ConstBytes(first->data, bucket.bytes);
  return true;
}

ConstBytes BucketReader::fill_broadcast(std::size_t index, const Bucket& bucket, std::byte* send,
                                        const Filled& filled) {
  ConstBytes payload;
  if (zero_copy_ && send_mapped(index, bucket, payload)) {
    if (filled) filled(-1, payload);
    return payload;
  }
  std::vector<ReadRequest>& reads = reads_;
  reads.clear();
  for (const Piece& p : bucket.pieces) {
    const std::size_t tensor = plan_.tensors[p.planned].index;
    const ByteRange range = rows_range(tensor, p.row_begin, p.row_end);
    reads.push_back({tensor, range, MutableBytes(send + p.offset, range.length)});
    copied_ += range.length;
  }
  if (!filled) {
    source_.read_many(reads);
    return ConstBytes(send, bucket.bytes);
  }
  // Each step from the end of the previous one to the end of its last request
  // (so the spans also cover the padding between pieces), the last to the end.
  std::uint64_t handed = 0;
  auto hand = [&](std::uint64_t end) {
    if (end <= handed) return;
    filled(-1, ConstBytes(send + handed, end - handed));
    handed = end;
  };
  read_in_steps([&](const std::vector<ReadRequest>& step) {
    hand(static_cast<std::uint64_t>(step.back().dst.data + step.back().dst.size - send));
  });
  hand(bucket.bytes);
  return ConstBytes(send, bucket.bytes);
}

// reads_, in order, a step of about kFilledStep bytes at a time, each step
// given to `after_step` once read. Requests of tensors whose bytes lie plainly
// in a file are cut at the steps' ends (a part of a request costs no more than
// the whole; the source merges a step's requests that follow each other).
void BucketReader::read_in_steps(
    const std::function<void(const std::vector<ReadRequest>&)>& after_step) {
  std::vector<ReadRequest>& step = step_;
  step.clear();
  std::uint64_t pending = 0;
  auto flush = [&] {
    if (step.empty()) return;
    source_.read_many(step);
    after_step(step);
    step.clear();
    pending = 0;
  };
  for (const ReadRequest& r : reads_) {
    const bool cut = md_.tensors[r.index].file_offset != 0;
    std::uint64_t at = 0;
    do {
      const std::uint64_t n =
          cut ? std::min(r.range.length - at, kFilledStep - pending) : r.range.length;
      step.push_back({r.index, {r.range.offset + at, n}, MutableBytes(r.dst.data + at, n)});
      at += n;
      pending += n;
      if (pending >= kFilledStep) flush();
    } while (at < r.range.length);
  }
  flush();
}

// A scatter step's requests that continue their region's bytes from where
// `filled` last left it, handed on as one span per region at the step's end
// (a split read's windows alternate regions row by row); a request past a gap
// (bytes that land later: see fill()) stops its region until the bucket is
// filled. Requests outside `send` (narrow rows, cut into it later; placed
// bytes) and in a placed region are skipped.
void BucketReader::hand_scatter_step(const Bucket& bucket, const std::byte* send,
                                     const std::vector<ReadRequest>& step, const Filled& filled) {
  step_from_ = handed_;
  const std::less<const std::byte*> before;
  for (const ReadRequest& r : step) {
    if (r.dst.size == 0 || before(r.dst.data, send) || !before(r.dst.data, send + bucket.bytes))
      continue;
    const auto at = static_cast<std::uint64_t>(r.dst.data - send);
    // The region holding it: the last one starting at or before it.
    const auto next = std::upper_bound(
        bucket.ranges.begin(), bucket.ranges.end(), at,
        [](std::uint64_t offset, const ByteRange& range) { return offset < range.offset; });
    const auto w = static_cast<std::size_t>(next - bucket.ranges.begin()) - 1;
    if (next == bucket.ranges.begin() || gap_[w] || placed_region(w)) continue;
    const ByteRange& region = bucket.ranges[w];
    if (at >= region.end()) continue;      // (in no region: the padding between them)
    if (at != region.offset + handed_[w])  // bytes before it are not there yet
      gap_[w] = true;
    else
      handed_[w] += r.dst.size;
  }
  for (std::size_t w = 0; w < handed_.size(); ++w)
    if (handed_[w] > step_from_[w])
      filled(static_cast<int>(w), ConstBytes(send + bucket.ranges[w].offset + step_from_[w],
                                             handed_[w] - step_from_[w]));
}

// Row-parallel: each full row is [one rank's window | the next rank's | ...]. When
// the windows tile the row, a request per window, in file order, cuts every
// rank's slice out of the file straight into the send buffer, tp rank r's into
// world rank home[r]'s region (the source reads them as one split read, merged
// with the requests before and after it). Narrow windows are instead one
// request for the full rows, cut by cut_narrow_windows once read. False (nothing
// requested) when the windows do not tile.
bool BucketReader::read_row_windows(const Bucket& bucket, const Piece& p, const PlannedTensor& t,
                                    const std::vector<int>& home, std::byte* send,
                                    std::vector<ReadRequest>& reads) {
  const TensorInfo& info = md_.tensors[t.index];
  const WindowLayout layout = window_layout(p.planned);
  std::int64_t col = 0;
  for (int k = 0; k < tp_size_; ++k) {
    const int r = layout.order[k];
    if (t.rows_for(r) < p.row_end || t.placements[r].source_start != col) return false;
    col += t.placements[r].source_length;
  }
  if (col != info.shape[1]) return false;
  const ByteRange full = rows_range(t.index, p.row_begin, p.row_end);
  const std::uint64_t row = shape_row_bytes(info.shape, info.dtype);
  const std::uint64_t narrow =  // where the next narrow piece's rows go in rows_
      narrow_.empty() ? 0 : narrow_.back().offset + reads[narrow_.back().request].range.length;
  if (row < kNarrowWindow * static_cast<std::uint64_t>(tp_size_) &&
      narrow + full.length <= kNarrowRowsBytes) {
    narrow_.push_back({reads.size(), narrow, &p});
    reads.push_back({t.index, full, MutableBytes(nullptr, full.length)});
    return true;
  }
  std::uint64_t at = full.offset;
  for_each_window(bucket, p, layout, home, send, [&](std::byte* dst, std::uint64_t n) {
    reads.push_back({t.index, {at, n}, MutableBytes(dst, n)});
    at += n;
  });
  return true;
}

// The narrow pieces' full rows, read into rows_: each tp rank's window of each
// row into world rank home[r]'s region (tp ranks no wanted rank holds: skipped).
void BucketReader::cut_narrow_windows(const Bucket& bucket, const std::vector<int>& home,
                                      std::byte* send) {
  for (const NarrowRows& n : narrow_) {
    const std::byte* from = rows_.data() + n.offset;
    for_each_window(bucket, *n.piece, window_layout(n.piece->planned), home, send,
                    [&](std::byte* dst, std::uint64_t bytes) {
                      if (dst) std::memcpy(dst, from, bytes);
                      from += bytes;
                    });
  }
}

// The regions of the world ranks in `wanted` (null: all of them). Each tp rank's
// slice is read once, into the region of the first wanted world rank that holds
// it (its home); other wanted ranks with that tp rank (replicas) copy it. A split
// read of a row-parallel piece reads every tp rank's window, into its home or,
// for a tp rank no wanted rank holds, into world rank r's region (never sent).
void BucketReader::fill_scatter(const Bucket& bucket, std::byte* send,
                                const std::vector<bool>* wanted, const Filled& filled,
                                Placed placed) {
  placed_ = placed;
  placed_hint_ = 0;
  std::vector<int> home(tp_size_, -1);
  for (int w = 0; w < world_size_; ++w)
    if ((!wanted || (*wanted)[w]) && home[w % tp_size_] < 0) home[w % tp_size_] = w;
  std::vector<int> split_home(home);
  for (int r = 0; r < tp_size_; ++r)
    if (split_home[r] < 0) split_home[r] = r;
  std::vector<ReadRequest>& reads = reads_;    // contiguous rows, merged by the source
  std::vector<Replica>& replicas = replicas_;  // copied once the rows they repeat are read
  reads.clear();
  replicas.clear();
  narrow_.clear();
  for (const Piece& p : bucket.pieces) {
    const PlannedTensor& t = plan_.tensors[p.planned];
    const TensorInfo& info = md_.tensors[t.index];
    const bool windows = row_parallel(t, info);
    const bool split = windows && read_row_windows(bucket, p, t, split_home, send, reads);
    const bool cut = split && !narrow_.empty() && narrow_.back().piece == &p;
    // A request per window also reads the windows of tp ranks no wanted rank
    // holds into the send buffer (not counted below); a cut skips them.
    if (split && !cut)
      for (int r = 0; r < tp_size_; ++r)
        if (home[r] < 0)
          copied_ += static_cast<std::uint64_t>(p.row_end - p.row_begin) * window_bytes(t, info, r);
    // Otherwise row-parallel slices all come from the same full rows: read them once.
    ConstBytes shared_rows;
    if (windows && !split) shared_rows = full_rows(t.index, p.row_begin, p.row_end, scratch_);
    requested_.clear();
    for (int w = 0; w < world_size_; ++w) {
      if (wanted && !(*wanted)[w]) continue;
      const int r = w % tp_size_;
      const std::int64_t end = std::min(p.row_end, t.rows_for(r));
      if (end <= p.row_begin) continue;
      const std::uint64_t at = p.rank_offset[w];
      const std::uint64_t n =
          static_cast<std::uint64_t>(end - p.row_begin) * t.row_bytes_for(r, info);
      if (w != home[r]) {  // a replica: same bytes as its tp rank's home
        copy_region(bucket, send, w, at, home[r], p.rank_offset[home[r]], n);
      } else if (split) {    // read above
      } else if (windows) {  // each full row contributes its column window
        const std::uint64_t full = shape_row_bytes(info.shape, info.dtype);
        const std::uint64_t width = window_bytes(t, info, r);
        const std::uint64_t skip = window_skip(t, info, r);
        for (std::int64_t i = 0; i < end - p.row_begin; ++i) {
          const std::byte* from = shared_rows.data + i * full + skip;
          locate(bucket, send, w, at + i * width, width, [&](std::byte* dst, std::uint64_t part) {
            std::memcpy(dst, from, part);
            from += part;
          });
        }
      } else {  // column-parallel or kernel format: contiguous full rows
        const ByteRange range = contiguous_rows(t, r, p.row_begin, end);
        // Rows an earlier tp rank reads too (a replicated tensor: every rank
        // holds all of it) are read once: a second read of the same bytes would
        // also break the run of file-adjacent requests the source merges.
        const auto same = std::find_if(requested_.begin(), requested_.end(),
                                       [&](const Requested& q) { return q.range == range; });
        if (same != requested_.end()) {
          copy_region(bucket, send, w, at, same->region, same->at, n);
        } else {
          requested_.push_back({range, w, at});
          std::uint64_t from = range.offset;
          locate(bucket, send, w, at, n, [&](std::byte* dst, std::uint64_t part) {
            reads.push_back({t.index, {from, part}, MutableBytes(dst, part)});
            from += part;
          });
        }
      }
      copied_ += n;
    }
  }
  if (!narrow_.empty()) {  // the narrow pieces' rows land in rows_, sized now that all are known
    const NarrowRows& last = narrow_.back();
    rows_.resize(
        std::max<std::size_t>(rows_.size(), last.offset + reads[last.request].range.length));
    for (const NarrowRows& n : narrow_) reads[n.request].dst.data = rows_.data() + n.offset;
  }
  if (filled) {
    handed_.assign(bucket.ranges.size(), 0);
    gap_.assign(bucket.ranges.size(), false);
    read_in_steps([&](const std::vector<ReadRequest>& step) {
      hand_scatter_step(bucket, send, step, filled);
    });
  } else {
    source_.read_many(reads);
  }
  cut_narrow_windows(bucket, home, send);
  for (const Replica& c : replicas) std::memcpy(c.dst, c.src, c.n);
  if (filled)  // what landed past a gap, and what no step reached
    for (std::size_t w = 0; w < bucket.ranges.size(); ++w)
      if (handed_[w] < bucket.ranges[w].length && !placed_region(w))
        filled(static_cast<int>(w), ConstBytes(send + bucket.ranges[w].offset + handed_[w],
                                               bucket.ranges[w].length - handed_[w]));
}

// One rank's own region, read straight from the source: contiguous rows in one
// request (the source merges requests that follow each other in the file into
// one preadv), and each row's column window of a row-parallel tensor copied out
// of the source's mapping (or read one by one where it has none). A replica
// reads what its tp rank reads.
ConstBytes BucketReader::fill_own(std::size_t index, int world_rank, std::byte* dst) {
  const Bucket& bucket = plan_.buckets.at(index);
  if (!bucket.scatter) return fill_broadcast(index, bucket, dst, {});
  const int r = world_rank % tp_size_;
  std::vector<ReadRequest>& reads = reads_;
  reads.clear();
  for (const Piece& p : bucket.pieces) {
    const PlannedTensor& t = plan_.tensors[p.planned];
    const TensorInfo& info = md_.tensors[t.index];
    const std::int64_t end = std::min(p.row_end, t.rows_for(r));
    if (end <= p.row_begin) continue;
    std::byte* out = dst + p.rank_offset[world_rank];
    if (row_parallel(t, info)) {
      const std::uint64_t full = shape_row_bytes(info.shape, info.dtype);
      const std::uint64_t width = window_bytes(t, info, r);
      const std::uint64_t skip = window_skip(t, info, r);
      // Out of the mapping where the source has one (a window per row would be a
      // system call per row), else one read per row's window.
      if (const auto rows = source_.view(t.index, rows_range(t.index, p.row_begin, end))) {
        for (std::int64_t i = 0; i < end - p.row_begin; ++i)
          std::memcpy(out + i * width, rows->data + i * full + skip, width);
      } else {
        for (std::int64_t row = p.row_begin; row < end; ++row, out += width)
          reads.push_back({t.index,
                           {static_cast<std::uint64_t>(row) * full + skip, width},
                           MutableBytes(out, width)});
      }
    } else {
      const ByteRange range = contiguous_rows(t, r, p.row_begin, end);
      reads.push_back({t.index, range, MutableBytes(out, range.length)});
    }
    copied_ += static_cast<std::uint64_t>(end - p.row_begin) * t.row_bytes_for(r, info);
  }
  source_.read_many(reads);
  return ConstBytes(dst, bucket.ranges[world_rank].length);
}

ConstBytes BucketReader::fill(std::size_t index, std::byte* send, const Filled& filled,
                              Placed placed) {
  const Bucket& bucket = plan_.buckets.at(index);
  if (!bucket.scatter) return fill_broadcast(index, bucket, send, filled);
  fill_scatter(bucket, send, nullptr, filled, placed);
  return ConstBytes(send, bucket.bytes);
}

ConstBytes BucketReader::fill_ranks(std::size_t index, const std::vector<int>& ranks,
                                    std::byte* send, const Filled& filled, Placed placed) {
  const Bucket& bucket = plan_.buckets.at(index);
  if (!bucket.scatter) return fill_broadcast(index, bucket, send, filled);
  std::vector<bool> wanted(static_cast<std::size_t>(world_size_), false);
  for (int w : ranks) wanted[static_cast<std::size_t>(w)] = true;
  fill_scatter(bucket, send, &wanted, filled, placed);
  return ConstBytes(send, bucket.bytes);
}

}  // namespace tpreload::detail
