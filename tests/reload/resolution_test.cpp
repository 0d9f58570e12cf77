// Plan-time resolution end to end, in one process: the reader fills each bucket
// (BucketReader), every simulated world rank takes its view of it (the whole
// bucket when broadcast, its region when scattered) and applies its own
// resolved writes into its own model. Every rank's parameters must equal the
// independent slicing of tests/support, for every world and tp size, both
// distributions and formats, tiny and large buckets.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "../../src/reload/bucket_reader.h"
#include "../support/tiny_models.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/checkpoint/writers.h"
#include "tpreload/core/crc32c.h"
#include "tpreload/model/kernel_shards.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/plan.h"

namespace tpreload {
namespace {

SourceMetadata metadata_of(WeightSource& source) {
  return {source.describe(), source.tensors(), source.kernel_format()};
}

// Runs the plan for every world rank and returns each rank's model. With
// `ranks_per_node` > 0 each node's reader fills only its node's regions
// (BucketReader::fill_ranks, as for --readers node) before its ranks apply.
// With `place` the reader places a rank's own plain copies straight into that
// rank's parameters (place_own_writes, as the pipeline does for the reader with
// host parameters) and that rank applies only the rest: kFirst, each node's
// first rank (world rank 0 with one reader, the home of its tp rank); kLast,
// each node's last rank (a replica when the node holds more ranks than tp, as
// a reader_rank of the last rank is). The bytes placed must never land in the
// send buffer, and some must be placed.
enum class Place { kNone, kFirst, kLast };
std::string place_name(Place p) {
  return p == Place::kFirst  ? " first rank's region placed"
         : p == Place::kLast ? " last rank's region placed"
                             : "";
}
std::vector<std::unique_ptr<TensorParallelModel>> simulate(
    const ModelConfig& config, WeightSource& source, const PlanOptions& o,
    const std::string& quantization, int ranks_per_node = 0, Place place = Place::kNone) {
  // (Phi-3: the stacked tensors as the parts the loaders take, as a reload lists them)
  const auto view = loader_view(source, config);
  WeightSource& listed = view ? *view : source;
  const SourceMetadata md = metadata_of(listed);
  std::vector<std::unique_ptr<TensorParallelModel>> models;
  std::vector<std::vector<BucketApply>> applies;
  for (int w = 0; w < o.world_size; ++w) {
    ModelOptions mo;
    mo.tp_size = o.tp_size;
    mo.tp_rank = w % o.tp_size;
    mo.quantization = quantization;
    models.push_back(std::make_unique<TensorParallelModel>(config, mo));
    models.back()->begin_load();
  }
  const Plan plan = make_plan(md, models[0]->rules(), o);
  for (int w = 0; w < o.world_size; ++w)
    applies.push_back(resolve_applies(plan, md, models[w]->rules(), o, w));
  detail::BucketReader reader(plan, md, listed, o.world_size, o.tp_size, /*zero_copy=*/false);
  std::vector<std::byte> send(plan.largest_bucket);
  constexpr std::byte kMarker{0xA5};
  std::uint64_t placed_bytes = 0;
  const int per_node = ranks_per_node > 0 ? ranks_per_node : o.world_size;
  // Per node, the rank placed and its direct reads (kept with the plan, as the pipeline's).
  std::map<int, std::pair<int, std::vector<detail::DirectReads>>> placing;
  for (int node = 0; place != Place::kNone && node < o.world_size; node += per_node) {
    const int w = place == Place::kFirst ? node : std::min(o.world_size, node + per_node) - 1;
    placing[node] = {w, detail::place_own_writes(plan, applies[w], models[w]->rules().params(), w)};
  }
  for (std::size_t b = 0; b < plan.buckets.size(); ++b)
    for (int node = 0; node < o.world_size; node += per_node) {
      std::vector<int> ranks;
      for (int w = node; w < std::min(o.world_size, node + per_node); ++w) ranks.push_back(w);
      const Bucket& bucket = plan.buckets[b];
      const int placed_rank = placing.count(node) ? placing[node].first : -1;
      const detail::DirectReads no_direct_reads;
      const detail::DirectReads& own =
          placed_rank >= 0 ? placing[node].second.at(b) : no_direct_reads;
      std::vector<std::byte*> storage;
      if (placed_rank >= 0) {
        const ParameterSink& sink = models[placed_rank]->sink();
        for (ParamSlot slot = 0; slot < sink.size(); ++slot)
          storage.push_back(sink.storage(slot).data);
      }
      const detail::Placed placed{placed_rank, &own.spans, storage.data()};
      std::fill(send.begin(), send.end(), kMarker);
      const ConstBytes bytes = ranks_per_node > 0
                                   ? reader.fill_ranks(b, ranks, send.data(), {}, placed)
                                   : reader.fill(b, send.data(), {}, placed);
      for (const detail::DirectSpan& p : own.spans) {
        placed_bytes += p.end - p.begin;
        const std::byte* region = send.data() + bucket.ranges[placed_rank].offset;
        EXPECT_TRUE(std::all_of(region + p.begin, region + p.end,
                                [&](std::byte c) { return c == kMarker; }))
            << "bucket " << b << ": placed bytes [" << p.begin << ", " << p.end << ") of rank "
            << placed_rank << " landed in the send buffer";
      }
      for (int w : ranks) {
        const std::byte* view = bucket.scatter ? bytes.data + bucket.ranges[w].offset : bytes.data;
        ParameterSink& sink = models[w]->sink();
        const auto& writes = applies[w][b].writes;
        for (std::size_t i = 0; i < writes.size(); ++i)
          if (w != placed_rank || own.placed.empty() || !own.placed[i]) sink.write(writes[i], view);
        for (const RowZero& z : applies[w][b].zeros) sink.zero(z);
        for (const auto& [slot, shards] : applies[w][b].completed) sink.mark_loaded(slot, shards);
      }
    }
  if (place != Place::kNone && o.distribution == Distribution::kScatter) {
    EXPECT_GT(placed_bytes, 0u);
  }
  // (the processing a reload runs per layer: DeepSeek's derived matrices)
  if (o.format == WeightFormat::kCheckpoint)
    for (auto& m : models) m->sink().process_all(m->options().tp_rank);
  return models;
}

void expect_equal_to(const std::vector<std::unique_ptr<TensorParallelModel>>& models,
                     const std::function<std::map<std::string, at::Tensor>(int tp_rank)>& want,
                     WeightFormat format, const std::string& what) {
  for (std::size_t w = 0; w < models.size(); ++w) {
    const TensorParallelModel& m = *models[w];
    const auto expected = want(m.options().tp_rank);
    for (const auto& [name, t] : expected)
      EXPECT_TRUE(testdata::same_bytes(m.parameter_for_reload(name), t))
          << what << " world rank " << w << " " << name;
    EXPECT_EQ(m.loaded_names(format), m.expected_names(format)) << what << " world rank " << w;
  }
}

TEST(Resolution, CheckpointFormatOnEverySimulatedRank) {
  for (const char* name : testdata::kTinyConfigs) {
    const ModelConfig config = testdata::tiny_config(name);
    const auto ckpt = testdata::random_checkpoint(config, 31);
    for (auto [world, tp] :
         std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {4, 4}, {4, 2}, {8, 4}, {8, 8}}) {
      for (Distribution d : {Distribution::kBroadcast, Distribution::kScatter}) {
        // Scatter with replicated tensors broadcast, or scattered (each rank its copy).
        for (std::uint64_t replicated : {std::uint64_t{0}, std::uint64_t{1} << 30}) {
          for (std::uint64_t bucket : {std::uint64_t{300}, std::uint64_t{1} << 30}) {
            for (Place place : {Place::kNone, Place::kFirst, Place::kLast}) {
              if (place != Place::kNone && d == Distribution::kBroadcast) continue;
              auto source = testdata::memory_source(ckpt);
              const std::string what = std::string(name) + " world " + std::to_string(world) +
                                       " tp " + std::to_string(tp) + " " +
                                       std::string(distribution_name(d)) + " bucket " +
                                       std::to_string(bucket) + " replicated scattered up to " +
                                       std::to_string(replicated) + place_name(place);
              const auto models = simulate(
                  config, *source, {WeightFormat::kCheckpoint, d, bucket, world, tp, replicated},
                  "", 0, place);
              expect_equal_to(
                  models, [&](int r) { return testdata::expected_shards(config, ckpt, tp, r); },
                  WeightFormat::kCheckpoint, what);
            }
          }
        }
      }
    }
  }
}

// Rows of 2,048 bytes (o_proj) and 3,072 (down_proj), bf16.
ModelConfig rows_config() {
  return parse_model_config(
      R"({"architectures":["LlamaForCausalLM"],"hidden_size":1024,"intermediate_size":1536,
      "num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":128,
      "torch_dtype":"bfloat16"})",
      "wide rows");
}

// Row-parallel windows of every width: the tiny configs' rows are narrow at every
// tp size (each piece's full rows read whole and cut in memory); rows of 2,048
// and 3,072 bytes have windows of 1 KiB and more at tp 2 (a request per window),
// 512 bytes on average at tp 4 (still a request per window), and 256 at tp 8,
// where four layers of narrow pieces in one large bucket exceed what a bucket
// cuts in memory (16 MiB) and the later ones take a request per window again.
// Node readers (fill_ranks) fill only their node's regions, skipping the
// windows of tp ranks no rank of the node holds.
TEST(Resolution, RowParallelWindowsOfEveryWidthLandInTheirRanks) {
  const ModelConfig config = rows_config();
  const auto ckpt = testdata::random_checkpoint(config, 77);
  // (world, tp, ranks per node: 0 for one reader): replicas of narrow and wide
  // windows, and node readers whose node holds some tp ranks' windows only.
  for (auto [world, tp, per_node] : std::vector<std::tuple<int, int, int>>{
           {2, 2, 0}, {4, 4, 0}, {8, 8, 0}, {4, 2, 0}, {16, 8, 0}, {8, 8, 4}, {4, 4, 2}}) {
    for (std::uint64_t bucket : {std::uint64_t{1} << 16, std::uint64_t{1} << 30}) {
      for (Place place : {Place::kNone, Place::kFirst, Place::kLast}) {
        auto source = testdata::memory_source(ckpt);
        const std::string what = "wide rows world " + std::to_string(world) + " tp " +
                                 std::to_string(tp) + " ranks per node " +
                                 std::to_string(per_node) + " bucket " + std::to_string(bucket) +
                                 place_name(place);
        const auto models =
            simulate(config, *source,
                     {WeightFormat::kCheckpoint, Distribution::kScatter, bucket, world, tp, 0}, "",
                     per_node, place);
        expect_equal_to(
            models, [&](int r) { return testdata::expected_shards(config, ckpt, tp, r); },
            WeightFormat::kCheckpoint, what);
      }
    }
  }
}

// What a node reader copies into its send buffer (bytes_copied, the bench's
// "copies per byte"): exactly its node's regions when every row-parallel piece
// is narrow (cut in memory: the other node's windows are read into the rows
// buffer, never into the send buffer). World 8, tp 8, nodes of 4: 256 and
// 384-byte windows.
TEST(Resolution, ANodeReaderCopiesExactlyItsNodesRegions) {
  const ModelConfig config = rows_config();
  const auto ckpt = testdata::random_checkpoint(config, 78);
  auto source = testdata::memory_source(ckpt);
  const SourceMetadata md = metadata_of(*source);
  const PlanOptions o{WeightFormat::kCheckpoint, Distribution::kScatter, 1 << 16, 8, 8, 0};
  ModelOptions mo;
  mo.tp_size = 8;
  const TensorParallelModel model(config, mo);
  const Plan plan = make_plan(md, model.rules(), o);
  detail::BucketReader reader(plan, md, *source, 8, 8, /*zero_copy=*/false);
  std::vector<std::byte> send(plan.largest_bucket);
  int scatter_buckets = 0;
  for (const std::vector<int>& node : {std::vector<int>{0, 1, 2, 3}, std::vector<int>{4, 5, 6, 7}})
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      const Bucket& bucket = plan.buckets[b];
      if (!bucket.scatter) continue;
      ++scatter_buckets;
      std::uint64_t regions = 0;
      for (int w : node) regions += bucket.ranges[static_cast<std::size_t>(w)].length;
      const std::uint64_t before = reader.bytes_copied();
      reader.fill_ranks(b, node, send.data());
      EXPECT_EQ(reader.bytes_copied() - before, regions)
          << "bucket " << b << " of node " << node.front();
    }
  EXPECT_GT(scatter_buckets, 4);
}

// A bucket summed as it is read (BucketReader::Filled, how the reader rank
// computes the CRC-32C of what each rank receives): each region's spans come in
// order and tile it (a broadcast bucket: all the bytes returned), and the CRC
// extended over the spans as they were handed equals the CRC of the region's
// final bytes (the send buffer holds a marker before each fill, so a span
// handed before its bytes landed sums the marker), which equal a fill without
// the callback. From a safetensors file (a region of more than two steps comes
// in several spans, while it is read), from its mapping (zero copy) and from
// memory (requests not cut). Wide and narrow windows, replicas, every node's
// reader, with and without replicas in the node.
TEST(Resolution, SummedAsReadEveryRegionInOrderWithItsFinalBytes) {
  for (const char* name : {"wide rows", "qwen3_moe"}) {
    const bool wide = std::string(name) == "wide rows";
    const ModelConfig config = wide ? rows_config() : testdata::tiny_config(name);
    const auto ckpt = testdata::random_checkpoint(config, 79);
    const std::string file = ::testing::TempDir() + "tpreload-summed-as-read.safetensors";
    write_safetensors(file, testdata::in_memory(ckpt));
    for (const std::string from : {"file", "mapping", "memory"}) {
      auto source = from == "memory" ? testdata::memory_source(ckpt) : open_weight_source(file);
      const SourceMetadata md = metadata_of(*source);
      for (auto [world, tp, per_node] : std::vector<std::tuple<int, int, int>>{
               {2, 2, 0}, {4, 4, 0}, {4, 2, 0}, {8, 8, 0}, {8, 8, 4}, {8, 2, 4}}) {
        for (auto [d, place] :
             std::vector<std::pair<Distribution, bool>>{{Distribution::kBroadcast, false},
                                                        {Distribution::kScatter, false},
                                                        {Distribution::kScatter, true}}) {
          const std::uint64_t bucket_bytes = wide ? std::uint64_t{3} << 20 : 700;
          const PlanOptions o{WeightFormat::kCheckpoint, d, bucket_bytes, world, tp, 4096};
          ModelOptions mo;
          mo.tp_size = tp;
          const Plan plan = make_plan(md, TensorParallelModel(config, mo).rules(), o);
          const bool zero_copy = from == "mapping";
          detail::BucketReader reader(plan, md, *source, world, tp, zero_copy);
          detail::BucketReader plain(plan, md, *source, world, tp, zero_copy);
          std::vector<std::byte> send(plan.largest_bucket), want(plan.largest_bucket);
          const std::string what =
              std::string(name) + " " + from + " world " + std::to_string(world) + " tp " +
              std::to_string(tp) + " nodes of " + std::to_string(per_node) + " " +
              std::string(distribution_name(d)) + (place ? " reader's region placed" : "");
          std::size_t stepped = 0;  // regions handed in more than one span
          const int per = per_node ? per_node : world;
          // With `place`, each node's reader (its first rank) reads its own rows
          // into a model of its own: that region is never handed, the others
          // are as without it (a replica of the reader copies from its rows).
          struct Reader {
            std::unique_ptr<TensorParallelModel> model;
            std::vector<detail::DirectReads> own;
            std::vector<std::byte*> storage;
          };
          std::map<int, Reader> readers;
          for (int node = 0; place && node < world; node += per) {
            ModelOptions mine = mo;
            mine.tp_rank = node % tp;
            Reader& r = readers[node];
            r.model = std::make_unique<TensorParallelModel>(config, mine);
            r.own =
                detail::place_own_writes(plan, resolve_applies(plan, md, r.model->rules(), o, node),
                                         r.model->rules().params(), node);
            for (ParamSlot slot = 0; slot < r.model->sink().size(); ++slot)
              r.storage.push_back(r.model->sink().storage(slot).data);
          }
          std::uint64_t placed_bytes = 0;
          for (std::size_t b = 0; b < plan.buckets.size(); ++b)
            for (int node = 0; node < world; node += per) {
              const Bucket& bucket = plan.buckets[b];
              std::vector<int> ranks;  // the regions filled
              for (int w = node; w < node + per; ++w) ranks.push_back(w);
              struct Seen {
                std::vector<ConstBytes> spans;
                std::uint32_t crc = 0;  // of the spans' bytes when they were handed
              };
              std::map<int, Seen> seen;
              const detail::BucketReader::Filled filled = [&](int region, ConstBytes span) {
                EXPECT_EQ(region < 0, !bucket.scatter) << what << " bucket " << b;
                Seen& s = seen[region];
                s.spans.push_back(span);
                s.crc = crc32c_extend(s.crc, span.data, span.size);
              };
              const auto marker = static_cast<int>(0x11 * (b % 15 + 1));
              std::memset(send.data(), marker, send.size());
              std::memset(want.data(), marker ^ 0xFF, want.size());
              detail::Placed placed;
              if (place) {
                const Reader& r = readers.at(node);
                placed = {node, &r.own.at(b).spans, r.storage.data()};
                for (const detail::DirectSpan& p : r.own.at(b).spans)
                  placed_bytes += p.end - p.begin;
              }
              const ConstBytes got = per_node
                                         ? reader.fill_ranks(b, ranks, send.data(), filled, placed)
                                         : reader.fill(b, send.data(), filled, placed);
              const ConstBytes plain_got =
                  per_node ? plain.fill_ranks(b, ranks, want.data()) : plain.fill(b, want.data());
              std::vector<std::pair<int, ByteRange>> checked;  // (region, its bytes in `got`)
              if (bucket.scatter)
                for (int w : ranks) {
                  if (placed.spans && !placed.spans->empty() && w == node) {
                    EXPECT_EQ(seen.count(w), 0u) << what << " bucket " << b << ": placed, handed";
                    continue;
                  }
                  checked.push_back({w, bucket.ranges[w]});
                }
              else
                checked.push_back({-1, {0, got.size}});
              for (const auto& [region, r] : checked) {
                const std::string where =
                    what + " bucket " + std::to_string(b) + " region " + std::to_string(region);
                const Seen& s = seen[region];
                std::uint64_t next = 0;
                for (const ConstBytes& span : s.spans) {
                  ASSERT_EQ(span.data, got.data + r.offset + next) << where << ": out of order";
                  next += span.size;
                }
                EXPECT_EQ(next, r.length) << where << ": the spans do not cover it";
                EXPECT_EQ(s.crc, crc32c(got.data + r.offset, r.length)) << where;
                EXPECT_EQ(std::memcmp(got.data + r.offset, plain_got.data + r.offset, r.length), 0)
                    << where;
                if (s.spans.size() > 1) ++stepped;
                if (from == "file" && !bucket.scatter &&
                    r.length > 2 * detail::BucketReader::kFilledStep) {
                  EXPECT_GT(s.spans.size(), 2u) << where;
                }
              }
            }
          if (wide && from == "file" && world <= 4) {
            EXPECT_GT(stepped, 0u) << what << ": no region was handed in steps";
          }
          if (place) {
            EXPECT_GT(placed_bytes, 0u) << what << ": nothing was placed";
          }
        }
      }
    }
  }
}

TEST(Resolution, KernelFormatShardsLandByName) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 32);
  const std::string dir = ::testing::TempDir() + "tpreload-resolution-kernel";
  for (const std::string quant : {"", "int8"}) {
    std::filesystem::remove_all(dir + quant);
    auto checkpoint = testdata::memory_source(ckpt);
    write_kernel_shards(config, *checkpoint, dir + quant, {2, quant});
    // What each tp rank must hold: its model loaded locally (checked elsewhere
    // against the independent slices and the int8 formula).
    std::map<int, std::map<std::string, at::Tensor>> want;
    for (int r = 0; r < 2; ++r) {
      ModelOptions mo;
      mo.tp_size = 2;
      mo.tp_rank = r;
      mo.quantization = quant;
      TensorParallelModel local(config, mo);
      auto s = testdata::memory_source(ckpt);
      local.load_weights(*s);
      for (const auto& [n, t] : local.named_parameters()) want[r][n] = t.clone();
    }
    for (Distribution d : {Distribution::kBroadcast, Distribution::kScatter})
      for (Place place :
           {Place::kNone, d == Distribution::kScatter ? Place::kLast : Place::kNone}) {
        auto source = open_weight_source(dir + quant);
        const auto models =
            simulate(config, *source, {WeightFormat::kKernel, d, 500, 4, 2}, quant, 0, place);
        expect_equal_to(
            models, [&](int r) { return want[r]; }, WeightFormat::kKernel,
            "kernel " + quant + " " + std::string(distribution_name(d)) + place_name(place));
      }
  }
}

// Which of a rank's writes its own regions are read straight into: plain
// copies of contiguous rows inside their parameter and the region, whose source
// bytes no other write of the bucket reads and whose rows no other write or
// zeroing of any bucket touches; in scatter buckets only. Each is placed at its
// parameter's rows (the address worked out here from the tensor itself).
TEST(Resolution, OnlyPlainCopiesWhoseSourceAndRowsNoOtherWriteSharesArePlaced) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  ModelOptions mo;
  mo.tp_size = 2;
  mo.tp_rank = 1;
  TensorParallelModel model(config, mo);
  const auto& params = model.rules().params();
  const auto slot_of = [&](const std::string& name) {
    for (std::size_t i = 0; i < params.size(); ++i)
      if (params[i].name == name) return static_cast<ParamSlot>(i);
    ADD_FAILURE() << name;
    return ParamSlot{0};
  };
  const std::string a_name = "model.layers.0.self_attn.o_proj.weight";
  const std::string b_name = "model.layers.1.self_attn.o_proj.weight";
  const ParamSlot a = slot_of(a_name), b = slot_of(b_name);
  const at::Tensor ta = model.parameter_for_reload(a_name), tb = model.parameter_for_reload(b_name);
  ASSERT_EQ(ta.sizes(), tb.sizes());
  const auto width = static_cast<std::uint64_t>(ta.size(1) * ta.element_size());
  const std::int64_t rows = ta.size(0);
  ASSERT_GE(rows, 42);
  auto copy = [&](ParamSlot slot, std::uint64_t src, std::int64_t dest, std::int64_t n) {
    RowWrite w;
    w.slot = slot;
    w.kind = WriteKind::kCopy;
    w.src_dtype = params[slot].dtype;
    w.src_offset = src;
    w.src_pitch = width;
    w.dest_row = dest;
    w.rows = n;
    return w;
  };
  const std::uint64_t region = 100 * width;  // world rank 1's region of the scatter buckets
  Plan plan;
  plan.buckets.resize(3);
  for (int k : {0, 1}) {
    plan.buckets[k].scatter = true;
    plan.buckets[k].ranges = {{0, 5 * width}, {5 * width, region}};
  }
  std::vector<BucketApply> applies(3);
  applies[0].writes = {
      copy(a, 0, 0, 2),                  // 0: placed
      copy(a, 10 * width, 2, 2),         // 1: its last source row is write 2's
      copy(b, 11 * width, 0, 1),         // 2
      copy(a, 20 * width, rows - 1, 2),  // 3: rows past the parameter's
      copy(b, 30 * width, 3, 1),         // 4: strided (below)
      copy(b, region - width, 5, 2),     // 5: past the region
      copy(b, 40 * width, 6, 3),         // 6: rows 6-8 of b, row 7 written in bucket 1
      copy(a, 50 * width, 4, 0),         // 7: no rows
      copy(a, 60 * width, 30, 2),        // 8: inside write 9's source, write 10 between them
      copy(a, 55 * width, 10, 8),        // 9: strided (below): reads [55, 70) rows of width
      copy(b, 57 * width, 20, 1),        // 10: inside write 9's source
      copy(a, 80 * width, 40, 1),        // 11: row 40 of a, zeroed in bucket 1
      copy(b, 90 * width, 30, 2),        // 12: placed
  };
  applies[0].writes[4].src_pitch = 2 * width;
  applies[0].writes[9].src_pitch = 2 * width;
  applies[1].writes = {copy(b, 0, 7, 1)};
  applies[1].zeros = {RowZero{a, 40, 41}};
  applies[2].writes = {copy(a, 0, 50, 1)};  // a broadcast bucket: nothing placed
  const auto own = detail::place_own_writes(plan, applies, params, 1);
  ASSERT_EQ(own.size(), 3u);
  EXPECT_EQ(own[0].placed, (std::vector<char>{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}));
  ASSERT_EQ(own[0].spans.size(), 2u);
  EXPECT_EQ(own[0].spans[0].begin, 0u);
  EXPECT_EQ(own[0].spans[0].end, 2 * width);
  EXPECT_EQ(own[0].spans[0].slot, a);
  EXPECT_EQ(own[0].spans[0].offset, 0u);
  EXPECT_EQ(own[0].spans[1].begin, 90 * width);
  EXPECT_EQ(own[0].spans[1].end, 92 * width);
  EXPECT_EQ(own[0].spans[1].slot, b);
  // Row 30 of b, from the tensor's own geometry: where those rows are in memory.
  const auto* base_b = static_cast<const std::byte*>(tb.data_ptr());
  EXPECT_EQ(model.sink().storage(b).data + own[0].spans[1].offset,
            base_b + 30 * tb.stride(0) * tb.element_size());
  EXPECT_TRUE(own[1].spans.empty());
  EXPECT_EQ(own[1].placed, std::vector<char>{0});
  EXPECT_TRUE(own[2].spans.empty());
}

TEST(Resolution, EachPieceResolvesToAtMostOneWriteAndEveryShardCompletesOnce) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  auto source = testdata::memory_source(testdata::random_checkpoint(config, 33));
  const SourceMetadata md = metadata_of(*source);
  const ShardingRules rules(config, 4, "int8");
  const PlanOptions o{WeightFormat::kCheckpoint, Distribution::kBroadcast, 700, 4, 4};
  const Plan plan = make_plan(md, rules, o);
  std::size_t pieces = 0;
  for (const Bucket& b : plan.buckets) pieces += b.pieces.size();
  for (int w = 0; w < 4; ++w) {
    const auto applies = resolve_applies(plan, md, rules, o, w);
    std::size_t writes = 0;
    std::map<ParamSlot, std::set<std::uint32_t>> completed;
    for (const BucketApply& a : applies) {
      writes += a.writes.size();
      for (const RowWrite& x : a.writes) ASSERT_LT(x.slot, rules.params().size());
      for (const auto& [slot, shard] : a.completed)
        EXPECT_TRUE(completed[slot].insert(shard).second)
            << rules.params()[slot].name << " shard completed twice";
    }
    EXPECT_LE(writes, pieces);
    for (ParamSlot s = 0; s < rules.params().size(); ++s) {
      if (!rules.params()[s].from_checkpoint) continue;
      EXPECT_EQ(completed[s].size(), rules.params()[s].shards) << rules.params()[s].name;
    }
  }
}

}  // namespace
}  // namespace tpreload
