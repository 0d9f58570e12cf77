// Config keys as Hugging Face writes them, the Qwen3 and Qwen3-MoE families, and
// the errors a wrong config gets.
#include <gtest/gtest.h>

#include "tpreload/core/error.h"
#include "tpreload/model/config.h"
#include "tpreload/model/sharding.h"

namespace tpreload {
namespace {

std::string error_of(const std::string& json) {
  try {
    parse_model_config(json, "config.json");
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

const char* const kMoe = R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":2048,
  "intermediate_size":6144,"num_hidden_layers":4,"num_attention_heads":32,"num_key_value_heads":4,
  "head_dim":128,"vocab_size":151936,"num_experts":128,"num_experts_per_tok":8,
  "moe_intermediate_size":768,"decoder_sparse_step":2,"mlp_only_layers":[3],"norm_topk_prob":true,
  "tie_word_embeddings":false,"dtype":"bfloat16"})";

TEST(Config, Qwen3MoeKeysAsHuggingFaceWritesThem) {
  const ModelConfig c = parse_model_config(kMoe, "config.json");
  EXPECT_EQ(c.head_dim, 128) << "head_dim from the config, not hidden / heads (64)";
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.dtype, DType::kBFloat16) << "'dtype' as newer transformers write it";
  // decoder_sparse_step 2: layers 1 and 3 would be sparse, but 3 is mlp-only.
  EXPECT_FALSE(c.sparse_layer(0));
  EXPECT_TRUE(c.sparse_layer(1));
  EXPECT_FALSE(c.sparse_layer(2));
  EXPECT_FALSE(c.sparse_layer(3));
  std::size_t experts = 0, dense_mlp = 0;
  for (const auto& s : checkpoint_tensor_specs(c)) {
    experts += s.name.find(".mlp.experts.") != std::string::npos;
    dense_mlp += s.name.find(".mlp.gate_proj.") != std::string::npos;
  }
  EXPECT_EQ(experts, 128u * 3) << "one sparse layer";
  EXPECT_EQ(dense_mlp, 3u) << "three dense layers";
  // The config survives a round trip through its own JSON.
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_EQ(back.mlp_only_layers, c.mlp_only_layers);
  EXPECT_EQ(back.decoder_sparse_step, 2);
  EXPECT_EQ(back.num_experts, 128);
}

TEST(Config, WrongConfigsNameTheirField) {
  EXPECT_NE(
      error_of(R"({"architectures":["GPT2LMHeadModel"]})")
          .find("architecture 'GPT2LMHeadModel' is not supported (supported: LlamaForCausalLM, "
                "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM)"),
      std::string::npos);
  std::string moe = kMoe;
  const auto at = moe.find("\"mlp_only_layers\":[3]");
  EXPECT_NE(
      error_of(moe.replace(at, 21, "\"mlp_only_layers\":[9]")).find("'mlp_only_layers' holds 9"),
      std::string::npos);
  moe = kMoe;
  EXPECT_NE(error_of(moe.replace(moe.find("\"num_experts\":128"), 17, "\"num_experts\":4"))
                .find("num_experts_per_tok 8 exceeds num_experts 4"),
            std::string::npos);
  moe = kMoe;  // a field no one reads, nested too deep to print
  const std::string deep =
      error_of(moe.replace(moe.find("\"norm_topk_prob\""), 0,
                           "\"x\":" + std::string(100'000, '[') + std::string(100'000, ']') + ","));
  EXPECT_EQ(deep.rfind("config.json: not valid JSON: ", 0), 0u) << deep;
  EXPECT_NE(deep.find("nested deeper than 64 levels"), std::string::npos) << deep;
  moe = kMoe;
  EXPECT_NE(error_of(moe.replace(moe.find("\"dtype\":\"bfloat16\""), 18, "\"dtype\":\"int8\""))
                .find("dtype 'int8' is not a floating type"),
            std::string::npos);
}

TEST(Config, ExpertLayoutsAreCheckedForTheTpSize) {
  const ModelConfig c = parse_model_config(kMoe, "config.json");
  EXPECT_NO_THROW(ShardingRules(c, 4, "", true));   // 128 experts / 4
  EXPECT_NO_THROW(ShardingRules(c, 4, "", false));  // 768 / 4
  std::string twelve = kMoe;
  twelve.replace(twelve.find("\"num_experts\":128"), 17, "\"num_experts\":12");
  try {
    ShardingRules(parse_model_config(twelve, "config.json"), 8, "", true);
    FAIL() << "12 experts split 8 ways";
  } catch (const ModelError& e) {
    EXPECT_NE(
        std::string(e.what()).find("num_experts (expert parallelism places whole experts) 12 is "
                                   "not divisible by 8"),
        std::string::npos)
        << e.what();
  }
  const ModelConfig dense =
      parse_model_config(R"({"architectures":["Qwen3ForCausalLM"],"hidden_size":64,
    "intermediate_size":96,"num_hidden_layers":1,"num_attention_heads":4,"vocab_size":10})",
                         "dense");
  EXPECT_THROW(ShardingRules(dense, 1, "", true), ModelError);
  const ShardingRules ep(c, 4, "", true);
  EXPECT_EQ(ep.local_experts(), 32);
  EXPECT_EQ(ep.local_moe_intermediate(), 768);
  const ParamSpec* w13 = ep.find_param("model.layers.1.mlp.experts.w13_weight");
  ASSERT_NE(w13, nullptr);
  EXPECT_EQ(w13->shape, (std::vector<std::int64_t>{32, 2 * 768, 2048}));
  EXPECT_EQ(w13->shards, 64u);
}

}  // namespace
}  // namespace tpreload
