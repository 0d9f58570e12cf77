// A reload from a WeightStream (internal): the reader takes the stream's
// tensors segment by segment (a few buckets at a time), and
// each segment is planned, preflighted, moved and applied as an in-memory
// source; each layer is processed once the reload has brought all of it.
// reload.cpp runs this in place of the plan and the pipeline of one source;
// the agreement, atomic mode, validation and the report are the same. No
// torch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipeline.h"
#include "tpreload/checkpoint/weight_source.h"

namespace tpreload::detail {

struct StreamRun {
  PipelineStats stats;  // summed over the segments (staging: the most)
  // Layers complete, in the order they completed; in an atomic reload their
  // ReloadTarget::finish_layer is the caller's to run, after the commit.
  std::vector<std::int64_t> finished_layers;
  std::vector<std::string> skipped;  // stream names with no parameter
  std::size_t segments = 0, tensors = 0, buckets = 0;
  std::uint64_t bytes_read = 0;     // on the reader: the bytes taken from the stream's tensors
  std::uint64_t segment_bytes = 0;  // the reader's stream_segment_bytes(), on every rank
};

// The bytes the reader takes from a stream before the ranks move them: one
// segment, kBucketsPerSegment x the buckets in flight (bucket_bytes x pipeline
// depth). Each segment costs a plan (its listing broadcast, its writes
// resolved) and a pipeline that fills and drains, so segments of a few
// buckets amortize it (figures: docs/PERFORMANCE.md, "Weight streams").
constexpr std::uint64_t kBucketsPerSegment = 4;
std::uint64_t stream_segment_bytes(const ReloadOptions& options);

// COLLECTIVE. The whole stream (`stream` on options.reader_rank, null on the
// other ranks), segment after segment: the reader takes tensors until it
// holds stream_segment_bytes() (the tensor that crosses it included), every
// rank learns whether a segment follows, and the segment is planned
// (PlanScope::kSegment) and run through the pipeline. After each segment
// every rank processes the layers it now holds whole (checkpoint format;
// finish_layer too unless atomic), and after the last the layers brought in
// part. Every failure reaches every rank alike: the stream's own (it threw, a
// tensor came twice, its bytes do not fit its shape), a corrupted bucket, a
// failed write or processing.
StreamRun run_stream(Communicator& world, DataTransport& data, WeightStream* stream,
                     ReloadTarget& model, const ReloadOptions& options, std::int64_t fingerprint,
                     ReloadWorkspace& workspace);

}  // namespace tpreload::detail
