// Synthetic checkpoints and float16/bfloat16 conversions (see synthetic.h).
#include "tpreload/checkpoint/synthetic.h"

#include <cmath>
#include <cstring>

#include "file_util.h"
#include "tpreload/core/error.h"
#include "tpreload/core/float8.h"
#include "tpreload/core/float_bits.h"
#include "tpreload/core/fnv.h"

namespace tpreload {
namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Approximately N(0, 1): the Irwin-Hall sum of four 16-bit uniforms, standardised.
float approx_normal(std::uint64_t& state) {
  const std::uint64_t r = splitmix64(state);
  float sum = 0;
  for (int k = 0; k < 4; ++k)
    sum += (static_cast<float>((r >> (16 * k)) & 0xFFFF) + 0.5f) / 65536.f;
  return (sum - 2.f) * 1.7320508f;
}

void store_float(DType dtype, float value, std::byte* out) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(out, &value, 4);
      break;
    case DType::kFloat64: {
      const double d = value;
      std::memcpy(out, &d, 8);
      break;
    }
    case DType::kFloat16: {
      const std::uint16_t h = float_to_half_bits(value);
      std::memcpy(out, &h, 2);
      break;
    }
    case DType::kFloat8E4M3:
      *out = static_cast<std::byte>(fp8::to_e4m3fn(value));
      break;
    case DType::kFloat8E5M2:
      *out = static_cast<std::byte>(fp8::to_e5m2(value));
      break;
    default: {
      const std::uint16_t b = float_to_bfloat16_bits(value);
      std::memcpy(out, &b, 2);
    }
  }
}

void fill_floating(const TensorSpec& spec, const SyntheticOptions& o, std::uint64_t state,
                   MutableBytes dst) {
  const SyntheticInit init = synthetic_init_for(spec.name);
  const std::size_t esize = dtype_size(spec.dtype), n = dst.size / esize;
  for (std::size_t i = 0; i < n; ++i) {
    float v;
    if (init == SyntheticInit::kInvFreq)
      v = static_cast<float>(1.0 / std::pow(o.rope_theta, (2.0 * i) / (2.0 * n)));
    else
      v = (init == SyntheticInit::kNorm ? 1.f : 0.f) +
          static_cast<float>(o.stddev) * approx_normal(state);
    store_float(spec.dtype, v, dst.data + i * esize);
  }
}

void fill_integral(const TensorSpec& spec, std::uint64_t state, MutableBytes dst) {
  for (std::size_t i = 0; i < dst.size; i += 8) {
    const std::uint64_t r = splitmix64(state);
    const std::size_t n = std::min<std::size_t>(8, dst.size - i);
    std::memcpy(dst.data + i, &r, n);
  }
  if (spec.dtype == DType::kBool)
    for (std::size_t i = 0; i < dst.size; ++i) dst.data[i] &= std::byte{1};
}

}  // namespace

std::uint16_t float_to_half_bits(float value) {
  return fbits::to_half(value);
}

float half_bits_to_float(std::uint16_t h) {
  return fbits::from_half(h);
}

std::uint16_t float_to_bfloat16_bits(float value) {
  return fbits::to_bfloat16(value);
}

float bfloat16_bits_to_float(std::uint16_t bits) {
  return fbits::from_bfloat16(bits);
}

SyntheticInit synthetic_init_for(const std::string& name) {
  if (detail::ends_with(name, ".inv_freq")) return SyntheticInit::kInvFreq;
  if (detail::ends_with(name, "norm.weight")) return SyntheticInit::kNorm;
  return SyntheticInit::kNormal;
}

void fill_synthetic(const TensorSpec& spec, const SyntheticOptions& options, MutableBytes dst) {
  std::uint64_t numel = 1;
  for (const auto d : spec.shape) numel *= static_cast<std::uint64_t>(d);
  if (dst.size != numel * dtype_size(spec.dtype))
    raise<UsageError>("synthetic tensor '", spec.name, "': buffer of ", dst.size, " bytes, need ",
                      numel * dtype_size(spec.dtype));
  std::uint64_t state = options.seed ^ fnv1a(spec.name);
  splitmix64(state);
  if (dtype_is_floating(spec.dtype) || dtype_is_float8(spec.dtype))
    fill_floating(spec, options, state, dst);
  else
    fill_integral(spec, state, dst);
}

std::vector<std::string> generate_checkpoint(const std::string& out_dir,
                                             const std::vector<TensorSpec>& tensors,
                                             const GenerateOptions& options) {
  const FillFn fill = [&](std::size_t i, MutableBytes dst) {
    fill_synthetic(tensors[i], options.values, dst);
  };
  if (options.format != "safetensors" && options.format != "hdf5")
    raise<UsageError>("generate: format '", options.format, "' is not safetensors or hdf5");
  if (options.shards < 1 || (options.format == "hdf5" && options.shards != 1))
    raise<UsageError>("generate: ", options.shards, " shards (need >= 1; hdf5 writes one file)");
  detail::make_directories(out_dir);
  if (options.format == "hdf5") {
    write_hdf5(detail::join_path(out_dir, "model.h5"), tensors, fill, options.hdf5);
    return {"model.h5"};
  }
  const Metadata metadata = {{"format", "pt"}};
  if (options.shards > 1)
    return write_safetensors_sharded(out_dir, tensors, fill, options.shards, metadata);
  write_safetensors(detail::join_path(out_dir, "model.safetensors"), tensors, fill, metadata);
  return {"model.safetensors"};
}

}  // namespace tpreload
