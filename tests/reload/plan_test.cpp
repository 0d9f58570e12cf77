#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>

#include "tpreload/core/error.h"
#include "tpreload/reload/plan.h"

namespace tpreload {
namespace {

ModelConfig config() {
  return parse_model_config(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
    "intermediate_size":96,"num_hidden_layers":3,"num_attention_heads":8,
    "num_key_value_heads":2,"vocab_size":100,"torch_dtype":"bfloat16"})",
                            "test");
}

// The ValidationError text `f` throws ("" when it throws none).
template <typename F>
std::string test_error(F&& f) {
  try {
    f();
  } catch (const ValidationError& e) {
    return e.what();
  }
  return "";
}

// Metadata for the config's checkpoint laid out in `order` (indices into the specs).
SourceMetadata metadata(const ModelConfig& c, bool reverse_layers = false) {
  SourceMetadata md;
  md.description = "test source";
  auto specs = checkpoint_tensor_specs(c);
  if (reverse_layers) std::reverse(specs.begin(), specs.end());
  std::uint64_t offset = 8;
  for (const auto& s : specs) {
    std::uint64_t n = 2;
    for (auto d : s.shape) n *= d;
    md.tensors.push_back({s.name, DType::kBFloat16, s.shape, n, "model.safetensors", offset, -1});
    offset += n;
  }
  return md;
}

TEST(Metadata, RoundTripsEveryField) {
  SourceMetadata md = metadata(config());
  md.tensors[3].tp_rank = 2;
  md.kernel = KernelFormatInfo{4, DType::kFloat16, "int8", "{\"a\": 1}", true};
  const SourceMetadata back = parse_metadata(serialize_metadata(md));
  EXPECT_EQ(back.description, md.description);
  ASSERT_EQ(back.tensors.size(), md.tensors.size());
  for (std::size_t i = 0; i < md.tensors.size(); ++i) {
    const TensorInfo &a = md.tensors[i], &b = back.tensors[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_EQ(a.nbytes, b.nbytes);
    EXPECT_EQ(a.file, b.file);
    EXPECT_EQ(a.file_offset, b.file_offset);
    EXPECT_EQ(a.tp_rank, b.tp_rank);
  }
  ASSERT_TRUE(back.kernel.has_value());
  EXPECT_EQ(back.kernel->tp_size, 4);
  EXPECT_EQ(back.kernel->quantization, "int8");
  EXPECT_EQ(back.kernel->config_json, "{\"a\": 1}");
  EXPECT_TRUE(back.kernel->expert_parallel);
  auto bytes = serialize_metadata(md);
  bytes.pop_back();
  EXPECT_THROW(parse_metadata(bytes), CommError);
}

// What picks a kept plan and tells ranks with different listings apart: a change
// in any one field changes the hash and fails the comparison.
TEST(Metadata, ListingHashAndComparisonSeeEveryField) {
  SourceMetadata base = metadata(config());
  base.kernel = KernelFormatInfo{4, DType::kFloat16, "int8", "{\"a\": 1}", true};
  auto hash = [](const SourceMetadata& m) {
    return listing_hash(m.description, m.tensors, m.kernel);
  };
  const std::uint64_t h = hash(base);
  EXPECT_EQ(hash(base), h);
  EXPECT_TRUE(same_listing(base, base.description, base.tensors, base.kernel));
  // A kept plan's listing is the parsed broadcast: it must compare equal to the
  // source's own, or no plan would ever be reused.
  EXPECT_TRUE(same_listing(parse_metadata(serialize_metadata(base)), base.description, base.tensors,
                           base.kernel));
  std::vector<std::pair<std::string, std::function<void(SourceMetadata&)>>> changes = {
      {"description", [](SourceMetadata& m) { m.description += "x"; }},
      {"a tensor less", [](SourceMetadata& m) { m.tensors.pop_back(); }},
      {"name", [](SourceMetadata& m) { m.tensors[5].name.back() = 'X'; }},
      {"name split differently",
       [](SourceMetadata& m) {  // the same characters, one moved to the next string
         m.tensors[5].name.pop_back();
         m.tensors[5].file = "t" + m.tensors[5].file;
       }},
      {"dtype", [](SourceMetadata& m) { m.tensors[2].dtype = DType::kFloat16; }},
      {"shape", [](SourceMetadata& m) { m.tensors[2].shape.back() += 1; }},
      {"nbytes", [](SourceMetadata& m) { m.tensors[2].nbytes += 1; }},
      {"file", [](SourceMetadata& m) { m.tensors[7].file = "other.safetensors"; }},
      {"file offset", [](SourceMetadata& m) { m.tensors[7].file_offset += 4096; }},
      {"tp rank", [](SourceMetadata& m) { m.tensors[0].tp_rank = 1; }},
      {"no kernel format", [](SourceMetadata& m) { m.kernel.reset(); }},
      {"kernel tp size", [](SourceMetadata& m) { m.kernel->tp_size = 8; }},
      {"kernel dtype", [](SourceMetadata& m) { m.kernel->dtype = DType::kBFloat16; }},
      {"quantization", [](SourceMetadata& m) { m.kernel->quantization = ""; }},
      {"config", [](SourceMetadata& m) { m.kernel->config_json = "{}"; }},
      {"expert parallel", [](SourceMetadata& m) { m.kernel->expert_parallel = false; }},
  };
  for (const auto& [what, change] : changes) {
    SourceMetadata m = base;
    change(m);
    EXPECT_NE(hash(m), h) << what;
    EXPECT_FALSE(same_listing(base, m.description, m.tensors, m.kernel)) << what;
    // And the wire format tells them apart too.
    EXPECT_NE(serialize_metadata(m), serialize_metadata(base)) << what;
  }
}

// Inputs the metadata fuzzer found accepted though serialize_metadata never
// writes them; each must be refused, naming what is wrong.
TEST(Metadata, RefusesWhatItNeverWrites) {
  auto error_of = [](const std::vector<std::uint8_t>& bytes) {
    try {
      parse_metadata(bytes);
    } catch (const CommError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // The fuzzer's input: empty description, no tensors, kernel flag byte 0x3d.
  std::vector<std::uint8_t> flag(8 + 8, 0);
  flag.push_back(0x3d);
  EXPECT_EQ(error_of(flag), "reload metadata: the kernel-format flag is 61, not 0 or 1");
  SourceMetadata one;
  one.tensors.push_back({"w", DType::kBFloat16, {3, 5}, 30, "f", 8, -1});
  const auto good = serialize_metadata(one);
  EXPECT_EQ(error_of(good), "");
  // Offsets by the wire format: description (8), count (8), name (8 + 1).
  const std::size_t dtype_at = 8 + 8 + 8 + 1, nbytes_at = dtype_at + 1 + 4 + 2 * 8;
  auto bad_dtype = good;
  bad_dtype[dtype_at] = 200;
  EXPECT_EQ(error_of(bad_dtype),
            "reload metadata: tensor 'w' has dtype code 200, not a known dtype");
  auto bad_bytes = good;
  bad_bytes[nbytes_at] = 31;
  EXPECT_EQ(error_of(bad_bytes),
            "reload metadata: tensor 'w' says 31 bytes, its shape and dtype make 30");
  auto negative = good;
  negative[dtype_at + 1 + 4 + 7] = 0x80;  // the first dimension's sign byte
  EXPECT_NE(error_of(negative).find("reload metadata: tensor 'w' has dimension -"),
            std::string::npos);
}

// Every planned tensor's rows are covered exactly once, in order, with `last`
// on the final piece; buckets respect the size unless one row is larger.
void check_coverage(const Plan& plan, const SourceMetadata& md, std::uint64_t bucket_bytes) {
  std::vector<std::int64_t> next(plan.tensors.size(), 0);
  for (const Bucket& b : plan.buckets) {
    EXPECT_FALSE(b.pieces.empty());
    if (b.pieces.size() > 1 || b.pieces[0].row_end - b.pieces[0].row_begin > 1) {
      EXPECT_LE(b.bytes, bucket_bytes);
    }
    for (const Piece& p : b.pieces) {
      EXPECT_EQ(p.row_begin, next[p.planned]) << md.tensors[plan.tensors[p.planned].index].name;
      EXPECT_GT(p.row_end, p.row_begin);
      next[p.planned] = p.row_end;
      EXPECT_EQ(p.last, p.row_end == plan.tensors[p.planned].rows);
    }
    if (b.scatter) {  // regions follow each other, each at a multiple of 8, and end the buffer
      std::uint64_t at = 0;
      for (const ByteRange& r : b.ranges) {
        EXPECT_EQ(r.offset, (at + 7) / 8 * 8);
        at = r.end();
      }
      EXPECT_EQ(at, b.bytes);
    }
  }
  // Every tensor's rows: a broadcast one's are its first dimension in the
  // listing (1 for a scalar); a scattered one is sent as its ranks' slices,
  // each a unit of the plan's rows (the rows of its largest slice).
  for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
    const auto& shape = md.tensors[plan.tensors[i].index].shape;
    EXPECT_EQ(next[i], plan.tensors[i].scatter ? plan.tensors[i].rows
                       : shape.empty()         ? 1
                                               : shape[0])
        << md.tensors[plan.tensors[i].index].name;
  }
}

TEST(Plan, CoversEveryRowOnceForEveryBucketSize) {
  const ModelConfig c = config();
  const ShardingRules rules(c, 4);
  const SourceMetadata md = metadata(c);
  for (Distribution d : {Distribution::kBroadcast, Distribution::kScatter})
    for (std::uint64_t bucket :
         {std::uint64_t{1}, std::uint64_t{300}, std::uint64_t{5000}, std::uint64_t{1} << 30}) {
      const Plan plan = make_plan(md, rules, {WeightFormat::kCheckpoint, d, bucket, 8, 4});
      check_coverage(plan, md, bucket);
      EXPECT_EQ(plan.tensors.size(), md.tensors.size());
    }
}

// Replicated tensors are broadcast unless scattering and their copies for the
// whole world fit the limit; sliced tensors follow the distribution.
TEST(Plan, SmallReplicatedTensorsJoinTheScatterBucketsLargerOnesAreBroadcast) {
  const ModelConfig c = config();  // norms: 64 bf16 = 128 bytes; embeddings 100 x 64 x 2
  const SourceMetadata md = metadata(c);
  for (const auto& [world, tp] : {std::pair{2, 2}, std::pair{4, 2}})
    for (Distribution d : {Distribution::kBroadcast, Distribution::kScatter})
      for (std::uint64_t limit : {std::uint64_t{0}, std::uint64_t{128} * world - 1,
                                  std::uint64_t{128} * world, std::uint64_t{1} << 30}) {
        const Plan plan = make_plan(md, ShardingRules(c, tp),
                                    {WeightFormat::kCheckpoint, d, 1 << 20, world, tp, limit});
        for (const PlannedTensor& t : plan.tensors) {
          const TensorInfo& info = md.tensors[t.index];
          std::uint64_t bytes = 2;
          for (std::int64_t n : info.shape) bytes *= static_cast<std::uint64_t>(n);
          // Replicated in this model (no biases): the norms, by name.
          const bool replicated = info.name.find("norm.weight") != std::string::npos;
          const bool want = d == Distribution::kScatter &&
                            (!replicated || bytes * static_cast<std::uint64_t>(world) <= limit);
          EXPECT_EQ(t.scatter, want) << info.name << " world " << world << " limit " << limit;
        }
        check_coverage(plan, md, 1 << 20);
      }
}

// Mixed element sizes (1-byte norms, 4-byte embeddings): every piece of a
// scatter bucket starts at a multiple of its element size in each rank's
// region, every region at a multiple of 8, and no bucket of more than one row
// exceeds the bucket size with that padding counted.
TEST(Plan, MixedElementSizesArePaddedWithinTheBucketSize) {
  const ModelConfig c = config();
  SourceMetadata md;
  md.description = "mixed";
  std::uint64_t offset = 8;
  for (const auto& s : checkpoint_tensor_specs(c)) {
    const DType dtype = s.shape.size() == 1                         ? DType::kInt8
                        : s.name.find("embed") != std::string::npos ? DType::kFloat32
                                                                    : DType::kBFloat16;
    std::uint64_t n = dtype == DType::kInt8 ? 1 : dtype == DType::kFloat32 ? 4 : 2;
    for (auto d : s.shape) n *= static_cast<std::uint64_t>(d);
    md.tensors.push_back({s.name, dtype, s.shape, n, "model.safetensors", offset, -1});
    offset += n;
  }
  for (const auto& [world, tp] : {std::pair{2, 1}, std::pair{4, 2}, std::pair{8, 4}})
    for (std::uint64_t bucket : {std::uint64_t{1}, std::uint64_t{37}, std::uint64_t{301},
                                 std::uint64_t{4099}, std::uint64_t{1} << 40}) {
      const Plan plan = make_plan(md, ShardingRules(c, tp),
                                  {WeightFormat::kCheckpoint, Distribution::kScatter, bucket, world,
                                   tp, std::uint64_t{1} << 30});
      check_coverage(plan, md, bucket);
      for (const Bucket& b : plan.buckets)
        for (const Piece& p : b.pieces) {
          const PlannedTensor& t = plan.tensors[p.planned];
          const TensorInfo& info = md.tensors[t.index];
          const std::uint64_t element = info.dtype == DType::kInt8      ? 1
                                        : info.dtype == DType::kFloat32 ? 4
                                                                        : 2;
          for (int w = 0; w < world; ++w) {
            if (std::min(p.row_end, t.rows_for(w % tp)) <= p.row_begin) continue;  // none its own
            EXPECT_EQ((b.ranges[w].offset + p.rank_offset[w]) % element, 0u)
                << info.name << " world rank " << w << " bucket size " << bucket;
          }
        }
    }
}

// With every replicated tensor small, a scatter plan is one run of the file:
// norms sit between the sliced tensors around them, in file order.
TEST(Plan, ScatterPlanWithSmallReplicatedTensorsFollowsTheFile) {
  const ModelConfig c = config();
  const SourceMetadata md = metadata(c);
  const Plan plan = make_plan(md, ShardingRules(c, 2),
                              {WeightFormat::kCheckpoint, Distribution::kScatter,
                               std::uint64_t{1} << 30, 2, 2, std::uint64_t{1} << 30});
  ASSERT_EQ(plan.buckets.size(), 1u);
  EXPECT_TRUE(plan.buckets[0].scatter);
  ASSERT_EQ(plan.buckets[0].pieces.size(), md.tensors.size());
  for (std::size_t i = 0; i < md.tensors.size(); ++i) {
    const Piece& p = plan.buckets[0].pieces[i];
    EXPECT_EQ(md.tensors[plan.tensors[p.planned].index].file_offset, md.tensors[i].file_offset)
        << i;  // the metadata lists the tensors in file order
  }
}

TEST(Plan, FinishesEachLayerOnceAfterItsLastPieceWhateverTheFileOrder) {
  const ModelConfig c = config();
  const SourceMetadata md = metadata(c, /*reverse_layers=*/true);
  for (Distribution d : {Distribution::kBroadcast, Distribution::kScatter}) {
    const Plan plan =
        make_plan(md, ShardingRules(c, 2, "int8"), {WeightFormat::kCheckpoint, d, 2000, 2, 2});
    std::map<std::int64_t, std::size_t> last_piece, finished_at;
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      for (const Piece& p : plan.buckets[b].pieces)
        if (plan.tensors[p.planned].layer >= 0) last_piece[plan.tensors[p.planned].layer] = b;
      for (std::int64_t layer : plan.buckets[b].finished_layers) {
        EXPECT_EQ(finished_at.count(layer), 0u) << "layer " << layer << " finished twice";
        finished_at[layer] = b;
      }
    }
    EXPECT_EQ(finished_at, last_piece);
    EXPECT_EQ(finished_at.size(), 3u);
  }
}

TEST(Plan, BroadcastBucketsFollowTheFileAndKindsDoNotAlternate) {
  const ModelConfig c = config();
  const SourceMetadata md = metadata(c);
  const Plan plan =
      make_plan(md, ShardingRules(c, 2),
                {WeightFormat::kCheckpoint, Distribution::kScatter, 1 << 20, 2, 2, 0});
  ASSERT_EQ(plan.buckets.size(), 2u);  // all broadcasts, then all scatters
  EXPECT_FALSE(plan.buckets[0].scatter);
  EXPECT_TRUE(plan.buckets[1].scatter);
  std::uint64_t at = 0;
  for (const Piece& p : plan.buckets[0].pieces) {
    const TensorInfo& info = md.tensors[plan.tensors[p.planned].index];
    EXPECT_GT(info.file_offset, at) << info.name << " out of file order";
    at = info.file_offset;
  }
}

TEST(Plan, UnknownNamesAreSkippedAndKernelMismatchesRejected) {
  const ModelConfig c = config();
  SourceMetadata md = metadata(c);
  md.tensors.push_back({"rotary.inv_freq", DType::kFloat32, {4}, 16, "f", 0, -1});
  const ShardingRules rules(c, 2);
  const Plan plan =
      make_plan(md, rules, {WeightFormat::kCheckpoint, Distribution::kBroadcast, 1 << 20, 2, 2});
  EXPECT_EQ(plan.skipped, (std::vector<std::string>{"rotary.inv_freq"}));
  EXPECT_THROW(
      make_plan(md, rules, {WeightFormat::kKernel, Distribution::kBroadcast, 1 << 20, 2, 2}),
      ValidationError);
  md.kernel = KernelFormatInfo{4, DType::kBFloat16, "", "{}"};
  const PlanOptions kernel{WeightFormat::kKernel, Distribution::kBroadcast, 1 << 20, 2, 2};
  const PlanOptions checkpoint{WeightFormat::kCheckpoint, Distribution::kBroadcast, 1 << 20, 2, 2};
  EXPECT_EQ(test_error([&] { make_plan(md, rules, kernel); }),
            "kernel-format source (test source) was made for tp 4, quantization none, not "
            "expert parallel; the model is tp 2, quantization none, not expert parallel "
            "(kernel-format shards fit one layout: shard the checkpoint for this one, e.g. "
            "reload_ckpt shard IN OUT --tp 2, or give the model the shards' layout); nothing "
            "was reloaded");
  // The other way round: kernel shards reloaded as a checkpoint, and a
  // checkpoint reloaded in kernel format, each naming what to do instead.
  EXPECT_EQ(test_error([&] { make_plan(md, rules, checkpoint); }),
            "checkpoint-format reload from (test source), which holds kernel-format shards: "
            "reload it in kernel format (reload_runner --kernel-format, ReloadOptions::format "
            "kKernel)");
  md.kernel.reset();
  EXPECT_EQ(test_error([&] { make_plan(md, rules, kernel); }),
            "kernel-format reload from (test source), which is a checkpoint-format source (no "
            "kernel_format.json): reload it in checkpoint format");
  EXPECT_THROW(
      make_plan(md, rules, {WeightFormat::kCheckpoint, Distribution::kBroadcast, 1 << 20, 3, 2}),
      UsageError);
}

}  // namespace
}  // namespace tpreload

namespace tpreload {
namespace {

// Under expert parallelism an expert tensor reaches only the rank that holds it,
// even when the rest is broadcast; with tensor-parallel experts every rank gets
// its column window. What a world rank receives of a piece is read off the
// bucket layout (the bytes between its offset and the next piece's in the rank's
// region), not off the plan's own per-rank row counts.
TEST(Plan, ExpertTensorsReachOnlyTheRanksThatHoldThem) {
  const ModelConfig c = parse_model_config(R"({"architectures":["Qwen3MoeForCausalLM"],
    "hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":8,
    "num_key_value_heads":4,"head_dim":8,"vocab_size":130,"num_experts":8,"num_experts_per_tok":2,
    "moe_intermediate_size":32,"torch_dtype":"bfloat16"})",
                                           "moe");
  const SourceMetadata md = metadata(c);
  for (bool ep : {true, false}) {
    for (Distribution d : {Distribution::kBroadcast, Distribution::kScatter}) {
      const ShardingRules rules(c, 4, "", ep);
      const Plan plan =
          make_plan(md, rules, {WeightFormat::kCheckpoint, d, 4096, 8, 4});  // 2 replicas
      std::map<std::string, std::map<int, std::uint64_t>>
          got;  // expert tensor -> world rank -> bytes
      for (const Bucket& b : plan.buckets)
        for (std::size_t k = 0; k < b.pieces.size(); ++k) {
          const Piece& p = b.pieces[k];
          const TensorInfo& info = md.tensors[plan.tensors[p.planned].index];
          if (info.name.find(".experts.") == std::string::npos) continue;
          if (ep) {
            ASSERT_TRUE(b.scatter) << info.name << " is broadcast under expert parallelism";
          }
          if (!b.scatter) continue;
          for (int w = 0; w < 8; ++w) {
            const std::uint64_t next =
                k + 1 < b.pieces.size() ? b.pieces[k + 1].rank_offset[w] : b.ranges[w].length;
            got[info.name][w] += next - p.rank_offset[w];
          }
        }
      if (!ep && d == Distribution::kBroadcast) continue;  // every rank takes whole tensors then
      ASSERT_EQ(got.size(), 2u * 8 * 3);
      for (const auto& [name, bytes] : got) {
        const int e = std::stoi(name.substr(name.find(".experts.") + 9));
        const std::uint64_t whole = 32 * 64 * 2;  // every expert tensor: 32 x 64 or 64 x 32 bf16
        for (int w = 0; w < 8; ++w) {
          // Expert parallelism: expert e whole on tp rank e / 2 of each replica, nothing
          // elsewhere; tensor-parallel experts: a quarter on every rank.
          const std::uint64_t want = ep ? (w % 4 == e / 2 ? whole : 0) : whole / 4;
          EXPECT_EQ(bytes.at(w), want)
              << name << " at world rank " << w << (ep ? " (ep)" : " (tp)");
        }
      }
    }
  }
}

TEST(Plan, KernelShardsMadeForAnotherConfigOrDtypeAreRejected) {
  const ModelConfig c = config();
  const ShardingRules rules(c, 2);
  const PlanOptions kernel{WeightFormat::kKernel, Distribution::kBroadcast, 1 << 20, 2, 2};
  SourceMetadata md;
  md.description = "shards";
  // Made for this config (its own text, reformatted, with a field tpreload does
  // not read): accepted.
  md.kernel = KernelFormatInfo{2, DType::kBFloat16, "", R"({"architectures":["LlamaForCausalLM"],
    "hidden_size":64,"intermediate_size":96,"num_hidden_layers":3,"num_attention_heads":8,
    "num_key_value_heads":2,"vocab_size":100,"torch_dtype":"bfloat16","_name_or_path":"x"})"};
  EXPECT_NO_THROW(make_plan(md, rules, kernel));
  // Settings only a forward pass reads (rotary, norm epsilon) change no byte
  // of the shards: accepted.
  md.kernel->config_json = R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
    "intermediate_size":96,"num_hidden_layers":3,"num_attention_heads":8,
    "num_key_value_heads":2,"vocab_size":100,"torch_dtype":"bfloat16","rope_theta":500000.0,
    "rope_scaling":{"rope_type":"linear","factor":2.0},"rms_norm_eps":1e-3})";
  EXPECT_NO_THROW(make_plan(md, rules, kernel));
  // Another model with the same tp size: every differing field that shapes
  // the weights named, and no other.
  md.kernel->config_json = R"({"architectures":["MistralForCausalLM"],"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":3,"num_attention_heads":8,
    "num_key_value_heads":2,"vocab_size":100,"torch_dtype":"bfloat16","rope_theta":500000.0})";
  EXPECT_EQ(test_error([&] { make_plan(md, rules, kernel); }),
            "kernel-format source (shards) was made for another model (its kernel_format.json "
            "vs the model's config): architectures 'MistralForCausalLM' vs 'LlamaForCausalLM', "
            "intermediate_size 128 vs 96; nothing was reloaded");
  // The directory's dtype.
  md.kernel = KernelFormatInfo{2, DType::kFloat16, "", c.json};
  EXPECT_EQ(test_error([&] { make_plan(md, rules, kernel); }),
            "kernel-format source (shards) was made for another model (its kernel_format.json "
            "vs the model's config): dtype float16 vs bfloat16; nothing was reloaded");
  // A config that is not one.
  md.kernel = KernelFormatInfo{2, DType::kBFloat16, "", "{}"};
  EXPECT_NE(test_error([&] {
              make_plan(md, rules, kernel);
            }).find("kernel-format source (shards): its kernel_format.json 'config': "),
            std::string::npos);
}

}  // namespace
}  // namespace tpreload
