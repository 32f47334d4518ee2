"""The baselines every circuslink benchmark is compared against, measured in the same run.

* :func:`nccl_pingpong`, :func:`nccl_allreduce`, :func:`nccl_grouped_sendrecv`: NCCL called
  directly through CuPy's binding, operations back to back on a stream, event-timed (as
  nccl-tests does). Collective over the world.
* :func:`mpi_pingpong`: MPI Send/Recv through mpi4py, GPU data staged through pinned host
  memory (the device image's MPI is not CUDA-aware). Collective; needs mpirun.
* :func:`nvshmem_pingpong`: NVSHMEM put-with-signal, a small CUDA program
  (``nvshmem_pingpong.cu``) built with nvcc and run under mpirun. Called from one process.
* :func:`nvshmem_stencil`: the 2-D Jacobi stencil of examples/stencil with its halos through NVSHMEM
  put-with-signal (``nvshmem_stencil.cu``), launch and persistent forms, N PEs under mpirun. Called from
  one process.
* :func:`nvshmem_allreduce`: NVSHMEM's float32 sum reductions on n PEs, on a stream and from a kernel
  (``nvshmem_allreduce.cu``). Called from one process.
* :func:`nvshmem_rma_chains`: put-with-signal chains in a ring of N PEs (``nvshmem_rma_chain.cu``), the
  exchange of ``bench rma``. Called from one process.

NVLink multicast stays off in all of them (``NCCL_NVLS_ENABLE=0``, ``NVSHMEM_DISABLE_NVLS=1``).
A baseline that cannot run returns rows with ``"skipped": "<reason>"`` (NCCL) or ``[]`` with a
message (MPI without mpirun), or raises :class:`circuslink.BackendError` (NVSHMEM without its
compiler, headers or mpirun); callers report it.
"""

from __future__ import annotations

from ._common import MULTICAST_OFF, disable_multicast
from ._mpi import mpi_pingpong
from ._nccl import nccl_allreduce, nccl_grouped_sendrecv, nccl_pingpong
from ._nvshmem import (
    build_nvshmem_pingpong,
    build_nvshmem_rma_chain,
    build_nvshmem_stencil,
    nvshmem_allreduce,
    nvshmem_pingpong,
    nvshmem_rma_chains,
    nvshmem_stencil,
)

__all__ = [
    "MULTICAST_OFF",
    "build_nvshmem_pingpong",
    "build_nvshmem_rma_chain",
    "build_nvshmem_stencil",
    "disable_multicast",
    "mpi_pingpong",
    "nccl_allreduce",
    "nccl_grouped_sendrecv",
    "nccl_pingpong",
    "nvshmem_allreduce",
    "nvshmem_pingpong",
    "nvshmem_rma_chains",
    "nvshmem_stencil",
]
