// A sharded source: what one rank holds of a checkpoint (a trainer's FSDP row
// slices, Megatron column slices, whole experts, replicated copies), as boxes
// of the full tensors. Every rank of a reload passes its own (an empty one
// where it holds nothing); the ranks gather the boxes, check that every byte
// some rank needs is held and that bytes held twice agree, and move each
// needed box point to point from a rank that holds it (transfer_plan.h). No
// rank reads a file or assembles a tensor it does not need. No torch here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tpreload/core/dtype.h"
#include "tpreload/core/span.h"
#include "tpreload/reload/transfer_plan.h"

namespace tpreload {

// One box of a checkpoint tensor held in memory: the elements of `box` of the
// tensor `name` of full shape `shape`, row-major and contiguous in `bytes`
// (owned by the caller, who keeps them alive through the reload, or by
// `keep_alive`).
struct HeldTensor {
  std::string name;  // Hugging Face checkpoint name
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;  // the full tensor's
  Box box;                          // Box::whole(shape) for a whole tensor
  ConstBytes bytes;
  std::shared_ptr<const void> keep_alive;
};

class ShardedSource {
 public:
  // Throws CheckpointError naming the tensor: a box that does not fit its
  // shape, bytes that are not the box's elements x dtype size, or one box of a
  // tensor given twice.
  explicit ShardedSource(std::vector<HeldTensor> held = {});

  const std::vector<HeldTensor>& held() const { return held_; }
  std::uint64_t bytes() const;  // of every box held
  // "3 boxes of 3 tensors (12582912 bytes)", for logs.
  std::string describe() const;

 private:
  std::vector<HeldTensor> held_;
};

struct RowSplit;

// `held` with every box of a tensor that `splits` stacks (stacked_checkpoint_
// tensors(): Phi-3's qkv_proj and gate_up_proj, GLM-4's gate_up_proj,
// GraniteMoE's experts, Granite's shared MLP) listed as boxes of its parts, as
// the weight loaders take them; the bytes are views into `held`'s (which must
// outlive the result). A box of a tensor split by rows of its last dimension
// (`flat`) must span every dimension between the first and the last whole
// (whole experts, rows of experts). Throws CheckpointError naming the tensor,
// its shape and box for a stacked tensor of another shape, or such a box.
ShardedSource split_stacked(const ShardedSource& held, const std::vector<RowSplit>& splits);

// The boxes of `shape` that rank `part` of `parts` holds when a tensor is cut
// into `parts` near-equal slices along dimension `dim` (the first
// shape[dim] % parts ranks one element more): what a trainer's FSDP row
// slices (dim 0) or Megatron column slices (dim 1) are. Dimension -1: the
// whole tensor on every part. Throws UsageError for a dimension the shape does
// not have or parts < 1.
Box slice_box(const std::vector<std::int64_t>& shape, int dim, int part, int parts);

}  // namespace tpreload
