#include "tpreload/comm/device.h"

#include <thread>

#include "tpreload/core/error.h"

namespace tpreload {

void wait_for_event(DeviceEvent& event, std::chrono::milliseconds timeout,
                    const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (int polls = 0; !event.done(); ++polls) {
    const auto waited = Clock::now() - start;
    if (waited > timeout) {
      event.gave_up();
      raise<CommTimeoutError>(what, " did not complete on the device within ", timeout.count(),
                              " ms; the device is stuck or a transfer it waits on never came");
    }
    // Copies of a bucket take micro- to milliseconds: spin briefly, then back off.
    if (waited < std::chrono::milliseconds(2) || polls % 64 != 0)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void synchronize(DeviceStream& stream, std::chrono::milliseconds timeout, const std::string& what) {
  auto event = stream.record();
  wait_for_event(*event, timeout, what);
}

}  // namespace tpreload
