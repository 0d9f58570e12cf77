// The reader rank's half of the pipeline (internal): fills the bytes of one bucket
// into a host send buffer, exactly as the plan lays them out. Broadcast buckets
// are runs of tensor rows (read with merged reads, or sent from the source's
// mapping with zero_copy); scatter buckets are one region per world rank, cut out
// of the file by the read itself: a request per column window of a row-parallel
// piece (narrow windows: one request for the piece's full rows, cut in memory)
// and per rank's contiguous rows, in file order, which the source merges into a
// few preadv calls per bucket; bytes two ranks hold (replicated tensors,
// replicas of a tp rank) are read once and copied. With Readers::kAll each rank fills its own
// region the same way (fill_own); with Readers::kNode a node's reader fills its node's regions
// (fill_ranks). The reader's own region can be read straight into its
// parameters instead (Placed). No torch, no transport here.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/reload/plan.h"

namespace tpreload::detail {

// Bytes [begin, end) of a scatter region (offsets as the region's writes count
// them) placed in parameter `slot`'s storage at byte `offset` instead of the
// send buffer.
struct DirectSpan {
  std::uint64_t begin = 0, end = 0;
  ParamSlot slot = kNoSlot;
  std::uint64_t offset = 0;
};

// One world rank's region of a bucket, placed by `spans` (sorted, disjoint)
// into the storage of each parameter slot (`storage[slot]`, host memory);
// bytes outside the spans go to the send buffer as usual.
struct Placed {
  int world_rank = -1;
  const std::vector<DirectSpan>* spans = nullptr;
  std::byte* const* storage = nullptr;
};

// World rank `world_rank`'s own regions of the scatter buckets of `plan` read
// straight into its parameters (when they are in host memory), per bucket: of
// its writes (`applies`, into `params`), the plain copies of contiguous rows
// (plain_row_copy) inside their parameter and the region whose source bytes
// no other write of the bucket reads (a tensor two parameters took stays in
// the send buffer) and whose rows no other write or zeroing of any bucket
// touches (a placed write can land before an earlier bucket is applied), as
// direct spans, with which writes they are (`placed`, per write: the apply
// skips those). Their rows change while the bucket is read, before anything
// is sent: a caller counts them as written (ParameterSink::count_placed) once a
// read of the bucket began. Pure: kept with the plan.
struct DirectReads {
  std::vector<DirectSpan> spans;
  std::vector<char> placed;
};
std::vector<DirectReads> place_own_writes(const Plan& plan, const std::vector<BucketApply>& applies,
                                          const std::vector<ParamSpec>& params, int world_rank);

class BucketReader {
 public:
  BucketReader(const Plan& plan, const SourceMetadata& metadata, WeightSource& source,
               int world_size, int tp_size, bool zero_copy)
      : plan_(plan),
        md_(metadata),
        source_(source),
        world_size_(world_size),
        tp_size_(tp_size),
        zero_copy_(zero_copy) {}

  // Fill bucket `index` into `send` (host memory of at least its bytes). Returns
  // the bytes to send: `send`, or a view of the source's mapping (zero copy, for
  // a broadcast bucket that is one run of one file). Throws CheckpointError as
  // the source does.
  //
  // `filled`, where given, is called with the bytes as they land in `send`:
  // the bucket is read in steps of about kFilledStep bytes, so that each step is
  // still in the core's cache when `filled` sums it (a second pass over a whole
  // bucket reads it back from the shared cache, at a quarter of the rate on some
  // CPUs: docs/PERFORMANCE.md, "Why it is fast"). `region` is -1 for a broadcast
  // bucket's bytes, else the world rank whose scatter region holds them. Each
  // region's spans come in order and tile it (a broadcast bucket: the bytes
  // returned), a region's bytes at the end of each step that read them, as far
  // as they are contiguous from its start. Bytes not read straight into place
  // land after the read (windows cut out of narrow rows, replicas of bytes
  // another rank's request reads, row windows copied out of full rows) or never
  // (alignment padding): from the first such gap on, a region comes once the
  // bucket is filled, in one span. A zero-copy broadcast bucket comes in one
  // span, and a tensor whose bytes are not plainly in a file (file_offset 0:
  // compressed HDF5, memory) is read in one request, however long.
  using Filled = std::function<void(int region, ConstBytes span)>;
  static constexpr std::uint64_t kFilledStep = std::uint64_t{512} << 10;
  //
  // `placed`, where given, puts bytes of one rank's scatter region elsewhere:
  // they are read or copied straight to their direct span (bytes of that region
  // other ranks repeat are copied from there), never into `send`, and not
  // handed to `filled`.
  ConstBytes fill(std::size_t index, std::byte* send, const Filled& filled = {},
                  Placed placed = {});

  // Readers::kAll: bucket `index` as world rank `world_rank` receives it (its
  // scatter region, or the whole of a broadcast bucket), read into `dst` (host
  // memory of at least that many bytes). Returns the bytes: `dst`, or a view of
  // the mapping as fill() does. Throws CheckpointError as the source does.
  ConstBytes fill_own(std::size_t index, int world_rank, std::byte* dst);

  // Readers::kNode: bucket `index` as fill() lays it out, with only the scatter
  // regions of world ranks `ranks` (a node's) filled, each tp rank's slice read
  // once (a rank whose tp rank an earlier one of `ranks` holds gets a copy).
  ConstBytes fill_ranks(std::size_t index, const std::vector<int>& ranks, std::byte* send,
                        const Filled& filled = {}, Placed placed = {});

  // Bytes read or copied into send buffers (or their direct spans) so far.
  std::uint64_t bytes_copied() const { return copied_; }

 private:
  // A row-parallel tensor's tp ranks in the order of their column windows
  // (order[0..tp_size)), and each tp rank's window bytes (width[r]).
  struct WindowLayout {
    const int* order;
    const std::uint64_t* width;
    int tp_size;
  };
  // Bytes [at, at + n) of world rank w's region: each(dst, bytes) for each
  // part in order, in `send` or where placed_ puts them.
  template <typename Each>
  void locate(const Bucket& bucket, std::byte* send, int w, std::uint64_t at, std::uint64_t n,
              Each&& each);
  // Every window of piece p's rows in file order: each(dst, bytes), dst being
  // where tp rank r's window of that row goes in world rank home[r]'s region
  // (null for a tp rank no rank in `home` holds; a placed window may come in parts).
  template <typename Each>
  void for_each_window(const Bucket& bucket, const Piece& p, const WindowLayout& l,
                       const std::vector<int>& home, std::byte* send, Each&& each);
  // Replica copies of n bytes: region `from` at `from_at` to region `to` at `to_at`.
  void copy_region(const Bucket& bucket, std::byte* send, int to, std::uint64_t to_at, int from,
                   std::uint64_t from_at, std::uint64_t n);
  ConstBytes fill_broadcast(std::size_t index, const Bucket& bucket, std::byte* send,
                            const Filled& filled);
  void read_in_steps(const std::function<void(const std::vector<ReadRequest>&)>& after_step);
  void hand_scatter_step(const Bucket& bucket, const std::byte* send,
                         const std::vector<ReadRequest>& step, const Filled& filled);
  bool send_mapped(std::size_t index, const Bucket& bucket, ConstBytes& payload);
  void fill_scatter(const Bucket& bucket, std::byte* send, const std::vector<bool>* wanted,
                    const Filled& filled, Placed placed);
  // Whether world rank w's region is placed elsewhere in the fill in progress.
  bool placed_region(std::size_t w) const {
    return placed_.spans && !placed_.spans->empty() && static_cast<int>(w) == placed_.world_rank;
  }
  bool read_row_windows(const Bucket& bucket, const Piece& p, const PlannedTensor& t,
                        const std::vector<int>& home, std::byte* send,
                        std::vector<ReadRequest>& reads);
  void cut_narrow_windows(const Bucket& bucket, const std::vector<int>& home, std::byte* send);
  ConstBytes full_rows(std::size_t tensor, std::int64_t a, std::int64_t b,
                       std::vector<std::byte>& scratch);
  ByteRange rows_range(std::size_t tensor, std::int64_t a, std::int64_t b) const;
  // Planned tensor `planned`'s layout, computed at its first use in this reader
  // (a bucket of 2,000 small tensors made it, with two allocations, once per
  // piece and twice per narrow one).
  WindowLayout window_layout(std::size_t planned);
  // Rows [a, b) of tp rank r's slice of a column-parallel or kernel-format tensor.
  ByteRange contiguous_rows(const PlannedTensor& t, int r, std::int64_t a, std::int64_t b) const;

  const Plan& plan_;
  const SourceMetadata& md_;
  WeightSource& source_;
  const int world_size_, tp_size_;
  const bool zero_copy_;
  std::uint64_t copied_ = 0;
  // A bucket's requests and the copies of bytes several ranks hold, kept from
  // bucket to bucket: a small-tensor bucket makes thousands of them, and memory
  // freshly allocated per bucket costs its page faults again.
  struct Replica {
    std::byte* dst;
    const std::byte* src;
    std::uint64_t n;
  };
  // A row-parallel piece whose windows are narrow (under kNarrowWindow bytes on
  // average): its full rows are one request into rows_ at `offset`, cut into the
  // ranks' regions once read (a request per window costs more than the copy).
  struct NarrowRows {
    std::size_t request;   // its index in reads_ (the destination is set once rows_ is sized)
    std::uint64_t offset;  // where its rows start in rows_
    const Piece* piece;
  };
  std::vector<ReadRequest> reads_, step_;
  // Bytes of each world rank's scatter region handed to `filled` so far, and
  // whether bytes landed past a gap (handed once the bucket is filled).
  std::vector<std::uint64_t> handed_, step_from_;
  std::vector<bool> gap_;
  std::vector<Replica> replicas_;
  std::vector<NarrowRows> narrow_;
  std::vector<std::byte> scratch_, rows_;
  // Rows of the piece being laid out that some tp rank requested: (file range,
  // the region and offset it lands in), so that a rank needing the same rows copies them.
  struct Requested {
    ByteRange range;
    int region;
    std::uint64_t at;
  };
  std::vector<Requested> requested_;
  Placed placed_;                // the scatter fill in progress's
  std::size_t placed_hint_ = 0;  // the span locate() last started from
  std::vector<bool> laid_out_;   // per planned tensor: its layout is in order_, width_
  std::vector<int> order_;       // planned tensors x tp_size
  std::vector<std::uint64_t> width_;
};

}  // namespace tpreload::detail
