// Synthetic checkpoints (reload_ckpt generate): names and shapes from the config,
// determinism by seed, value ranges, float16/bfloat16 rounding; and the tool itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "../checkpoint/test_util.h"
#include "tpreload/checkpoint/synthetic.h"
#include "tpreload/model/config.h"

namespace tpreload {
namespace {

using test::TempDir;

const char* const kConfig = R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
  "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 8,
  "num_key_value_heads": 2, "vocab_size": 50, "torch_dtype": "bfloat16"})";

std::vector<TensorSpec> specs_for(const ModelConfig& c) {
  std::vector<TensorSpec> specs;
  for (const auto& s : checkpoint_tensor_specs(c)) specs.push_back({s.name, c.dtype, s.shape});
  return specs;
}

TEST(Generate, WritesTheConfigsTensorNamesAndShapes) {
  const ModelConfig config = parse_model_config(kConfig, "test config");
  const auto specs = checkpoint_tensor_specs(config);
  for (const char* format : {"safetensors", "hdf5"}) {
    TempDir dir;
    GenerateOptions options;
    options.format = format;
    generate_checkpoint(dir.path(), specs_for(config), options);
    auto source = open_weight_source(dir.path());
    ASSERT_EQ(source->tensors().size(), specs.size()) << format;
    std::map<std::string, std::vector<std::int64_t>> got, want;
    for (const auto& t : source->tensors()) {
      got[t.name] = t.shape;
      EXPECT_EQ(t.dtype, DType::kBFloat16) << t.name;
    }
    for (const auto& s : specs) want[s.name] = s.shape;
    EXPECT_EQ(got, want) << format;
    if (std::string(format) == "safetensors") {  // file order is the config's order
      for (std::size_t i = 0; i < specs.size(); ++i) {
        EXPECT_EQ(source->tensors()[i].name, specs[i].name);
      }
    }
  }
}

// Every tensor's bytes by name (order-independent: HDF5 lists group by group).
std::map<std::string, std::string> all_bytes(WeightSource& source) {
  std::map<std::string, std::string> out;
  for (std::size_t i = 0; i < source.tensors().size(); ++i) {
    std::string bytes(source.tensors()[i].nbytes, '\0');
    source.read(i, {0, bytes.size()}, MutableBytes(bytes.data(), bytes.size()));
    out[source.tensors()[i].name] = bytes;
  }
  return out;
}

TEST(Generate, IsDeterministicBySeedWhateverTheShardsOrFormat) {
  const ModelConfig config = parse_model_config(kConfig, "test config");
  auto generate = [&](const std::string& dir, std::uint64_t seed, int shards, const char* format) {
    GenerateOptions options;
    options.values.seed = seed;
    options.shards = shards;
    options.format = format;
    generate_checkpoint(dir, specs_for(config), options);
    return all_bytes(*open_weight_source(dir));
  };
  TempDir dir;
  const auto a = generate(dir / "a", 7, 1, "safetensors");
  EXPECT_TRUE(generate(dir / "b", 7, 1, "safetensors") == a);
  EXPECT_TRUE(generate(dir / "c", 7, 4, "safetensors") == a);
  EXPECT_TRUE(generate(dir / "d", 7, 1, "hdf5") == a);
  EXPECT_FALSE(generate(dir / "e", 8, 1, "safetensors") == a);
  EXPECT_EQ(test::read_file(dir / "a/model.safetensors"),
            test::read_file(dir / "b/model.safetensors"));
}

TEST(Generate, ValuesLookLikeWeightsAndNorms) {
  std::vector<std::uint16_t> w(4096), n(4096);
  fill_synthetic({"model.layers.0.mlp.up_proj.weight", DType::kBFloat16, {4096}}, {},
                 MutableBytes(w));
  fill_synthetic({"model.layers.0.input_layernorm.weight", DType::kBFloat16, {4096}}, {},
                 MutableBytes(n));
  double sum = 0, sq = 0, nsum = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double v = bfloat16_bits_to_float(w[i]);
    sum += v, sq += v * v, nsum += bfloat16_bits_to_float(n[i]);
  }
  EXPECT_NEAR(sum / 4096, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sq / 4096), 0.02, 0.002);
  EXPECT_NEAR(nsum / 4096, 1.0, 0.002);
  std::vector<float> inv(4);
  fill_synthetic({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::kFloat32, {4}}, {},
                 MutableBytes(inv));
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_FLOAT_EQ(inv[2], 0.01f);  // 1 / 10000^(4/8)
}

TEST(Conversions, HalfRoundsToNearestEven) {
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half_bits(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00);  // tie rounds to even: infinity
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even stays
  EXPECT_EQ(float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, odd rounds up
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000);             // tie to even: zero
  EXPECT_EQ(float_to_half_bits(std::ldexp(3.0f, -26)), 0x0001);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half_bits(INFINITY), 0x7c00);
  EXPECT_EQ(float_to_half_bits(NAN) & 0x7e00, 0x7e00);
  for (std::uint32_t h = 0; h < 0x7c00; ++h)  // every finite half survives the round trip
    ASSERT_EQ(float_to_half_bits(half_bits_to_float(static_cast<std::uint16_t>(h))), h);
}

TEST(Conversions, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bfloat16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie, even
  EXPECT_EQ(float_to_bfloat16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie, odd up
  EXPECT_EQ(float_to_bfloat16_bits(1.0f + 1.5f * std::ldexp(1.0f, -8)), 0x3f81);
  EXPECT_EQ(float_to_bfloat16_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bfloat16_bits(NAN) & 0x7fc0, 0x7fc0);
  EXPECT_EQ(bfloat16_bits_to_float(0x3f80), 1.0f);
}

// The tool binary, built with the tests (the ASan job builds only this test
// binary: there alone the test is skipped).
TEST(ReloadCkptTool, GenerateInspectVerifyConvert) {
  const std::string tool = std::string(TPRELOAD_BINARY_DIR) + "/reload_ckpt";
  ASSERT_EQ(::access(tool.c_str(), X_OK), 0) << tool << " is not built";
  TempDir dir;
  test::write_file(dir / "config.json", kConfig);
  auto run = [&](const std::string& args) {
    return std::system((tool + " " + args + " > " + (dir / "out.txt") + " 2>&1").c_str());
  };
  ASSERT_EQ(run("generate --config " + (dir / "config.json") + " --out " + (dir / "g") +
                " --shards 2 --seed 5 --with-inv-freq --extra foo.bar:2x3"),
            0)
      << test::read_file(dir / "out.txt");
  ASSERT_EQ(run("verify " + (dir / "g") + " --read-data"), 0);
  EXPECT_EQ(test::read_file(dir / "out.txt").rfind("OK: ", 0), 0u);
  ASSERT_EQ(run("inspect " + (dir / "g")), 0);
  const std::string listing = test::read_file(dir / "out.txt");
  EXPECT_NE(listing.find("model.layers.2.self_attn.rotary_emb.inv_freq\tfloat32\t[4]\t16"),
            std::string::npos);
  EXPECT_NE(listing.find("foo.bar\tbfloat16\t[2, 3]\t12"), std::string::npos);
  ASSERT_EQ(run("convert " + (dir / "g") + " " + (dir / "c.h5")), 0);
  ASSERT_EQ(run("convert " + (dir / "c.h5") + " " + (dir / "c.safetensors")), 0);
  EXPECT_TRUE(all_bytes(*open_weight_source(dir / "c.safetensors")) ==
              all_bytes(*open_weight_source(dir / "g")));
  test::write_file(dir / "bad.safetensors", "abc");
  EXPECT_NE(run("verify " + (dir / "bad.safetensors")), 0);
  EXPECT_EQ(test::read_file(dir / "out.txt"),
            "reload_ckpt: error: safetensors file '" + (dir / "bad.safetensors") +
                "': file is 3 bytes, too small for the 8-byte header length\n");
}

}  // namespace
}  // namespace tpreload
