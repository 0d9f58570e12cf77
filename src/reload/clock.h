// The reload engine's clock for its phase timings (internal).
#pragma once

#include <chrono>

namespace tpreload::detail {

using Clock = std::chrono::steady_clock;

// Seconds from `t` to now.
inline double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace tpreload::detail
