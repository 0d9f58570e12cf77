// Sharded sources: any rank may hold boxes of checkpoint tensors (a trainer's
// FSDP row slices, Megatron column slices, whole experts, replicated copies),
// and every rank may need boxes of them (its tensor-parallel slices). The
// transfer plan says, for every byte a rank needs, which rank sends it: point
// to point, balanced among the ranks that hold the same bytes, nothing through
// a rank that does not need it. Pure and torch-free: every rank computes the
// same plan from the same gathered lists.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpreload/core/dtype.h"
#include "tpreload/core/span.h"

namespace tpreload {

// A box of a tensor: along each dimension of its full shape, the elements
// [offset[d], offset[d] + size[d]). A 0-d tensor's box has no dimensions.
struct Box {
  std::vector<std::int64_t> offset;
  std::vector<std::int64_t> size;

  std::int64_t elements() const;  // product of the sizes (1 for no dimensions)
  // "[0:4, 8:16]": each dimension's [begin:end).
  std::string describe() const;
  // The whole of a tensor of `shape`.
  static Box whole(const std::vector<std::int64_t>& shape);
  friend bool operator==(const Box& a, const Box& b) {
    return a.offset == b.offset && a.size == b.size;
  }
  friend bool operator!=(const Box& a, const Box& b) { return !(a == b); }
};

// The elements two boxes of one tensor share, or nullopt when they share none.
std::optional<Box> intersect(const Box& a, const Box& b);

// A box one rank holds of a checkpoint tensor of `shape` (the full tensor's).
struct HeldBox {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  Box box;
  int rank = 0;
};

// A box one rank needs of a checkpoint tensor.
struct NeededBox {
  std::string name;
  Box box;
  int rank = 0;
};

struct TransferPlan {
  struct Tensor {
    std::string name;
    DType dtype = DType::kFloat32;
    std::vector<std::int64_t> shape;
  };
  // `box` of tensors[tensor] from rank `from` to rank `to`; from == to is a
  // copy within the rank (it holds what it needs), counted in neither
  // direction.
  struct Transfer {
    std::size_t tensor = 0;
    int from = 0;
    int to = 0;
    Box box;
    std::uint64_t bytes = 0;
  };
  // A region of tensors[tensor] that several ranks hold: their bytes there
  // must be the same, which only the bytes can tell (compared before any write).
  struct Shared {
    std::size_t tensor = 0;
    Box box;
    std::vector<int> ranks;  // ascending
  };

  std::vector<Tensor> tensors;          // every tensor held, by name
  std::vector<Transfer> transfers;      // by tensor, then receiving rank, then box
  std::vector<Shared> shared;           // by tensor, then box
  std::vector<std::uint64_t> sent;      // bytes each rank sends to others
  std::vector<std::uint64_t> received;  // bytes each rank receives from others
};

// Plans the transfers that bring every needed box to its rank from the held
// ones. Among the ranks that hold a region, the one that needs it keeps its
// own; otherwise the region goes in pieces of at most `piece_bytes` (whole
// rows of its first dimension, at least one) to the holder that has sent the
// least so far, so that replicas share the sending. Deterministic: the same
// lists, in any order, give the same plan.
//
// Throws ValidationError, naming tensor, ranks and boxes, when a rank is
// outside [0, world_size); a box does not fit its tensor's shape; two ranks
// hold one tensor with different dtypes or shapes; a needed tensor is held by
// no rank; or part of a needed box is held by no rank (the first such region,
// with the count of the others).
TransferPlan plan_transfers(std::vector<HeldBox> held, std::vector<NeededBox> needed,
                            int world_size, std::uint64_t piece_bytes);

// Copies the elements of `region` from `from`, which holds those of `from_box`
// (row-major, contiguous), into `to`, which holds those of `to_box` alike:
// how a sender packs a transfer out of what it holds, how a receiver unpacks
// it into what it needs, and a rank's copy of its own. `region` must lie in
// both boxes and each buffer must be its box's size; else UsageError.
void copy_region(ConstBytes from, const Box& from_box, MutableBytes to, const Box& to_box,
                 const Box& region, std::size_t element_bytes);

}  // namespace tpreload
