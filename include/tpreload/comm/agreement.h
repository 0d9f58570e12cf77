// Turning one rank's problem into the same error on every rank, over the control
// plane. Used wherever ranks may fail locally before a collective step (opening a
// source, preflight, opening a device or NCCL): every rank then stops alike
// instead of leaving peers waiting.
#pragma once

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
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
// ranks had one: "<what> failed on rank R/N: <problem> (and on K other ranks)",
// followed by `if_some_ranks` when some ranks had none.
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
    others = detail::concat(" (and on ", ranks_with_problem - 1, " other ranks)");
  raise<Agreed<E>>(what, " failed on rank ", first, "/", comm.size(), ": ", message, others,
                   ranks_with_problem < comm.size() ? if_some_ranks : std::string());
}

// The value agree_on_values compares for a text (an option's spelling, a path):
// its FNV-1a, the same whatever build each rank runs.
inline std::uint64_t text_value(const std::string& text) {
  return fnv1a(text);
}

// COLLECTIVE (two allreduces). Every rank passes the same list of named values
// (options, hashes of what must match); if any value differs between ranks,
// every rank throws the same Agreed<E>: "ranks disagree on <names>" followed by
// `consequence`. Every bit of a value counts.
template <typename E>
void agree_on_values(Communicator& comm,
                     const std::vector<std::pair<std::string, std::uint64_t>>& values,
                     const std::string& consequence) {
  std::vector<std::int64_t> lo, hi;
  for (const auto& v : values) lo.push_back(static_cast<std::int64_t>(v.second));
  hi = lo;
  allreduce_ints(comm, lo, IntOp::kMin);
  allreduce_ints(comm, hi, IntOp::kMax);
  std::string differ;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (lo[i] != hi[i]) differ += (differ.empty() ? "" : ", ") + values[i].first;
  if (!differ.empty()) raise<Agreed<E>>("ranks disagree on ", differ, consequence);
}

}  // namespace tpreload
