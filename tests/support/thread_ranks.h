// Ranks as threads of the test process, over the threads communicator
// (make_thread_communicators): what the single-process tests use to run a
// collective on several ranks without a launcher.
#pragma once

#include <chrono>
#include <functional>

#include "tpreload/comm/communicator.h"

namespace tpreload::testing {

// Runs `body` on `ranks` threads, thread r with rank r's communicator, and
// waits for all; rethrows the first rank's failure (gtest's assertions in the
// threads are reported as they happen). A collective waits at most `timeout`;
// a failed one throws on its rank (no abort).
void run_ranks(int ranks, const std::function<void(Communicator&)>& body,
               std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace tpreload::testing
