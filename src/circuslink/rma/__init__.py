"""Persistent RMA queues: the TCA / QUDA RMA interface (docs/papers.md: TCA/QUDA, Fig. 4), on GPUs.

An application that repeats the same exchange every iteration (a halo exchange) declares
its writes once, commits them into a queue, and then runs each iteration as one
``start()`` and one ``wait()``::

    from circuslink import rma

    win = rma.window_alloc(world, nbytes)                   # collective
    h = rma.declare_write(win, dst_off, win, src_off, n, dst_rank=right)
    q = rma.Queue.alloc(win)                                # collective
    q.push(h)
    q.add_origin(left)                                      # who writes into me
    q.commit()                                              # collective: build the chain once
    for it in range(steps):
        q.start()                                           # post my window, run my writes
        q.wait()                                            # mine done and my origins' arrived
        compute(win.local)

Transposing puts (UZURA): ``declare_transpose_write`` moves a rows x cols block into a peer
transposed, in the same queues (docs/transpose.md).

Windows: in mapped memory (the default, from the transport that maps peers inside a node; the back-end's
module moves the bytes: ``cpu``, shared memory, the reference; ``cuda``, CUDA IPC over NVLink, one launch per
start, ``q.start(stream=)`` / ``q.wait(stream=, block=False)`` to enqueue cycles on a stream, and
``circuslink::rma_start`` / ``rma_wait`` in ``<circuslink/rma.cuh>`` for kernels that drive the queue
themselves with ``q.device_handle()``), or ``window_alloc(..., memory="mpi3")`` (MPI-3 windows, ``MPI_Put`` in
post/start/complete/wait epochs: the MPI back-end the RMA papers compare against). Windows and queues are
resources (``close()`` / ``free()``, ``with``); ``q.describe()`` shows the committed plan. docs/rma.md has the
semantics.
"""

from __future__ import annotations

from ._core import (
    MsgHandle,
    Queue,
    Window,
    declare_strided_write,
    declare_write,
    meet,
    meeting_queue,
    queue_alloc,
    window_alloc,
)
from ._transpose import TransposeHandle, declare_transpose_write, plan_local_transpose, transpose_tiles

__all__ = [
    "MsgHandle",
    "Queue",
    "TransposeHandle",
    "Window",
    "declare_strided_write",
    "declare_transpose_write",
    "declare_write",
    "meet",
    "meeting_queue",
    "plan_local_transpose",
    "queue_alloc",
    "transpose_tiles",
    "window_alloc",
]
