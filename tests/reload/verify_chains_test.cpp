// The CRC-32C chains of broadcast buckets (src/reload/verify_chains.h): each tp
// rank's chain is exactly the bytes its writes alone read, the shared chain the
// bytes several ranks' writes read, and a rank's checks are exactly the chains
// its writes read. What every rank reads is worked out here from the writes
// themselves, row by row (resolve_applies, for every tp rank), never from the
// layout; the CRC-32Cs from those bytes copied out in order.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "../../src/reload/verify_chains.h"
#include "../support/tiny_models.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/crc32c.h"
#include "tpreload/core/error.h"
#include "tpreload/model/kernel_shards.h"
#include "tpreload/model/sharding.h"
#include "tpreload/reload/plan.h"

namespace tpreload {
namespace {

struct Case {
  std::string what;
  SourceMetadata md;
  ShardingRules rules;
  PlanOptions options;
};

// Each bucket byte one of `writes` reads, row by row: each(byte).
template <typename Each>
void for_each_byte_read(const std::vector<RowWrite>& writes, const ShardingRules& rules,
                        Each&& each) {
  for (const RowWrite& w : writes) {
    const std::uint64_t row = write_source_row_bytes(w, rules.params().at(w.slot));
    for (std::int64_t i = 0; i < w.rows; ++i)
      for (std::uint64_t b = 0; b < row; ++b)
        each(w.src_offset + static_cast<std::uint64_t>(i) * w.src_pitch + b);
  }
}

// Per byte of a bucket: how many tp ranks' writes read it, and the last that did.
struct Readers {
  std::vector<int> count, rank;
};

Readers readers_of(const Case& c, const Plan& plan, std::size_t bucket) {
  Readers out{std::vector<int>(plan.buckets[bucket].bytes, 0),
              std::vector<int>(plan.buckets[bucket].bytes, -1)};
  for (int r = 0; r < c.options.tp_size; ++r) {
    std::vector<char> mine(plan.buckets[bucket].bytes, 0);
    const auto applies = resolve_applies(plan, c.md, c.rules, c.options, r);
    for_each_byte_read(applies[bucket].writes, c.rules, [&](std::uint64_t at) { mine.at(at) = 1; });
    for (std::size_t b = 0; b < mine.size(); ++b)
      if (mine[b]) {
        ++out.count[b];
        out.rank[b] = r;
      }
  }
  return out;
}

void check_case(const Case& c, std::size_t& buckets_checked) {
  const Plan plan = make_plan(c.md, c.rules, c.options);
  const int tp = c.options.tp_size, shared = tp;
  std::mt19937_64 rng(7);
  for (std::size_t k = 0; k < plan.buckets.size(); ++k) {
    const Bucket& bucket = plan.buckets[k];
    if (bucket.scatter) continue;
    ++buckets_checked;
    const std::string what = c.what + " bucket " + std::to_string(k + 1);
    const detail::ChainLayout layout = detail::chain_layout(plan, c.md, bucket, tp);
    ASSERT_EQ(layout.chains, tp + 1) << what;
    const Readers readers = readers_of(c, plan, k);
    // Each chain's bytes, in bucket order, as the writes say.
    std::vector<std::byte> bytes(bucket.bytes);
    for (auto& b : bytes) b = static_cast<std::byte>(rng());
    std::vector<std::vector<std::byte>> of_chain(tp + 1);
    for (std::size_t b = 0; b < bytes.size(); ++b)
      if (readers.count[b] > 0)
        of_chain[readers.count[b] == 1 ? readers.rank[b] : shared].push_back(bytes[b]);
    // Summed in one span, and in spans cut anywhere (as the reader reads them).
    std::vector<std::uint32_t> whole(tp + 1, 0), cut(tp + 1, 0);
    detail::extend_chains(layout, 0, ConstBytes(bytes.data(), bytes.size()), nullptr, whole);
    for (std::uint64_t at = 0; at < bytes.size();) {
      const std::uint64_t n = std::min<std::uint64_t>(bytes.size() - at, 1 + rng() % 3000);
      detail::extend_chains(layout, at, ConstBytes(bytes.data() + at, n), nullptr, cut);
      at += n;
    }
    for (int chain = 0; chain <= tp; ++chain) {
      const auto& mine = of_chain[chain];
      const std::uint32_t want = crc32c(mine.data(), mine.size());
      EXPECT_EQ(whole[chain], want) << what << " chain " << chain;
      EXPECT_EQ(cut[chain], want) << what << " chain " << chain << ", summed in cut spans";
      EXPECT_EQ(detail::chain_bytes(layout, chain), mine.size()) << what << " chain " << chain;
    }
    // What each rank checks: its chain where it alone reads bytes, the shared
    // chain where it reads bytes another rank reads too, nothing else.
    for (int r = 0; r < tp; ++r) {
      std::vector<char> want(tp + 1, 0);
      const auto writes = resolve_applies(plan, c.md, c.rules, c.options, r).at(k).writes;
      for_each_byte_read(writes, c.rules,
                         [&](std::uint64_t at) { want[readers.count[at] == 1 ? r : shared] = 1; });
      EXPECT_EQ(detail::chains_read(layout, writes, c.rules.params()), want)
          << what << " tp rank " << r;
    }
  }
}

TEST(VerifyChains, EachChainIsTheBytesItsRanksWritesReadAndEachRankChecksItsOwn) {
  std::size_t buckets = 0, cases = 0;
  auto run = [&](const std::string& what, WeightSource& source, const ModelConfig& config, int tp,
                 const std::string& quant, WeightFormat format) {
    // (Phi-3: the stacked tensors as the parts the loaders take, as a reload lists them)
    const auto view = format == WeightFormat::kCheckpoint ? loader_view(source, config) : nullptr;
    const WeightSource& listed = view ? *view : source;
    for (std::uint64_t bucket_bytes : {std::uint64_t{700}, std::uint64_t{1} << 20}) {
      Case c{what + " tp " + std::to_string(tp) + " buckets of " + std::to_string(bucket_bytes),
             {listed.describe(), listed.tensors(), listed.kernel_format()},
             ShardingRules(config, tp, quant),
             {format, Distribution::kBroadcast, bucket_bytes, tp, tp, 0}};
      check_case(c, buckets);
      ++cases;
    }
  };
  for (const char* name : testdata::kTinyConfigs) {
    const ModelConfig config = testdata::tiny_config(name);
    auto source = testdata::memory_source(testdata::random_checkpoint(config, 41));
    for (int tp : {1, 2, 4, 8}) {
      try {
        ShardingRules probe(config, tp);
      } catch (const ModelError&) {
        continue;  // (this config cannot be split tp ways)
      }
      run(name, *source, config, tp, "", WeightFormat::kCheckpoint);
    }
  }
  // int8 (writes that read their rows in another dtype) and kernel-format shards.
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  const auto ckpt = testdata::random_checkpoint(config, 42);
  auto checkpoint = testdata::memory_source(ckpt);
  run("llama_gqa int8", *checkpoint, config, 2, "int8", WeightFormat::kCheckpoint);
  for (const std::string quant : {"", "int8"}) {
    const std::string dir = ::testing::TempDir() + "tpreload-verify-chains-kernel" + quant;
    std::filesystem::remove_all(dir);
    write_kernel_shards(config, *checkpoint, dir, {2, quant});
    auto shards = open_weight_source(dir);
    run("llama_gqa kernel " + quant, *shards, config, 2, quant, WeightFormat::kKernel);
  }
  EXPECT_GT(cases, 30u);
  EXPECT_GT(buckets, 300u);
}

// A write that reads bytes outside every chain (a layout that disagrees with
// the writes) is refused, naming the parameter and the bytes: those bytes would
// otherwise be applied without a check. A write inside a chain is not.
TEST(VerifyChains, AWriteThatReadsBytesInNoChainIsRefused) {
  detail::ChainLayout layout;
  layout.chains = 3;
  layout.segments = {{0, 48, 1}, {64, 100, 0}};  // bytes 48-63 of each row in no chain
  layout.runs = {{1000, 100, 4, 0, 2}};          // 4 rows of 100 bytes from byte 1000
  ParamSpec param;
  param.name = "w";
  param.dtype = DType::kFloat32;
  RowWrite w;
  w.slot = 0;
  w.src_dtype = DType::kFloat32;
  w.src_pitch = 100;
  w.rows = 4;
  // Bytes [0, 48) of every row: chain 1 only.
  param.shape = {4, 12};
  w.src_offset = 1000;
  EXPECT_EQ(detail::chains_read(layout, {w}, {param}), (std::vector<char>{0, 1, 0}));
  // Bytes [64, 100) of every row: chain 0 only.
  param.shape = {4, 9};
  w.src_offset = 1064;
  EXPECT_EQ(detail::chains_read(layout, {w}, {param}), (std::vector<char>{1, 0, 0}));
  // Bytes [40, 60) of every row: 12 of its 20 bytes lie in no chain.
  param.shape = {4, 5};
  w.src_offset = 1040;
  try {
    detail::chains_read(layout, {w}, {param});
    ADD_FAILURE() << "a write reading bytes in no chain was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cover only 8 of the 20 bytes [1040, 1060) that a "
                                         "write into w reads"),
              std::string::npos)
        << e.what();
  }
  // Contiguous rows past the run's end: the bytes after it are in no chain.
  param.shape = {4, 25};
  w.src_offset = 1300;
  w.rows = 2;
  EXPECT_THROW(detail::chains_read(layout, {w}, {param}), Error);
}

}  // namespace
}  // namespace tpreload
