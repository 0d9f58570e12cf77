// DeepSeek-V2 and V3 (and Kimi-K2, whose config names DeepseekV3ForCausalLM):
// the released config.json files read as vLLM's deepseek_v2.py reads them, the
// checkpoint layout (multi-head latent attention, dense layers, routed and
// shared experts, block-FP8 scales) and the parameters at tp 8. Every expected
// shape is computed here from the config's numbers.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tpreload/core/error.h"
#include "tpreload/model/config.h"
#include "tpreload/model/sharding.h"

namespace tpreload {
namespace {

using Shape = std::vector<std::int64_t>;

// DeepSeek-V3's config.json as released (deepseek-ai/DeepSeek-V3).
const std::string kV3 = R"({"architectures":["DeepseekV3ForCausalLM"],"attention_bias":false,
  "attention_dropout":0.0,"aux_loss_alpha":0.001,"bos_token_id":0,"eos_token_id":1,"ep_size":1,
  "first_k_dense_replace":3,"hidden_act":"silu","hidden_size":7168,"initializer_range":0.02,
  "intermediate_size":18432,"kv_lora_rank":512,"max_position_embeddings":163840,
  "model_type":"deepseek_v3","moe_intermediate_size":2048,"moe_layer_freq":1,"n_group":8,
  "n_routed_experts":256,"n_shared_experts":1,"norm_topk_prob":true,"num_attention_heads":128,
  "num_experts_per_tok":8,"num_hidden_layers":61,"num_key_value_heads":128,
  "num_nextn_predict_layers":1,"pretraining_tp":1,"q_lora_rank":1536,"qk_nope_head_dim":128,
  "qk_rope_head_dim":64,"quantization_config":{"activation_scheme":"dynamic","fmt":"e4m3",
  "quant_method":"fp8","weight_block_size":[128,128]},"rms_norm_eps":1e-06,
  "rope_scaling":{"beta_fast":32,"beta_slow":1,"factor":40,"mscale":1.0,"mscale_all_dim":1.0,
  "original_max_position_embeddings":4096,"type":"yarn"},"rope_theta":10000,
  "routed_scaling_factor":2.5,"scoring_func":"sigmoid","seq_aux":true,"tie_word_embeddings":false,
  "topk_group":4,"topk_method":"noaux_tc","torch_dtype":"bfloat16","transformers_version":"4.33.1",
  "use_cache":true,"v_head_dim":128,"vocab_size":129280})";

// Kimi-K2-Instruct's (moonshotai): DeepSeek-V3's architecture, 384 experts in
// one group, one dense layer.
const std::string kKimiK2 = R"({"architectures":["DeepseekV3ForCausalLM"],
  "attention_bias":false,"bos_token_id":163584,"eos_token_id":163585,"first_k_dense_replace":1,
  "hidden_act":"silu","hidden_size":7168,"intermediate_size":18432,"kv_lora_rank":512,
  "max_position_embeddings":131072,"model_type":"kimi_k2","moe_intermediate_size":2048,
  "moe_layer_freq":1,"n_group":1,"n_routed_experts":384,"n_shared_experts":1,
  "norm_topk_prob":true,"num_attention_heads":64,"num_experts_per_tok":8,
  "num_hidden_layers":61,"num_key_value_heads":64,"num_nextn_predict_layers":0,
  "q_lora_rank":1536,"qk_nope_head_dim":128,"qk_rope_head_dim":64,
  "quantization_config":{"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8",
  "weight_block_size":[128,128]},"rms_norm_eps":1e-06,"rope_scaling":{"beta_fast":1.0,
  "beta_slow":1.0,"factor":32.0,"mscale":1.0,"mscale_all_dim":1.0,
  "original_max_position_embeddings":4096,"type":"yarn"},"rope_theta":50000.0,
  "routed_scaling_factor":2.827,"scoring_func":"sigmoid","tie_word_embeddings":false,
  "topk_group":1,"topk_method":"noaux_tc","torch_dtype":"bfloat16","v_head_dim":128,
  "vocab_size":163840})";

// DeepSeek-V2-Lite's (deepseek-ai/DeepSeek-V2-Lite): no q_lora_rank, greedy
// softmax routing without a score correction.
const std::string kV2Lite = R"({"architectures":["DeepseekV2ForCausalLM"],
  "attention_bias":false,"first_k_dense_replace":1,"hidden_act":"silu","hidden_size":2048,
  "intermediate_size":10944,"kv_lora_rank":512,"max_position_embeddings":163840,
  "model_type":"deepseek_v2","moe_intermediate_size":1408,"moe_layer_freq":1,"n_group":1,
  "n_routed_experts":64,"n_shared_experts":2,"norm_topk_prob":false,"num_attention_heads":16,
  "num_experts_per_tok":6,"num_hidden_layers":27,"num_key_value_heads":16,"q_lora_rank":null,
  "qk_nope_head_dim":128,"qk_rope_head_dim":64,"rms_norm_eps":1e-06,"rope_scaling":{
  "beta_fast":32,"beta_slow":1,"factor":40,"mscale":0.707,"mscale_all_dim":0.707,
  "original_max_position_embeddings":4096,"type":"yarn"},"rope_theta":10000,
  "routed_scaling_factor":1.0,"scoring_func":"softmax","tie_word_embeddings":false,
  "topk_group":1,"topk_method":"greedy","torch_dtype":"bfloat16","v_head_dim":128,
  "vocab_size":102400})";

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("no '" + from + "' in the config");
  return text.replace(at, from.size(), to);
}

std::map<std::string, Shape> layout_of(const ModelConfig& c) {
  std::map<std::string, Shape> out;
  for (const CheckpointTensorSpec& spec : checkpoint_tensor_specs(c)) out[spec.name] = spec.shape;
  return out;
}

ParamSpec param(const ShardingRules& rules, const std::string& name) {
  const ParamSpec* p = rules.find_param(name);
  if (!p) throw std::runtime_error("no parameter " + name);
  return *p;
}

std::int64_t blocks(std::int64_t n) {
  return (n + 127) / 128;
}

TEST(DeepSeek, V3AsReleased) {
  const ModelConfig c = parse_model_config(kV3, "config.json");
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.head_dim, 128 + 64);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.shared_experts_intermediate_size, 2048);
  EXPECT_TRUE(c.score_correction);
  EXPECT_FALSE(c.float32_router);
  EXPECT_TRUE(c.sigmoid_routing);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c.rope_interleaved);
  EXPECT_TRUE(c.fp8.blocks());
  EXPECT_FALSE(c.sparse_layer(2));
  EXPECT_TRUE(c.sparse_layer(3));
  EXPECT_TRUE(c.sparse_layer(60));

  const std::string a = "model.layers.3.self_attn.";
  auto layout = layout_of(c);
  EXPECT_EQ(layout[a + "q_a_proj.weight"], (Shape{1536, 7168}));
  EXPECT_EQ(layout[a + "q_a_proj.weight_scale_inv"], (Shape{blocks(1536), blocks(7168)}));
  EXPECT_EQ(layout[a + "kv_a_proj_with_mqa.weight"], (Shape{512 + 64, 7168}));
  EXPECT_EQ(layout[a + "kv_a_proj_with_mqa.weight_scale_inv"], (Shape{blocks(576), blocks(7168)}));
  EXPECT_EQ(layout[a + "q_a_layernorm.weight"], (Shape{1536}));
  EXPECT_EQ(layout[a + "q_b_proj.weight"], (Shape{128 * 192, 1536}));
  EXPECT_EQ(layout[a + "kv_a_layernorm.weight"], (Shape{512}));
  EXPECT_EQ(layout[a + "kv_b_proj.weight"], (Shape{128 * (128 + 128), 512}));
  EXPECT_EQ(layout[a + "o_proj.weight"], (Shape{7168, 128 * 128}));
  EXPECT_EQ(layout.count(a + "q_proj.weight"), 0u);
  EXPECT_EQ(layout["model.layers.3.mlp.gate.weight"], (Shape{256, 7168}));
  EXPECT_EQ(layout.count("model.layers.3.mlp.gate.weight_scale_inv"), 0u) << "routers stay";
  EXPECT_EQ(layout["model.layers.3.mlp.gate.e_score_correction_bias"], (Shape{256}));
  EXPECT_EQ(layout["model.layers.3.mlp.experts.255.down_proj.weight_scale_inv"],
            (Shape{blocks(7168), blocks(2048)}));
  EXPECT_EQ(layout["model.layers.3.mlp.shared_experts.gate_proj.weight"], (Shape{2048, 7168}));
  EXPECT_EQ(layout["model.layers.2.mlp.down_proj.weight"], (Shape{7168, 18432}));
  EXPECT_EQ(layout.count("model.layers.2.mlp.gate.weight"), 0u) << "layers 0-2 are dense";
  EXPECT_EQ(layout.count("model.layers.61.self_attn.kv_b_proj.weight"), 0u) << "MTP: not read";
  // (embed, norm, head; a layer's attention: 5 FP8 weights with their scales, 2
  // norms; a dense layer's MLP 3 weights and scales; a sparse layer's router,
  // correction, 256 experts of 3 and the shared experts' 3, each with scales)
  const std::size_t attention = 2 * 5 + 2;
  const std::size_t dense = 2 + attention + 2 * 3, sparse = 2 + attention + 2 + 256 * 3 * 2 + 3 * 2;
  EXPECT_EQ(layout.size(), 3 + 3 * dense + 58 * sparse);

  const ShardingRules rules(c, 8);
  const ParamSpec fused = param(rules, a + "fused_qkv_a_proj.weight");
  EXPECT_EQ(fused.shape, (Shape{1536 + 576, 7168}));
  EXPECT_EQ(fused.dtype, DType::kFloat8E4M3);
  EXPECT_EQ(fused.kind, ShardKind::kReplicated);
  EXPECT_EQ(fused.shards, 2u);
  // (vLLM's grid over the merged rows: ceil((1536 + 576) / 128), not 12 + 5 rows)
  EXPECT_EQ(param(rules, a + "fused_qkv_a_proj.weight_scale_inv").shape,
            (Shape{blocks(1536 + 576), blocks(7168)}));
  EXPECT_EQ(param(rules, a + "q_b_proj.weight").shape, (Shape{128 / 8 * 192, 1536}));
  EXPECT_EQ(param(rules, a + "kv_b_proj.weight").shape, (Shape{128 / 8 * 256, 512}));
  EXPECT_EQ(param(rules, a + "kv_b_proj.weight_scale_inv").shape,
            (Shape{128 / 8 * 256 / 128, 512 / 128}));
  EXPECT_EQ(param(rules, a + "o_proj.weight").shape, (Shape{7168, 128 / 8 * 128}));
  EXPECT_EQ(param(rules, a + "q_a_layernorm.weight").dtype, DType::kBFloat16);
  EXPECT_EQ(param(rules, "model.layers.3.mlp.gate.weight").dtype, DType::kBFloat16);
  EXPECT_EQ(param(rules, "model.layers.3.mlp.gate.e_score_correction_bias").dtype, DType::kFloat32);
  EXPECT_EQ(param(rules, "model.layers.3.mlp.experts.w13_weight").shape,
            (Shape{256, 2 * 2048 / 8, 7168}));
  EXPECT_EQ(param(rules, "model.layers.3.mlp.shared_experts.gate_up_proj.weight").shape,
            (Shape{2 * 2048 / 8, 7168}));
  EXPECT_EQ(rules.find_param(a + "q_a_proj.weight"), nullptr) << "merged into fused_qkv_a_proj";

  // kv_a_proj_with_mqa whole on every rank, after q_a_proj's 1536 rows; its
  // scales after q_a_proj's 12 grid rows; q_b_proj's heads of rank 3.
  for (int rank : {0, 3, 7}) {
    const auto kv_a = rules.place(a + "kv_a_proj_with_mqa.weight", rank);
    ASSERT_TRUE(kv_a);
    EXPECT_EQ(kv_a->param, a + "fused_qkv_a_proj.weight");
    EXPECT_EQ(kv_a->shard, 1u);
    EXPECT_EQ(kv_a->source_dim, -1);
    EXPECT_EQ(kv_a->dest_row, 1536);
    const auto grid = rules.place(a + "kv_a_proj_with_mqa.weight_scale_inv", rank);
    ASSERT_TRUE(grid);
    EXPECT_EQ(grid->param, a + "fused_qkv_a_proj.weight_scale_inv");
    EXPECT_EQ(grid->dest_row, 1536 / 128);
    EXPECT_EQ(grid->slice_shape(), (Shape{blocks(576), blocks(7168)}));
  }
  const auto q_b = rules.place(a + "q_b_proj.weight", 3);
  EXPECT_EQ(q_b->source_dim, 0);
  EXPECT_EQ(q_b->source_start, 3 * 16 * 192);
  EXPECT_EQ(q_b->source_length, 16 * 192);
  const auto o = rules.place(a + "o_proj.weight_scale_inv", 3);
  EXPECT_EQ(o->source_dim, 1);
  EXPECT_EQ(o->source_start, 3 * 16 * 128 / 128);
  EXPECT_EQ(o->source_length, 16 * 128 / 128);

  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
}

TEST(DeepSeek, KimiK2AndV2LiteConfigs) {
  const ModelConfig k = parse_model_config(kKimiK2, "config.json");
  EXPECT_EQ(k.architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(k.num_experts, 384);
  EXPECT_EQ(k.n_group, 1);
  EXPECT_EQ(k.routed_scaling_factor, 2.827);
  EXPECT_FALSE(k.sparse_layer(0));
  EXPECT_TRUE(k.sparse_layer(1));
  const ShardingRules ep(k, 8, "", true);
  EXPECT_EQ(param(ep, "model.layers.1.mlp.experts.w2_weight").shape, (Shape{384 / 8, 7168, 2048}));
  EXPECT_EQ(param(ep, "model.layers.1.self_attn.kv_b_proj.weight").shape,
            (Shape{64 / 8 * 256, 512}));

  const ModelConfig v2 = parse_model_config(kV2Lite, "config.json");
  EXPECT_EQ(v2.q_lora_rank, 0);
  EXPECT_FALSE(v2.score_correction);
  EXPECT_FALSE(v2.sigmoid_routing);
  EXPECT_FALSE(v2.norm_topk_prob);
  EXPECT_FALSE(v2.fp8.quantized());
  const std::string a = "model.layers.1.self_attn.";
  auto layout = layout_of(v2);
  EXPECT_EQ(layout[a + "q_proj.weight"], (Shape{16 * 192, 2048}));
  EXPECT_EQ(layout[a + "kv_a_proj_with_mqa.weight"], (Shape{576, 2048}));
  EXPECT_EQ(layout.count(a + "q_a_proj.weight"), 0u);
  EXPECT_EQ(layout.count("model.layers.1.mlp.gate.e_score_correction_bias"), 0u);
  const ShardingRules rules(v2, 4);
  EXPECT_EQ(param(rules, a + "q_proj.weight").shape, (Shape{16 / 4 * 192, 2048}));
  const ParamSpec kv_a = param(rules, a + "kv_a_proj_with_mqa.weight");
  EXPECT_EQ(kv_a.shape, (Shape{576, 2048}));
  EXPECT_EQ(kv_a.shards, 1u);
  EXPECT_EQ(rules.find_param(a + "fused_qkv_a_proj.weight"), nullptr);
  const ModelConfig back = parse_model_config(model_config_to_json(v2), "round trip");
  EXPECT_TRUE(config_differences(v2, back).empty()) << config_differences(v2, back)[0];

  // moe_layer_freq 2 from layer 1 on: experts on layers 2, 4, ... only.
  const ModelConfig every_second =
      parse_model_config(replaced(kV2Lite, R"("moe_layer_freq":1)", R"("moe_layer_freq":2)"), "c");
  for (std::int64_t l = 0; l < 27; ++l)
    EXPECT_EQ(every_second.sparse_layer(l), l >= 1 && l % 2 == 0) << l;
  const ModelConfig freq_back =
      parse_model_config(model_config_to_json(every_second), "round trip");
  EXPECT_TRUE(config_differences(every_second, freq_back).empty());
}

void expect_refused(const std::string& text, const std::string& what, int tp = 1) {
  try {
    ShardingRules(parse_model_config(text, "config.json"), tp);
    ADD_FAILURE() << "not refused: " << what;
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(DeepSeek, Refusals) {
  expect_refused(replaced(kV3, R"("attention_bias":false)", R"("attention_bias":true)"),
                 "attention_bias true is refused for DeepseekV3ForCausalLM");
  expect_refused(replaced(kV3, R"("topk_method":"noaux_tc")", R"("topk_method":"top2")"),
                 "topk_method 'top2'");
  expect_refused(replaced(kV3, R"("n_group":8)", R"("n_group":6)"),
                 "n_routed_experts 256 is not a multiple of n_group 6");
  expect_refused(replaced(kV3, R"("kv_lora_rank":512,)", ""), "kv_lora_rank");
  // q_a_proj's rows not whole blocks: its scales and kv_a_proj_with_mqa's would
  // not tile the merged grid.
  expect_refused(replaced(kV3, R"("q_lora_rank":1536)", R"("q_lora_rank":1500)"),
                 "the rows of 'model.layers.0.self_attn.q_a_proj.weight' (a part of a merged "
                 "replicated layer) 1500 is not a multiple of the block 128");
  // kv_b_proj's rows per rank: 128 heads of 256 rows split 3 ways is refused by
  // the heads already; 2 heads of 256 split 4 ways are 128 rows: accepted.
  expect_refused(kV3, "num_attention_heads 128 is not divisible by 3", 3);
}

}  // namespace
}  // namespace tpreload
