// A WeightStream over tensors the test holds, counting what the reload holds
// of it: each yielded tensor counts from its yield until the reload drops it
// (its keep_alive). Optionally throws instead of yielding tensor `fail_at`,
// or yields tensor `again` a second time after the last. No torch here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "tpreload/checkpoint/weight_source.h"

namespace tpreload::testing {

struct StreamCounts {
  std::uint64_t live = 0;  // bytes yielded and not yet dropped
  std::uint64_t most = 0;  // the most live at once
  std::size_t yielded = 0;
};

struct StreamFaults {
  std::optional<std::size_t> fail_at;  // throws "the trainer failed at tensor N"
  std::optional<std::size_t> again;    // yields this one once more at the end
};

inline std::unique_ptr<WeightStream> counting_stream(
    std::vector<InMemoryTensor> tensors, std::shared_ptr<StreamCounts> counts,
    std::optional<KernelFormatInfo> kernel = std::nullopt, StreamFaults faults = {}) {
  struct Dropped {  // (dropping the last copy of a yielded tensor)
    std::shared_ptr<const void> inner;
    std::shared_ptr<StreamCounts> counts;
    std::uint64_t bytes = 0;
    ~Dropped() {
      if (counts) counts->live -= bytes;
    }
  };
  auto all = std::make_shared<std::vector<InMemoryTensor>>(std::move(tensors));
  auto next = std::make_shared<std::size_t>(0);
  return make_weight_stream(
      [all, next, counts, faults]() -> std::optional<InMemoryTensor> {
        const std::size_t i = (*next)++;
        if (faults.fail_at && i == *faults.fail_at)
          throw std::runtime_error("the trainer failed at tensor " + std::to_string(i));
        std::size_t index = i;
        if (i >= all->size()) {
          if (!faults.again || i > all->size()) return std::nullopt;
          index = *faults.again;
        }
        InMemoryTensor t = (*all)[index];
        auto dropped = std::make_shared<Dropped>();
        dropped->inner = t.keep_alive;
        dropped->counts = counts;
        dropped->bytes = t.bytes.size;
        t.keep_alive = std::move(dropped);
        counts->live += t.bytes.size;
        counts->most = std::max(counts->most, counts->live);
        ++counts->yielded;
        return t;
      },
      std::move(kernel), "test stream");
}

}  // namespace tpreload::testing
