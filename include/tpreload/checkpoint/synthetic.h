// Synthetic checkpoints for tests and benchmarks: seeded pseudo-random tensors
// (reload_ckpt generate), and exact float16/bfloat16 conversions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpreload/checkpoint/writers.h"
#include "tpreload/core/span.h"

namespace tpreload {

// IEEE binary16 bits of `value`, rounded to nearest, ties to even (overflow gives
// infinity, NaN stays NaN).
std::uint16_t float_to_half_bits(float value);
float half_bits_to_float(std::uint16_t bits);

// bfloat16 bits of `value`, rounded to nearest, ties to even (NaN stays a quiet NaN).
std::uint16_t float_to_bfloat16_bits(float value);
float bfloat16_bits_to_float(std::uint16_t bits);

// How fill_synthetic() initialises a tensor, chosen by name.
enum class SyntheticInit {
  kNormal,   // N(0, stddev): weights, biases, embeddings
  kNorm,     // 1 + N(0, stddev): names ending in "norm.weight"
  kInvFreq,  // rotary inverse frequencies 1 / theta^(2i/d): names ending in ".inv_freq"
};
SyntheticInit synthetic_init_for(const std::string& name);

struct SyntheticOptions {
  std::uint64_t seed = 0;
  double stddev = 0.02;
  double rope_theta = 10000.0;  // for kInvFreq
};

// Fill `dst` (exactly nbytes of `spec`) deterministically from (options.seed,
// spec.name): the same name and seed give the same bytes whatever the order,
// shard count or file format. Floating types follow synthetic_init_for(name)
// (rounded to nearest even in float16/bfloat16, encoded as core/float8.h does in
// the FP8 types); integer types get uniform random
// bits, bool 0/1. Throws UsageError if dst.size is wrong.
void fill_synthetic(const TensorSpec& spec, const SyntheticOptions& options, MutableBytes dst);

struct GenerateOptions {
  std::string format = "safetensors";  // "safetensors" or "hdf5"
  int shards = 1;                      // safetensors only: > 1 writes a sharded set
  SyntheticOptions values;
  Hdf5WriteOptions hdf5;
};

// Write a synthetic checkpoint of `tensors` into `out_dir` (created if missing):
// model.safetensors (shards == 1), model-0000i-of-0000K.safetensors plus
// model.safetensors.index.json (shards > 1), or model.h5 (hdf5). The safetensors
// "__metadata__" is {"format": "pt"} as transformers writes. Returns the file names
// written. Throws UsageError for bad options, CheckpointError for I/O failures.
std::vector<std::string> generate_checkpoint(const std::string& out_dir,
                                             const std::vector<TensorSpec>& tensors,
                                             const GenerateOptions& options);

}  // namespace tpreload
