#include "verify_chains.h"

#include <algorithm>

#include "row_windows.h"
#include "tpreload/core/crc32c.h"

namespace tpreload::detail {
namespace {

// Bytes [begin, end) of a row that tp rank `rank` reads.
struct Mark {
  std::uint64_t begin, end;
  int rank;
};

// Appends the segments of one row of `length` bytes read as `marks` say: bytes
// one rank alone reads in its chain, bytes several read in the shared chain,
// bytes none reads in no segment; neighbours of one chain merged.
void add_segments(std::vector<Mark>& marks, int shared, std::vector<ChainLayout::Segment>& out) {
  std::vector<std::uint64_t> cuts;
  for (const Mark& m : marks)
    if (m.begin < m.end) {
      cuts.push_back(m.begin);
      cuts.push_back(m.end);
    }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  const std::size_t first = out.size();
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    int chain = -1;
    for (const Mark& m : marks)
      if (m.begin <= cuts[i] && cuts[i + 1] <= m.end && m.rank != chain)
        chain = chain < 0 ? m.rank : shared;
    if (chain < 0) continue;
    if (out.size() > first && out.back().chain == chain && out.back().end == cuts[i])
      out.back().end = cuts[i + 1];
    else
      out.push_back({cuts[i], cuts[i + 1], chain});
  }
}

// The first run that may hold bucket byte `at`.
std::vector<ChainLayout::Run>::const_iterator run_at(const ChainLayout& layout, std::uint64_t at) {
  auto run =
      std::upper_bound(layout.runs.begin(), layout.runs.end(), at,
                       [](std::uint64_t v, const ChainLayout::Run& r) { return v < r.offset; });
  return run == layout.runs.begin() ? run : std::prev(run);
}

std::uint64_t run_end(const ChainLayout::Run& r) {
  return r.offset + r.pitch * r.rows;
}

}  // namespace

ChainLayout chain_layout(const Plan& plan, const SourceMetadata& metadata, const Bucket& bucket,
                         int tp_size) {
  ChainLayout layout;
  layout.chains = tp_size + 1;
  const int shared = tp_size;
  std::vector<Mark> marks;
  for (const Piece& p : bucket.pieces) {
    const PlannedTensor& t = plan.tensors[p.planned];
    const TensorInfo& info = metadata.tensors[t.index];
    const std::uint64_t row_bytes = shape_row_bytes(info.shape, info.dtype);
    const auto rows = static_cast<std::uint64_t>(p.row_end - p.row_begin);
    if (rows == 0 || row_bytes == 0) continue;
    ChainLayout::Run run;
    run.offset = p.offset;
    run.first = static_cast<std::uint32_t>(layout.segments.size());
    marks.clear();
    if (t.kernel()) {
      run.pitch = rows * row_bytes;
      run.rows = 1;
      marks.push_back({0, run.pitch, t.owner_tp_rank});
    } else if (row_parallel(t, info)) {  // a window of every row per rank
      run.pitch = row_bytes;
      run.rows = rows;
      for (int r = 0; r < tp_size; ++r) {
        const Placement& at = t.placements[r];
        if (!at.held) continue;
        if (at.source_dim == 1)
          marks.push_back(
              {window_skip(t, info, r), window_skip(t, info, r) + window_bytes(t, info, r), r});
        else  // (a rank that takes whole rows: all of every row, as far as chains go)
          marks.push_back({0, row_bytes, r});
      }
    } else {  // contiguous rows per rank, or the whole piece
      run.pitch = rows * row_bytes;
      run.rows = 1;
      for (int r = 0; r < tp_size; ++r) {
        const Placement& at = t.placements[r];
        if (!at.held) continue;
        if (at.source_dim == 0) {
          const std::int64_t a = std::max(at.source_start, p.row_begin);
          const std::int64_t b = std::min(at.source_start + at.source_length, p.row_end);
          if (a < b)
            marks.push_back({static_cast<std::uint64_t>(a - p.row_begin) * row_bytes,
                             static_cast<std::uint64_t>(b - p.row_begin) * row_bytes, r});
        } else {
          marks.push_back({0, run.pitch, r});
        }
      }
    }
    add_segments(marks, shared, layout.segments);
    run.last = static_cast<std::uint32_t>(layout.segments.size());
    if (run.last > run.first) layout.runs.push_back(run);
  }
  std::sort(
      layout.runs.begin(), layout.runs.end(),
      [](const ChainLayout::Run& a, const ChainLayout::Run& b) { return a.offset < b.offset; });
  return layout;
}

std::vector<ChainLayout> chain_layouts(const Plan& plan, const SourceMetadata& metadata,
                                       int tp_size) {
  std::vector<ChainLayout> out(plan.buckets.size());
  for (std::size_t k = 0; k < plan.buckets.size(); ++k)
    if (!plan.buckets[k].scatter) out[k] = chain_layout(plan, metadata, plan.buckets[k], tp_size);
  return out;
}

void extend_chains(const ChainLayout& layout, std::uint64_t at, ConstBytes span,
                   const std::vector<char>* wanted, std::vector<std::uint32_t>& crcs) {
  const std::uint64_t end = at + span.size;
  for (auto run = run_at(layout, at); run != layout.runs.end() && run->offset < end; ++run) {
    if (run_end(*run) <= at) continue;
    for (std::uint64_t row = at > run->offset ? (at - run->offset) / run->pitch : 0;
         row < run->rows; ++row) {
      const std::uint64_t base = run->offset + row * run->pitch;
      if (base >= end) break;
      for (std::uint32_t s = run->first; s < run->last; ++s) {
        const ChainLayout::Segment& g = layout.segments[s];
        if (wanted && !(*wanted)[static_cast<std::size_t>(g.chain)]) continue;
        const std::uint64_t a = std::max(base + g.begin, at), b = std::min(base + g.end, end);
        if (a >= b) continue;
        std::uint32_t& crc = crcs[static_cast<std::size_t>(g.chain)];
        crc = crc32c_extend(crc, span.data + (a - at), b - a);
      }
    }
  }
}

std::vector<char> chains_read(const ChainLayout& layout, const std::vector<RowWrite>& writes,
                              const std::vector<ParamSpec>& params) {
  std::vector<char> read(static_cast<std::size_t>(layout.chains), 0);
  // Chains of the segments of `run` that bytes [a, b) of each of its rows meet.
  auto mark = [&](const ChainLayout::Run& run, std::uint64_t a, std::uint64_t b) {
    for (std::uint32_t s = run.first; s < run.last; ++s) {
      const ChainLayout::Segment& g = layout.segments[s];
      if (g.begin < b && a < g.end) read[static_cast<std::size_t>(g.chain)] = 1;
    }
  };
  for (const RowWrite& w : writes) {
    if (w.rows <= 0) continue;
    const std::uint64_t row = write_source_row_bytes(w, params.at(w.slot));
    const std::uint64_t begin = w.src_offset, end = write_source_end(w, params.at(w.slot));
    for (auto run = run_at(layout, begin); run != layout.runs.end() && run->offset < end; ++run) {
      if (run_end(*run) <= begin) continue;
      if (run->rows == 1) {  // contiguous: the bytes between the write's first and last
        mark(*run, std::max(begin, run->offset) - run->offset,
             std::min(end, run_end(*run)) - run->offset);
        continue;
      }
      // A write of the run's rows: the same bytes of each (a column window).
      const std::uint64_t in_row = (begin - std::min(begin, run->offset)) % run->pitch;
      if (begin >= run->offset && end <= run_end(*run) && in_row + row <= run->pitch &&
          (w.rows == 1 || w.src_pitch == run->pitch))
        mark(*run, in_row, in_row + row);
      else
        mark(*run, 0, run->pitch);  // anything else: every chain of the run
    }
  }
  return read;
}

std::uint64_t chain_bytes(const ChainLayout& layout, int chain) {
  std::uint64_t n = 0;
  for (const ChainLayout::Run& run : layout.runs)
    for (std::uint32_t s = run.first; s < run.last; ++s)
      if (layout.segments[s].chain == chain)
        n += (layout.segments[s].end - layout.segments[s].begin) * run.rows;
  return n;
}

}  // namespace tpreload::detail
