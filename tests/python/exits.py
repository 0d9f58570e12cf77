"""How a Python job under mpirun ends when something fails: run by ctest through
mpi_tests/expect_exit.sh, which checks the exit status, the time and the output.

  exits.py alone   rank 1 raises before a collective its peers are already in:
                   the job must end (MPI_Abort from the exit), not hang.
  exits.py agreed  every rank gets the same error from reload_weights and lets it
                   end the program: MPI is finalized and the job exits 1.
  exits.py thread  rank 1's reload thread ends with a tpreload error of its own
                   (not agreed) and its main thread returns while rank 0 waits
                   in a collective: the exit must end the job, not finalize.
"""
import os
import sys
import threading

import tpreload

world = tpreload.World()
if sys.argv[1] == "alone":
    if world.rank == 1:
        raise ValueError("rank 1 fails alone")
    world.barrier()  # rank 0 waits here for a rank that has gone
elif sys.argv[1] == "agreed":
    tpreload.reload_weights({}, os.path.join(os.path.dirname(__file__), "no-such-model"), world=world)
elif sys.argv[1] == "thread":
    if world.rank == 1:
        def reload_thread():
            raise tpreload.CommError("rank 1's reload thread fails alone")
        worker = threading.Thread(target=reload_thread)
        worker.start()
        worker.join()
    else:
        world.barrier()  # rank 0 waits here for a rank that has gone
