// Row writes as data: the rows, offsets and pitches one piece of a checkpoint
// tensor lands with, against offsets computed here from the shapes.
#include <gtest/gtest.h>

#include "tpreload/core/error.h"
#include "tpreload/model/config.h"
#include "tpreload/model/row_writes.h"
#include "tpreload/model/sharding.h"

namespace tpreload {
namespace {

ModelConfig config() {
  return parse_model_config(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
    "intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":8,
    "num_key_value_heads":2,"vocab_size":100,"torch_dtype":"bfloat16"})",
                            "test");
}

TEST(RowWrites, ColumnParallelKeepsOnlyThisRanksRows) {
  const ShardingRules rules(config(), 4);
  // up_proj [96, 64] on tp rank 2 of 4: rows [48, 72) land at rows 24.. of gate_up_proj.
  const Placement pl = *rules.place("model.layers.1.mlp.up_proj.weight", 2);
  const std::uint64_t row = 64 * 2;
  // A block of rows [40, 60) starting at byte 1000 of the bucket: rows 48..59 are ours.
  const auto w = checkpoint_row_write(rules, pl, DType::kBFloat16, 40, 20, false, 1000);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->slot, rules.find_slot("model.layers.1.mlp.gate_up_proj.weight"));
  EXPECT_EQ(w->src_offset, 1000 + 8 * row);
  EXPECT_EQ(w->src_pitch, row);
  EXPECT_EQ(w->dest_row, 24 + 0);
  EXPECT_EQ(w->rows, 12);
  EXPECT_EQ(w->kind, WriteKind::kCopy);
  EXPECT_FALSE(checkpoint_row_write(rules, pl, DType::kBFloat16, 0, 48, false, 0))
      << "rows of other ranks";
  // Presliced (scatter): slice rows map one to one.
  const auto s = checkpoint_row_write(rules, pl, DType::kBFloat16, 5, 3, true, 77);
  EXPECT_EQ(*s, (RowWrite{w->slot, WriteKind::kCopy, DType::kBFloat16, 77, row, 24 + 5, 3}));
}

TEST(RowWrites, RowParallelCutsTheColumnWindowWithAPitch) {
  const ShardingRules rules(config(), 4);
  const Placement pl = *rules.place("model.layers.0.self_attn.o_proj.weight", 3);  // [64, 64]
  const auto w = checkpoint_row_write(rules, pl, DType::kBFloat16, 10, 5, false, 256);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->src_offset, 256 + 3 * 16 * 2) << "columns [48, 64) of each row";
  EXPECT_EQ(w->src_pitch, 64 * 2u) << "a whole checkpoint row";
  EXPECT_EQ(w->dest_row, 10);
  EXPECT_EQ(w->rows, 5);
}

TEST(RowWrites, KvHeadsReplicatedPastTheirCountLandAfterQ) {
  const ShardingRules rules(config(), 4);  // 2 KV heads over 4 ranks: ranks 2, 3 hold head 1
  const Placement pl = *rules.place("model.layers.0.self_attn.v_proj.weight", 3);  // [16, 64]
  const auto w = checkpoint_row_write(rules, pl, DType::kBFloat16, 0, 16, false, 0);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->src_offset, 8 * 64 * 2u) << "head 1 starts at row 8";
  EXPECT_EQ(w->rows, 8);
  EXPECT_EQ(w->dest_row, 16 + 8) << "after 2 local q heads (16 rows) and the k head (8 rows)";
}

TEST(RowWrites, VocabPaddingAndInt8) {
  const ShardingRules rules(config(), 2, "int8");
  const Placement emb =
      *rules.place("model.embed_tokens.weight", 1);  // vocab 100 -> 128, 64 per rank
  const auto zero = padding_rows(rules, emb);
  ASSERT_TRUE(zero);
  EXPECT_EQ(zero->row_begin, 100 - 64);
  EXPECT_EQ(zero->row_end, 64);
  EXPECT_FALSE(padding_rows(rules, *rules.place("model.embed_tokens.weight", 0)));
  const Placement down = *rules.place("model.layers.0.mlp.down_proj.weight", 1);
  const auto w = checkpoint_row_write(rules, down, DType::kBFloat16, 0, 64, false, 0);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->kind, WriteKind::kQuantizeInt8);
  const ParamSpec& p = rules.params()[w->slot];
  ASSERT_NE(p.scale_slot, kNoSlot);
  EXPECT_EQ(rules.params()[p.scale_slot].name, "model.layers.0.mlp.down_proj.weight_scale");
}

TEST(RowWrites, SlotsResolveBaseLayerSpellings) {
  const ShardingRules rules(config(), 1);
  const ParamSlot s = rules.find_slot("model.layers.1.self_attn.qkv_proj.weight");
  ASSERT_NE(s, kNoSlot);
  EXPECT_EQ(rules.params()[s].name, "model.layers.1.self_attn.qkv_proj.weight");
  EXPECT_EQ(rules.find_slot("model.layers.1.self_attn.qkv_proj.base_layer.weight"), s);
  EXPECT_EQ(rules.find_slot("model.layers.1.self_attn.nope.weight"), kNoSlot);
  EXPECT_EQ(rules.params()[s].shards, 3u) << "q, k and v";
}

// Newer vLLM nests FusedMoE's parameters one module deeper (RoutedExperts):
// kernel-format tensors so named resolve to the same slots; nothing else does.
TEST(RowWrites, SlotsResolveRoutedExpertSpellings) {
  const ModelConfig moe =
      parse_model_config(R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,
    "intermediate_size":96,"moe_intermediate_size":32,"num_experts":4,"num_experts_per_tok":2,
    "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":10})",
                         "moe");
  const ShardingRules rules(moe, 2);
  for (const std::string leaf : {"w13_weight", "w2_weight"}) {
    const std::string plain = "model.layers.1.mlp.experts." + leaf;
    const std::string routed = "model.layers.1.mlp.experts.routed_experts." + leaf;
    const ParamSlot s = rules.find_slot(plain);
    ASSERT_NE(s, kNoSlot) << plain;
    EXPECT_EQ(rules.params()[s].name, plain);
    EXPECT_EQ(rules.find_slot(routed), s) << routed;
    EXPECT_EQ(with_routed_experts(plain), routed);
    EXPECT_EQ(strip_routed_experts(routed), plain);
  }
  // Only FusedMoE's leaves under ".experts.", and only that spelling.
  EXPECT_EQ(with_routed_experts("model.layers.1.mlp.gate.weight"), "");
  EXPECT_EQ(with_routed_experts("model.layers.1.mlp.experts.gate.weight"), "");
  EXPECT_EQ(strip_routed_experts("model.layers.1.mlp.gate.weight"),
            "model.layers.1.mlp.gate.weight");
  EXPECT_EQ(rules.find_slot("model.layers.1.mlp.routed_experts.w13_weight"), kNoSlot);
  EXPECT_EQ(rules.find_slot("model.layers.1.mlp.experts.routed_experts.gate.weight"), kNoSlot);
  EXPECT_EQ(rules.find_slot("model.layers.1.mlp.experts.routed_experts.routed_experts.w2_weight"),
            kNoSlot);
}

}  // namespace
}  // namespace tpreload
