"""What the channel machinery takes from a user's kernel: ``circuslink bench resources``.

CIRCUS reported the FPGA area its channels take (3.3% of the chip for the system, about 1.6% per channel
pair). On a GPU the channel code is inlined into the user's kernel, so its cost is registers, shared
and local memory per thread, the threads (warp, block or grid) that run a call, the SMs those threads
occupy while they wait, and the ring memory per channel. Each row comes from a kernel that does nothing
but one call form (``bench/kernels/channel_resources.cu``), compiled for this GPU; the ring rows from
the channel geometry at its defaults.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import BackendError
from . import _driver as drv

KERNELS = Path(__file__).parent / "kernels" / "channel_resources.cu"
FORMS = [  # (kernel, call, threads that run it, what it occupies while it waits)
    ("res_write_warp", "tx.write_warp", "32 (a warp)", "one warp slot"),
    ("res_read_warp", "rx.read_warp", "32 (a warp)", "one warp slot"),
    ("res_session_write_warp", "session.write_warp", "32 (a warp)", "one warp slot"),
    ("res_session_read_warp", "session.read_warp", "32 (a warp)", "one warp slot"),
    ("res_forward_warp", "session.forward_warp", "32 (a warp)", "one warp slot"),
    ("res_write_block", "tx.write_block", "the block", "one block"),
    ("res_read_block", "rx.read_block", "the block", "one block"),
    ("res_write_grid", "tx.write_grid", "the grid", "the grid (<= the rank's SM budget)"),
    ("res_read_grid", "rx.read_grid", "the grid", "the grid (<= the rank's SM budget)"),
    ("res_forward_grid", "rx.forward_grid", "the grid", "the grid (<= the rank's SM budget)"),
    ("res_write_thread", "tx.write", "1", "one thread"),
    ("res_read_thread", "rx.read", "1", "one thread"),
]
RING_EXAMPLES = [(64, 4), (4096, 4), (1 << 16, 4), (1 << 20, 4), (16 << 20, 1)]  # (depth, element bytes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    drv.add_output_arguments(parser, plot=False)
    parser.add_argument("--backend", choices=("cuda",), default="cuda", help="back-end (cuda only)")


def run(args: argparse.Namespace) -> int:
    import circuslink as cl

    from ..backends import cuda_device_count
    from ..channels import protocol as P

    if cuda_device_count() == 0:  # there is no cpu form to offer: say so, before anything starts
        raise BackendError("bench resources reads the register counts of kernels compiled for a GPU, and no GPU is "
                           "visible on this machine")
    world = cl.init(args.backend)
    if not world.backend.runs_kernels:
        raise BackendError("bench resources reads a GPU compiler's register counts: it needs the cuda back-end")
    module = cl.compile(KERNELS.read_text())
    results = drv.Results("resources", world)
    for kernel, call, threads, occupies in FORMS:
        fn = module.get_function(kernel)
        results.add(impl=call, bytes=0, kernel=kernel, threads=threads, occupies=occupies,
                    registers_per_thread=int(fn.num_regs), static_shared_bytes=int(fn.shared_size_bytes),
                    local_bytes_per_thread=int(fn.local_size_bytes))
    rings = []
    for depth, elem in RING_EXAMPLES:
        geo = P.geometry(depth, elem)
        rings.append({"depth_bytes": depth * elem, "nslots": geo.nslots, "chunk": geo.chunk,
                      "ring_bytes": geo.ring_bytes, "control_bytes": P.CTRL_BYTES + 4 * geo.nslots,
                      "handle_bytes": P.HANDLE.size})
    results.meta["rings"] = rings
    results.meta["sm_budget"] = world.sm_budget

    def text() -> None:
        drv.print_table(results.rows, ["impl", "threads", "registers_per_thread", "static_shared_bytes",
                                       "local_bytes_per_thread", "occupies"],
                        f"channel machinery per call form ({results.device})", args)
        drv.print_table([dict(r, impl="ring", bytes=r["depth_bytes"]) for r in rings],
                        ["bytes", "nslots", "chunk", "ring_bytes", "control_bytes", "handle_bytes"],
                        "memory per channel at the default geometry (the ring lives in the receiver's memory)", args)

    drv.finish(results, args, text)
    world.close()
    return 0
