// What every rank of a reload must agree on, checked by the reload's first
// collective. Internal to the reload layer.
#pragma once

#include <cstdint>

#include "tpreload/reload/reload.h"

namespace tpreload {
class Communicator;
class DataTransport;
class ReloadTarget;
}  // namespace tpreload

namespace tpreload::detail {

// COLLECTIVE, and the first call of a reload: ranks whose models or options
// differ would compute different plans or post different collectives, so every
// rank stops here alike with one UsageError naming the parts that differ and
// which ranks hold which value: the config's fields that shape the weights,
// the parameter layout (names, shapes, dtypes, splits, layers, shards), the
// quantization, LoRA, expert parallelism, the tp size, the data plane, and
// every option that changes the plan or the collectives. Returns a
// fingerprint of all of them (a kept plan is keyed by it).
std::int64_t check_ranks_agree(Communicator& world, const ReloadTarget& model,
                               const ReloadOptions& options, const DataTransport& data);

}  // namespace tpreload::detail
