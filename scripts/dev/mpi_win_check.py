"""Dev check: can this Open MPI create an MPI-3 window and run a PSCW epoch? Usage:
mpirun -np 2 python scripts/dev/mpi_win_check.py [multiple|funneled] [create|allocate]"""
import sys

import mpi4py

mpi4py.rc.thread_level = sys.argv[1] if len(sys.argv) > 1 else "funneled"
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

comm = MPI.COMM_WORLD
if comm.rank == 0:
    import os

    print({k: v for k, v in os.environ.items() if k.startswith("OMPI_MCA")})
flavor = sys.argv[2] if len(sys.argv) > 2 else "create"
try:
    if flavor == "create":
        buf = np.zeros(64, dtype=np.uint8)
        win = MPI.Win.Create(buf, disp_unit=1, comm=comm)
    else:
        win = MPI.Win.Allocate(64, disp_unit=1, comm=comm)
        buf = np.frombuffer(win.tomemory(), dtype=np.uint8, count=64)
        buf[:] = 0
        comm.Barrier()
    peer = 1 - comm.rank
    group = comm.group.Incl([peer])
    win.Post(group)
    win.Start(group)
    win.Put(np.full(64, comm.rank + 1, dtype=np.uint8), peer)
    win.Complete()
    win.Wait()
    ok = int(buf[0]) == peer + 1
    del buf
    win.Free()
    print(f"rank {comm.rank}: thread level {mpi4py.rc.thread_level}, {flavor}: window ok={ok}")
except Exception as exc:
    print(f"rank {comm.rank}: thread level {mpi4py.rc.thread_level}, {flavor}: {type(exc).__name__}: {exc}")
