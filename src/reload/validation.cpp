#include "validation.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sync.h"
#include "tpreload/comm/agreement.h"
#include "tpreload/core/error.h"

namespace tpreload::detail {

// COLLECTIVE. Ranks that hold the same tp rank in different replicas must hold
// the same bytes: every rank's CRC-32C of each parameter (in the rules' order,
// the same on every rank) is summed slot by slot over the world, and every rank
// groups each tp rank's world ranks by the value they hold. The same
// ValidationError on every rank names each parameter that differs and which
// ranks hold which value.
void compare_replicas(Communicator& world, int serving, ReloadTarget& model,
                      std::chrono::milliseconds device_timeout) {
  // (the serving ranks: those that hold parameters, ReloadOptions::serving_ranks)
  const int n = serving, tp = model.rules().tp_size();
  if (n <= tp) return;
  const auto& params = model.rules().params();
  const auto all = static_cast<std::size_t>(world.size());
  std::vector<std::int64_t> crcs(params.size() * all, 0);
  std::optional<std::string> problem;  // reading a parameter back can fail on one rank
  try {
    for (std::size_t i = 0; model.sink().holds_parameters() && i < params.size(); ++i) {
      const ParamStorage& s = model.sink().storage(static_cast<ParamSlot>(i));
      crcs[i * all + static_cast<std::size_t>(world.rank())] =
          model.sink().crc32c(s.data, s.bytes, "'" + params[i].name + "'", device_timeout);
    }
  } catch (const std::exception& e) {
    problem = e.what();
  }
  agree_on_problem<CommError>(world, problem, "checksumming the parameters to compare replicas");
  allreduce_ints(world, crcs, IntOp::kSum);
  // Per parameter and tp rank, which world ranks hold which CRC.
  std::string differ;
  std::size_t count = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::string groups;
    for (int r = 0; r < tp; ++r) {
      std::map<std::int64_t, std::string> holders;
      for (int w = r; w < n; w += tp) {
        std::string& ranks = holders[crcs[i * all + static_cast<std::size_t>(w)]];
        ranks += detail::concat(ranks.empty() ? "" : ", ", w);
      }
      if (holders.size() < 2) continue;
      std::string by_value;
      for (const auto& [crc, ranks] : holders)
        by_value += detail::concat(by_value.empty() ? "" : "; ", "CRC-32C ", crc,
                                   " on world ranks ", ranks);
      groups += detail::concat(groups.empty() ? "" : ", ", "tp rank ", r, ": ", by_value);
    }
    if (groups.empty()) continue;
    if (count++ < 8)
      differ += detail::concat(differ.empty() ? "" : "; ", "'", params[i].name, "' (", groups, ")");
  }
  if (count)
    raise<Agreed<ValidationError>>(
        "replicas differ after the reload: ", count,
        " parameter(s) hold different bytes on replicas of the same tp rank: ", differ,
        count > 8 ? "; ..." : "");
}

// COLLECTIVE. Bitsets of loaded names: OR says someone loaded it, AND that all did.
// Bit i: the i-th expected parameter (in slot order) by slot, no names copied.
void validate(Communicator& world, const ReloadTarget& model, WeightFormat format,
              ReloadResult& result) {
  const ParameterSink& sink = model.sink();
  const std::vector<ParamSpec>& params = model.rules().params();
  const std::vector<ParamSlot> expected = sink.expected_slots(format);
  const std::size_t words = (expected.size() + 63) / 64;
  std::vector<std::uint64_t> mine(words, 0);
  for (std::size_t i = 0; i < expected.size(); ++i)
    if (sink.loaded(expected[i])) mine[i / 64] |= 1ull << (i % 64);
  // (a rank that holds no parameters, push_shards, counts as neither)
  auto any = mine, all = mine;
  if (!sink.holds_parameters()) std::fill(all.begin(), all.end(), ~std::uint64_t{0});
  allreduce_bits(world, any, BitOp::kOr);
  allreduce_bits(world, all, BitOp::kAnd);
  std::vector<std::size_t> partial;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const std::uint64_t bit = 1ull << (i % 64);
    if (!(any[i / 64] & bit))
      result.not_loaded_on_all_ranks.push_back(params[expected[i]].name);
    else if (!(all[i / 64] & bit))
      partial.push_back(i);
  }
  if (partial.empty()) return;
  // Which ranks miss each partially loaded name: one row per name, one column per rank.
  const int n = world.size();
  std::vector<std::int64_t> has(partial.size() * n, 0);
  for (std::size_t k = 0; k < partial.size(); ++k)
    has[k * n + world.rank()] =
        sink.holds_parameters() ? (mine[partial[k] / 64] >> (partial[k] % 64)) & 1 : 1;
  allreduce_ints(world, has, IntOp::kSum);
  for (std::size_t k = 0; k < partial.size(); ++k)
    for (int r = 0; r < n; ++r)
      if (!has[k * n + r])
        result.not_loaded_on_some_ranks[params[expected[partial[k]]].name].push_back(r);
}

}  // namespace tpreload::detail
