// Online FP8 (vLLM's --quantization fp8 of a bfloat16 checkpoint, and the
// block-scaled variant "fp8-block"): every decoder linear weight and expert is
// float8_e4m3fn with float32 scales computed over the rank's fused weight (each
// expert's w13 and w2 apart): with "fp8" one scale, amax / 448, as vLLM's
// Fp8LinearMethod and Fp8MoEMethod quantize a checkpoint that is not FP8; with
// "fp8-block" one per 128 x 128 block, as vLLM's per_block_cast_to_fp8 (the
// shard zero-padded to whole blocks, amax at least 1e-4, times 1/448 as PyTorch
// computes a division by a number on CUDA). The expected codes come from the
// test's own arithmetic: the slices cut and concatenated here, the scales in
// float, the nearest representable value searched in a table
// (fp8_checkpoints.h). The sizes put block edges inside logical shards.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../support/emulated_device.h"
#include "fp8_checkpoints.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/model/quantize.h"
#include "tpreload/reload/reload.h"

namespace tpreload {
namespace {

using testdata::cut;
using testdata::expect_shards;
using Checkpoint = testdata::Fp8TestCheckpoint;

constexpr std::int64_t kH = 192, kHeads = 4, kKv = 2, kHd = 48, kInter = 320, kVocab = 128;
constexpr std::int64_t kExperts = 4, kMoeInter = 160;
constexpr testdata::Fp8Sizes kSizes{kH, kHeads, kKv, kHd, kInter, kVocab, kExperts, kMoeInter};

const char* kDense = R"({"architectures":["LlamaForCausalLM"],"hidden_size":192,
  "intermediate_size":320,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
  "head_dim":48,"vocab_size":128,"torch_dtype":"bfloat16","tie_word_embeddings":false})";

const char* kMoe = R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":192,
  "intermediate_size":320,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,
  "head_dim":48,"vocab_size":128,"num_experts":4,"num_experts_per_tok":2,
  "moe_intermediate_size":160,"norm_topk_prob":true,"torch_dtype":"bfloat16",
  "tie_word_embeddings":false})";

// A bfloat16 checkpoint: the "FP8" modules of the builders are plain weights.
void add_bf16(Checkpoint& c, const std::string& module, std::int64_t rows, std::int64_t cols) {
  c.bf16(module + ".weight", {rows, cols});
}

Checkpoint dense_checkpoint() {
  Checkpoint c = testdata::fp8_dense_checkpoint(kSizes, add_bf16);
  // (the builder leaves layer 1's o_proj in bfloat16 as an "ignored" one: the
  // same here, quantized all the same)
  return c;
}

// The test's quantizations of a rank's (fused) local weight: its codes and its
// scale (0-dim) or grid.
//  - per tensor: scale = amax / 448 in float, each value times 1.0f / scale,
//    nearest code;
//  - blocks: zero-padded to whole 128 x 128 blocks, each block's amax (at least
//    1e-4) times the float 1/448, each value times the reciprocal of its
//    block's scale, nearest code; the padding cut off again.
std::pair<at::Tensor, at::Tensor> quantized(const at::Tensor& t, bool blocks) {
  const at::Tensor x = t.to(at::kFloat).contiguous();
  at::Tensor codes = at::empty(x.sizes(), at::kByte);
  auto* q = codes.data_ptr<std::uint8_t>();
  if (!blocks) {
    const float* p = x.data_ptr<float>();
    float amax = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) amax = std::max(amax, std::fabs(p[i]));
    const float scale = amax / 448.0f, inverse = 1.0f / scale;
    for (std::int64_t i = 0; i < x.numel(); ++i) q[i] = testdata::nearest_code(p[i] * inverse);
    return {codes, at::full({}, scale, at::kFloat)};
  }
  const std::int64_t m = x.size(0), n = x.size(1), pm = (m + 127) / 128, pn = (n + 127) / 128;
  const at::Tensor padded = at::constant_pad_nd(x, {0, pn * 128 - n, 0, pm * 128 - m}, 0);
  const at::Tensor view = padded.view({pm, 128, pn, 128});
  const at::Tensor amax = view.abs().amax({1, 3}, true).clamp_min(1e-4);
  const at::Tensor scale = amax * (1.0f / 448.0f);
  const at::Tensor scaled = (view * at::reciprocal(scale))
                                .view({pm * 128, pn * 128})
                                .narrow(0, 0, m)
                                .narrow(1, 0, n)
                                .contiguous();
  const float* p = scaled.data_ptr<float>();
  // (vLLM computes this on a GPU, whose arithmetic makes every NaN the
  // canonical positive one, 0x7FFFFFFF: a NaN block's scale; torch casts it to
  // the NaN code 0x7F)
  for (std::int64_t i = 0; i < x.numel(); ++i)
    q[i] = std::isnan(p[i]) ? 0x7F : testdata::nearest_code(p[i]);
  const at::Tensor gpu_nan = at::full({}, 0x7FFFFFFF, at::kInt).view(at::kFloat);
  return {codes, at::where(at::isnan(scale), gpu_nan, scale).view({pm, pn}).contiguous()};
}

// What a scheme makes of the test's checkpoints.
struct Scheme {
  const char* name;  // ModelOptions::quantization
  bool blocks;
  std::string scale_leaf() const { return blocks ? "weight_scale_inv" : "weight_scale"; }
};
const Scheme kPerTensor{"fp8", false}, kBlocks{"fp8-block", true};

void expect_linear(std::map<std::string, at::Tensor>& want, const Scheme& s,
                   const std::string& module, const at::Tensor& local) {
  const auto [codes, scale] = quantized(local, s.blocks);
  want[module + ".weight"] = codes;
  want[module + "." + s.scale_leaf()] = s.blocks ? scale : scale.reshape({1});
}

void expect_attention(std::map<std::string, at::Tensor>& want, const Scheme& s, const Checkpoint& c,
                      const std::string& p, int tp, int r) {
  const auto& t = c.tensors;
  const auto [q_at, q_rows, kv_at, kv_rows] = testdata::attention_rows(kSizes, tp, r);
  const std::string a = p + "self_attn.";
  expect_linear(want, s, a + "qkv_proj",
                at::cat({cut(t.at(a + "q_proj.weight"), q_at, q_rows, 0, kH),
                         cut(t.at(a + "k_proj.weight"), kv_at, kv_rows, 0, kH),
                         cut(t.at(a + "v_proj.weight"), kv_at, kv_rows, 0, kH)}));
  const std::int64_t o_cols = kHeads * kHd / tp;
  expect_linear(want, s, a + "o_proj", cut(t.at(a + "o_proj.weight"), 0, kH, r * o_cols, o_cols));
}

std::map<std::string, at::Tensor> expected_dense(const Scheme& s, const Checkpoint& c, int tp,
                                                 int r) {
  std::map<std::string, at::Tensor> want;
  const auto& t = c.tensors;
  const std::int64_t rows = kInter / tp;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    expect_attention(want, s, c, p, tp, r);
    const std::string m = p + "mlp.";
    expect_linear(want, s, m + "gate_up_proj",
                  at::cat({cut(t.at(m + "gate_proj.weight"), r * rows, rows, 0, kH),
                           cut(t.at(m + "up_proj.weight"), r * rows, rows, 0, kH)}));
    expect_linear(want, s, m + "down_proj",
                  cut(t.at(m + "down_proj.weight"), 0, kH, r * rows, rows));
  }
  return want;
}

// Each local expert's w13 (its gate rows, then its up rows) and w2 quantized
// apart, a scale (or grid) each.
std::map<std::string, at::Tensor> expected_moe(const Scheme& s, const Checkpoint& c, int tp, int r,
                                               bool ep) {
  std::map<std::string, at::Tensor> want;
  expect_attention(want, s, c, "model.layers.0.", tp, r);
  const auto& t = c.tensors;
  const std::string x = "model.layers.0.mlp.experts.";
  const std::int64_t local = ep ? kExperts / tp : kExperts, inter = ep ? kMoeInter : kMoeInter / tp;
  const std::int64_t first = ep ? r * local : 0, at_row = ep ? 0 : r * inter;
  std::vector<at::Tensor> w13, w2, w13_scale, w2_scale;
  for (std::int64_t e = first; e < first + local; ++e) {
    const std::string n = x + std::to_string(e) + ".";
    const auto [gate_up, s13] =
        quantized(at::cat({cut(t.at(n + "gate_proj.weight"), at_row, inter, 0, kH),
                           cut(t.at(n + "up_proj.weight"), at_row, inter, 0, kH)}),
                  s.blocks);
    const auto [down, s2] =
        quantized(cut(t.at(n + "down_proj.weight"), 0, kH, at_row, inter), s.blocks);
    w13.push_back(gate_up);
    w2.push_back(down);
    w13_scale.push_back(s13);
    w2_scale.push_back(s2);
  }
  const std::string leaf = s.blocks ? "_scale_inv" : "_scale";
  want[x + "w13_weight"] = at::stack(w13);
  want[x + "w13_weight" + leaf] = at::stack(w13_scale);
  want[x + "w2_weight"] = at::stack(w2);
  want[x + "w2_weight" + leaf] = at::stack(w2_scale);
  return want;
}

ModelOptions fp8(const Scheme& s, int tp, int r, bool ep = false,
                 std::shared_ptr<Device> device = nullptr) {
  ModelOptions o = testdata::tp_rank_options(tp, r, ep, std::move(device));
  o.quantization = s.name;
  return o;
}

ModelConfig config(const char* text) {
  return parse_model_config(text, "the test's config");
}

TEST(Fp8Online, DenseWeightsAreQuantizedOverTheRanksFusedWeight) {
  const Checkpoint c = dense_checkpoint();
  for (const Scheme& s : {kPerTensor, kBlocks}) {
    for (const int tp : {1, 2}) {
      for (int r = 0; r < tp; ++r) {
        TensorParallelModel model(config(kDense), fp8(s, tp, r));
        auto source = c.source();
        model.load_weights(*source);
        expect_shards(
            model, expected_dense(s, c, tp, r),
            std::string(s.name) + ", tp " + std::to_string(tp) + " rank " + std::to_string(r));
      }
    }
    // The norms and embeddings keep the model's dtype.
    TensorParallelModel model(config(kDense), fp8(s, 1, 0));
    EXPECT_EQ(model.parameter_for_reload("model.layers.0.input_layernorm.weight").scalar_type(),
              at::kBFloat16);
    EXPECT_EQ(model.parameter_for_reload("model.embed_tokens.weight").scalar_type(), at::kBFloat16);
  }
}

TEST(Fp8Online, ExpertsAreQuantizedOneByOne) {
  const Checkpoint c = testdata::fp8_moe_checkpoint(kSizes, add_bf16);
  for (const Scheme& s : {kPerTensor, kBlocks}) {
    for (const bool ep : {false, true}) {
      for (int r = 0; r < 2; ++r) {
        TensorParallelModel model(config(kMoe), fp8(s, 2, r, ep));
        auto source = c.source();
        model.load_weights(*source);
        expect_shards(model, expected_moe(s, c, 2, r, ep),
                      std::string(s.name) + ", " + (ep ? "expert" : "tensor") + " parallel, rank " +
                          std::to_string(r));
      }
    }
  }
}

// Blocks that are all zero, all under the 1e-4 floor, or hold a NaN: in layer
// 0's qkv_proj (q rows 0-191, k 192-287, v 288-383 at tp 1), block (0, 0) zero,
// block (1, 1) (q rows 128-191 and k rows 0-63, columns 128-191) tiny, a NaN
// in v_proj's row 5.
TEST(Fp8Online, BlocksOfZerosTinyValuesAndNaN) {
  Checkpoint c = dense_checkpoint();
  const std::string a = "model.layers.0.self_attn.";
  c.tensors[a + "q_proj.weight"].narrow(0, 0, 128).narrow(1, 0, 128).zero_();
  c.tensors[a + "q_proj.weight"].narrow(0, 128, 64).narrow(1, 128, 64).mul_(1e-6);
  c.tensors[a + "k_proj.weight"].narrow(0, 0, 64).narrow(1, 128, 64).mul_(1e-6);
  c.tensors[a + "v_proj.weight"][5][7] = NAN;
  const std::map<std::string, at::Tensor> all = expected_dense(kBlocks, c, 1, 0);
  TensorParallelModel model(config(kDense), fp8(kBlocks, 1, 0));
  auto source = c.source();
  model.load_weights(*source);
  expect_shards(model, all, "zeros, tiny values and a NaN");
  // (what the test's expectation says of those blocks: the floor's scale for
  // the zero and the tiny block, codes 0 in the zero one and not in the tiny
  // one; a NaN scale and NaN codes in the NaN's block)
  const at::Tensor grid = all.at(a + "qkv_proj.weight_scale_inv");
  const at::Tensor codes = all.at(a + "qkv_proj.weight");
  EXPECT_EQ(grid[0][0].item<float>(), 1e-4f * (1.0f / 448.0f));
  EXPECT_EQ(grid[1][1].item<float>(), 1e-4f * (1.0f / 448.0f));
  EXPECT_EQ(codes.narrow(0, 0, 128).narrow(1, 0, 128).max().item<int>(), 0);
  EXPECT_GT(codes.narrow(0, 128, 128).narrow(1, 128, 64).max().item<int>(), 0);
  EXPECT_TRUE(std::isnan(grid[2][0].item<float>()));
  EXPECT_EQ(codes[293][0].item<int>(), 0x7F);
}

// The DType of values staged as `type` (float32, bfloat16 or float16).
DType staged_dtype(at::ScalarType type) {
  return type == at::kFloat      ? DType::kFloat32
         : type == at::kBFloat16 ? DType::kBFloat16
                                 : DType::kFloat16;
}

// f(what) at every instruction-set level of the host's kernels this CPU runs,
// `what` naming the level and the staged dtype.
template <typename F>
void at_every_level(DType dtype, F f) {
  for (const QuantizeLevel level :
       {QuantizeLevel::kBaseline, QuantizeLevel::kAvx2, QuantizeLevel::kAvx512}) {
    if (!quantize_supports(level)) continue;
    detail::ScopedQuantizeLevel use(level);
    f(std::string(quantize_level_name(level)) + ", " + std::string(dtype_name(dtype)));
  }
}

// The host's kernels at every instruction-set level this CPU has, of values
// staged as float32, bfloat16 and float16, against the test's arithmetic: every tie between two
// neighbouring codes (the midpoints, both signs; with amax 448 the per-tensor scale is 1), NaNs,
// zeros, values below the floor, lengths and tiles that end inside a vector.
TEST(Fp8Online, EveryKernelLevelGivesTheTestsBytes) {
  std::vector<float> v;
  for (int c = 0; c < 0x7E; ++c)
    for (const float sign : {1.0f, -1.0f})
      v.push_back(sign *
                  (testdata::value_of(static_cast<std::uint8_t>(c)) +
                   testdata::value_of(static_cast<std::uint8_t>(c + 1))) /
                  2);
  v.push_back(448.0f);
  v.push_back(NAN);
  v.push_back(-0.0f);
  at::manual_seed(3);
  const at::Tensor noise = at::randn({40 * 61 - static_cast<std::int64_t>(v.size())}) * 100;
  v.insert(v.end(), noise.data_ptr<float>(), noise.data_ptr<float>() + noise.numel());
  const at::Tensor flat = at::tensor(v);
  // (as a 40 x 61 grid of 16 x 16 blocks: a zero block, a tiny one, a NaN's)
  at::Tensor tiles = at::tensor(v).view({40, 61}).clone();
  tiles.narrow(0, 16, 16).narrow(1, 0, 16).zero_();
  tiles.narrow(0, 16, 16).narrow(1, 16, 16).mul_(1e-9);
  for (const at::ScalarType type : {at::kFloat, at::kBFloat16, at::kHalf}) {
    // (the values as the staging of a model of that dtype holds them)
    const at::Tensor flat_t = flat.to(type), tiles_t = tiles.to(type);
    const DType dtype = staged_dtype(type);
    // (pairs, not bindings: a lambda below uses them)
    at::Tensor codes, scale;
    std::tie(codes, scale) = quantized(flat_t, false);
    at_every_level(dtype, [&](const std::string& what) {
      at::Tensor got = at::empty({flat.numel()}, at::kByte);
      float got_scale = 0;
      quantize_fp8_host(flat_t.data_ptr(), dtype, static_cast<std::uint64_t>(flat.numel()),
                        got.data_ptr<std::uint8_t>(), &got_scale);
      EXPECT_EQ(got_scale, scale.item<float>()) << what;
      EXPECT_TRUE(at::equal(got, codes)) << what << ": per tensor";
      for (const std::int64_t block : {16, 128}) {
        // (the test's blocks are 128: a 16-block grid is the 128 one's
        // arithmetic on each 16 x 16 piece, compared piece by piece)
        at::Tensor got_codes = at::empty({40, 61}, at::kByte);
        const std::int64_t gr = (40 + block - 1) / block, gc = (61 + block - 1) / block;
        at::Tensor grid = at::empty({gr, gc}, at::kFloat);
        quantize_fp8_blocks_host(tiles_t.data_ptr(), dtype, 40, 61, block,
                                 got_codes.data_ptr<std::uint8_t>(), grid.data_ptr<float>());
        for (std::int64_t r = 0; r < gr; ++r)
          for (std::int64_t c = 0; c < gc; ++c) {
            const at::Tensor piece = tiles_t.narrow(0, r * block, std::min(block, 40 - r * block))
                                         .narrow(1, c * block, std::min(block, 61 - c * block));
            const auto [want_codes, want_grid] = quantized(piece, true);
            const at::Tensor got_piece =
                got_codes.narrow(0, r * block, piece.size(0)).narrow(1, c * block, piece.size(1));
            const float want_scale = want_grid.item<float>(), got_s = grid[r][c].item<float>();
            EXPECT_TRUE(got_s == want_scale || (std::isnan(got_s) && std::isnan(want_scale)))
                << what << ", block " << block << " (" << r << ", " << c << "): " << got_s
                << " vs the test's " << want_scale;
            EXPECT_TRUE(at::equal(got_piece.contiguous(), want_codes))
                << what << ", block " << block << " (" << r << ", " << c << ")";
          }
      }
    });
  }
}

// The same against random values of every exponent that matters (from far
// below the smallest subnormal, 2^-9, to above 448) with random mantissas:
// products that land anywhere between two codes, per tensor and per 128 x 128
// block (one row of eight blocks, the last one partial).
TEST(Fp8Online, EveryKernelLevelRoundsRandomValuesOfEveryExponent) {
  constexpr std::int64_t kRows = 64, kCols = 1000;
  std::mt19937 gen(11);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, (1u << 23) - 1), exponent(100, 135),
      sign(0, 1);
  std::vector<float> v(kRows * kCols);
  for (float& x : v) {
    const std::uint32_t u = sign(gen) << 31 | exponent(gen) << 23 | mantissa(gen);
    std::memcpy(&x, &u, sizeof x);
  }
  const at::Tensor values = at::tensor(v).view({kRows, kCols});
  for (const at::ScalarType type : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor staged = values.to(type).contiguous();
    const DType dtype = staged_dtype(type);
    at::Tensor codes, scale, block_codes, grid;  // (not bindings: the lambda uses them)
    std::tie(codes, scale) = quantized(staged, false);
    std::tie(block_codes, grid) = quantized(staged, true);
    at_every_level(dtype, [&](const std::string& what) {
      at::Tensor got = at::empty({kRows, kCols}, at::kByte);
      float got_scale = 0;
      quantize_fp8_host(staged.data_ptr(), dtype, kRows * kCols, got.data_ptr<std::uint8_t>(),
                        &got_scale);
      EXPECT_EQ(got_scale, scale.item<float>()) << what;
      EXPECT_EQ(at::ne(got, codes).sum().item<std::int64_t>(), 0) << what << ": per tensor";
      at::Tensor got_grid = at::empty_like(grid);
      quantize_fp8_blocks_host(staged.data_ptr(), dtype, kRows, kCols, 128,
                               got.data_ptr<std::uint8_t>(), got_grid.data_ptr<float>());
      EXPECT_TRUE(at::equal(got_grid, grid)) << what;
      EXPECT_EQ(at::ne(got, block_codes).sum().item<std::int64_t>(), 0) << what << ": blocks";
    });
  }
}

// A load that fails after staging part of a layer (layer 1's q_proj, 100
// times larger, without its k_proj and v_proj) leaves nothing behind: the next
// load's scales come from its own values alone.
TEST(Fp8Online, ALoadThatFailedLeavesNoStagedAmaxBehind) {
  const Checkpoint whole = dense_checkpoint();
  Checkpoint part = whole;
  part.tensors.erase("model.layers.1.self_attn.k_proj.weight");
  part.tensors.erase("model.layers.1.self_attn.v_proj.weight");
  auto& q = part.tensors.at("model.layers.1.self_attn.q_proj.weight");
  q = (q.to(at::kFloat) * 100).to(at::kBFloat16);
  for (const Scheme& s : {kPerTensor, kBlocks}) {
    TensorParallelModel model(config(kDense), fp8(s, 1, 0));
    auto bad = part.source();
    EXPECT_THROW(model.load_weights(*bad), Error) << s.name;
    auto good = whole.source();
    model.load_weights(*good);
    expect_shards(model, expected_dense(s, whole, 1, 0),
                  std::string(s.name) + ", after a failed load");
  }
}

// The report counts what the sink holds for the processing after a reload of
// the one-layer MoE model at tp 1 (kept for the next reload): only the units
// that come in parts are staged, one write per checkpoint tensor here, in the
// order of their names (each expert's down, gate, up; then k, o, q, v), and a
// spare buffer that fits is reused.
//  - Per tensor a unit is a fused weight or an expert: w2 and o_proj come
//    whole (quantized from their writes); each expert's w13 is staged from its
//    gate to its up, one buffer for all; qkv from k to v, one more (larger):
//    w13 + qkv values at 2 bytes.
//  - Per block a unit is a band of 128 rows: k's rows open the two qkv bands
//    they touch (q|k and k|v), both in flight until q and v close them; each
//    expert's gate|up band comes earlier and reuses the same buffer: two bands.
// Staging whole units (or the layer) would hold more: w2's and o_proj's too.
TEST(Fp8Online, TheReportCountsTheStagedWeights) {
  const Checkpoint c = testdata::fp8_moe_checkpoint(kSizes, add_bf16);
  const std::int64_t qkv = (kHeads + 2 * kKv) * kHd * kH, w13 = 2 * kMoeInter * kH;
  const std::int64_t k_first = kHeads * kHd, k_last = (kHeads + kKv) * kHd - 1;
  const std::int64_t k_bands = k_last / 128 - k_first / 128 + 1;
  ASSERT_EQ(k_bands, 2);        // (the sizes put k across a band edge...
  ASSERT_NE(k_first % 128, 0);  // ...with q and v in its first and last band)
  ASSERT_NE((k_last + 1) % 128, 0);
  ASSERT_NE(kMoeInter % 128, 0);  // (and an expert's gate|up edge inside a band)
  for (const Scheme& s : {kPerTensor, kBlocks}) {
    TensorParallelModel model(config(kMoe), fp8(s, 1, 0));
    auto control = make_local_communicator();
    auto source = c.source();
    const ReloadResult r = reload_weights(model, *control, source.get(), ReloadOptions{});
    const std::int64_t want = s.blocks ? k_bands * 128 * kH * 2 : (w13 + qkv) * 2;
    EXPECT_EQ(r.processing_staging_bytes, static_cast<std::uint64_t>(want)) << s.name;
  }
}

// Through the engine, twice, broadcast and scatter, atomic or not, host and
// (emulated) device memory; a float32 source too (the scale is computed from
// the values as they arrive, whatever their dtype).
TEST(Fp8Online, AReloadQuantizesEveryLayerInPlace) {
  const Checkpoint v1 = testdata::fp8_moe_checkpoint(kSizes, add_bf16);
  Checkpoint v2 = testdata::fp8_moe_checkpoint(kSizes, add_bf16);
  for (auto& [name, t] : v2.tensors) t = (t.flip({0}) * 3).contiguous();
  Checkpoint v2_f32 = v2;
  for (auto& [name, t] : v2_f32.tensors) {
    t = t.to(at::kFloat);
    v2_f32.dtypes[name] = DType::kFloat32;
  }
  for (const Scheme& s : {kPerTensor, kBlocks})
    testdata::reload_in_every_mode(config(kMoe), fp8(s, 1, 0), v1, {&v2, &v2_f32},
                                   expected_moe(s, v2, 1, 0, false),
                                   "model.layers.0.mlp.experts.w13_weight");
}

// Values of another dtype are rounded to the model's (bfloat16) before they are
// quantized, as vLLM loads them into a parameter of the model's dtype first: a
// float32 source whose values bfloat16 cannot hold gives the codes of those
// values rounded to bfloat16 (by ATen here).
TEST(Fp8Online, ValuesOfAnotherDtypeAreRoundedToTheModelsFirst) {
  Checkpoint f32 = testdata::fp8_moe_checkpoint(kSizes, add_bf16);
  Checkpoint rounded = f32;
  for (auto& [name, t] : f32.tensors) {
    at::manual_seed(7);
    t = (t.to(at::kFloat) * (1 + at::rand(t.sizes()) * 0.01)).contiguous();
    f32.dtypes[name] = DType::kFloat32;
    rounded.tensors[name] = t.to(at::kBFloat16);
  }
  const Checkpoint v1 = testdata::fp8_moe_checkpoint(kSizes, add_bf16);
  for (const Scheme& s : {kPerTensor, kBlocks}) {
    const auto want = expected_moe(s, rounded, 1, 0, false);
    ASSERT_FALSE(
        testdata::same_bytes(want.at("model.layers.0.mlp.experts.w13_weight").view(at::kByte),
                             expected_moe(s, f32, 1, 0, false)
                                 .at("model.layers.0.mlp.experts.w13_weight")
                                 .view(at::kByte)))
        << "the test's float32 values quantize as their bfloat16 roundings do";
    testdata::reload_in_every_mode(config(kMoe), fp8(s, 1, 0), v1, {&f32}, want,
                                   "model.layers.0.mlp.experts.w13_weight");
  }
}

// A reload that brings part of a weight (q_proj without k_proj and v_proj) is
// refused before any write: the scale is the amax over the whole fused weight.
TEST(Fp8Online, AWeightBroughtInPartIsRefusedBeforeAnyWrite) {
  const Checkpoint whole = dense_checkpoint();
  Checkpoint part = whole;
  part.tensors.erase("model.layers.1.self_attn.k_proj.weight");
  part.tensors.erase("model.layers.1.self_attn.v_proj.weight");
  for (const Scheme& s : {kPerTensor, kBlocks}) {
    TensorParallelModel model(config(kDense), fp8(s, 1, 0));
    auto control = make_local_communicator();
    auto first = whole.source();
    reload_weights(model, *control, first.get(), ReloadOptions{});
    auto source = part.source();
    try {
      reload_weights(model, *control, source.get(), ReloadOptions{});
      FAIL() << s.name << ": q_proj alone was taken";
    } catch (const ValidationError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "online FP8 layer 1 on tp rank 0: this load brings only part of "
                    "'model.layers.1.self_attn.qkv_proj.weight'"),
                std::string::npos)
          << e.what();
    }
    expect_shards(model, expected_dense(s, whole, 1, 0),
                  std::string(s.name) + ", after the refused reload");
  }
}

}  // namespace
}  // namespace tpreload
