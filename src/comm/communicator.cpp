#include "tpreload/comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "tpreload/core/error.h"

namespace tpreload {

void detail::check_timeout(const char* what, std::chrono::milliseconds timeout) {
  constexpr std::chrono::hours kYear{24 * 366};
  if (timeout.count() <= 0 || timeout > kYear)
    raise<UsageError>(what, " must be positive and at most a year (", kYear.count() * 3600000,
                      " ms), got ", timeout.count(), " ms");
}

void detail::check_scatter_arguments(const std::string& who, int rank, int size, ConstBytes send,
                                     const std::vector<ByteRange>& ranges, MutableBytes recv,
                                     bool root) {
  if (ranges.size() != static_cast<std::size_t>(size))
    raise<UsageError>(who, ": got ", ranges.size(), " ranges for ", size, " ranks");
  const ByteRange& own = ranges[static_cast<std::size_t>(rank)];
  if (recv.size != own.length)
    raise<UsageError>(who, ": the receive buffer holds ", recv.size,
                      " bytes but the range for this rank is ", own.length, " bytes");
  if (!root) return;
  for (std::size_t r = 0; r < ranges.size(); ++r)
    if (ranges[r].offset > send.size || ranges[r].length > send.size - ranges[r].offset)
      raise<UsageError>(who, ": the range for rank ", r, " [", ranges[r].offset, ", +",
                        ranges[r].length, ") exceeds the ", send.size, "-byte send buffer");
}

std::vector<std::string> gather_texts(Communicator& comm, const std::vector<std::string>& slots,
                                      std::size_t slot_words) {
  const std::size_t slot_bytes = slot_words * 8;
  std::vector<std::uint64_t> words(slots.size() * slot_words, 0);  // (each slot has one owner)
  for (std::size_t i = 0; i < slots.size(); ++i)
    std::memcpy(&words[i * slot_words], slots[i].data(), std::min(slots[i].size(), slot_bytes - 1));
  if (!words.empty()) comm.allreduce_bits(words.data(), words.size(), BitOp::kOr);
  std::vector<std::string> texts;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const char* text = reinterpret_cast<const char*>(&words[i * slot_words]);
    texts.emplace_back(text, strnlen(text, slot_bytes));
  }
  return texts;
}

std::vector<std::string> host_names(Communicator& comm) {
  constexpr std::size_t kWords = 9;  // 72 bytes: HOST_NAME_MAX (64) and its end
  static_assert(HOST_NAME_MAX < kWords * 8, "a host name fits its words");
  std::vector<std::string> slots(static_cast<std::size_t>(comm.size()));  // each rank sets its own
  char host[HOST_NAME_MAX + 1] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  slots[static_cast<std::size_t>(comm.rank())] = host;
  return gather_texts(comm, slots, kWords);
}

// The first rank whose host name is this rank's (names compared whole, not
// hashed).
int Communicator::node_leader() {
  const std::vector<std::string> hosts = host_names(*this);
  const auto me = static_cast<std::size_t>(rank());
  std::size_t leader = 0;
  while (hosts[leader] != hosts[me]) ++leader;
  return static_cast<int>(leader);
}

}  // namespace tpreload
