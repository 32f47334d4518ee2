"""What each rank sees of its GPU under MPS: SM count, share, budget, and how many blocks of each
spinning kernel fit in it (registers per thread decide). Run: circuslink run -n 2 -- python mps_diag.py"""

import os
from pathlib import Path

import circuslink as cl

w = cl.init()
b = w.backend
src = Path(cl.__file__).parent
kernels = []
rma = cl.compile((src / "rma" / "rma_kernels.cu").read_text())
kernels.append(("rma start (256 thr)", rma.get_function("circuslink_rma_start"), 256))
arl = cl.compile((src / "bench" / "kernels" / "allreduce_like.cu").read_text())
kernels += [("allreduce-like A (512)", arl.get_function("ar_like_a"), 512),
            ("allreduce-like B (512)", arl.get_function("ar_like_b"), 512)]
pp = cl.compile((src / "bench" / "kernels" / "pingpong_channels.cu").read_text())
kernels += [("pingpong grid (256)", pp.get_function("pingpong_grid"), 256),
            ("stream grid (256)", pp.get_function("stream_grid"), 256)]
occupancy = b.xp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor
lines = [f"rank {w.rank}: share {os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')}% "
         f"SMs reported {b.sm_count}, budget {b.sm_budget}"]
for name, fn, threads in kernels:
    lines.append(f"  {name}: {fn.num_regs} regs/thread, {fn.shared_size_bytes} B static smem, "
                 f"{occupancy(fn.kernel.ptr, threads, 0)} blocks an SM, max resident blocks {b.max_blocks(fn, threads)}")
print("\n".join(lines), flush=True)
w.close()
