// Checkpoint tensors that hold several tensors stacked along their first
// dimension, listed as those tensors. Phi-3 checkpoints store q, k and v as one
// `self_attn.qkv_proj.weight` and gate and up as one `mlp.gate_up_proj.weight`;
// vLLM's QKVParallelLinear and MergedColumnParallelLinear weight loaders split
// such a tensor by rows (loaded_shard_id None) and load each part as if the
// checkpoint had held it. A source wrapped here lists the parts instead of the
// stacked tensor, so that every reader, plan and weight loader downstream sees
// the tensors they already know. Each part is a run of whole rows: a contiguous
// byte range of the stacked tensor, read (or viewed) through the wrapped source
// at an offset. No torch here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tpreload {

class WeightSource;

// One tensor of a stacked tensor: `rows` rows under `name`.
struct RowPart {
  std::string name;
  std::int64_t rows = 0;
};

// A stacked tensor's name and its parts, first rows first. Rows are those of
// its first dimension; `flat`: those of its last, every leading dimension
// flattened (GraniteMoE's experts [E, 2 x I, hidden], listed as each expert's
// gate and up [I, hidden]): a part's shape is then [rows, last], and the
// stacked tensor must be at least 2-D. Where `shape` is given the stacked
// tensor must have it exactly (a flat split should give it: many shapes
// flatten to the same rows).
struct RowSplit {
  std::string name;
  std::vector<RowPart> parts;
  bool flat = false;
  std::vector<std::int64_t> shape{};  // the stacked tensor's; empty: only its rows checked
};

// `base` with every tensor named in `splits` listed as its parts, in its place
// and in order: same dtype and file, the shape with its first dimension the
// part's rows (`flat`: [rows, last]), file_offset and bytes advanced past the
// rows before it. Every
// other tensor, the metadata, the kernel-format description and the known
// listing are `base`'s. `base` must outlive the result; reads go through it.
// `whose` names what asks for the split in messages (e.g. "Phi3ForCausalLM's
// config").
//
// The listing is made when first asked for (tensors(), describe()); it throws
// CheckpointError, naming the file, the tensor, its shape and the parts, for a
// stacked tensor that is not at least 1-D with as many rows as its parts add
// up to (`flat`: as many rows of its last dimension), and for a part whose
// name `base` also lists. Reads out of a part's
// bounds throw CheckpointError naming the part.
std::unique_ptr<WeightSource> make_row_split_source(WeightSource& base,
                                                    std::vector<RowSplit> splits,
                                                    std::string whose);

}  // namespace tpreload
