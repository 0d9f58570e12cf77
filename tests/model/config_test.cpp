// Config keys as Hugging Face writes them, the Qwen3 and Qwen3-MoE families, and
// the errors a wrong config gets.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include "tpreload/core/error.h"
#include "tpreload/model/config.h"
#include "tpreload/model/sharding.h"
#include "tpreload/model/target.h"

namespace tpreload {
namespace {

// `text` with its first `from` replaced by `to` (`from` must be there).
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  if (at == std::string::npos) throw std::invalid_argument("no '" + from + "' in the config");
  return text.replace(at, from.size(), to);
}

// `text` without each of `keys` (each must be there).
std::string without(std::string text, std::initializer_list<const char*> keys) {
  for (const char* key : keys) text = replaced(text, key, "");
  return text;
}

// Each checkpoint tensor's shape, by name.
std::map<std::string, std::vector<std::int64_t>> shapes_of(const ModelConfig& c) {
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& s : checkpoint_tensor_specs(c)) shapes[s.name] = s.shape;
  return shapes;
}

std::string error_of(const std::string& json) {
  try {
    parse_model_config(json, "config.json");
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

// Whether `json` is refused with a ModelError whose message holds `fragment`
// (else the message, or that none came).
::testing::AssertionResult refused(const std::string& json, const std::string& fragment) {
  const std::string error = error_of(json);
  if (error.find(fragment) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected a ModelError holding '" << fragment << "', got "
                                       << (error.empty() ? "none" : "'" + error + "'");
}

const char* const kMoe = R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":2048,
  "intermediate_size":6144,"num_hidden_layers":4,"num_attention_heads":32,"num_key_value_heads":4,
  "head_dim":128,"vocab_size":151936,"num_experts":128,"num_experts_per_tok":8,
  "moe_intermediate_size":768,"decoder_sparse_step":2,"mlp_only_layers":[3],"norm_topk_prob":true,
  "tie_word_embeddings":false,"dtype":"bfloat16"})";

TEST(Config, Qwen3MoeKeysAsHuggingFaceWritesThem) {
  const ModelConfig c = parse_model_config(kMoe, "config.json");
  EXPECT_EQ(c.head_dim, 128) << "head_dim from the config, not hidden / heads (64)";
  EXPECT_EQ(c.qk_norm, QkNorm::kShared);
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

// A model's directory from what names its config: the directory itself, or the
// one holding the config file.
// Every field of ModelConfig but its text, changed alone, is named by
// config_differences, as config.json names it, with both values; and by its
// kWeights half (which the kernel-format shards and the ranks' agreement
// compare) unless only a forward pass reads it.
TEST(Config, EveryFieldChangedAloneIsNamed) {
  const ModelConfig base;
  struct Change {
    std::string difference;
    std::function<void(ModelConfig&)> edit;
  };
  const std::vector<Change> changes = {
      {"architectures '' vs 'LlamaForCausalLM'",
       [](ModelConfig& c) { c.architecture = "LlamaForCausalLM"; }},
      {"hidden_size 0 vs 8", [](ModelConfig& c) { c.hidden_size = 8; }},
      {"intermediate_size 0 vs 8", [](ModelConfig& c) { c.intermediate_size = 8; }},
      {"num_hidden_layers 0 vs 8", [](ModelConfig& c) { c.num_hidden_layers = 8; }},
      {"num_attention_heads 0 vs 8", [](ModelConfig& c) { c.num_attention_heads = 8; }},
      {"num_key_value_heads 0 vs 8", [](ModelConfig& c) { c.num_key_value_heads = 8; }},
      {"head_dim 0 vs 8", [](ModelConfig& c) { c.head_dim = 8; }},
      {"vocab_size 0 vs 8", [](ModelConfig& c) { c.vocab_size = 8; }},
      {"rms_norm_eps 1e-06 vs 1e-05", [](ModelConfig& c) { c.rms_norm_eps = 1e-5; }},
      {"rope_theta 10000.0 vs 500000.0", [](ModelConfig& c) { c.rope_theta = 5e5; }},
      {"rope_scaling 'none' vs '{\"factor\":2.0,\"rope_type\":\"linear\"}'",
       [](ModelConfig& c) { c.rope_scaling.json = R"({"factor":2.0,"rope_type":"linear"})"; }},
      {"partial_rotary_factor 1.0 vs 0.5", [](ModelConfig& c) { c.partial_rotary_factor = 0.5; }},
      {"interleaved rotary false vs true", [](ModelConfig& c) { c.rope_interleaved = true; }},
      {"tie_word_embeddings false vs true", [](ModelConfig& c) { c.tie_word_embeddings = true; }},
      {"hidden_activation 'silu' vs 'gelu'",
       [](ModelConfig& c) { c.activation = Activation::kGelu; }},
      {"Gemma-style normalization false vs true",
       [](ModelConfig& c) { c.gemma_normalization = true; }},
      {"norm layout 'pre-norms' vs 'sandwich'",
       [](ModelConfig& c) { c.norm_layout = NormLayout::kSandwich; }},
      {"norm layout 'pre-norms' vs 'GLM's sandwich'",
       [](ModelConfig& c) { c.norm_layout = NormLayout::kGlm; }},
      {"norm layout 'pre-norms' vs 'post-norms'",
       [](ModelConfig& c) { c.norm_layout = NormLayout::kPost; }},
      {"norm layout 'pre-norms' vs 'parallel'",
       [](ModelConfig& c) { c.norm_layout = NormLayout::kParallel; }},
      {"query_pre_attn_scalar 0.0 vs 256.0", [](ModelConfig& c) { c.query_pre_attn_scalar = 256; }},
      {"attn_logit_softcapping 0.0 vs 50.0", [](ModelConfig& c) { c.attn_logit_softcapping = 50; }},
      {"final_logit_softcapping 0.0 vs 30.0",
       [](ModelConfig& c) { c.final_logit_softcapping = 30; }},
      {"sliding_window 0 vs 4096", [](ModelConfig& c) { c.sliding_window = 4096; }},
      {"sliding_layers [] vs [0,2]",
       [](ModelConfig& c) {
         c.sliding_layers = {0, 2};
       }},
      {"the sliding layers' rope_theta 0.0 vs 10000.0",
       [](ModelConfig& c) { c.sliding_rope_theta = 1e4; }},
      {"the sliding layers' rope scaling 'none' vs '{\"factor\":4.0,\"rope_type\":\"linear\"}'",
       [](ModelConfig& c) {
         c.sliding_rope_scaling.json = R"({"factor":4.0,"rope_type":"linear"})";
       }},
      {"embedding_multiplier 1.0 vs 12.0", [](ModelConfig& c) { c.embedding_multiplier = 12; }},
      {"attention_multiplier 0.0 vs 0.25", [](ModelConfig& c) { c.attention_multiplier = 0.25; }},
      {"residual_multiplier 1.0 vs 0.5", [](ModelConfig& c) { c.residual_multiplier = 0.5; }},
      {"logits_scaling 1.0 vs 8.0", [](ModelConfig& c) { c.logits_scaling = 8; }},
      {"logit_scale 1.0 vs 0.0625", [](ModelConfig& c) { c.logit_scale = 0.0625; }},
      {"mean-centred norms (LayerNorm) false vs true", [](ModelConfig& c) { c.layer_norm = true; }},
      {"full layers without rotary false vs true",
       [](ModelConfig& c) { c.nope_full_layers = true; }},
      {"attention_bias false vs true", [](ModelConfig& c) { c.attention_bias = true; }},
      {"o_proj_bias false vs true", [](ModelConfig& c) { c.o_proj_bias = true; }},
      {"mlp_bias false vs true", [](ModelConfig& c) { c.mlp_bias = true; }},
      {"q/k norms 'none' vs 'one weight for every head'",
       [](ModelConfig& c) { c.qk_norm = QkNorm::kShared; }},
      {"q/k norms 'none' vs 'over the whole projection'",
       [](ModelConfig& c) { c.qk_norm = QkNorm::kWhole; }},
      {"q/k norms 'none' vs 'each head its own weights'",
       [](ModelConfig& c) { c.qk_norm = QkNorm::kPerHead; }},
      {"num_experts 0 vs 8", [](ModelConfig& c) { c.num_experts = 8; }},
      {"num_experts_per_tok 0 vs 2", [](ModelConfig& c) { c.num_experts_per_tok = 2; }},
      {"moe_intermediate_size 0 vs 8", [](ModelConfig& c) { c.moe_intermediate_size = 8; }},
      {"decoder_sparse_step 1 vs 2", [](ModelConfig& c) { c.decoder_sparse_step = 2; }},
      {"mlp_only_layers [] vs [1]", [](ModelConfig& c) { c.mlp_only_layers = {1}; }},
      {"norm_topk_prob false vs true", [](ModelConfig& c) { c.norm_topk_prob = true; }},
      {"shared_expert_intermediate_size 0 vs 8",
       [](ModelConfig& c) { c.shared_expert_intermediate_size = 8; }},
      {"shared_intermediate_size 0 vs 8",
       [](ModelConfig& c) { c.shared_mlp_intermediate_size = 8; }},
      {"first_k_dense_replace 0 vs 3", [](ModelConfig& c) { c.first_k_dense_replace = 3; }},
      {"float32 router false vs true", [](ModelConfig& c) { c.float32_router = true; }},
      {"e_score_correction_bias false vs true", [](ModelConfig& c) { c.score_correction = true; }},
      {"sigmoid routing false vs true", [](ModelConfig& c) { c.sigmoid_routing = true; }},
      {"n_group 1 vs 8", [](ModelConfig& c) { c.n_group = 8; }},
      {"topk_group 1 vs 4", [](ModelConfig& c) { c.topk_group = 4; }},
      {"routed_scaling_factor 1.0 vs 2.5", [](ModelConfig& c) { c.routed_scaling_factor = 2.5; }},
      {"n_shared_experts x moe_intermediate_size 0 vs 1536",
       [](ModelConfig& c) { c.shared_experts_intermediate_size = 1536; }},
      {"q_lora_rank 0 vs 1536", [](ModelConfig& c) { c.q_lora_rank = 1536; }},
      {"kv_lora_rank 0 vs 512", [](ModelConfig& c) { c.kv_lora_rank = 512; }},
      {"qk_nope_head_dim 0 vs 128", [](ModelConfig& c) { c.qk_nope_head_dim = 128; }},
      {"qk_rope_head_dim 0 vs 64", [](ModelConfig& c) { c.qk_rope_head_dim = 64; }},
      {"v_head_dim 0 vs 128", [](ModelConfig& c) { c.v_head_dim = 128; }},
      {"torch_dtype float32 vs bfloat16", [](ModelConfig& c) { c.dtype = DType::kBFloat16; }},
      {"quantization_config 'none' vs 'fp8, weight_block_size [128, 64], ignored [lm_head]'",
       [](ModelConfig& c) {
         c.fp8.block_n = 128;
         c.fp8.block_k = 64;
         c.fp8.ignored = {"lm_head"};
       }},
  };
  // The fields only a forward pass reads: a difference changes no parameter
  // and no byte a checkpoint puts in one, so a reload does not compare them
  // (ConfigFields::kWeights).
  const std::set<std::string> forward_only = {"rms_norm_eps",
                                              "rope_theta",
                                              "rope_scaling",
                                              "partial_rotary_factor",
                                              "interleaved rotary",
                                              "hidden_activation",
                                              "Gemma-style normalization",
                                              "query_pre_attn_scalar",
                                              "attn_logit_softcapping",
                                              "final_logit_softcapping",
                                              "sliding_window",
                                              "sliding_layers",
                                              "the sliding layers' rope_theta",
                                              "the sliding layers' rope scaling",
                                              "embedding_multiplier",
                                              "attention_multiplier",
                                              "residual_multiplier",
                                              "logits_scaling",
                                              "logit_scale",
                                              "mean-centred norms (LayerNorm)",
                                              "full layers without rotary",
                                              "num_experts_per_tok",
                                              "norm_topk_prob",
                                              "sigmoid routing",
                                              "n_group",
                                              "topk_group",
                                              "routed_scaling_factor"};
  std::size_t forward_tried = 0;
  for (const Change& change : changes) {
    ModelConfig changed = base;
    change.edit(changed);
    EXPECT_EQ(config_differences(base, changed), std::vector<std::string>{change.difference});
    const bool forward = std::any_of(forward_only.begin(), forward_only.end(), [&](auto& f) {
      return change.difference.rfind(f + " ", 0) == 0;
    });
    forward_tried += forward;
    EXPECT_EQ(config_differences(base, changed, ConfigFields::kWeights),
              forward ? std::vector<std::string>{} : std::vector<std::string>{change.difference})
        << change.difference;
  }
  EXPECT_EQ(forward_tried, forward_only.size());
  for (const ConfigField& field : config_fields(base))
    EXPECT_TRUE(
        std::any_of(changes.begin(), changes.end(),
                    [&](const Change& c) { return c.difference.rfind(field.name + " ", 0) == 0; }))
        << "'" << field.name << "' is listed but not tried here";
  ModelConfig only_text = base;
  only_text.json = "{}";
  EXPECT_TRUE(config_differences(base, only_text).empty()) << "the text does not count";
}

TEST(Config, TheModelDirectoryOfAConfigPath) {
  const std::string dir = ::testing::TempDir() + "tpreload-model-directory";
  std::filesystem::create_directories(dir);
  EXPECT_EQ(model_directory(dir), dir);
  EXPECT_EQ(model_directory(dir + "/config.json"), dir);
  EXPECT_EQ(model_directory("config.json"), ".");
  EXPECT_EQ(model_directory("/config.json"), "/");
}

// Mixtral-8x7B's config.json (transformers' MixtralConfig; vLLM's mixtral.py):
// num_local_experts experts of intermediate_size in every layer, top-k weights
// always renormalised, experts named block_sparse_moe.experts.<e>.w1/w3/w2, no
// biases whatever attention_bias says, rope_theta 1e6, rms_norm_eps 1e-5 and 8
// key/value heads when absent.
TEST(Config, MixtralKeysAsHuggingFaceWritesThem) {
  const std::string mixtral = R"({"architectures":["MixtralForCausalLM"],"hidden_size":4096,
    "intermediate_size":14336,"num_hidden_layers":3,"num_attention_heads":32,"vocab_size":32000,
    "num_local_experts":8,"num_experts_per_tok":2,"rms_norm_eps":1e-05,"sliding_window":null,
    "router_aux_loss_coef":0.02,"attention_bias":true,"torch_dtype":"bfloat16"})";
  const ModelConfig c = parse_model_config(mixtral, "config.json");
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 14336);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(parse_model_config(replaced(mixtral, R"("rms_norm_eps":1e-05,)", ""), "c").rms_norm_eps,
            1e-5)
      << "MixtralConfig's default";
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  for (std::int64_t l = 0; l < 3; ++l) EXPECT_TRUE(c.sparse_layer(l)) << l;
  std::set<std::string> names;
  for (const auto& s : checkpoint_tensor_specs(c)) names.insert(s.name);
  EXPECT_EQ(names.size(),
            1 + 3 * (6 + 1 + 8 * 3) + 2u);  // (embed; norms, q/k/v/o, router, experts; norm, head)
  for (const char* name : {"model.layers.2.block_sparse_moe.gate.weight",
                           "model.layers.0.block_sparse_moe.experts.7.w1.weight",
                           "model.layers.0.block_sparse_moe.experts.7.w2.weight",
                           "model.layers.1.block_sparse_moe.experts.0.w3.weight", "lm_head.weight"})
    EXPECT_EQ(names.count(name), 1u) << name;
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  const std::string too_many =
      replaced(mixtral, R"("num_experts_per_tok":2)", R"("num_experts_per_tok":9)");
  EXPECT_TRUE(refused(too_many, "num_experts_per_tok 9 exceeds num_local_experts 8"));
}

// Phi-3-medium's config.json (transformers' Phi3Config; vLLM's phi3.py, its
// Llama): q/k/v stacked in self_attn.qkv_proj and gate/up in mlp.gate_up_proj in
// the checkpoint, cut into the parts the loaders take; num_attention_heads KV
// heads and rms_norm_eps 1e-5 when absent; biases only where Llama's keys ask
// (stacked as their weights); partial_rotary_factor as Phi-4-mini writes it, at
// the top level or in rope_parameters (transformers 5), for every family.
TEST(Config, Phi3KeysAsHuggingFaceWritesThem) {
  const std::string phi3 = R"({"architectures":["Phi3ForCausalLM"],"hidden_size":5120,
    "intermediate_size":17920,"num_hidden_layers":2,"num_attention_heads":40,
    "num_key_value_heads":10,"vocab_size":32064,"rms_norm_eps":1e-05,"rope_scaling":null,
    "sliding_window":131072,"original_max_position_embeddings":4096,"torch_dtype":"bfloat16"})";
  const ModelConfig c = parse_model_config(phi3, "config.json");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.attention_bias || c.o_proj_bias || c.mlp_bias || c.qk_norm != QkNorm::kNone);
  EXPECT_EQ(c.partial_rotary_factor, 1);
  const ModelConfig plain = parse_model_config(
      replaced(replaced(phi3, R"("num_key_value_heads":10,)", ""), R"("rms_norm_eps":1e-05,)", ""),
      "c");
  EXPECT_EQ(plain.num_key_value_heads, 40) << "Phi3Config: num_attention_heads when absent";
  EXPECT_EQ(plain.rms_norm_eps, 1e-5) << "Phi3Config's default";
  // Phi-3.5's longrope: the context lengths at the top level join its
  // settings (as vLLM copies them in), so a config that writes them inside
  // reads the same; the factor lists are read as numbers.
  const std::string longrope =
      replaced(replaced(phi3, R"("rope_scaling":null)",
                        R"("rope_scaling":{"type":"longrope","short_factor":[1.0,1.25],)"
                        R"("long_factor":[2,4.5]},"max_position_embeddings":131072)"),
               R"("sliding_window":131072,)", "");
  const ModelConfig lr = parse_model_config(longrope, "c");
  EXPECT_EQ(lr.rope_scaling.type, "longrope");
  EXPECT_EQ(lr.rope_scaling.short_factor, (std::vector<double>{1.0, 1.25}));
  EXPECT_EQ(lr.rope_scaling.long_factor, (std::vector<double>{2.0, 4.5}));
  EXPECT_EQ(lr.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(lr.rope_scaling.max_position_embeddings, 131072);
  EXPECT_EQ(lr.rope_scaling.short_mscale, 0);
  const ModelConfig mscales =
      parse_model_config(replaced(longrope, R"("long_factor":[2,4.5])",
                                  R"("long_factor":[2,4.5],"short_mscale":1.25,"long_mscale":1.5)"),
                         "c");
  EXPECT_EQ(mscales.rope_scaling.short_mscale, 1.25);
  EXPECT_EQ(mscales.rope_scaling.long_mscale, 1.5);
  EXPECT_EQ(parse_model_config(replaced(longrope, R"("type":"longrope")", R"("type":"su")"), "c")
                .rope_scaling.type,
            "longrope")
      << "su is longrope's older name";
  // Given both ways, the context lengths must agree.
  EXPECT_TRUE(refused(replaced(longrope, R"("long_factor":[2,4.5]})",
                               R"("long_factor":[2,4.5],"original_max_position_embeddings":2048})"),
                      "original_max_position_embeddings 4096 and "
                      "rope_scaling.original_max_position_embeddings 2048.0 differ"));
  const ModelConfig inside = parse_model_config(
      replaced(replaced(longrope, R"("long_factor":[2,4.5]})",
                        R"("long_factor":[2,4.5],"original_max_position_embeddings":4096,)"
                        R"("max_position_embeddings":131072})"),
               R"("original_max_position_embeddings":4096,)", ""),
      "c");
  EXPECT_TRUE(config_differences(lr, inside).empty()) << config_differences(lr, inside)[0];
  const ModelConfig lr_back = parse_model_config(model_config_to_json(lr), "round trip");
  EXPECT_TRUE(config_differences(lr, lr_back).empty()) << config_differences(lr, lr_back)[0];
  EXPECT_TRUE(
      refused(replaced(longrope, R"("long_factor":[2,4.5])", R"("long_factor":[2,"x"])"),
              "field 'rope_scaling.long_factor' must be a list of numbers, got [2.0,\"x\"]"));
  // The checkpoint's tensors: stacked; the loaders': Hugging Face's separate ones.
  std::map<std::string, std::vector<std::int64_t>> held, loaded;
  for (const auto& s : checkpoint_tensor_specs(c)) held[s.name] = s.shape;
  for (const auto& s : loader_tensor_specs(c)) loaded[s.name] = s.shape;
  const std::string p = "model.layers.1.";
  EXPECT_EQ(held[p + "self_attn.qkv_proj.weight"],
            (std::vector<std::int64_t>{40 * 128 + 2 * 10 * 128, 5120}));
  EXPECT_EQ(held[p + "mlp.gate_up_proj.weight"], (std::vector<std::int64_t>{2 * 17920, 5120}));
  EXPECT_EQ(held.count(p + "self_attn.q_proj.weight") + held.count(p + "mlp.up_proj.weight"), 0u);
  EXPECT_EQ(held.size(), 1 + 2 * 6 + 2u);  // (embed; norms, qkv, o, gate_up, down; norm, head)
  EXPECT_EQ(loaded[p + "self_attn.k_proj.weight"], (std::vector<std::int64_t>{1280, 5120}));
  EXPECT_EQ(loaded[p + "mlp.up_proj.weight"], (std::vector<std::int64_t>{17920, 5120}));
  EXPECT_EQ(loaded.count(p + "self_attn.qkv_proj.weight"), 0u);
  const auto stacked = stacked_checkpoint_tensors(c);
  ASSERT_EQ(stacked.size(), 4u);  // two per layer
  EXPECT_EQ(stacked[2].name, p + "self_attn.qkv_proj.weight");
  ASSERT_EQ(stacked[2].parts.size(), 3u);
  EXPECT_EQ(stacked[2].parts[0].name, p + "self_attn.q_proj.weight");
  EXPECT_EQ(stacked[2].parts[0].rows, 5120);
  EXPECT_EQ(stacked[2].parts[2].name, p + "self_attn.v_proj.weight");
  EXPECT_EQ(stacked[2].parts[2].rows, 1280);
  EXPECT_EQ(stacked[3].parts[1].name, p + "mlp.up_proj.weight");
  EXPECT_EQ(stacked[3].parts[1].rows, 17920);
  EXPECT_TRUE(stacked_checkpoint_tensors(
                  parse_model_config(replaced(phi3, "Phi3ForCausalLM", "LlamaForCausalLM"), "c"))
                  .empty())
      << "Llama stacks nothing";
  // Biases (Llama's keys): stacked as their weights.
  const ModelConfig biased =
      parse_model_config(replaced(phi3, R"("rope_scaling":null,)",
                                  R"("rope_scaling":null,"attention_bias":true,"mlp_bias":true,)"),
                         "c");
  auto biases = shapes_of(biased);
  EXPECT_EQ(biases[p + "self_attn.qkv_proj.bias"], (std::vector<std::int64_t>{7680}));
  EXPECT_EQ(biases[p + "mlp.gate_up_proj.bias"], (std::vector<std::int64_t>{2 * 17920}));
  EXPECT_EQ(biases[p + "self_attn.o_proj.bias"], (std::vector<std::int64_t>{5120}));
  EXPECT_EQ(biases.count(p + "self_attn.q_proj.bias"), 0u);
  const auto biased_stacks = stacked_checkpoint_tensors(biased);
  ASSERT_EQ(biased_stacks.size(), 8u);  // weights and biases, two layers
  EXPECT_EQ(biased_stacks[1].name, "model.layers.0.self_attn.qkv_proj.bias");
  EXPECT_EQ(biased_stacks[1].parts[1].name, "model.layers.0.self_attn.k_proj.bias");
  EXPECT_EQ(biased_stacks[1].parts[1].rows, 1280);
  // partial_rotary_factor: read, compared and written back; at most 1.
  const std::string partial = replaced(phi3, R"("rope_scaling":null,)",
                                       R"("rope_scaling":null,"partial_rotary_factor":0.75,)");
  const ModelConfig mini = parse_model_config(partial, "c");
  EXPECT_EQ(mini.partial_rotary_factor, 0.75);
  EXPECT_EQ(config_differences(c, mini),
            std::vector<std::string>{"partial_rotary_factor 1.0 vs 0.75"});
  const ModelConfig back = parse_model_config(model_config_to_json(mini), "round trip");
  EXPECT_TRUE(config_differences(mini, back).empty()) << config_differences(mini, back)[0];
  const std::string over = replaced(partial, "0.75", "1.5");
  EXPECT_TRUE(refused(over, "partial_rotary_factor must be at most 1, got 1.5"));
  // In rope_parameters, as transformers 5 writes it: the same setting, and no
  // rope scaling; beside a top-level one, they must agree.
  const std::string nested = replaced(
      phi3, R"("rope_scaling":null,)",
      R"("rope_parameters":{"rope_type":"default","rope_theta":10000.0,"partial_rotary_factor":0.75},)");
  const ModelConfig v5 = parse_model_config(nested, "c");
  EXPECT_TRUE(config_differences(mini, v5).empty()) << config_differences(mini, v5)[0];
  EXPECT_EQ(v5.rope_scaling.json, "");
  const std::string both = replaced(nested, R"("num_hidden_layers":2,)",
                                    R"("num_hidden_layers":2,"partial_rotary_factor":0.5,)");
  EXPECT_TRUE(refused(
      both, "partial_rotary_factor 0.5 and rope_parameters.partial_rotary_factor 0.75 differ"));
  const ModelConfig qwen3 = parse_model_config(
      replaced(replaced(partial, "Phi3ForCausalLM", "Qwen3ForCausalLM"),
               R"("num_key_value_heads":10,)", R"("num_key_value_heads":10,"head_dim":128,)"),
      "c");
  EXPECT_EQ(qwen3.partial_rotary_factor, 0.75) << "every family reads it (vLLM's get_rope)";
}

// Gemma-2B's config.json (16 heads here; transformers' GemmaConfig; vLLM's
// gemma.py): the head
// tied to the embeddings when the key is absent, and required; one KV head;
// tanh-approximated GeLU unless hidden_activation says "gelu" (hidden_act's
// "gelu" is the known mistake vLLM overrides); 16 KV heads and head_dim 256 when
// absent; no biases whatever attention_bias says.
TEST(Config, GemmaKeysAsHuggingFaceWritesThem) {
  const std::string gemma = R"({"architectures":["GemmaForCausalLM"],"hidden_size":2048,
    "intermediate_size":16384,"num_hidden_layers":2,"num_attention_heads":16,
    "num_key_value_heads":1,"head_dim":256,"vocab_size":256000,"hidden_act":"gelu",
    "rms_norm_eps":1e-06,"rope_theta":10000.0,"attention_bias":true,"torch_dtype":"bfloat16"})";
  const ModelConfig c = parse_model_config(gemma, "config.json");
  EXPECT_TRUE(c.tie_word_embeddings) << "GemmaConfig's default";
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
  EXPECT_TRUE(c.gemma_normalization);
  EXPECT_FALSE(c.attention_bias || c.o_proj_bias || c.mlp_bias);
  std::set<std::string> names;
  for (const auto& s : checkpoint_tensor_specs(c)) names.insert(s.name);
  EXPECT_EQ(names.count("lm_head.weight"), 0u);
  EXPECT_EQ(names.size(), 1 + 2 * 9 + 1u);  // (embed; norms, q/k/v/o, gate/up/down; norm)
  const ModelConfig plain =
      parse_model_config(replaced(replaced(gemma, R"("num_key_value_heads":1,"head_dim":256,)", ""),
                                  R"("hidden_act":"gelu",)", R"("hidden_activation":"gelu",)"),
                         "c");
  EXPECT_EQ(plain.num_key_value_heads, 16) << "GemmaConfig's default";
  EXPECT_EQ(plain.head_dim, 256) << "GemmaConfig's default, not 2048 / 16";
  EXPECT_EQ(plain.activation, Activation::kGelu) << "exact GeLU when hidden_activation says so";
  const ModelConfig back = parse_model_config(model_config_to_json(plain), "round trip");
  EXPECT_TRUE(config_differences(plain, back).empty()) << config_differences(plain, back)[0];
  EXPECT_EQ(config_differences(c, back),
            (std::vector<std::string>{"num_key_value_heads 1 vs 16",
                                      "hidden_activation 'gelu_pytorch_tanh' vs 'gelu'"}));
  const std::string untied =
      replaced(gemma, R"("hidden_act")", R"("tie_word_embeddings":false,"hidden_act")");
  EXPECT_TRUE(refused(untied,
                      "GemmaForCausalLM ties its LM head to the embeddings (vLLM "
                      "asserts tie_word_embeddings), but the config sets it false"));
  const std::string silu =
      replaced(gemma, R"("hidden_act")", R"("hidden_activation":"silu","hidden_act")");
  EXPECT_TRUE(refused(silu, "hidden_activation \"silu\" is not one Gemma takes"));
  EXPECT_EQ(
      parse_model_config(replaced(gemma, "GemmaForCausalLM", "LlamaForCausalLM"), "c").activation,
      Activation::kSilu)
      << "only Gemma reads hidden_activation";
}

// Gemma-2-2B's config.json, with another scalar and no attention cap, and three
// layers (transformers' Gemma2Config; vLLM's gemma2.py): the
// pre/post feed-forward norms in the checkpoint; attention scaled by
// query_pre_attn_scalar, soft-capped scores and logits (null: none), sliding
// windows on the layers layer_types marks, the even ones without it; Gemma2Config's
// defaults for absent keys; tanh GeLU only.
TEST(Config, Gemma2KeysAsHuggingFaceWritesThem) {
  const std::string gemma2 = R"({"architectures":["Gemma2ForCausalLM"],"hidden_size":2304,
    "intermediate_size":9216,"num_hidden_layers":3,"num_attention_heads":8,"num_key_value_heads":4,
    "head_dim":256,"vocab_size":256000,"hidden_act":"gelu_pytorch_tanh",
    "hidden_activation":"gelu_pytorch_tanh",
    "query_pre_attn_scalar":224,"attn_logit_softcapping":null,"final_logit_softcapping":30.0,
    "sliding_window":4096,"layer_types":["full_attention","sliding_attention","full_attention"],
    "torch_dtype":"bfloat16"})";
  const ModelConfig c = parse_model_config(gemma2, "config.json");
  EXPECT_TRUE(c.tie_word_embeddings && c.gemma_normalization);
  EXPECT_EQ(c.norm_layout, NormLayout::kSandwich);
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
  EXPECT_EQ(c.query_pre_attn_scalar, 224);
  EXPECT_EQ(c.attn_logit_softcapping, 0) << "null: not capped";
  EXPECT_EQ(c.final_logit_softcapping, 30);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.sliding_layers, std::vector<std::int64_t>{1});
  EXPECT_TRUE(c.sliding_layer(1) && !c.sliding_layer(0) && !c.sliding_layer(2));
  auto shapes = shapes_of(c);
  EXPECT_EQ(shapes["model.layers.2.pre_feedforward_layernorm.weight"],
            std::vector<std::int64_t>{2304});
  EXPECT_EQ(shapes["model.layers.0.post_feedforward_layernorm.weight"],
            std::vector<std::int64_t>{2304});
  EXPECT_EQ(shapes.size(), 1 + 3 * 11 + 1u);  // (embed; 4 norms, q/k/v/o, gate/up/down; norm)
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  // Gemma2Config's defaults: 4 KV heads, head_dim 256, scalar 256, caps 50 and
  // 30, windows of 4096 on the even layers.
  const ModelConfig d = parse_model_config(
      without(
          gemma2,
          {R"("num_key_value_heads":4,)", R"("head_dim":256,)", R"("query_pre_attn_scalar":224,)",
           R"("attn_logit_softcapping":null,"final_logit_softcapping":30.0,)",
           R"("sliding_window":4096,"layer_types":["full_attention","sliding_attention","full_attention"],)"}),
      "c");
  EXPECT_EQ(d.num_key_value_heads, 4);
  EXPECT_EQ(d.head_dim, 256);
  EXPECT_EQ(d.query_pre_attn_scalar, 256);
  EXPECT_EQ(d.attn_logit_softcapping, 50);
  EXPECT_EQ(d.final_logit_softcapping, 30);
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.sliding_layers, (std::vector<std::int64_t>{0, 2}));
  const std::string exact = replaced(gemma2, R"("hidden_activation":"gelu_pytorch_tanh")",
                                     R"("hidden_activation":"gelu")");
  EXPECT_TRUE(refused(exact,
                      "Gemma2ForCausalLM takes hidden_activation gelu_pytorch_tanh "
                      "only, got \"gelu\""));
  const std::string act =
      replaced(gemma2, R"("hidden_act":"gelu_pytorch_tanh")", R"("hidden_act":"gelu")");
  EXPECT_TRUE(refused(act, "Gemma2ForCausalLM takes hidden_act gelu_pytorch_tanh only"));
  const std::string no_scalar =
      replaced(gemma2, R"("query_pre_attn_scalar":224)", R"("query_pre_attn_scalar":null)");
  EXPECT_TRUE(refused(no_scalar, "'query_pre_attn_scalar' must be a positive number, got null"));
  // attention_bias gives q/k/v and o_proj biases (vLLM's Gemma2Attention), none to the MLP.
  const ModelConfig biased =
      parse_model_config(replaced(gemma2, R"("torch_dtype")",
                                  R"("attention_bias":true,"mlp_bias":true,"torch_dtype")"),
                         "c");
  EXPECT_TRUE(biased.attention_bias && biased.o_proj_bias);
  EXPECT_FALSE(biased.mlp_bias) << "Gemma 2 reads attention_bias alone";
  const ModelConfig biased_back = parse_model_config(model_config_to_json(biased), "round trip");
  EXPECT_TRUE(config_differences(biased, biased_back).empty())
      << config_differences(biased, biased_back)[0];
  const std::string short_types = replaced(gemma2, R"(,"full_attention"])", "]");
  EXPECT_TRUE(refused(short_types, "field 'layer_types' must list the 3 layers' attention"));
  const std::string odd_type = replaced(gemma2, R"("sliding_attention")", R"("chunked")");
  EXPECT_TRUE(refused(odd_type, "layer_types[1] is \"chunked\""));
}

// gemma-3-1b's config.json as transformers 4 writes it (Gemma3TextConfig;
// vLLM's gemma3.py), seven layers.
const char* const kGemma3 = R"({"architectures":["Gemma3ForCausalLM"],"hidden_size":1152,
  "intermediate_size":6912,"num_hidden_layers":7,"num_attention_heads":4,"num_key_value_heads":1,
  "head_dim":256,"vocab_size":262144,"hidden_activation":"gelu_pytorch_tanh",
  "query_pre_attn_scalar":256,"rope_theta":1000000,"rope_local_base_freq":10000,
  "rope_scaling":null,"sliding_window":512,"sliding_window_pattern":6,
  "attn_logit_softcapping":null,"final_logit_softcapping":null,"rms_norm_eps":1e-06,
  "torch_dtype":"bfloat16"})";

TEST(Config, Gemma3KeysAsHuggingFaceWritesThem) {
  const ModelConfig c = parse_model_config(kGemma3, "config.json");
  EXPECT_TRUE(c.tie_word_embeddings && c.gemma_normalization);
  EXPECT_EQ(c.qk_norm, QkNorm::kShared);
  EXPECT_EQ(c.norm_layout, NormLayout::kSandwich);
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
  EXPECT_EQ(c.query_pre_attn_scalar, 256);
  EXPECT_EQ(c.attn_logit_softcapping, 0);
  EXPECT_EQ(c.final_logit_softcapping, 0);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.sliding_rope_theta, 1e4);
  EXPECT_TRUE(c.rope_scaling.json.empty() && c.sliding_rope_scaling.json.empty());
  EXPECT_EQ(c.sliding_window, 512);
  // Every layer but each sixth slides: 0-4 and 6, written out.
  EXPECT_EQ(c.sliding_layers, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 6}));
  auto shapes = shapes_of(c);
  EXPECT_EQ(shapes["model.layers.6.self_attn.q_norm.weight"], std::vector<std::int64_t>{256});
  EXPECT_EQ(shapes["model.layers.0.self_attn.k_norm.weight"], std::vector<std::int64_t>{256});
  EXPECT_EQ(shapes["model.layers.3.pre_feedforward_layernorm.weight"],
            std::vector<std::int64_t>{1152});
  EXPECT_EQ(shapes["model.layers.1.self_attn.k_proj.weight"],
            (std::vector<std::int64_t>{256, 1152}));
  // (embed; per layer 4 norms, q/k/v/o, q/k norms, gate/up/down; norm; tied)
  EXPECT_EQ(shapes.size(), 1 + 7 * 13 + 1u);
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];

  // Gemma3TextConfig's defaults: 4 KV heads, head_dim 256, rope_theta 1e6,
  // local base 1e4, windows of 4096 on all but every sixth layer, scalar 256,
  // no soft-capping.
  const ModelConfig d = parse_model_config(
      without(kGemma3, {R"("num_key_value_heads":1,)", R"("head_dim":256,)",
                        R"("query_pre_attn_scalar":256,)",
                        R"("rope_theta":1000000,"rope_local_base_freq":10000,)",
                        R"("sliding_window":512,"sliding_window_pattern":6,)",
                        R"("attn_logit_softcapping":null,"final_logit_softcapping":null,)"}),
      "c");
  EXPECT_EQ(d.num_key_value_heads, 4);
  EXPECT_EQ(d.head_dim, 256);
  EXPECT_EQ(d.rope_theta, 1e6);
  EXPECT_EQ(d.sliding_rope_theta, 1e4);
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.sliding_layers, c.sliding_layers);
  EXPECT_EQ(d.query_pre_attn_scalar, 256);
  EXPECT_EQ(d.attn_logit_softcapping, 0);
  EXPECT_EQ(d.final_logit_softcapping, 0);
  // vLLM's Gemma3Attention caps no scores whatever the config says; the logits
  // it caps where final_logit_softcapping is set.
  const ModelConfig capped = parse_model_config(
      replaced(kGemma3, R"("attn_logit_softcapping":null,"final_logit_softcapping":null)",
               R"("attn_logit_softcapping":50.0,"final_logit_softcapping":30.0)"),
      "c");
  EXPECT_EQ(capped.attn_logit_softcapping, 0);
  EXPECT_EQ(capped.final_logit_softcapping, 30);
  const ModelConfig pattern = parse_model_config(
      replaced(kGemma3, R"("sliding_window_pattern":6)", R"("sliding_window_pattern":3)"), "c");
  EXPECT_EQ(pattern.sliding_layers, (std::vector<std::int64_t>{0, 1, 3, 4, 6}));
  const ModelConfig no_window = parse_model_config(
      replaced(kGemma3, R"("sliding_window":512)", R"("sliding_window":null)"), "c");
  // Without a window every layer attends to all, and the sliding type's
  // layers still turn at their own base (the rotary goes by type).
  EXPECT_EQ(no_window.sliding_layers, c.sliding_layers);
  EXPECT_TRUE(no_window.sliding_type(0) && !no_window.sliding_layer(0));
  const ModelConfig no_window_back =
      parse_model_config(model_config_to_json(no_window), "round trip");
  EXPECT_TRUE(config_differences(no_window, no_window_back).empty())
      << config_differences(no_window, no_window_back)[0];
  // vLLM's Gemma3MLP reads hidden_activation alone.
  EXPECT_EQ(parse_model_config(replaced(kGemma3, R"("hidden_activation")",
                                        R"("hidden_act":"gelu","hidden_activation")"),
                               "c")
                .activation,
            Activation::kGeluTanh);

  // transformers 5 writes the rope per attention type: the same model as
  // transformers 4's keys.
  const std::string scaled = replaced(kGemma3, R"("rope_scaling":null)",
                                      R"("rope_scaling":{"rope_type":"linear","factor":8.0})");
  const std::string v5 =
      replaced(replaced(scaled, R"("rope_theta":1000000,"rope_local_base_freq":10000,)", ""),
               R"("rope_scaling":{"rope_type":"linear","factor":8.0})",
               R"("rope_parameters":{"full_attention":{"rope_type":"linear","factor":8,)"
               R"("rope_theta":1000000.0},"sliding_attention":{"rope_type":"default",)"
               R"("rope_theta":10000.0}})");
  const ModelConfig four = parse_model_config(scaled, "4"), five = parse_model_config(v5, "5");
  EXPECT_EQ(five.rope_scaling.type, "linear");
  EXPECT_EQ(five.rope_scaling.factor, 8);
  EXPECT_EQ(five.sliding_rope_theta, 1e4);
  EXPECT_TRUE(config_differences(four, five).empty()) << config_differences(four, five)[0];
  // A scaled sliding rotary (which transformers 4's keys cannot say) survives
  // the round trip.
  const ModelConfig local_scaled =
      parse_model_config(replaced(v5, R"("sliding_attention":{"rope_type":"default",)",
                                  R"("sliding_attention":{"rope_type":"linear","factor":2,)"),
                         "5");
  EXPECT_EQ(local_scaled.sliding_rope_scaling.type, "linear");
  EXPECT_EQ(local_scaled.sliding_rope_scaling.factor, 2);
  EXPECT_EQ(local_scaled.rope_scaling.factor, 8);
  const ModelConfig local_back =
      parse_model_config(model_config_to_json(local_scaled), "round trip");
  EXPECT_TRUE(config_differences(local_scaled, local_back).empty())
      << config_differences(local_scaled, local_back)[0];
  EXPECT_FALSE(config_differences(five, local_scaled).empty());

  const std::string disagree = replaced(v5, R"("sliding_window":512)",
                                        R"("rope_local_base_freq":5000,"sliding_window":512)");
  EXPECT_TRUE(refused(disagree,
                      "rope_local_base_freq 5000 and "
                      "rope_parameters.sliding_attention.rope_theta 10000.0 differ"));
  const std::string odd_type =
      replaced(v5, R"("sliding_attention":{)", R"("chunked_attention":{},"sliding_attention":{)");
  EXPECT_TRUE(refused(odd_type,
                      "rope_parameters per attention type holds "
                      "'chunked_attention'"));
  const std::string llama = replaced(v5, "Gemma3ForCausalLM", "LlamaForCausalLM");
  EXPECT_TRUE(refused(llama,
                      "is read for Gemma3ForCausalLM, Olmo2ForCausalLM and "
                      "Olmo3ForCausalLM only, not LlamaForCausalLM"));
  const std::string full_theta = replaced(v5, R"("rope_theta":1000000.0})", R"("rope_theta":0})");
  EXPECT_TRUE(refused(full_theta,
                      "'rope_parameters.full_attention.rope_theta' must be a "
                      "positive number"));
  const std::string float_pattern =
      replaced(kGemma3, R"("sliding_window_pattern":6)", R"("sliding_window_pattern":6.0)");
  EXPECT_TRUE(refused(float_pattern, "field 'sliding_window_pattern' must be an integer, got 6.0"));
  // A partial rotary (no Gemma 3 has one; vLLM's versions read it differently).
  const std::string partial =
      replaced(kGemma3, R"("torch_dtype")", R"("partial_rotary_factor":0.5,"torch_dtype")");
  EXPECT_TRUE(refused(partial, "partial_rotary_factor 0.5 is refused for Gemma3ForCausalLM"));
  const std::string partial_local = replaced(
      v5, R"("rope_theta":10000.0})", R"("rope_theta":10000.0,"partial_rotary_factor":0.5})");
  EXPECT_TRUE(refused(partial_local,
                      "rope_parameters.sliding_attention.partial_rotary_factor 0.5 is refused"));
  const std::string exact = replaced(kGemma3, R"("hidden_activation":"gelu_pytorch_tanh")",
                                     R"("hidden_activation":"gelu")");
  EXPECT_TRUE(refused(exact,
                      "Gemma3ForCausalLM takes hidden_activation gelu_pytorch_tanh "
                      "only, got \"gelu\""));
  // attention_bias gives q/k/v and o_proj biases (vLLM's Gemma3Attention).
  const ModelConfig biased = parse_model_config(
      replaced(kGemma3, R"("torch_dtype")", R"("attention_bias":true,"torch_dtype")"), "c");
  EXPECT_TRUE(biased.attention_bias && biased.o_proj_bias && !biased.mlp_bias);
}

// granite-3.1-8b-instruct's config.json (transformers' GraniteConfig; vLLM's
// granite.py), two layers.
const char* const kGranite = R"({"architectures":["GraniteForCausalLM"],"attention_bias":false,
  "attention_dropout":0.0,"attention_multiplier":0.0078125,"embedding_multiplier":12.0,
  "hidden_act":"silu","hidden_size":4096,"intermediate_size":12800,"logits_scaling":16.0,
  "max_position_embeddings":131072,"mlp_bias":false,"model_type":"granite",
  "num_attention_heads":32,"num_hidden_layers":2,"num_key_value_heads":8,
  "residual_multiplier":0.22,"rms_norm_eps":1e-05,"rope_scaling":null,"rope_theta":10000000.0,
  "tie_word_embeddings":true,"torch_dtype":"bfloat16","vocab_size":49155})";

// granite-4.0-micro's config (GraniteMoeHybridForCausalLM, two of its 40
// layers): every layer attention, no experts, the shared MLP the layers' MLP;
// vLLM's granitemoehybrid.py names its parameters shared_mlp.input_linear
// (gate rows, then up rows: a MergedColumnParallelLinear of two parts) and
// output_linear (row-parallel).
TEST(Config, GraniteHybridKeysAsHuggingFaceWritesThem) {
  const std::string micro = R"({"architectures":["GraniteMoeHybridForCausalLM"],
    "attention_bias":false,"attention_dropout":0.0,"attention_multiplier":0.0078125,
    "bos_token_id":100257,"embedding_multiplier":12,"eos_token_id":100257,"hidden_act":"silu",
    "hidden_size":2560,"init_method":"mup","initializer_range":0.1,"intermediate_size":8192,
    "layer_types":["attention","attention"],"logits_scaling":10,"mamba_chunk_size":256,
    "mamba_conv_bias":true,"mamba_d_conv":4,"mamba_d_head":64,"mamba_d_state":256,
    "mamba_expand":2,"mamba_n_groups":1,"mamba_n_heads":128,"mamba_proj_bias":false,
    "max_position_embeddings":131072,"model_type":"granitemoehybrid",
    "normalization_function":"rmsnorm","num_attention_heads":40,"num_experts_per_tok":0,
    "num_hidden_layers":2,"num_key_value_heads":8,"num_local_experts":0,
    "output_router_logits":false,"pad_token_id":100256,"position_embedding_type":"rope",
    "residual_multiplier":0.22,"rms_norm_eps":1e-05,"rope_scaling":null,"rope_theta":10000000,
    "router_aux_loss_coef":0.01,"shared_intermediate_size":8192,"tie_word_embeddings":true,
    "torch_dtype":"bfloat16","use_cache":true,"vocab_size":100352})";
  const ModelConfig c = parse_model_config(micro, "config.json");
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_FALSE(c.sparse_layer(0) || c.sparse_layer(1));
  EXPECT_EQ(c.shared_mlp_intermediate_size, 8192);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_theta, 1e7);
  EXPECT_FALSE(c.nope_full_layers);
  EXPECT_EQ(c.embedding_multiplier, 12.0);
  EXPECT_EQ(c.attention_multiplier, 0.0078125);
  EXPECT_EQ(c.residual_multiplier, 0.22);
  EXPECT_EQ(c.logits_scaling, 10.0);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias || c.o_proj_bias || c.mlp_bias);
  auto held = shapes_of(c);
  EXPECT_EQ(held["model.layers.1.shared_mlp.input_linear.weight"],
            (std::vector<std::int64_t>{2 * 8192, 2560}));
  EXPECT_EQ(held["model.layers.1.shared_mlp.output_linear.weight"],
            (std::vector<std::int64_t>{2560, 8192}));
  // (embed; per layer 2 norms, q/k/v/o, the shared MLP's two; norm; tied)
  EXPECT_EQ(held.size(), 1 + 2 * 8 + 1u);
  EXPECT_EQ(held.count("model.layers.0.mlp.down_proj.weight"), 0u);
  std::map<std::string, std::vector<std::int64_t>> loaded;
  for (const auto& s : loader_tensor_specs(c)) loaded[s.name] = s.shape;
  EXPECT_EQ(loaded["model.layers.0.shared_mlp.gate_proj.weight"],
            (std::vector<std::int64_t>{8192, 2560}));
  EXPECT_EQ(loaded["model.layers.0.shared_mlp.up_proj.weight"],
            (std::vector<std::int64_t>{8192, 2560}));
  EXPECT_EQ(loaded.count("model.layers.0.shared_mlp.input_linear.weight"), 0u);
  // At tp 4: input_linear a quarter of gate's rows then of up's, in two shards;
  // output_linear a quarter of its columns.
  const ShardingRules rules(c, 4);
  std::map<std::string, ParamSpec> params;
  for (const ParamSpec& p : rules.params()) params[p.name] = p;
  const ParamSpec& in = params.at("model.layers.1.shared_mlp.input_linear.weight");
  EXPECT_EQ(in.shape, (std::vector<std::int64_t>{2 * 8192 / 4, 2560}));
  EXPECT_EQ(in.shards, 2u);
  EXPECT_EQ(in.kind, ShardKind::kColumn);
  const ParamSpec& out = params.at("model.layers.1.shared_mlp.output_linear.weight");
  EXPECT_EQ(out.shape, (std::vector<std::int64_t>{2560, 8192 / 4}));
  EXPECT_EQ(out.kind, ShardKind::kRow);
  EXPECT_EQ(params.size(), 1 + 2 * 6 + 1u);  // (qkv_proj, o_proj, two norms, two shared)
  ModelConfig unread = c;  // (intermediate_size, which no layer reads, need not split)
  unread.intermediate_size = 8191;
  EXPECT_NO_THROW(ShardingRules(unread, 4));
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  // attention_bias gives q/k/v's and o_proj's biases; "nope" and null turn no rotary.
  const ModelConfig biased = parse_model_config(
      replaced(micro, R"("attention_bias":false)", R"("attention_bias":true)"), "c");
  EXPECT_TRUE(biased.attention_bias && biased.o_proj_bias && !biased.mlp_bias);
  EXPECT_EQ(shapes_of(biased)["model.layers.0.self_attn.o_proj.bias"],
            (std::vector<std::int64_t>{2560}));
  for (const char* none :
       {R"("position_embedding_type":"nope")", R"("position_embedding_type":null)", ""}) {
    const ModelConfig n = parse_model_config(replaced(micro, R"("position_embedding_type":"rope",)",
                                                      std::string(none) + (*none ? "," : "")),
                                             "c");
    EXPECT_TRUE(n.nope_full_layers) << none;
    const ModelConfig round = parse_model_config(model_config_to_json(n), "round trip");
    EXPECT_TRUE(config_differences(n, round).empty()) << none;
  }
  // With experts: GraniteMoE's stacked tensors beside the shared MLP.
  const ModelConfig moe = parse_model_config(
      replaced(replaced(micro, R"("num_local_experts":0)", R"("num_local_experts":4)"),
               R"("num_experts_per_tok":0)", R"("num_experts_per_tok":2)"),
      "c");
  EXPECT_EQ(moe.num_experts, 4);
  EXPECT_EQ(moe.moe_intermediate_size, 8192);
  EXPECT_TRUE(moe.sparse_layer(1));
  held = shapes_of(moe);
  EXPECT_EQ(held["model.layers.1.block_sparse_moe.input_linear.weight"],
            (std::vector<std::int64_t>{4, 2 * 8192, 2560}));
  EXPECT_EQ(held["model.layers.1.shared_mlp.input_linear.weight"],
            (std::vector<std::int64_t>{2 * 8192, 2560}));
  const ModelConfig moe_back = parse_model_config(model_config_to_json(moe), "round trip");
  EXPECT_TRUE(config_differences(moe, moe_back).empty()) << config_differences(moe, moe_back)[0];
  // Refused: Mamba layers, layer_types missing or short, the counts missing or
  // both 0, another position embedding, another head_dim.
  EXPECT_TRUE(refused(replaced(micro, R"(["attention","attention"])", R"(["attention","mamba"])"),
                      "layer_types[1] is \"mamba\": GraniteMoeHybrid's Mamba layers are not "
                      "supported"));
  EXPECT_TRUE(refused(without(micro, {R"("layer_types":["attention","attention"],)"}),
                      "field 'layer_types' must list the 2 layers of GraniteMoeHybridForCausalLM, "
                      "got nothing"));
  // (layers_block_type: the older key, an alias in GraniteMoeHybridConfig)
  const ModelConfig older =
      parse_model_config(replaced(micro, R"("layer_types":)", R"("layers_block_type":)"), "c");
  EXPECT_TRUE(config_differences(c, older).empty()) << config_differences(c, older)[0];
  EXPECT_TRUE(refused(replaced(micro, R"("layer_types":)",
                               R"("layers_block_type":["attention",)"
                               R"("mamba"],"layer_types":)"),
                      "layer_types [\"attention\",\"attention\"] and layers_block_type "
                      "[\"attention\",\"mamba\"] differ"));
  EXPECT_TRUE(refused(replaced(micro, R"("layer_types":["attention","attention"])",
                               R"("layers_block_type":["mamba","attention"])"),
                      "layers_block_type[0] is \"mamba\""));
  EXPECT_TRUE(refused(replaced(micro, R"(["attention","attention"])", R"(["attention"])"),
                      "field 'layer_types' must list the 2 layers"));
  EXPECT_TRUE(refused(without(micro, {R"("num_local_experts":0,)"}),
                      "field 'num_local_experts' must be a non-negative integer (0 for a model "
                      "without experts), got nothing"));
  EXPECT_TRUE(refused(without(micro, {R"("shared_intermediate_size":8192,)"}),
                      "field 'shared_intermediate_size' must be a non-negative integer"));
  EXPECT_TRUE(refused(
      replaced(micro, R"("shared_intermediate_size":8192)", R"("shared_intermediate_size":0)"),
      "num_local_experts and shared_intermediate_size are both 0"));
  EXPECT_TRUE(refused(replaced(micro, R"("position_embedding_type":"rope")",
                               R"("position_embedding_type":"alibi")"),
                      "position_embedding_type \"alibi\" is not \"rope\", \"nope\" or null"));
  EXPECT_TRUE(
      refused(replaced(micro, R"("hidden_size":2560)", R"("hidden_size":2560,"head_dim":128)"),
              "GraniteMoeHybridForCausalLM takes head_dim as hidden_size / num_attention_heads "
              "(vLLM's granitemoehybrid.py reads no head_dim)"));
}

// GLM-4.5-Air's config.json as Hugging Face writes it (keys of the released
// Glm4MoeConfig), and GLM-4.5's differences: dense layers first, then sparse
// ones with a float32 router and its score correction, shared experts.
TEST(Config, Glm4MoeKeysAsHuggingFaceWritesThem) {
  const std::string air = R"({"architectures":["Glm4MoeForCausalLM"],"attention_bias":true,
    "attention_dropout":0.0,"pad_token_id":151329,"eos_token_id":[151329,151336,151338],
    "head_dim":128,"hidden_act":"silu","hidden_size":4096,"partial_rotary_factor":0.5,
    "initializer_range":0.02,"intermediate_size":10944,"max_position_embeddings":131072,
    "model_type":"glm4_moe","moe_intermediate_size":1408,"norm_topk_prob":true,
    "num_attention_heads":96,"n_group":1,"topk_group":1,"n_routed_experts":128,
    "n_shared_experts":1,"routed_scaling_factor":1.0,"num_experts_per_tok":8,
    "first_k_dense_replace":1,"num_hidden_layers":46,"num_key_value_heads":8,
    "num_nextn_predict_layers":1,"rms_norm_eps":1e-05,"rope_scaling":null,"rope_theta":1000000,
    "tie_word_embeddings":false,"torch_dtype":"bfloat16","transformers_version":"4.54.0",
    "use_cache":true,"use_qk_norm":false,"vocab_size":151552})";
  const ModelConfig c = parse_model_config(air, "config.json");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_EQ(c.shared_experts_intermediate_size, 1 * 1408);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_TRUE(c.sigmoid_routing);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_EQ(c.partial_rotary_factor, 0.5);
  EXPECT_FALSE(c.rope_interleaved) << "vLLM's get_rope turns halves (neox style) for GLM-4.5";
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.sparse_layer(0));
  EXPECT_TRUE(c.sparse_layer(1));
  EXPECT_TRUE(c.sparse_layer(45));
  auto held = shapes_of(c);
  EXPECT_EQ(held["model.layers.0.mlp.gate_proj.weight"], (std::vector<std::int64_t>{10944, 4096}));
  EXPECT_EQ(held.count("model.layers.1.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(held["model.layers.1.mlp.gate.weight"], (std::vector<std::int64_t>{128, 4096}));
  EXPECT_EQ(held["model.layers.1.mlp.gate.e_score_correction_bias"],
            (std::vector<std::int64_t>{128}));
  EXPECT_EQ(held["model.layers.1.mlp.experts.127.down_proj.weight"],
            (std::vector<std::int64_t>{4096, 1408}));
  EXPECT_EQ(held["model.layers.1.mlp.shared_experts.up_proj.weight"],
            (std::vector<std::int64_t>{1408, 4096}));
  EXPECT_EQ(held["model.layers.1.self_attn.q_proj.bias"], (std::vector<std::int64_t>{96 * 128}));
  EXPECT_EQ(held.count("model.layers.1.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(held.count("model.layers.1.self_attn.q_norm.weight"), 0u);
  EXPECT_EQ(held.count("model.layers.46.mlp.gate.weight"), 0u) << "the MTP layer is not read";
  // (embed, norm, head; layer 0: 2 norms, q/k/v/o + 3 biases, 3 MLP; each sparse
  // layer: 2 norms, 7 attention, router and correction, 128 x 3 experts, 3 shared)
  EXPECT_EQ(held.size(), 3 + 12 + 45 * (2 + 7 + 2 + 128 * 3 + 3u));

  // Tensor parallelism at 8: vLLM's parameters, the router and its correction
  // float32 and replicated, the shared experts split as an MLP.
  const ShardingRules rules(c, 8);
  auto param = [&](const std::string& name) {
    const ParamSpec* p = rules.find_param(name);
    if (!p) throw std::runtime_error("no parameter " + name);
    return *p;
  };
  const ParamSpec router = param("model.layers.1.mlp.gate.weight");
  EXPECT_EQ(router.dtype, DType::kFloat32);
  EXPECT_EQ(router.shape, (std::vector<std::int64_t>{128, 4096}));
  const ParamSpec correction = param("model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(correction.dtype, DType::kFloat32);
  EXPECT_EQ(correction.shape, (std::vector<std::int64_t>{128}));
  const ParamSpec shared = param("model.layers.1.mlp.shared_experts.gate_up_proj.weight");
  EXPECT_EQ(shared.dtype, DType::kBFloat16);
  EXPECT_EQ(shared.shape, (std::vector<std::int64_t>{2 * 1408 / 8, 4096}));
  EXPECT_EQ(shared.shards, 2u);
  EXPECT_EQ(param("model.layers.1.mlp.shared_experts.down_proj.weight").shape,
            (std::vector<std::int64_t>{4096, 1408 / 8}));
  EXPECT_EQ(param("model.layers.1.mlp.experts.w13_weight").shape,
            (std::vector<std::int64_t>{128, 2 * 1408 / 8, 4096}));
  EXPECT_EQ(param("model.layers.0.mlp.gate_up_proj.weight").shape,
            (std::vector<std::int64_t>{2 * 10944 / 8, 4096}));
  // (96 / 8 query heads and one of the 8 KV heads, each of 128)
  EXPECT_EQ(param("model.layers.1.self_attn.qkv_proj.bias").shape,
            (std::vector<std::int64_t>{(12 + 2) * 128}));
  const ShardingRules int8(c, 8, "int8");
  EXPECT_EQ(int8.find_param("model.layers.1.mlp.gate.weight")->dtype, DType::kFloat32);
  EXPECT_EQ(int8.find_param("model.layers.1.mlp.shared_experts.down_proj.weight")->dtype,
            DType::kInt8);
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];

  // GLM-4.5: q and k normed per head, three dense layers, weights x 2.5.
  const std::string full =
      replaced(replaced(replaced(air, R"("use_qk_norm":false)", R"("use_qk_norm":true)"),
                        R"("first_k_dense_replace":1)", R"("first_k_dense_replace":3)"),
               R"("routed_scaling_factor":1.0)", R"("routed_scaling_factor":2.5)");
  const ModelConfig g = parse_model_config(full, "config.json");
  EXPECT_EQ(g.qk_norm, QkNorm::kShared);
  EXPECT_EQ(g.routed_scaling_factor, 2.5);
  EXPECT_FALSE(g.sparse_layer(2));
  EXPECT_TRUE(g.sparse_layer(3));
  EXPECT_EQ(shapes_of(g)["model.layers.5.self_attn.k_norm.weight"],
            (std::vector<std::int64_t>{128}));
  const ModelConfig g_back = parse_model_config(model_config_to_json(g), "round trip");
  EXPECT_TRUE(config_differences(g, g_back).empty()) << config_differences(g, g_back)[0];
  // No shared experts: 0 or null.
  for (const char* none : {R"("n_shared_experts":0)", R"("n_shared_experts":null)"}) {
    const ModelConfig n =
        parse_model_config(replaced(air, R"("n_shared_experts":1)", none), "config.json");
    EXPECT_EQ(n.shared_experts_intermediate_size, 0) << none;
    EXPECT_EQ(shapes_of(n).count("model.layers.1.mlp.shared_experts.up_proj.weight"), 0u);
  }
  // Absent: true for norm_topk_prob, 0.5 for partial_rotary_factor.
  const ModelConfig defaults = parse_model_config(
      without(air, {R"("norm_topk_prob":true,)", R"("partial_rotary_factor":0.5,)"}), "c");
  EXPECT_TRUE(defaults.norm_topk_prob);
  EXPECT_EQ(defaults.partial_rotary_factor, 0.5);
  // null norm_topk_prob: false, as Hugging Face's router and vLLM's renormalize read it.
  EXPECT_FALSE(
      parse_model_config(replaced(air, R"("norm_topk_prob":true)", R"("norm_topk_prob":null)"), "c")
          .norm_topk_prob);
  // A checkpoint router of another shape names the parameter's float32.
  const ShardingRules one(c, 1);
  const auto router_place = one.place("model.layers.1.mlp.gate.weight", 0);
  ASSERT_TRUE(router_place);
  const std::string problem =
      checkpoint_tensor_problem(one, 0, *router_place, {127, 4096}, DType::kBFloat16, false);
  EXPECT_NE(problem.find("expected [128, 4096] float32, got [127, 4096] bfloat16"),
            std::string::npos)
      << problem;

  // Refused, by name.
  for (const char* key :
       {R"("n_routed_experts":128,)", R"("first_k_dense_replace":1,)", R"("n_group":1,)",
        R"("topk_group":1,)", R"("n_shared_experts":1,)", R"("routed_scaling_factor":1.0,)"}) {
    const std::string k(key);
    const std::string name = k.substr(1, k.find('"', 1) - 1);
    EXPECT_TRUE(refused(without(air, {key}), "'" + name + "'")) << name;
  }
  // (head_dim even where hidden_size / num_attention_heads would give it)
  EXPECT_TRUE(
      refused(without(replaced(air, R"("num_attention_heads":96)", R"("num_attention_heads":32)"),
                      {R"("head_dim":128,)"}),
              "field 'head_dim' is missing"));
  EXPECT_TRUE(refused(replaced(air, R"("hidden_act":"silu")", R"("hidden_act":"gelu")"),
                      "takes hidden_act silu only"));
  EXPECT_TRUE(refused(replaced(air, R"("n_group":1,)", R"("n_group":3,)"),
                      "n_routed_experts 128 is not a multiple of n_group 3"));
  EXPECT_TRUE(refused(replaced(air, R"("topk_group":1,)", R"("topk_group":2,)"),
                      "topk_group 2 exceeds n_group 1"));
  EXPECT_TRUE(refused(replaced(replaced(air, R"("n_group":1,)", R"("n_group":64,)"),
                               R"("topk_group":1,)", R"("topk_group":3,)"),
                      "num_experts_per_tok 8 exceeds the 6 experts of topk_group 3 groups of 2"));
  EXPECT_TRUE(refused(replaced(air, R"("n_group":1,)", R"("n_group":128,)"),
                      "n_group 128 leaves groups of one expert (128 routed experts)"));
  EXPECT_TRUE(
      refused(replaced(air, R"("tie_word_embeddings":false)", R"("tie_word_embeddings":true)"),
              "tie_word_embeddings true is refused for Glm4MoeForCausalLM"));
  EXPECT_TRUE(refused(replaced(air, R"("n_shared_experts":1,)", R"("n_shared_experts":-1,)"),
                      "'n_shared_experts' must be a non-negative integer"));
}

// What must divide the tensor-parallel size: intermediate_size only where a
// dense MLP reads it, the experts' size only where experts are split (not
// under expert parallelism), each named as the config names it.
TEST(Config, IntermediateSizesMustDivideTpWhereALayerSplitsThem) {
  auto split_error = [](const std::string& json, int tp, bool ep) -> std::string {
    try {
      ShardingRules(parse_model_config(json, "config.json"), tp, "", ep);
    } catch (const ModelError& e) {
      return e.what();
    }
    return "";
  };
  const std::string qwen = R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,
    "intermediate_size":100,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":8,
    "head_dim":8,"vocab_size":128,"num_experts":8,"num_experts_per_tok":2,
    "moe_intermediate_size":16,"mlp_only_layers":[1]})";
  EXPECT_NE(split_error(qwen, 8, false)
                .find("cannot split the model 8 ways: intermediate_size 100 is not divisible by 8"),
            std::string::npos)
      << "layer 1 is dense";
  EXPECT_EQ(split_error(without(qwen, {R"(,"mlp_only_layers":[1])"}), 8, false), "")
      << "every layer sparse: intermediate_size is read by none";
  EXPECT_NE(split_error(replaced(without(qwen, {R"(,"mlp_only_layers":[1])"}),
                                 R"("moe_intermediate_size":16)", R"("moe_intermediate_size":12)"),
                        8, false)
                .find("moe_intermediate_size 12 is not divisible by 8"),
            std::string::npos);
  const std::string mixtral = R"({"architectures":["MixtralForCausalLM"],"hidden_size":64,
    "intermediate_size":36,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":8,
    "vocab_size":128,"num_local_experts":8,"num_experts_per_tok":2})";
  EXPECT_NE(split_error(mixtral, 8, false)
                .find("cannot split the model 8 ways: intermediate_size (the experts') 36 is not "
                      "divisible by 8"),
            std::string::npos);
  EXPECT_EQ(split_error(mixtral, 8, true), "") << "whole experts per rank: their size unsplit";
  const std::string glm = R"({"architectures":["Glm4MoeForCausalLM"],"hidden_size":64,
    "intermediate_size":10,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":8,
    "head_dim":8,"vocab_size":128,"n_routed_experts":8,"num_experts_per_tok":2,
    "moe_intermediate_size":16,"n_shared_experts":1,"first_k_dense_replace":0,"n_group":1,
    "topk_group":1,"routed_scaling_factor":1.0})";
  EXPECT_EQ(split_error(glm, 8, false), "") << "no dense layer";
  EXPECT_NE(
      split_error(replaced(glm, R"("first_k_dense_replace":0)", R"("first_k_dense_replace":1)"), 8,
                  false)
          .find("intermediate_size 10 is not divisible by 8"),
      std::string::npos);
}

// GraniteMoeShared (vLLM's granitemoeshared.py): GraniteMoE's experts and a
// shared MLP of shared_intermediate_size in every layer (0 when absent:
// GraniteMoE's layout); no biases.
TEST(Config, GraniteMoeSharedKeysAsHuggingFaceWritesThem) {
  const std::string shared = R"({"architectures":["GraniteMoeSharedForCausalLM"],
    "attention_bias":false,"attention_multiplier":0.0078125,"embedding_multiplier":12.0,
    "hidden_act":"silu","hidden_size":1024,"intermediate_size":512,"logits_scaling":6.0,
    "model_type":"granitemoeshared","num_attention_heads":16,"num_experts_per_tok":8,
    "num_hidden_layers":2,"num_key_value_heads":8,"num_local_experts":32,
    "residual_multiplier":0.22,"rms_norm_eps":1e-06,"rope_theta":10000,
    "shared_intermediate_size":1536,"tie_word_embeddings":true,"torch_dtype":"bfloat16",
    "vocab_size":49155})";
  const ModelConfig c = parse_model_config(shared, "config.json");
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.moe_intermediate_size, 512);
  EXPECT_EQ(c.shared_mlp_intermediate_size, 1536);
  auto held = shapes_of(c);
  EXPECT_EQ(held["model.layers.0.shared_mlp.input_linear.weight"],
            (std::vector<std::int64_t>{2 * 1536, 1024}));
  EXPECT_EQ(held["model.layers.0.shared_mlp.output_linear.weight"],
            (std::vector<std::int64_t>{1024, 1536}));
  EXPECT_EQ(held["model.layers.0.block_sparse_moe.input_linear.weight"],
            (std::vector<std::int64_t>{32, 2 * 512, 1024}));
  // (embed; per layer 2 norms, q/k/v/o, three stacked experts' tensors, two shared; norm)
  EXPECT_EQ(held.size(), 1 + 2 * 11 + 1u);
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  const ModelConfig plain =
      parse_model_config(without(shared, {R"("shared_intermediate_size":1536,)"}), "c");
  EXPECT_EQ(plain.shared_mlp_intermediate_size, 0);
  EXPECT_EQ(shapes_of(plain).count("model.layers.0.shared_mlp.input_linear.weight"), 0u);
  EXPECT_TRUE(refused(replaced(shared, R"("attention_bias":false)", R"("attention_bias":true)"),
                      "attention_bias true is refused for GraniteMoeSharedForCausalLM"));
  EXPECT_TRUE(refused(
      replaced(shared, R"("shared_intermediate_size":1536)", R"("shared_intermediate_size":null)"),
      "field 'shared_intermediate_size' must be a non-negative integer"));
  ModelConfig odd = c;  // (a shared MLP that 16 ranks cannot split)
  odd.shared_mlp_intermediate_size = 1000;
  EXPECT_NO_THROW(ShardingRules(c, 16));
  try {
    ShardingRules(odd, 16);
    ADD_FAILURE() << "a shared_intermediate_size of 1000 split 16 ways was not refused";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("shared_intermediate_size"), std::string::npos)
        << e.what();
  }
}

// GraniteMoE as granite-3.0-1b-a400m's config writes it (2 of its 24 layers):
// Granite's scaling and Mixtral's experts, which its checkpoint stacks in
// three tensors a layer (the loaders take them as Mixtral's, apart).
TEST(Config, GraniteMoeKeysAsHuggingFaceWritesThem) {
  const std::string moe = R"({"architectures":["GraniteMoeForCausalLM"],"attention_bias":false,
    "attention_dropout":0.1,"attention_multiplier":0.015625,"bos_token_id":0,
    "embedding_multiplier":12.0,"eos_token_id":0,"hidden_act":"silu","hidden_size":1024,
    "initializer_range":0.02,"intermediate_size":512,"logits_scaling":6.0,
    "max_position_embeddings":4096,"model_type":"granitemoe","num_attention_heads":16,
    "num_experts_per_tok":8,"num_hidden_layers":2,"num_key_value_heads":8,
    "num_local_experts":32,"output_router_logits":false,"pad_token_id":0,
    "residual_multiplier":0.22,"rms_norm_eps":1e-06,"rope_scaling":null,"rope_theta":10000,
    "router_aux_loss_coef":0.01,"tie_word_embeddings":true,"torch_dtype":"bfloat16",
    "use_cache":true,"vocab_size":49155})";
  const ModelConfig c = parse_model_config(moe, "config.json");
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 512);
  EXPECT_TRUE(c.norm_topk_prob && c.tie_word_embeddings);
  EXPECT_TRUE(c.sparse_layer(0) && c.sparse_layer(1));
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.embedding_multiplier, 12.0);
  EXPECT_EQ(c.attention_multiplier, 0.015625);
  EXPECT_EQ(c.residual_multiplier, 0.22);
  EXPECT_EQ(c.logits_scaling, 6.0);
  EXPECT_FALSE(c.attention_bias || c.o_proj_bias || c.mlp_bias);
  auto held = shapes_of(c);
  EXPECT_EQ(held["model.layers.1.block_sparse_moe.input_linear.weight"],
            (std::vector<std::int64_t>{32, 1024, 1024}));
  EXPECT_EQ(held["model.layers.1.block_sparse_moe.output_linear.weight"],
            (std::vector<std::int64_t>{32, 1024, 512}));
  EXPECT_EQ(held["model.layers.0.block_sparse_moe.router.layer.weight"],
            (std::vector<std::int64_t>{32, 1024}));
  // (embed; per layer 2 norms, q/k/v/o, the three stacked tensors; norm)
  EXPECT_EQ(held.size(), 1 + 2 * 9 + 1u);
  std::map<std::string, std::vector<std::int64_t>> loaded;
  for (const auto& s : loader_tensor_specs(c)) loaded[s.name] = s.shape;
  EXPECT_EQ(loaded["model.layers.1.block_sparse_moe.experts.31.w1.weight"],
            (std::vector<std::int64_t>{512, 1024}));
  EXPECT_EQ(loaded["model.layers.1.block_sparse_moe.experts.31.w2.weight"],
            (std::vector<std::int64_t>{1024, 512}));
  EXPECT_EQ(loaded["model.layers.0.block_sparse_moe.gate.weight"],
            (std::vector<std::int64_t>{32, 1024}));
  EXPECT_EQ(loaded.count("model.layers.0.block_sparse_moe.input_linear.weight"), 0u);
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  // GraniteMoeConfig's defaults: 8 experts, top 2, KV heads = heads, untied.
  const ModelConfig d = parse_model_config(
      without(moe, {R"("num_experts_per_tok":8,)", R"("num_key_value_heads":8,)",
                    R"("num_local_experts":32,)", R"("tie_word_embeddings":true,)"}),
      "c");
  EXPECT_EQ(d.num_experts, 8);
  EXPECT_EQ(d.num_experts_per_tok, 2);
  EXPECT_EQ(d.num_key_value_heads, 16);
  EXPECT_FALSE(d.tie_word_embeddings);
  EXPECT_TRUE(refused(replaced(moe, R"("attention_bias":false)", R"("attention_bias":true)"),
                      "attention_bias true is refused for GraniteMoeForCausalLM"));
  EXPECT_TRUE(refused(replaced(moe, R"("hidden_act":"silu")", R"("hidden_act":"gelu")"),
                      "GraniteMoeForCausalLM takes hidden_act silu only"));
  EXPECT_TRUE(
      refused(replaced(moe, R"("hidden_size":1024)", R"("hidden_size":1024,"head_dim":128)"),
              "GraniteMoeForCausalLM takes head_dim as hidden_size / num_attention_heads "
              "(vLLM's granitemoe.py reads no head_dim)"));
}

TEST(Config, GraniteKeysAsHuggingFaceWritesThem) {
  const ModelConfig c = parse_model_config(kGranite, "config.json");
  EXPECT_EQ(c.embedding_multiplier, 12);
  EXPECT_EQ(c.attention_multiplier, 0.0078125);
  EXPECT_EQ(c.residual_multiplier, 0.22);
  EXPECT_EQ(c.logits_scaling, 16);
  EXPECT_EQ(c.head_dim, 4096 / 32);
  EXPECT_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias || c.o_proj_bias || c.mlp_bias || c.gemma_normalization);
  EXPECT_EQ(c.activation, Activation::kSilu);
  auto shapes = shapes_of(c);
  EXPECT_EQ(shapes["model.layers.1.self_attn.k_proj.weight"],
            (std::vector<std::int64_t>{8 * 128, 4096}));
  EXPECT_EQ(shapes.size(), 1 + 2 * 9 + 1u);  // (embed; 2 norms, q/k/v/o, gate/up/down; norm)
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  // GraniteConfig's defaults: every multiplier 1 (the attention's scale
  // itself, not head_dim^-1/2), rope_theta 10000.
  const ModelConfig d = parse_model_config(
      without(kGranite, {R"("attention_multiplier":0.0078125,"embedding_multiplier":12.0,)",
                         R"("logits_scaling":16.0,)", R"("residual_multiplier":0.22,)",
                         R"("rope_theta":10000000.0,)"}),
      "c");
  EXPECT_EQ(d.embedding_multiplier, 1);
  EXPECT_EQ(d.attention_multiplier, 1);
  EXPECT_EQ(d.residual_multiplier, 1);
  EXPECT_EQ(d.logits_scaling, 1);
  EXPECT_EQ(d.rope_theta, 1e4);
  // Each multiplier is a difference of its own (kernel-format shards made for
  // other values are refused by it).
  const ModelConfig scaled = parse_model_config(
      replaced(kGranite, R"("logits_scaling":16.0)", R"("logits_scaling":8.0)"), "c");
  EXPECT_EQ(config_differences(c, scaled), std::vector<std::string>{"logits_scaling 16.0 vs 8.0"});
  for (const auto& [name, from, to] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"attention_multiplier", "0.0078125", "0.5"},
           {"embedding_multiplier", "12.0", "2.0"},
           {"residual_multiplier", "0.22", "0.5"}}) {
    const std::string key = "\"" + name + "\":";
    const auto diff =
        config_differences(c, parse_model_config(replaced(kGranite, key + from, key + to), "c"));
    EXPECT_EQ(diff, std::vector<std::string>{name + " " + from + " vs " + to});
  }
  // attention_bias or bias gives q/k/v and o_proj biases (no qkv_bias is read,
  // as vLLM's GraniteAttention reads none); mlp_bias the MLP's.
  const ModelConfig biased = parse_model_config(
      replaced(replaced(kGranite, R"("attention_bias":false)", R"("bias":true,"qkv_bias":false)"),
               R"("mlp_bias":false)", R"("mlp_bias":true)"),
      "c");
  EXPECT_TRUE(biased.attention_bias && biased.o_proj_bias && biased.mlp_bias);
  const ModelConfig biased_back = parse_model_config(model_config_to_json(biased), "round trip");
  EXPECT_TRUE(config_differences(biased, biased_back).empty())
      << config_differences(biased, biased_back)[0];
  const std::string gelu = replaced(kGranite, R"("hidden_act":"silu")", R"("hidden_act":"gelu")");
  EXPECT_TRUE(refused(gelu, "GraniteForCausalLM takes hidden_act silu only, got \"gelu\""));
  const std::string null =
      replaced(kGranite, R"("residual_multiplier":0.22)", R"("residual_multiplier":null)");
  EXPECT_TRUE(refused(null, "field 'residual_multiplier' must be a positive number, got null"));
  const std::string zero = replaced(kGranite, R"("logits_scaling":16.0)", R"("logits_scaling":0)");
  EXPECT_TRUE(refused(zero, "field 'logits_scaling' must be a positive number, got 0"));
}

// OLMo-2-1124-7B's config.json (transformers' Olmo2Config; vLLM's olmo2.py),
// two layers.
const char* const kOlmo2 = R"({"architectures":["Olmo2ForCausalLM"],"attention_bias":false,
  "attention_dropout":0.0,"hidden_act":"silu","hidden_size":4096,"intermediate_size":11008,
  "max_position_embeddings":4096,"model_type":"olmo2","num_attention_heads":32,
  "num_hidden_layers":2,"num_key_value_heads":32,"rms_norm_eps":1e-06,"rope_scaling":null,
  "rope_theta":500000,"tie_word_embeddings":false,"torch_dtype":"float32","vocab_size":100352})";

// GLM-4-9B-0414's config.json, cut to 2 layers (Glm4Config; vLLM's glm4.py):
// q/k/v biases, gate/up stacked in the checkpoint (q/k/v apart), four norms a
// layer under GLM's names, rotary on interleaved pairs over half of each head.
TEST(Config, Glm4KeysAsHuggingFaceWritesThem) {
  const std::string glm4 = R"({"architectures":["Glm4ForCausalLM"],"attention_bias":true,
    "attention_dropout":0.0,"eos_token_id":[151329,151336,151338],"head_dim":128,
    "hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,"intermediate_size":13696,
    "max_position_embeddings":32768,"model_type":"glm4","num_attention_heads":32,
    "num_hidden_layers":2,"num_key_value_heads":2,"pad_token_id":151329,
    "partial_rotary_factor":0.5,"rms_norm_eps":1e-05,"rope_theta":10000.0,
    "tie_word_embeddings":false,"torch_dtype":"bfloat16","use_cache":true,"vocab_size":151552})";
  const ModelConfig c = parse_model_config(glm4, "config.json");
  EXPECT_TRUE(c.attention_bias && c.rope_interleaved);
  EXPECT_EQ(c.norm_layout, NormLayout::kGlm);
  EXPECT_FALSE(c.o_proj_bias || c.mlp_bias || c.qk_norm != QkNorm::kNone || c.gemma_normalization ||
               c.tie_word_embeddings);
  EXPECT_EQ(c.partial_rotary_factor, 0.5);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  std::map<std::string, std::vector<std::int64_t>> held, loaded;
  for (const auto& s : checkpoint_tensor_specs(c)) held[s.name] = s.shape;
  for (const auto& s : loader_tensor_specs(c)) loaded[s.name] = s.shape;
  const std::string p = "model.layers.1.";
  EXPECT_EQ(held[p + "mlp.gate_up_proj.weight"], (std::vector<std::int64_t>{2 * 13696, 4096}));
  EXPECT_EQ(held[p + "self_attn.q_proj.bias"], std::vector<std::int64_t>{32 * 128});
  EXPECT_EQ(held[p + "self_attn.k_proj.weight"], (std::vector<std::int64_t>{2 * 128, 4096}));
  for (const char* norm : {"input_layernorm", "post_self_attn_layernorm",
                           "post_attention_layernorm", "post_mlp_layernorm"})
    EXPECT_EQ(held[p + norm + ".weight"], std::vector<std::int64_t>{4096}) << norm;
  EXPECT_EQ(held.count(p + "self_attn.qkv_proj.weight") + held.count(p + "mlp.gate_proj.weight") +
                held.count(p + "pre_feedforward_layernorm.weight") +
                held.count(p + "self_attn.o_proj.bias"),
            0u);
  // (embed; per layer 4 norms, q/k/v weights and biases, o, gate_up, down; norm, head)
  EXPECT_EQ(held.size(), 1 + 2 * (4 + 6 + 1 + 2) + 2u);
  EXPECT_EQ(loaded[p + "mlp.up_proj.weight"], (std::vector<std::int64_t>{13696, 4096}));
  EXPECT_EQ(loaded.count(p + "mlp.gate_up_proj.weight"), 0u);
  const auto stacked = stacked_checkpoint_tensors(c);
  ASSERT_EQ(stacked.size(), 2u);  // gate/up alone, one per layer
  EXPECT_EQ(stacked[1].name, p + "mlp.gate_up_proj.weight");
  ASSERT_EQ(stacked[1].parts.size(), 2u);
  EXPECT_EQ(stacked[1].parts[0].name, p + "mlp.gate_proj.weight");
  EXPECT_EQ(stacked[1].parts[1].rows, 13696);
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  // Glm4Config's defaults: KV heads 2, head_dim 128, rms_norm_eps 1.5625e-7,
  // q/k/v biases, half of each head turned.
  const ModelConfig d = parse_model_config(
      without(glm4, {R"("attention_bias":true,)", R"("head_dim":128,)",
                     R"("num_key_value_heads":2,"pad_token_id":151329,)",
                     R"("partial_rotary_factor":0.5,)", R"("rms_norm_eps":1e-05,)"}),
      "c");
  EXPECT_EQ(d.num_key_value_heads, 2);
  EXPECT_EQ(d.head_dim, 128);
  EXPECT_EQ(d.rms_norm_eps, 1.5625e-7);
  EXPECT_TRUE(d.attention_bias);
  EXPECT_EQ(d.partial_rotary_factor, 0.5);
  // A whole-head rotary (set, against the default) survives the round trip.
  const ModelConfig whole = parse_model_config(
      replaced(glm4, R"("partial_rotary_factor":0.5)", R"("partial_rotary_factor":1.0)"), "c");
  EXPECT_EQ(whole.partial_rotary_factor, 1);
  const ModelConfig whole_back = parse_model_config(model_config_to_json(whole), "round trip");
  EXPECT_TRUE(config_differences(whole, whole_back).empty())
      << config_differences(whole, whole_back)[0];
  const ModelConfig plain = parse_model_config(
      replaced(glm4, R"("attention_bias":true)", R"("attention_bias":false)"), "c");
  EXPECT_FALSE(plain.attention_bias);
  const ModelConfig plain_back = parse_model_config(model_config_to_json(plain), "round trip");
  EXPECT_FALSE(plain_back.attention_bias) << "false written, not left to the default";
  EXPECT_TRUE(refused(replaced(glm4, R"("hidden_act":"silu")", R"("hidden_act":"gelu")"),
                      "Glm4ForCausalLM takes hidden_act silu only, got \"gelu\""));
}

// ERNIE-4.5-0.3B-PT's config.json, cut to 2 layers (Ernie4_5Config; vLLM's
// ernie45.py): Llama's tensors without biases, tied, rotary on interleaved
// pairs over whole heads.
TEST(Config, Ernie45KeysAsHuggingFaceWritesThem) {
  const std::string ernie = R"({"architectures":["Ernie4_5ForCausalLM"],"bos_token_id":1,
    "eos_token_id":2,"hidden_act":"silu","hidden_size":1024,"intermediate_size":3072,
    "max_position_embeddings":131072,"model_type":"ernie4_5","num_attention_heads":16,
    "num_key_value_heads":2,"head_dim":128,"num_hidden_layers":2,"pad_token_id":0,
    "rms_norm_eps":1e-05,"use_cache":false,"vocab_size":103424,"rope_theta":500000,
    "use_bias":false,"tie_word_embeddings":true,"torch_dtype":"bfloat16"})";
  const ModelConfig c = parse_model_config(ernie, "config.json");
  EXPECT_TRUE(c.rope_interleaved && c.tie_word_embeddings);
  EXPECT_EQ(c.norm_layout, NormLayout::kPre);
  EXPECT_FALSE(c.attention_bias || c.o_proj_bias || c.mlp_bias || c.qk_norm != QkNorm::kNone ||
               c.gemma_normalization);
  EXPECT_EQ(c.partial_rotary_factor, 1);
  EXPECT_EQ(c.rope_theta, 500000);
  auto held = shapes_of(c);
  EXPECT_EQ(held["model.layers.1.self_attn.q_proj.weight"],
            (std::vector<std::int64_t>{16 * 128, 1024}));
  EXPECT_EQ(held["model.layers.1.mlp.up_proj.weight"], (std::vector<std::int64_t>{3072, 1024}));
  EXPECT_EQ(held.count("lm_head.weight"), 0u);
  // (embed; per layer 2 norms, q/k/v/o, gate/up/down; norm)
  EXPECT_EQ(held.size(), 1 + 2 * 9 + 1u);
  EXPECT_TRUE(stacked_checkpoint_tensors(c).empty());
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  // Ernie4_5Config's defaults: tied, 2 KV heads, head_dim 128, rope_theta
  // 500000, rms_norm_eps 1e-5.
  const ModelConfig d = parse_model_config(
      without(ernie, {R"("num_key_value_heads":2,"head_dim":128,)", R"("rms_norm_eps":1e-05,)",
                      R"("rope_theta":500000,)", R"("tie_word_embeddings":true,)"}),
      "c");
  EXPECT_EQ(d.num_key_value_heads, 2);
  EXPECT_EQ(d.head_dim, 128);
  EXPECT_EQ(d.rope_theta, 500000);
  EXPECT_EQ(d.rms_norm_eps, 1e-5);
  EXPECT_TRUE(d.tie_word_embeddings);
  const ModelConfig untied = parse_model_config(
      replaced(ernie, R"("tie_word_embeddings":true)", R"("tie_word_embeddings":false)"), "c");
  const ModelConfig untied_back = parse_model_config(model_config_to_json(untied), "round trip");
  EXPECT_FALSE(untied_back.tie_word_embeddings) << "false written, not left to the default";
  // A logit_scale, which vLLM's LlamaForCausalLM multiplies the logits by.
  const ModelConfig scaled = parse_model_config(
      replaced(ernie, R"("use_bias":false)", R"("use_bias":false,"logit_scale":0.5)"), "c");
  EXPECT_EQ(scaled.logit_scale, 0.5);
  EXPECT_EQ(c.logit_scale, 1);
  const ModelConfig scaled_back = parse_model_config(model_config_to_json(scaled), "round trip");
  EXPECT_TRUE(config_differences(scaled, scaled_back).empty())
      << config_differences(scaled, scaled_back)[0];
  EXPECT_TRUE(refused(replaced(ernie, R"("use_bias":false)", R"("use_bias":true)"),
                      "use_bias true is refused for Ernie4_5ForCausalLM"));
  EXPECT_TRUE(refused(replaced(ernie, R"("hidden_act":"silu")", R"("hidden_act":"relu")"),
                      "Ernie4_5ForCausalLM takes hidden_act silu only, got \"relu\""));
}

// c4ai-command-r-v01's config.json, cut to 2 layers (CohereConfig; vLLM's
// commandr.py): Llama's tensors but one norm a layer and no lm_head, the
// LayerNorm's epsilon in layer_norm_eps, logit_scale, interleaved rotary.
TEST(Config, CohereKeysAsHuggingFaceWritesThem) {
  const std::string cohere = R"({"architectures":["CohereForCausalLM"],"attention_bias":false,
    "attention_dropout":0.0,"bos_token_id":5,"eos_token_id":255001,"hidden_act":"silu",
    "hidden_size":8192,"initializer_range":0.02,"intermediate_size":22528,
    "layer_norm_eps":1e-05,"logit_scale":0.0625,"max_position_embeddings":8192,
    "model_type":"cohere","num_attention_heads":64,"num_hidden_layers":2,
    "num_key_value_heads":64,"pad_token_id":0,"rope_theta":8000000.0,"torch_dtype":"float16",
    "use_cache":true,"use_qk_norm":false,"vocab_size":256000})";
  const ModelConfig c = parse_model_config(cohere, "config.json");
  EXPECT_TRUE(c.layer_norm && c.rope_interleaved && c.tie_word_embeddings);
  EXPECT_EQ(c.norm_layout, NormLayout::kParallel);
  EXPECT_FALSE(c.attention_bias || c.o_proj_bias || c.mlp_bias || c.qk_norm != QkNorm::kNone);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.logit_scale, 0.0625);
  EXPECT_EQ(c.rope_theta, 8e6);
  auto held = shapes_of(c);
  EXPECT_EQ(held["model.layers.1.input_layernorm.weight"], std::vector<std::int64_t>{8192});
  EXPECT_EQ(
      held.count("model.layers.1.post_attention_layernorm.weight") + held.count("lm_head.weight"),
      0u);
  // (embed; per layer 1 norm, q/k/v/o, gate/up/down; norm)
  EXPECT_EQ(held.size(), 1 + 2 * 8 + 1u);
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  // CohereConfig's defaults: KV heads = heads, layer_norm_eps 1e-5,
  // logit_scale 0.0625, tied; rope_theta transformers 4's 10000. An
  // rms_norm_eps is not Cohere's key.
  const ModelConfig d = parse_model_config(
      replaced(without(cohere, {R"("layer_norm_eps":1e-05,"logit_scale":0.0625,)",
                                R"("num_key_value_heads":64,)", R"("rope_theta":8000000.0,)"}),
               R"("hidden_act")", R"("rms_norm_eps":0.5,"hidden_act")"),
      "c");
  EXPECT_EQ(d.num_key_value_heads, 64);
  EXPECT_EQ(d.rms_norm_eps, 1e-5);
  EXPECT_EQ(d.logit_scale, 0.0625);
  EXPECT_EQ(d.rope_theta, 1e4);
  EXPECT_TRUE(d.tie_word_embeddings);
  EXPECT_TRUE(refused(replaced(cohere, R"("logit_scale":0.0625)", R"("logit_scale":null)"),
                      "field 'logit_scale' must be a positive number, got null"));
  EXPECT_TRUE(
      refused(replaced(cohere, R"("use_cache")", R"("tie_word_embeddings":false,"use_cache")"),
              "CohereForCausalLM computes its logits with the embeddings"));
  EXPECT_TRUE(refused(replaced(cohere, R"("attention_bias":false)", R"("attention_bias":true)"),
                      "attention_bias true is refused for CohereForCausalLM"));
  // Command R+ (use_qk_norm): q and k normed per head, each head by its own
  // weights, [heads, head_dim] and [KV heads, head_dim].
  const ModelConfig plus = parse_model_config(
      replaced(replaced(cohere, R"("use_qk_norm":false)", R"("use_qk_norm":true)"),
               R"("num_key_value_heads":64)", R"("num_key_value_heads":8)"),
      "config.json");
  EXPECT_EQ(plus.qk_norm, QkNorm::kPerHead);
  auto plus_held = shapes_of(plus);
  EXPECT_EQ(plus_held["model.layers.1.self_attn.q_norm.weight"],
            (std::vector<std::int64_t>{64, 128}));
  EXPECT_EQ(plus_held["model.layers.1.self_attn.k_norm.weight"],
            (std::vector<std::int64_t>{8, 128}));
  EXPECT_EQ(plus_held.size(), 1 + 2 * 10 + 1u);  // (and q/k norms a layer)
  const ModelConfig plus_back = parse_model_config(model_config_to_json(plus), "round trip");
  EXPECT_TRUE(config_differences(plus, plus_back).empty())
      << config_differences(plus, plus_back)[0];
  EXPECT_TRUE(
      refused(replaced(cohere, R"("hidden_size":8192)", R"("hidden_size":8192,"head_dim":64)"),
              "CohereForCausalLM takes head_dim as hidden_size / num_attention_heads "
              "(vLLM's commandr.py reads no head_dim)"));
}

// c4ai-command-r7b-12-2024's config.json, cut to 4 layers (Cohere2Config;
// vLLM's commandr.py): Cohere's keys plus windows on all but every
// sliding_window_pattern-th layer, whose full layers turn no rotary.
TEST(Config, Cohere2KeysAsHuggingFaceWritesThem) {
  const std::string cohere2 = R"({"architectures":["Cohere2ForCausalLM"],"attention_bias":false,
    "attention_dropout":0.0,"bos_token_id":5,"eos_token_id":255001,"head_dim":128,
    "hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,"intermediate_size":14336,
    "layer_norm_eps":1e-05,"logit_scale":0.25,"max_position_embeddings":8192,
    "model_type":"cohere2","num_attention_heads":32,"num_hidden_layers":4,
    "num_key_value_heads":8,"pad_token_id":0,"rope_theta":50000,"sliding_window":4096,
    "sliding_window_pattern":4,"torch_dtype":"bfloat16","use_cache":true,"vocab_size":256000,
    "order_of_interleaved_layers":"local_attn_first","position_embedding_type":"rope_gptj",
    "rotary_pct":1.0,"use_embedding_sharing":true,"use_gated_activation":true})";
  const ModelConfig c = parse_model_config(cohere2, "config.json");
  EXPECT_EQ(c.norm_layout, NormLayout::kParallel);
  EXPECT_TRUE(c.layer_norm && c.rope_interleaved && c.nope_full_layers && c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.sliding_layers, (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(c.logit_scale, 0.25);
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  // Cohere2Config's defaults: windows of 4096, pattern 4; layer_types first.
  const ModelConfig d = parse_model_config(
      without(cohere2, {R"("sliding_window":4096,)", R"("sliding_window_pattern":4,)"}), "c");
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.sliding_layers, (std::vector<std::int64_t>{0, 1, 2}));
  const ModelConfig typed = parse_model_config(
      replaced(cohere2, R"("sliding_window_pattern":4,)",
               R"("layer_types":["full_attention","sliding_attention","full_attention",)"
               R"("sliding_attention"],)"),
      "c");
  EXPECT_EQ(typed.sliding_layers, (std::vector<std::int64_t>{1, 3}));
  // (the pattern is not read beside layer_types, as Cohere2Config reads it)
  const ModelConfig typed_null = parse_model_config(
      replaced(cohere2, R"("sliding_window_pattern":4,)",
               R"("sliding_window_pattern":null,"layer_types":["sliding_attention",)"
               R"("sliding_attention","sliding_attention","full_attention"],)"),
      "c");
  EXPECT_EQ(typed_null.sliding_layers, (std::vector<std::int64_t>{0, 1, 2}));
  // (Cohere2Config has no use_qk_norm and Hugging Face's Cohere2Attention no
  // q/k norms, where vLLM's commandr.py would apply them)
  EXPECT_TRUE(refused(replaced(cohere2, R"("use_cache")", R"("use_qk_norm":true,"use_cache")"),
                      "use_qk_norm true is refused for Cohere2ForCausalLM"));
  EXPECT_TRUE(refused(replaced(cohere2, R"("sliding_window":4096)", R"("sliding_window":null)"),
                      "Cohere2ForCausalLM takes a positive 'sliding_window', got null"));
  auto held = shapes_of(c);
  EXPECT_EQ(held.size(), 1 + 4 * 8 + 1u);  // (embed; per layer 1 norm, q/k/v/o, gate/up/down; norm)
}

// EXAONE 4 as its 32B's config writes it (4 of its 64 layers), and the 1.2B's
// form without windows.
TEST(Config, Exaone4KeysAsHuggingFaceWritesThem) {
  const std::string exaone4 = R"({"architectures":["Exaone4ForCausalLM"],"attention_dropout":0.0,
    "bos_token_id":1,"eos_token_id":361,"head_dim":128,"hidden_act":"silu","hidden_size":5120,
    "initializer_range":0.02,"intermediate_size":27392,"max_position_embeddings":131072,
    "model_type":"exaone4","num_attention_heads":40,"num_hidden_layers":4,
    "num_key_value_heads":8,"pad_token_id":0,"rms_norm_eps":1e-05,
    "rope_scaling":{"factor":16.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
    "original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":1000000,
    "sliding_window":4096,"sliding_window_pattern":"LLLG","layer_types":["sliding_attention",
    "sliding_attention","sliding_attention","full_attention"],"tie_word_embeddings":false,
    "torch_dtype":"bfloat16","use_cache":true,"vocab_size":102400})";
  const ModelConfig c = parse_model_config(exaone4, "config.json");
  EXPECT_EQ(c.norm_layout, NormLayout::kPost);
  EXPECT_EQ(c.qk_norm, QkNorm::kShared);
  EXPECT_TRUE(c.nope_full_layers);
  EXPECT_FALSE(c.tie_word_embeddings || c.attention_bias || c.o_proj_bias || c.mlp_bias ||
               c.layer_norm || c.rope_interleaved || c.gemma_normalization);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.sliding_layers, (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(c.logit_scale, 1);
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  auto shapes = shapes_of(c);
  // (embed; per layer 2 norms, q/k/v/o, q/k norms, gate/up/down; norm; head)
  EXPECT_EQ(shapes.size(), 1 + 4 * 11 + 2u);
  EXPECT_EQ(shapes.count("model.layers.0.input_layernorm.weight"), 0u);
  EXPECT_EQ(shapes["model.layers.3.self_attn.q_norm.weight"], std::vector<std::int64_t>{128});
  EXPECT_EQ(shapes["model.layers.3.self_attn.k_norm.weight"], std::vector<std::int64_t>{128});
  EXPECT_EQ(shapes["model.layers.0.self_attn.q_proj.weight"],
            (std::vector<std::int64_t>{40 * 128, 5120}));
  EXPECT_EQ(shapes["model.layers.2.post_feedforward_layernorm.weight"],
            std::vector<std::int64_t>{5120});

  // Exaone4Config's defaults: windows of 4096 on all but every fourth layer
  // (the pattern an integer there), 32 KV heads, rms_norm_eps 1e-5, untied.
  const std::string bare = R"({"architectures":["Exaone4ForCausalLM"],"hidden_size":256,
    "intermediate_size":512,"num_hidden_layers":8,"num_attention_heads":32,"vocab_size":1000,
    "rope_theta":1000000})";
  const ModelConfig d = parse_model_config(bare, "c");
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.sliding_layers, (std::vector<std::int64_t>{0, 1, 2, 4, 5, 6}));
  EXPECT_TRUE(d.nope_full_layers);
  EXPECT_EQ(d.num_key_value_heads, 32);
  EXPECT_EQ(d.head_dim, 8);
  EXPECT_EQ(d.rms_norm_eps, 1e-5);
  EXPECT_FALSE(d.tie_word_embeddings);
  const ModelConfig pattern2 = parse_model_config(
      replaced(bare, R"("rope_theta")", R"("sliding_window_pattern":2,"rope_theta")"), "c");
  EXPECT_EQ(pattern2.sliding_layers, (std::vector<std::int64_t>{0, 2, 4, 6}));
  // transformers 5's rope_parameters
  const ModelConfig five = parse_model_config(
      replaced(bare, R"("rope_theta":1000000)",
               R"("rope_parameters":{"rope_type":"default","rope_theta":500000.0})"),
      "c");
  EXPECT_EQ(five.rope_theta, 5e5);

  // The 1.2B's form: a null window, every layer full and turning rotary; tied.
  const std::string small = R"({"architectures":["Exaone4ForCausalLM"],"hidden_size":2048,
    "intermediate_size":4096,"num_hidden_layers":2,"num_attention_heads":32,
    "num_key_value_heads":8,"head_dim":64,"vocab_size":102400,"rope_theta":1000000.0,
    "sliding_window":null,"sliding_window_pattern":null,"layer_types":["full_attention",
    "full_attention"],"tie_word_embeddings":true,"torch_dtype":"bfloat16"})";
  const ModelConfig s = parse_model_config(small, "config.json");
  EXPECT_TRUE(s.sliding_layers.empty());
  EXPECT_EQ(s.sliding_window, 0);
  EXPECT_FALSE(s.nope_full_layers);
  EXPECT_TRUE(s.tie_word_embeddings);
  const ModelConfig s_back = parse_model_config(model_config_to_json(s), "round trip");
  EXPECT_TRUE(config_differences(s, s_back).empty()) << config_differences(s, s_back)[0];
  EXPECT_TRUE(refused(without(small, {R"("layer_types":["full_attention",
    "full_attention"],)"}),
                      "Exaone4ForCausalLM with a null sliding_window needs 'layer_types'"));

  // Where the references would serve other logits, or a key cannot be read.
  EXPECT_TRUE(refused(without(bare, {R"(,
    "rope_theta":1000000)"}),
                      "Exaone4ForCausalLM needs 'rope_theta' (Hugging Face's Exaone4Config takes "
                      "10000 where it is absent, vLLM 1000000)"));
  for (const char* key : {"attention_bias", "bias", "mlp_bias"})
    EXPECT_TRUE(refused(
        replaced(bare, R"("rope_theta")", std::string("\"") + key + "\":true,\"rope_theta\""),
        std::string(key) + " true is refused for Exaone4ForCausalLM"))
        << key;
  EXPECT_TRUE(refused(replaced(bare, R"("rope_theta")", R"("logit_scale":2.0,"rope_theta")"),
                      "logit_scale 2.0 is refused for Exaone4ForCausalLM (vLLM's model reads "
                      "it, Hugging Face's does not)"));
  EXPECT_TRUE(refused(replaced(bare, R"("rope_theta")", R"("hidden_act":"gelu","rope_theta")"),
                      "Exaone4ForCausalLM takes hidden_act silu only"));
  EXPECT_TRUE(refused(
      replaced(bare, R"("rope_theta")", R"("sliding_window_pattern":"LLLG","rope_theta")"),
      "Exaone4ForCausalLM reads sliding_window_pattern \"LLLG\" only beside 'layer_types'"));
  EXPECT_TRUE(refused(
      replaced(bare, R"("rope_theta")", R"("sliding_window_pattern":1,"rope_theta")"),
      "Exaone4ForCausalLM has a sliding_window of 4096 but no sliding layer (Hugging Face would "
      "turn no layer's rotary, vLLM every layer's)"));
  EXPECT_TRUE(
      refused(replaced(small, R"("layer_types":["full_attention",)",
                       R"("layer_types":["sliding_attention",)"),
              "Exaone4ForCausalLM has sliding layers in 'layer_types' but a null sliding_window"));
}

TEST(Config, OlmoKeysAsHuggingFaceWritesThem) {
  const ModelConfig c = parse_model_config(kOlmo2, "config.json");
  EXPECT_EQ(c.qk_norm, QkNorm::kWhole);
  EXPECT_EQ(c.norm_layout, NormLayout::kPost);
  EXPECT_FALSE(c.gemma_normalization || c.attention_bias || c.o_proj_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_TRUE(c.sliding_layers.empty());
  EXPECT_EQ(c.sliding_rope_theta, 0);
  auto shapes = shapes_of(c);
  EXPECT_EQ(shapes.count("model.layers.0.input_layernorm.weight"), 0u);
  EXPECT_EQ(shapes.count("model.layers.0.pre_feedforward_layernorm.weight"), 0u);
  EXPECT_EQ(shapes["model.layers.1.self_attn.q_norm.weight"], std::vector<std::int64_t>{32 * 128});
  EXPECT_EQ(shapes["model.layers.1.self_attn.k_norm.weight"], std::vector<std::int64_t>{32 * 128});
  EXPECT_EQ(shapes["model.layers.0.post_feedforward_layernorm.weight"],
            std::vector<std::int64_t>{4096});
  // (embed; per layer 2 norms, q/k/v/o, q/k norms, gate/up/down; norm; head)
  EXPECT_EQ(shapes.size(), 1 + 2 * 11 + 2u);
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  // Olmo2Config's defaults: KV heads = heads, rms_norm_eps 1e-5, rope_theta 1e4.
  const ModelConfig d =
      parse_model_config(without(kOlmo2, {R"("num_key_value_heads":32,)",
                                          R"("rms_norm_eps":1e-06,)", R"("rope_theta":500000,)"}),
                         "c");
  EXPECT_EQ(d.num_key_value_heads, 32);
  EXPECT_EQ(d.rms_norm_eps, 1e-5);
  EXPECT_EQ(d.rope_theta, 1e4);
  // GQA: k_norm spans the KV heads' projection.
  const ModelConfig gqa = parse_model_config(
      replaced(kOlmo2, R"("num_key_value_heads":32)", R"("num_key_value_heads":8)"), "c");
  auto gqa_shapes = shapes_of(gqa);
  EXPECT_EQ(gqa_shapes["model.layers.0.self_attn.k_norm.weight"],
            std::vector<std::int64_t>{8 * 128});
  const std::string head_dim =
      replaced(kOlmo2, R"("hidden_size":4096)", R"("hidden_size":4096,"head_dim":64)");
  EXPECT_TRUE(refused(head_dim,
                      "Olmo2ForCausalLM takes head_dim as hidden_size / "
                      "num_attention_heads"));

  // OLMo 3 (Olmo3Config's defaults): windows of 4096 on all but every fourth
  // layer, whose rotary is rope_theta's unscaled; rope_scaling for the full
  // layers alone.
  std::string olmo3 = replaced(replaced(kOlmo2, "Olmo2ForCausalLM", "Olmo3ForCausalLM"),
                               R"("num_hidden_layers":2)", R"("num_hidden_layers":8)");
  olmo3 = replaced(olmo3, R"("rope_scaling":null)",
                   R"("rope_scaling":{"rope_type":"yarn","factor":8.0,)"
                   R"("original_max_position_embeddings":8192})");
  const ModelConfig three = parse_model_config(olmo3, "c");
  EXPECT_EQ(three.sliding_window, 4096);
  EXPECT_EQ(three.sliding_layers, (std::vector<std::int64_t>{0, 1, 2, 4, 5, 6}));
  EXPECT_EQ(three.sliding_rope_theta, 500000);
  EXPECT_TRUE(three.sliding_rope_scaling.json.empty());
  EXPECT_EQ(three.rope_scaling.type, "yarn");
  EXPECT_EQ(three.qk_norm, QkNorm::kWhole);
  EXPECT_EQ(three.norm_layout, NormLayout::kPost);
  const ModelConfig three_back = parse_model_config(model_config_to_json(three), "round trip");
  EXPECT_TRUE(config_differences(three, three_back).empty())
      << config_differences(three, three_back)[0];
  // transformers 5's rope per attention type: the same model.
  const std::string five = replaced(
      replaced(olmo3, R"("rope_theta":500000,)", ""),
      R"("rope_scaling":{"rope_type":"yarn","factor":8.0,"original_max_position_embeddings":8192})",
      R"("rope_parameters":{"full_attention":{"rope_type":"yarn","factor":8,)"
      R"("original_max_position_embeddings":8192,"rope_theta":500000},)"
      R"("sliding_attention":{"rope_type":"default","rope_theta":500000}})");
  const ModelConfig three_five = parse_model_config(five, "5");
  EXPECT_TRUE(config_differences(three, three_five).empty())
      << config_differences(three, three_five)[0];
  // A sliding base apart from the full one survives the round trip.
  const ModelConfig apart =
      parse_model_config(replaced(five, R"("rope_type":"default","rope_theta":500000)",
                                  R"("rope_type":"default","rope_theta":10000)"),
                         "5");
  EXPECT_EQ(apart.sliding_rope_theta, 1e4);
  const ModelConfig apart_back = parse_model_config(model_config_to_json(apart), "round trip");
  EXPECT_TRUE(config_differences(apart, apart_back).empty())
      << config_differences(apart, apart_back)[0];
  // An OLMo 2 config with layer_types slides as vLLM reads it.
  const ModelConfig typed =
      parse_model_config(replaced(kOlmo2, R"("rope_theta":500000,)",
                                  R"("rope_theta":500000,"sliding_window":64,)"
                                  R"("layer_types":["sliding_attention","full_attention"],)"),
                         "c");
  EXPECT_EQ(typed.sliding_window, 64);
  EXPECT_EQ(typed.sliding_layers, std::vector<std::int64_t>{0});
  EXPECT_EQ(typed.sliding_rope_theta, 500000);
  const std::string partial =
      replaced(olmo3, R"("torch_dtype")", R"("partial_rotary_factor":0.5,"torch_dtype")");
  EXPECT_TRUE(refused(partial, "partial_rotary_factor 0.5 is refused for Olmo3ForCausalLM"));
  EXPECT_TRUE(refused(replaced(olmo3, R"("torch_dtype")", R"("sliding_window":null,"torch_dtype")"),
                      "Olmo3ForCausalLM takes a positive 'sliding_window', got null"));
  EXPECT_TRUE(refused(replaced(kOlmo2, R"("rope_theta":500000,)",
                               R"("layer_types":["sliding_attention","full_attention"],)"),
                      "Olmo2ForCausalLM with 'layer_types' needs a 'sliding_window'"));
  EXPECT_TRUE(refused(
      replaced(kOlmo2, R"("rope_theta":500000,)",
               R"("rope_parameters":{"full_attention":{"rope_theta":500000},)"
               R"("sliding_attention":{"rope_theta":10000}},)"),
      "rope_parameters.sliding_attention is given but Olmo2ForCausalLM has no sliding layers"));
}

// Qwen1.5-MoE-A2.7B's config.json (transformers' Qwen2MoeConfig; vLLM's
// qwen2_moe.py): Qwen3-MoE's expert keys plus a shared expert, a dense MLP of
// shared_expert_intermediate_size with a [1, hidden] sigmoid gate, in every
// sparse layer; q/k/v biases always.
TEST(Config, Qwen2MoeKeysAsHuggingFaceWritesThem) {
  const std::string qwen2_moe = R"({"architectures":["Qwen2MoeForCausalLM"],"hidden_size":2048,
    "intermediate_size":5632,"num_hidden_layers":2,"num_attention_heads":16,
    "num_key_value_heads":16,"vocab_size":151936,"num_experts":60,"num_experts_per_tok":4,
    "moe_intermediate_size":1408,"shared_expert_intermediate_size":5632,"decoder_sparse_step":1,
    "mlp_only_layers":[],"norm_topk_prob":false,"rope_theta":1000000.0,"torch_dtype":"bfloat16"})";
  const ModelConfig c = parse_model_config(qwen2_moe, "config.json");
  EXPECT_EQ(c.num_experts, 60);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_EQ(c.shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  auto shapes = shapes_of(c);
  EXPECT_EQ(shapes["model.layers.1.mlp.shared_expert.gate_proj.weight"],
            (std::vector<std::int64_t>{5632, 2048}));
  EXPECT_EQ(shapes["model.layers.1.mlp.shared_expert.down_proj.weight"],
            (std::vector<std::int64_t>{2048, 5632}));
  EXPECT_EQ(shapes["model.layers.0.mlp.shared_expert_gate.weight"],
            (std::vector<std::int64_t>{1, 2048}));
  EXPECT_EQ(shapes["model.layers.0.mlp.experts.59.up_proj.weight"],
            (std::vector<std::int64_t>{1408, 2048}));
  EXPECT_EQ(shapes.count("model.layers.0.self_attn.q_proj.bias"), 1u);
  const ModelConfig back = parse_model_config(model_config_to_json(c), "round trip");
  EXPECT_TRUE(config_differences(c, back).empty()) << config_differences(c, back)[0];
  const std::string zero = replaced(qwen2_moe, R"("shared_expert_intermediate_size":5632,)",
                                    R"("shared_expert_intermediate_size":0,)");
  EXPECT_TRUE(refused(zero, "field 'shared_expert_intermediate_size' must be positive, got 0"));
}

// Expert keys a config leaves out take its config class's defaults, as vLLM
// (which loads the config through it) sees them: MixtralConfig's 8 experts, top
// 2; Qwen3MoeConfig's 128, top 8, of 768; Qwen2MoeConfig's 60, top 4, of 1408,
// and a shared expert of 5632. The count may be spelled num_local_experts
// (transformers 5 maps num_experts onto it); both given, they must agree.
TEST(Config, ExpertKeysTakeTheirConfigClassesDefaults) {
  const std::string head = R"("hidden_size":2048,"intermediate_size":14336,
    "num_hidden_layers":2,"num_attention_heads":16,"num_key_value_heads":4,"vocab_size":50})";
  auto parse = [&](const std::string& arch, const std::string& fields) {
    return parse_model_config(R"({"architectures":[")" + arch + R"("],)" + fields + head, "c");
  };
  const ModelConfig mixtral = parse("MixtralForCausalLM", "");
  EXPECT_EQ(mixtral.num_experts, 8);
  EXPECT_EQ(mixtral.num_experts_per_tok, 2);
  const ModelConfig qwen3 = parse("Qwen3MoeForCausalLM", "");
  EXPECT_EQ(qwen3.num_experts, 128);
  EXPECT_EQ(qwen3.num_experts_per_tok, 8);
  EXPECT_EQ(qwen3.moe_intermediate_size, 768);
  EXPECT_EQ(qwen3.decoder_sparse_step, 1);
  EXPECT_FALSE(qwen3.norm_topk_prob);
  const ModelConfig qwen2 = parse("Qwen2MoeForCausalLM", "");
  EXPECT_EQ(qwen2.num_experts, 60);
  EXPECT_EQ(qwen2.num_experts_per_tok, 4);
  EXPECT_EQ(qwen2.moe_intermediate_size, 1408);
  EXPECT_EQ(qwen2.shared_expert_intermediate_size, 5632);
  EXPECT_EQ(parse("Qwen3MoeForCausalLM", R"("num_local_experts":64,)").num_experts, 64);
  EXPECT_EQ(parse("MixtralForCausalLM", R"("num_experts":4,)").num_experts, 4);
  EXPECT_EQ(parse("Qwen2MoeForCausalLM", R"("num_experts":16,"num_local_experts":16,)").num_experts,
            16);
  const std::string both = R"({"architectures":["Qwen3MoeForCausalLM"],"num_experts":16,)"
                           R"("num_local_experts":32,)" +
                           head;
  EXPECT_TRUE(refused(both, "num_experts 16 and num_local_experts 32 differ"));
}

// Which biases a checkpoint holds, as vLLM reads the config: Llama and Mistral
// (llama.py) take q/k/v and o_proj biases from attention_bias or bias, with
// qkv_bias, when present, deciding q/k/v's, and gate/up/down biases from
// mlp_bias; Qwen2 (qwen2.py) always has q/k/v biases and no others; Qwen3
// (qwen3.py) takes q/k/v's from attention_bias, never o_proj's or the MLP's.
TEST(Config, BiasesAsVllmReadsTheConfig) {
  struct Case {
    const char* arch;
    const char* fields;
    bool qkv, o, mlp;
  };
  for (const Case& c : {
           Case{"LlamaForCausalLM", "", false, false, false},
           Case{"LlamaForCausalLM", R"("attention_bias":true,)", true, true, false},
           Case{"LlamaForCausalLM", R"("bias":true,)", true, true, false},
           Case{"LlamaForCausalLM", R"("bias":true,"qkv_bias":false,)", false, true, false},
           Case{"LlamaForCausalLM", R"("qkv_bias":true,)", true, false, false},
           Case{"LlamaForCausalLM", R"("attention_bias":null,"mlp_bias":true,)", false, false,
                true},
           Case{"MistralForCausalLM", R"("mlp_bias":true,"attention_bias":true,)", true, true,
                true},
           Case{"Qwen2ForCausalLM", R"("attention_bias":false,"mlp_bias":true,)", true, false,
                false},
           Case{"Qwen3ForCausalLM", R"("attention_bias":true,"mlp_bias":true,)", true, false,
                false},
           Case{"Qwen3ForCausalLM", "", false, false, false},
       }) {
    const std::string json = std::string(R"({"architectures":[")") + c.arch + R"("],)" + c.fields +
                             R"("hidden_size":32,"intermediate_size":64,"num_hidden_layers":1,
                             "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":50,
                             "torch_dtype":"bfloat16"})";
    const ModelConfig config = parse_model_config(json, "config.json");
    std::set<std::string> biases, want;
    for (const auto& spec : checkpoint_tensor_specs(config))
      if (spec.name.size() > 5 && spec.name.compare(spec.name.size() - 5, 5, ".bias") == 0)
        biases.insert(spec.name);
    const std::string p = "model.layers.0.";
    if (c.qkv)
      for (const char* x : {"q", "k", "v"}) want.insert(p + "self_attn." + x + "_proj.bias");
    if (c.o) want.insert(p + "self_attn.o_proj.bias");
    if (c.mlp)
      for (const char* x : {"gate", "up", "down"}) want.insert(p + "mlp." + x + "_proj.bias");
    EXPECT_EQ(biases, want) << json;
    // Written back and read again, the same model.
    const auto again = parse_model_config(model_config_to_json(config), "written");
    EXPECT_TRUE(config_differences(config, again).empty()) << json;
  }
  // any true/false field: the same
  EXPECT_TRUE(refused(replaced(kMoe, "\"tie_word_embeddings\":false", "\"tie_word_embeddings\":1"),
                      "config.json: field 'tie_word_embeddings' must be true or false, got 1"));
  EXPECT_TRUE(
      refused(replaced(kMoe, "\"norm_topk_prob\"", "\"attention_bias\":\"yes\",\"norm_topk_prob\""),
              "config.json: field 'attention_bias' must be true or false, got \"yes\""));
}

// Keys a config.json may leave out take the defaults of the Hugging Face config
// classes vLLM reads it through (transformers' configuration_llama.py,
// configuration_mistral.py, configuration_qwen2.py, configuration_qwen3.py,
// configuration_qwen3_moe.py): num_key_value_heads None (= the attention heads)
// for Llama, 8 for Mistral, 32 for Qwen2 and Qwen3, 4 for Qwen3-MoE; head_dim
// 128 for Qwen3, hidden_size / heads elsewhere. A null key means the attention
// heads, or hidden_size / heads.
TEST(Config, AbsentKeysTakeHuggingFaceDefaults) {
  struct Case {
    const char* arch;
    const char* fields;
    std::int64_t kv_heads, head_dim;
  };
  // hidden 2048 over 64 heads: 32 per head where no default says otherwise.
  for (const Case& c : {
           Case{"LlamaForCausalLM", "", 64, 32},
           Case{"MistralForCausalLM", "", 8, 32},
           Case{"Qwen2ForCausalLM", "", 32, 32},
           Case{"Qwen3ForCausalLM", "", 32, 128},
           Case{"Qwen3MoeForCausalLM",
                R"("num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":16,)", 4, 32},
           Case{"Qwen2MoeForCausalLM",
                R"("num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":16,)"
                R"("shared_expert_intermediate_size":32,)",
                16, 32},
           Case{"MistralForCausalLM", R"("num_key_value_heads":null,)", 64, 32},
           Case{"Qwen3ForCausalLM", R"("num_key_value_heads":null,"head_dim":null,)", 64, 32},
           Case{"Qwen3ForCausalLM", R"("num_key_value_heads":16,"head_dim":64,)", 16, 64},
       }) {
    const std::string json = std::string(R"({"architectures":[")") + c.arch + R"("],)" + c.fields +
                             R"("hidden_size":2048,"intermediate_size":64,"num_hidden_layers":1,
                             "num_attention_heads":64,"vocab_size":50})";
    const ModelConfig config = parse_model_config(json, "config.json");
    EXPECT_EQ(config.num_key_value_heads, c.kv_heads) << json;
    EXPECT_EQ(config.head_dim, c.head_dim) << json;
    const ModelConfig again = parse_model_config(model_config_to_json(config), "written");
    EXPECT_EQ(again.num_key_value_heads, c.kv_heads) << "written back: " << json;
    EXPECT_EQ(again.head_dim, c.head_dim) << "written back: " << json;
  }
  // 28 heads (Qwen2-7B's) without the key: 32 key/value heads do not divide
  // them, as transformers' default would not.
  EXPECT_TRUE(refused(R"({"architectures":["Qwen2ForCausalLM"],"hidden_size":3584,
                     "intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":28,
                     "vocab_size":50})",
                      "num_attention_heads 28 is not a multiple of num_key_value_heads 32"));
}

// A small Llama config without its closing brace, for the rope tests to add to.
const std::string kLlamaHead = R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
    "intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":4,"vocab_size":50)";

// rope_theta where transformers 4 writes it (the top level) and where
// transformers 5 does (rope_parameters), the default where neither has it.
TEST(Config, RopeThetaAtTheTopOrInRopeParameters) {
  auto theta = [&](const std::string& fields) {
    return parse_model_config(kLlamaHead + fields + "}", "config.json").rope_theta;
  };
  EXPECT_EQ(theta(""), 10000.0);
  EXPECT_EQ(theta(R"(,"rope_theta":500000.0)"), 500000.0);
  EXPECT_EQ(theta(R"(,"rope_parameters":{"rope_theta":500000.0,"rope_type":"default"})"), 500000.0);
  EXPECT_EQ(
      theta(R"(,"rope_theta":1e6,"rope_parameters":{"rope_theta":1000000,"rope_type":"default"})"),
      1e6);
  EXPECT_EQ(theta(R"(,"rope_theta":null,"rope_parameters":null)"), 10000.0);
  // Written back, it is read the same.
  const ModelConfig c = parse_model_config(
      kLlamaHead + R"(,"rope_parameters":{"rope_theta":250000})" + "}", "config.json");
  EXPECT_EQ(parse_model_config(model_config_to_json(c), "written").rope_theta, 250000.0);
  EXPECT_NE(
      error_of(kLlamaHead + R"(,"rope_theta":1000000,"rope_parameters":{"rope_theta":1000000.5}})")
          .find("config.json: rope_theta 1000000 and rope_parameters.rope_theta 1000000.5 "
                "differ"),
      std::string::npos);
  EXPECT_TRUE(refused(kLlamaHead + R"(,"rope_parameters":{"rope_theta":"big"}})",
                      "field 'rope_parameters.rope_theta' must be a number, got \"big\""));
  EXPECT_TRUE(refused(kLlamaHead + R"(,"rope_parameters":[1]})",
                      "field 'rope_parameters' must be an object, got [1]"));
  EXPECT_TRUE(refused(kLlamaHead + R"(,"rms_norm_eps":-1})",
                      "field 'rms_norm_eps' must be a positive number, got -1"));
}

// Rope scaling as vLLM's get_rope finds it: `rope_scaling` (transformers 4) or,
// where that is not set, `rope_parameters` beside rope_theta (5); the kind in
// `rope_type` or `type`. Settings compare by value (8 and 8.0, `type` and
// `rope_type` alike), and a default kind is no scaling. Only a malformed value
// refuses the config (a reload does not need rope); fields the forward pass
// needs are checked there (Forward.RopeScalingAsTheConfigSaysIt).
TEST(Config, RopeScalingAsVllmReadsIt) {
  auto scaling = [&](const std::string& fields) {
    return parse_model_config(kLlamaHead + fields + "}", "config.json").rope_scaling;
  };
  for (const std::string none :
       {"", R"(,"rope_scaling":null)", R"(,"rope_parameters":{"rope_theta":5e5})",
        R"(,"rope_parameters":{"rope_theta":5e5,"rope_type":"default"})",
        R"(,"rope_scaling":{"type":"default"})",
        R"(,"rope_scaling":{"type":"default","rope_type":"default"})"}) {
    EXPECT_EQ(scaling(none).type, "default") << none;
    EXPECT_EQ(scaling(none).json, "") << none;
  }
  const std::string llama31 = R"({"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,)"
                              R"("original_max_position_embeddings":8192,"rope_type":"llama3"})";
  const RopeScaling s = scaling(R"(,"rope_scaling":)" + llama31);
  EXPECT_EQ(s.type, "llama3");
  EXPECT_EQ(s.source, "rope_scaling");
  EXPECT_EQ(s.factor, 8.0);
  EXPECT_EQ(s.low_freq_factor, 1.0);
  EXPECT_EQ(s.high_freq_factor, 4.0);
  EXPECT_EQ(s.original_max_position_embeddings, 8192.0);
  // The same settings written by transformers 5, with integers, and with the
  // older `type` beside `rope_type` (transformers 4 writes both once it loaded one).
  const RopeScaling v5 =
      scaling(R"(,"rope_parameters":{"rope_theta":500000.0,)"
              R"("rope_type":"llama3","factor":8,"low_freq_factor":1,)"
              R"("high_freq_factor":4,"original_max_position_embeddings":8192})");
  EXPECT_EQ(v5.json, s.json);
  EXPECT_EQ(v5.source, "rope_parameters");
  EXPECT_EQ(scaling(R"(,"rope_scaling":)" + llama31.substr(0, llama31.size() - 1) +
                    R"(,"type":"llama3"})")
                .json,
            s.json);
  EXPECT_NE(
      scaling(R"(,"rope_scaling":)" + llama31.substr(0, llama31.size() - 9) + R"("yarn"})").json,
      s.json);
  const RopeScaling linear = scaling(R"(,"rope_scaling":{"type":"linear","factor":2})");
  EXPECT_EQ(linear.type, "linear");
  EXPECT_EQ(linear.factor, 2.0);
  EXPECT_EQ(linear.json, scaling(R"(,"rope_scaling":{"rope_type":"linear","factor":2.0})").json);
  // rope_scaling wins over rope_parameters, as transformers 5 and vLLM read them.
  EXPECT_EQ(scaling(R"(,"rope_scaling":{"type":"linear","factor":2},)"
                    R"("rope_parameters":{"rope_type":"linear","factor":4})")
                .factor,
            2.0);
  // yarn's settings: vLLM's defaults where not given, else as written.
  auto yarn_settings = [](const RopeScaling& r) {
    return std::make_tuple(r.beta_fast, r.beta_slow, r.extrapolation_factor, r.attn_factor,
                           r.apply_yarn_scaling, r.truncate);
  };
  const RopeScaling yarn = scaling(
      R"(,"rope_scaling":{"rope_type":"yarn","factor":4,"original_max_position_embeddings":32768})");
  EXPECT_EQ(yarn.type, "yarn");
  EXPECT_EQ(yarn.factor, 4.0);
  EXPECT_EQ(yarn.original_max_position_embeddings, 32768.0);
  EXPECT_EQ(yarn_settings(yarn), std::make_tuple(32.0, 1.0, 1.0, 1.0, true, true));
  EXPECT_EQ(yarn_settings(scaling(R"(,"rope_scaling":{"rope_type":"yarn","factor":4,)"
                                  R"("beta_fast":16,"beta_slow":2,"extrapolation_factor":0.5,)"
                                  R"("attn_factor":0.8,"apply_yarn_scaling":false,)"
                                  R"("truncate":false})")),
            std::make_tuple(16.0, 2.0, 0.5, 0.8, false, false));
  EXPECT_TRUE(refused(kLlamaHead + R"(,"rope_scaling":{"rope_type":"yarn","truncate":"no"}})",
                      "field 'rope_scaling.truncate' must be true or false, got \"no\""));
  // Kinds the forward pass does not compute, and fields it would need but
  // that are absent, do not refuse the config.
  EXPECT_EQ(scaling(R"(,"rope_scaling":{"rope_type":"longrope","factor":4.0})").type, "longrope");
  EXPECT_EQ(scaling(R"(,"rope_scaling":{"rope_type":"llama3","factor":8})").low_freq_factor, 0.0);
  // Written back, read the same; compared field by field.
  const ModelConfig c = parse_model_config(kLlamaHead + R"(,"rope_scaling":)" + llama31 + "}", "c");
  EXPECT_EQ(parse_model_config(model_config_to_json(c), "written").rope_scaling.json, s.json);
  const auto differences = config_differences(c, parse_model_config(kLlamaHead + "}", "plain"));
  ASSERT_EQ(differences.size(), 1u);
  EXPECT_EQ(differences[0].find("rope_scaling '{"), 0u) << differences[0];
  EXPECT_NE(differences[0].find("}' vs 'none'"), std::string::npos) << differences[0];
  // Malformed values are named.
  EXPECT_TRUE(refused(kLlamaHead + R"(,"rope_scaling":[8]})",
                      "field 'rope_scaling' must be an object, got [8]"));
  EXPECT_TRUE(refused(kLlamaHead + R"(,"rope_parameters":{"rope_type":"linear","factor":"big"}})",
                      "field 'rope_parameters.factor' must be a number, got \"big\""));
  EXPECT_TRUE(refused(kLlamaHead + R"(,"rope_scaling":{"rope_type":7}})",
                      "field 'rope_scaling.rope_type' must be a name, got 7"));
  EXPECT_TRUE(refused(kLlamaHead + R"(,"rope_scaling":{"rope_type":"linear","type":"llama3"}})",
                      "rope_scaling.rope_type \"linear\" and rope_scaling.type \"llama3\" "
                      "differ"));
}

TEST(Config, WrongConfigsNameTheirField) {
  EXPECT_NE(
      error_of(R"({"architectures":["GPT2LMHeadModel"]})")
          .find("architecture 'GPT2LMHeadModel' is not supported (supported: CohereForCausalLM, "
                "Cohere2ForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, "
                "Ernie4_5ForCausalLM, "
                "Exaone4ForCausalLM, "
                "GemmaForCausalLM, "
                "Gemma2ForCausalLM, Gemma3ForCausalLM, Glm4ForCausalLM, Glm4MoeForCausalLM, "
                "GraniteForCausalLM, "
                "GraniteMoeForCausalLM, GraniteMoeHybridForCausalLM, GraniteMoeSharedForCausalLM, "
                "LlamaForCausalLM, "
                "MistralForCausalLM, MixtralForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, "
                "Phi3ForCausalLM, Qwen2ForCausalLM, "
                "Qwen2MoeForCausalLM, Qwen3ForCausalLM, "
                "Qwen3MoeForCausalLM)"),
      std::string::npos);
  EXPECT_TRUE(refused(replaced(kMoe, "\"mlp_only_layers\":[3]", "\"mlp_only_layers\":[9]"),
                      "'mlp_only_layers' holds 9"));
  EXPECT_TRUE(refused(replaced(kMoe, "\"num_experts\":128", "\"num_experts\":4"),
                      "num_experts_per_tok 8 exceeds num_experts 4"));
  // a field no one reads, nested too deep to print
  const std::string deep = error_of(replaced(
      kMoe, "\"norm_topk_prob\"",
      "\"x\":" + std::string(100'000, '[') + std::string(100'000, ']') + ",\"norm_topk_prob\""));
  EXPECT_EQ(deep.rfind("config.json: not valid JSON: ", 0), 0u) << deep;
  EXPECT_NE(deep.find("nested deeper than 64 levels"), std::string::npos) << deep;
  EXPECT_TRUE(refused(replaced(kMoe, "\"dtype\":\"bfloat16\"", "\"dtype\":\"int8\""),
                      "dtype 'int8' is not a floating type"));
}

TEST(Config, ExpertLayoutsAreCheckedForTheTpSize) {
  const ModelConfig c = parse_model_config(kMoe, "config.json");
  EXPECT_NO_THROW(ShardingRules(c, 4, "", true));   // 128 experts / 4
  EXPECT_NO_THROW(ShardingRules(c, 4, "", false));  // 768 / 4
  const std::string twelve = replaced(kMoe, "\"num_experts\":128", "\"num_experts\":12");
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
    "intermediate_size":96,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":4,
    "vocab_size":10})",
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
