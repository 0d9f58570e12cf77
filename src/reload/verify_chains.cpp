#include "verify_chains.h"

#include <algorithm>

#include "row_windows.h"
#include "tpreload/core/crc32c.h"
#include "tpreload/core/error.h"

namespace tpreload::detail {
namespace {

// Bytes [begin, end) of a row that tp rank `rank` reads.
struct Mark {
  std::uint64_t begin, end;
  int rank;
};

// Appends the segments of one row (of a run) read as `marks` say: bytes one
// rank alone reads in its chain, bytes several read in the shared chain, bytes
// none reads in no segment; neighbours of one chain merged.
// (`cuts`: scratch, kept from piece to piece.)
void add_segments(const std::vector<Mark>& marks, int shared, std::vector<std::uint64_t>& cuts,
                  std::vector<ChainLayout::Segment>& out) {
  cuts.clear();
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

// Each part of bucket bytes [a, b) that lies in a chain, in bucket order:
// each(chain, lo, hi) for bytes [lo, hi).
template <typename Each>
void for_each_part(const ChainLayout& layout, std::uint64_t a, std::uint64_t b, Each&& each) {
  for (auto run = run_at(layout, a); run != layout.runs.end() && run->offset < b; ++run) {
    if (run_end(*run) <= a) continue;
    for (std::uint64_t row = a > run->offset ? (a - run->offset) / run->pitch : 0; row < run->rows;
         ++row) {
      const std::uint64_t base = run->offset + row * run->pitch;
      if (base >= b) break;
      for (std::uint32_t s = run->first; s < run->last; ++s) {
        const ChainLayout::Segment& g = layout.segments[s];
        const std::uint64_t lo = std::max(base + g.begin, a), hi = std::min(base + g.end, b);
        if (lo < hi) each(g.chain, lo, hi);
      }
    }
  }
}

}  // namespace

ChainLayout chain_layout(const Plan& plan, const SourceMetadata& metadata, const Bucket& bucket,
                         int tp_size) {
  ChainLayout layout;
  layout.chains = tp_size + 1;
  const int shared = tp_size;
  std::vector<Mark> marks;
  std::vector<std::uint64_t> cuts;
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
    add_segments(marks, shared, cuts, layout.segments);
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
  for_each_part(layout, at, at + span.size, [&](int chain, std::uint64_t lo, std::uint64_t hi) {
    const auto c = static_cast<std::size_t>(chain);
    if (!wanted || (*wanted)[c]) crcs[c] = crc32c_extend(crcs[c], span.data + (lo - at), hi - lo);
  });
}

std::vector<char> chains_read(const ChainLayout& layout, const std::vector<RowWrite>& writes,
                              const std::vector<ParamSpec>& params) {
  std::vector<char> read(static_cast<std::size_t>(layout.chains), 0);
  for (const RowWrite& w : writes) {
    if (w.rows <= 0) continue;
    const ParamSpec& param = params.at(w.slot);
    const std::uint64_t row = write_source_row_bytes(w, param);
    // Rows that follow each other are one range; strided rows are read one by one.
    const bool contiguous = w.rows == 1 || w.src_pitch == row;
    const std::uint64_t n = contiguous ? row * static_cast<std::uint64_t>(w.rows) : row;
    for (std::int64_t i = 0; i < (contiguous ? 1 : w.rows); ++i) {
      const std::uint64_t a = w.src_offset + static_cast<std::uint64_t>(i) * w.src_pitch;
      std::uint64_t covered = 0;
      for_each_part(layout, a, a + n, [&](int chain, std::uint64_t lo, std::uint64_t hi) {
        read[static_cast<std::size_t>(chain)] = 1;
        covered += hi - lo;
      });
      // Every byte a write reads is in a chain by construction: one that is not
      // could be applied unchecked, so the plan is refused instead.
      if (covered != n)
        raise<Error>("the checksum chains of a broadcast bucket cover only ", covered, " of the ",
                     n, " bytes [", a, ", ", a + n, ") that a write into ", param.name,
                     " reads (an inconsistent plan)");
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
