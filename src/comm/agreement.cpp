#include "tpreload/comm/agreement.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace tpreload {
namespace {

constexpr std::size_t kShownGroups = 3;  // values named per part; the rest counted
constexpr std::size_t kTextWords = 12;   // 96 bytes of a value's text, with its end
constexpr std::size_t kItemWords = 32;   // 256 of an item's (a parameter's whole line)

// "rank 3", "ranks 0-2, 5" (ascending ranks).
std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

// A value's text as it travels: at most `words` * 8 - 1 bytes. A longer one
// keeps its head and tail (where configs' texts differ, often), and a short
// hash of the whole, so that texts cut alike still show apart.
std::string clipped(const std::string& text, std::size_t words) {
  const std::size_t kMax = words * 8 - 1, kTail = 24;
  if (text.size() <= kMax) return text;
  char hash[16];
  std::snprintf(hash, sizeof hash, " #%06llx",
                static_cast<unsigned long long>(fnv1a(text) & 0xffffff));
  const std::size_t head = kMax - 3 - kTail - std::strlen(hash);
  return text.substr(0, head) + "..." + text.substr(text.size() - kTail) + hash;
}

// The ranks holding each value of one part, in the order of their lowest rank.
struct Group {
  std::uint64_t value;
  std::vector<int> ranks;
};

std::vector<Group> groups_of(const std::uint64_t* held, int size) {
  std::vector<Group> groups;
  for (int r = 0; r < size; ++r) {
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const Group& x) { return x.value == held[r]; });
    if (g == groups.end())
      groups.push_back({held[r], {r}});
    else
      g->ranks.push_back(r);
  }
  return groups;
}

std::string by_rank(Communicator& comm, const std::vector<AgreedValue>& values,
                    const std::vector<std::size_t>& differ, std::size_t words = kTextWords);

// COLLECTIVE (an allreduce; two more where every rank lists items; then
// by_rank's where one differs). Where an opaque value with items differs: "
// (the first that differs, counting from 0: <item> 12: 'a' on ranks 0-2, 'b'
// on rank 3)", or nothing where some rank lists no items (or failed to) or
// every item is alike.
std::string first_item_apart(Communicator& comm, const AgreedValue& v) {
  std::vector<std::string> mine;
  bool listed = static_cast<bool>(v.items);
  try {  // (a rank that cannot list them must still post what the others post)
    if (listed) mine = v.items();
  } catch (const std::exception&) {
    mine.clear();
    listed = false;
  }
  // The longest list, and whether every rank has one (0 where some rank has none).
  std::vector<std::int64_t> lists = {static_cast<std::int64_t>(mine.size()), listed ? -1 : 0};
  allreduce_ints(comm, lists, IntOp::kMax);
  if (lists[1] == 0) return {};
  const auto longest = static_cast<std::size_t>(lists[0]);
  std::vector<std::int64_t> lo(longest, 0), hi;
  for (std::size_t i = 0; i < mine.size(); ++i)  // (past a list's end: 0 then)
    lo[i] = static_cast<std::int64_t>(fnv1a(mine[i]) | 1);
  hi = lo;
  allreduce_ints(comm, lo, IntOp::kMin);
  allreduce_ints(comm, hi, IntOp::kMax);
  std::size_t first = 0;
  while (first < longest && lo[first] == hi[first]) ++first;
  if (first == longest) return {};
  const std::string text = first < mine.size() ? "'" + mine[first] + "'"
                                               : detail::concat("none (", mine.size(), " in all)");
  return " (the first that differs, counting from 0: " +
         by_rank(comm, {AgreedValue(detail::concat(v.item, " ", first), text)}, {0}, kItemWords) +
         ")";
}

// COLLECTIVE (an allreduce and a gather, then first_item_apart's for each
// opaque value). "<name>: 8 on ranks 0-2, 4 on rank 3; ..." for each of
// `values` listed in `differ` (the same on every rank), texts cut to `words`.
std::string by_rank(Communicator& comm, const std::vector<AgreedValue>& values,
                    const std::vector<std::size_t>& differ, std::size_t words) {
  // Every rank's value of each part that differs (each rank sets only its own
  // words), then the text of each value shown, from the lowest rank holding it.
  const int size = comm.size();
  const auto n = static_cast<std::size_t>(size);
  const auto me = static_cast<std::size_t>(comm.rank());
  std::vector<std::uint64_t> held(differ.size() * n, 0);
  for (std::size_t k = 0; k < differ.size(); ++k) held[k * n + me] = values[differ[k]].value;
  comm.allreduce_bits(held.data(), held.size(), BitOp::kOr);
  std::vector<std::vector<Group>> groups;
  std::size_t shown = 0;
  for (std::size_t k = 0; k < differ.size(); ++k) {
    groups.push_back(groups_of(&held[k * n], size));
    if (!values[differ[k]].opaque) shown += std::min(groups.back().size(), kShownGroups);
  }
  std::vector<std::string> slots(shown);
  for (std::size_t k = 0, slot = 0; k < differ.size(); ++k) {
    if (values[differ[k]].opaque) continue;
    for (std::size_t g = 0; g < std::min(groups[k].size(), kShownGroups); ++g, ++slot)
      if (groups[k][g].ranks.front() == comm.rank())
        slots[slot] = clipped(values[differ[k]].shown, words);
  }
  const std::vector<std::string> texts = gather_texts(comm, slots, words);

  std::vector<std::string> parts(differ.size());
  for (std::size_t k = 0, slot = 0; k < differ.size(); ++k) {
    const AgreedValue& v = values[differ[k]];
    std::string& part = parts[k];
    part = v.name + ": ";
    const std::vector<Group>& gs = groups[k];
    for (std::size_t g = 0; g < std::min(gs.size(), kShownGroups); ++g) {
      std::string what;
      if (v.opaque) {
        what = g == 0 ? "one value" : "another";
      } else {
        what = texts[slot++];
      }
      part += (g ? ", " : "") + what + " on " + rank_list(gs[g].ranks);
    }
    if (gs.size() > kShownGroups) {
      std::vector<int> rest;
      for (std::size_t g = kShownGroups; g < gs.size(); ++g)
        rest.insert(rest.end(), gs[g].ranks.begin(), gs[g].ranks.end());
      std::sort(rest.begin(), rest.end());
      const std::size_t others = gs.size() - kShownGroups;
      part += detail::concat(", ", others, others == 1 ? " other value on " : " other values on ",
                             rank_list(rest));
    }
  }
  for (std::size_t k = 0; k < differ.size(); ++k)  // (in the same order on every rank)
    if (values[differ[k]].opaque) parts[k] += first_item_apart(comm, values[differ[k]]);
  std::string out;
  for (std::size_t k = 0; k < parts.size(); ++k) out += (k ? "; " : "") + parts[k];
  return out;
}

}  // namespace

std::string detail::disagreement(Communicator& comm, const std::vector<AgreedValue>& values,
                                 const std::string& consequence) {
  std::vector<std::int64_t> lo, hi;
  for (const auto& v : values) lo.push_back(static_cast<std::int64_t>(v.value));
  hi = lo;
  allreduce_ints(comm, lo, IntOp::kMin);
  allreduce_ints(comm, hi, IntOp::kMax);
  std::vector<std::size_t> differ;  // the same on every rank
  for (std::size_t i = 0; i < values.size(); ++i)
    if (lo[i] != hi[i]) differ.push_back(i);
  if (differ.empty()) return {};
  std::string names;
  for (std::size_t k = 0; k < differ.size(); ++k) names += (k ? ", " : "") + values[differ[k]].name;
  return "ranks disagree on " + names + consequence + "; by rank: " + by_rank(comm, values, differ);
}

}  // namespace tpreload
