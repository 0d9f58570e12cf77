// A two-rank job in which rank 1 is stuck and never enters the broadcast rank 0 makes.
// Rank 0 must give up after its 2 s deadline, say which collective stalled, and
// end the job; ctest checks the message and that the job ends within its timeout.
#include <iostream>
#include <thread>

#include "tpreload/comm/mpi_communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

int main(int argc, char** argv) {
  using namespace tpreload;
  MpiRuntime mpi(&argc, &argv);
  init_logging(mpi.world_rank(), mpi.world_size());
  CommOptions options;
  options.timeout = std::chrono::milliseconds(2000);
  auto world = MpiCommunicator::world(options);
  try {
    if (world->rank() == 0) {
      std::vector<std::uint8_t> buf(64, 1);
      world->broadcast(MutableBytes(buf), 1);  // waits for data rank 1 never sends
      std::cout << "broadcast completed; the probe expected a timeout" << std::endl;
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(30));  // a stuck peer
    }
  } catch (const CommTimeoutError& e) {
    std::cerr << e.what() << std::endl;
    world->abort(2);
  }
  return 1;
}
