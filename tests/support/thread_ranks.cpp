#include "thread_ranks.h"

#include <exception>
#include <thread>
#include <vector>

namespace tpreload::testing {

void run_ranks(int ranks, const std::function<void(Communicator&)>& body,
               std::chrono::milliseconds timeout) {
  CommOptions options;
  options.timeout = timeout;
  options.abort_on_failure = false;
  auto comms = make_thread_communicators(ranks, options);
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        body(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace tpreload::testing
