"""How a Python job under mpirun ends when something fails: run by ctest through
mpi_tests/expect_exit.sh, which checks the exit status, the time and the output.

  exits.py alone   rank 1 raises before a collective its peers are already in:
                   the job must end (MPI_Abort from the exit), not hang.
  exits.py agreed  every rank gets the same error from reload_weights and lets it
                   end the program: MPI is finalized and the job exits 1.
"""
import os
import sys

import tpreload

world = tpreload.World()
if sys.argv[1] == "alone":
    if world.rank == 1:
        raise ValueError("rank 1 fails alone")
    world.barrier()  # rank 0 waits here for a rank that has gone
elif sys.argv[1] == "agreed":
    tpreload.reload_weights({}, os.path.join(os.path.dirname(__file__), "no-such-model"), world=world)
