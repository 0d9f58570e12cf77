// After a reload's writes (internal): which expected parameters the ranks
// loaded, and whether replicas of a tp rank hold the same bytes. Both
// COLLECTIVE, with the same result or error on every rank. No torch here.
#pragma once

#include <chrono>

#include "tpreload/comm/communicator.h"
#include "tpreload/model/target.h"
#include "tpreload/reload/reload.h"

namespace tpreload::detail {

// Bitsets of loaded names over the world: OR says some rank loaded a
// parameter, AND that all did (ranks that hold no parameters count as
// neither); fills result.not_loaded_on_all_ranks and not_loaded_on_some_ranks.
void validate(Communicator& world, const ReloadTarget& model, WeightFormat format,
              ReloadResult& result);

// Ranks that hold the same tp rank in different replicas (among world ranks
// [0, serving)) must hold the same bytes: every rank's CRC-32C of each
// parameter, summed slot by slot over the world, grouped per tp rank by
// value. The same ValidationError on every rank names each parameter that
// differs and which ranks hold which value.
void compare_replicas(Communicator& world, int serving, ReloadTarget& model,
                      std::chrono::milliseconds device_timeout);

}  // namespace tpreload::detail
