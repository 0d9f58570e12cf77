#include "tpreload/comm/communicator.h"

#include <unistd.h>

#include <climits>
#include <functional>
#include <string>
#include <vector>

namespace tpreload {

// Every rank's host-name hash at its own index, summed over the ranks: each rank
// then finds the first rank with its hash.
int Communicator::node_leader() {
  char host[HOST_NAME_MAX + 1] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::vector<std::int64_t> hashes(static_cast<std::size_t>(size()), 0);
  hashes[static_cast<std::size_t>(rank())] =
      static_cast<std::int64_t>(std::hash<std::string>{}(host) >> 1);
  allreduce_ints(hashes.data(), hashes.size(), IntOp::kSum);
  int leader = 0;
  while (hashes[static_cast<std::size_t>(leader)] != hashes[static_cast<std::size_t>(rank())])
    ++leader;
  return leader;
}

}  // namespace tpreload
