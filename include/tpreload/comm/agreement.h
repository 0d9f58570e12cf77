// Turning one rank's problem into the same error on every rank, over the control
// plane. Used wherever ranks may fail locally before a collective step (opening a
// source, preflight, opening a device or NCCL): every rank then stops alike
// instead of leaving peers waiting.
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/core/fnv.h"

namespace tpreload {

// Marks an error every rank raised alike at the same point of its collectives
// (agree_on_problem): no transfer is in flight, so a program may end cleanly
// (finalize and exit 1) instead of aborting the job.
class AgreedError {
 public:
  virtual ~AgreedError() = default;
};

// An `E` that is also an AgreedError (catch it as E).
template <typename E>
class Agreed final : public E, public AgreedError {
 public:
  using E::E;
};

// COLLECTIVE. If any rank has a problem, every rank throws the same `E` (an
// Agreed<E>) whose message names the lowest such rank, its problem, and how many
// ranks had one: "<what> failed on rank R/N: <problem> (and on K other ranks)"
// ("1 other rank"), followed by `if_some_ranks` when some ranks had none.
template <typename E>
void agree_on_problem(Communicator& comm, const std::optional<std::string>& problem,
                      const std::string& what, const std::string& if_some_ranks = {}) {
  std::int64_t first = problem ? comm.rank() : INT64_MAX;
  comm.allreduce_ints(&first, 1, IntOp::kMin);
  if (first == INT64_MAX) return;
  std::int64_t ranks_with_problem = problem ? 1 : 0;
  comm.allreduce_ints(&ranks_with_problem, 1, IntOp::kSum);
  std::int64_t length = comm.rank() == first ? static_cast<std::int64_t>(problem->size()) : 0;
  comm.allreduce_ints(&length, 1, IntOp::kMax);
  std::string message(static_cast<std::size_t>(length), '\0');
  if (comm.rank() == first) message = *problem;
  comm.broadcast(MutableBytes(message.data(), message.size()), static_cast<int>(first));
  std::string others;
  if (ranks_with_problem > 1)
    others = detail::concat(" (and on ", ranks_with_problem - 1,
                            ranks_with_problem == 2 ? " other rank)" : " other ranks)");
  raise<Agreed<E>>(what, " failed on rank ", first, "/", comm.size(), ": ", message, others,
                   ranks_with_problem < comm.size() ? if_some_ranks : std::string());
}

// One value every rank must pass alike, and what an error shows of it.
struct AgreedValue {
  std::string name;
  std::uint64_t value = 0;
  std::string shown;    // what an error shows of it (texts of over 95 bytes cut)
  bool opaque = false;  // a hash: an error says only which ranks hold which
  // An opaque hash may list what it hashes, one text per item (each parameter
  // of a layout), so that an error can also show the first item that differs:
  // called only where ranks hold different hashes. Each text must carry every
  // bit of its item that the hash does. `item` names one ("parameter").
  std::function<std::vector<std::string>()> items;
  std::string item;

  // (Templates so that an int is neither ambiguous nor read as a bool.)
  template <typename I,
            std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
  AgreedValue(std::string name_, I number)
      : name(std::move(name_)),
        value(static_cast<std::uint64_t>(number)),
        shown(std::to_string(number)) {}
  template <typename B, std::enable_if_t<std::is_same_v<B, bool>, int> = 0>
  AgreedValue(std::string name_, B flag)
      : name(std::move(name_)), value(flag ? 1 : 0), shown(flag ? "true" : "false") {}
  // Compared by its FNV-1a, the same whatever build each rank runs; an empty
  // text shown as ''.
  AgreedValue(std::string name_, std::string_view text)
      : name(std::move(name_)),
        value(fnv1a(text)),
        shown(text.empty() ? "''" : std::string(text)) {}

  static AgreedValue opaque_hash(std::string name, std::uint64_t hash,
                                 std::function<std::vector<std::string>()> items = {},
                                 std::string item = "item") {
    AgreedValue v(std::move(name), hash);
    v.opaque = true;
    v.items = std::move(items);
    v.item = std::move(item);
    return v;
  }
};

namespace detail {
// COLLECTIVE (two allreduces; two more where values differ, and for each
// opaque value that differs one more, two more where every rank lists its
// items, and two more where an item differs). Empty where every
// rank passed the same values; otherwise the error agree_on_values raises.
std::string disagreement(Communicator& comm, const std::vector<AgreedValue>& values,
                         const std::string& consequence);
}  // namespace detail

// COLLECTIVE. Every rank passes the same list of named values (options, hashes
// of what must match: the same names in the same order, each opaque or not
// alike; only the values may differ); if any value differs between ranks,
// every rank throws the same Agreed<E>: "ranks disagree on <names>" followed by
// `consequence`, then which ranks hold which value of each: "; by rank:
// <name>: 8 on ranks 0-2, 4 on rank 3" (an opaque one: "one value on ranks
// 0-2, another on rank 3"; one with items adds the first that differs: " (the
// first that differs, counting from 0: parameter 12: 'a' on ranks 0-2, 'b' on
// rank 3)", each text up to 255 bytes, a rank whose list ends before it
// showing "none (12 in all)"; where any rank's items() throws, none is shown).
// Every bit of a value counts.
template <typename E>
void agree_on_values(Communicator& comm, const std::vector<AgreedValue>& values,
                     const std::string& consequence) {
  const std::string error = detail::disagreement(comm, values, consequence);
  if (!error.empty()) raise<Agreed<E>>(error);
}

}  // namespace tpreload
