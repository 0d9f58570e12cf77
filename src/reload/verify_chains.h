// The CRC-32C chains of a broadcast bucket (internal): which of its bytes each
// tensor-parallel rank reads, so that a receiver verifies exactly those. Every
// rank receives the whole bucket but its writes read only its rows of a
// column-parallel tensor and its window of every row of a row-parallel one; the
// reader sums the bytes only tp rank r reads into chain r, the bytes several tp
// ranks read (replicated tensors) into one shared chain, and bytes no rank reads
// (padding, experts no rank holds) into none. A chain's CRC-32C is that of its
// bytes in bucket order. The layout follows from the plan alone, the same on
// every rank; a receiver checks every chain its writes touch (chains_read), so a
// write that strays from its rank's chain costs a longer check, never a missed
// flip, and a write that reads a byte in no chain is refused when planned. Broadcast buckets moved
// in device memory are checked in fixed blocks instead (pipeline.cpp). No torch here.
#pragma once

#include <cstdint>
#include <vector>

#include "tpreload/core/span.h"
#include "tpreload/model/row_writes.h"
#include "tpreload/reload/plan.h"

namespace tpreload::detail {

struct ChainLayout {
  // Bytes [begin, end) of each row of a run, counted from the row's start.
  struct Segment {
    std::uint64_t begin = 0, end = 0;
    int chain = 0;
  };
  // `rows` rows `pitch` bytes apart from bucket byte `offset`, each laid out by
  // segments [first, last) (a piece of a tensor; contiguous pieces are one row).
  struct Run {
    std::uint64_t offset = 0, pitch = 0, rows = 0;
    std::uint32_t first = 0, last = 0;
  };
  int chains = 0;         // tp_size + 1: the last is the shared chain
  std::vector<Run> runs;  // by offset, disjoint
  std::vector<Segment> segments;
};

// The chains of `bucket` (broadcast) of `plan` for `tp_size` ranks.
ChainLayout chain_layout(const Plan& plan, const SourceMetadata& metadata, const Bucket& bucket,
                         int tp_size);

// Per bucket of `plan`: its chains (broadcast buckets; empty for scatter ones).
std::vector<ChainLayout> chain_layouts(const Plan& plan, const SourceMetadata& metadata,
                                       int tp_size);

// Extends crcs[c] by the bytes of chain c among bucket bytes [at, at + span.size),
// `span` being those bytes, for every chain c (`wanted` null) or those with
// wanted[c] set. Summing a bucket's spans in order gives each chain's CRC-32C.
void extend_chains(const ChainLayout& layout, std::uint64_t at, ConstBytes span,
                   const std::vector<char>* wanted, std::vector<std::uint32_t>& crcs);

// The chains holding a byte that any of `writes` (one rank's, into `params`)
// reads: the rank's own chain and, where it reads any, the shared one. Throws
// Error for a write that reads a byte in no chain (the layout and the writes
// disagree: that byte would be applied unchecked).
std::vector<char> chains_read(const ChainLayout& layout, const std::vector<RowWrite>& writes,
                              const std::vector<ParamSpec>& params);

// Bytes chain `chain` holds (messages).
std::uint64_t chain_bytes(const ChainLayout& layout, int chain);

}  // namespace tpreload::detail
