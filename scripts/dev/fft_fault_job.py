"""Dev experiment: the FFT GPU test's job (tests/test_fft.py CASES, the GPU's cases) written out with every rank
printing its case and, when an RMA start or wait raises, the queue that raised: its describe() (protocol, words,
grid, tiles) and its writes. Usage: python scripts/dev/fft_fault_job.py OUT.py; run OUT.py under `circuslink run`."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import test_fft as t  # noqa: E402

PATCH = '''
from circuslink.rma import _cuda as _rc
def _wrap(name):
    orig = getattr(_rc.CudaQueue, name)
    def call(self, *a, **k):
        try:
            return orig(self, *a, **k)
        except BaseException as exc:
            hs = [(h.dst_rank, h.dst_offset, h.src_offset, h.count, h.block_bytes, h.src_stride, h.dst_stride)
                  for h in self.handles]
            print(f"QUEUE-FAULT rank {world.rank} in {name}: {type(exc).__name__}: {exc}; {self.describe()}; "
                  f"origins {self.n_origins} lines {self.n_lines} writes {hs} "
                  f"tputs {[(p.rows, p.cols, p.src_ld, p.dst_ld, p.elem) for p in self.tchain.pieces]}", flush=True)
            raise
    setattr(_rc.CudaQueue, name, call)
_wrap("start"); _wrap("wait")
'''
code = t.CASES.format(cases=2, largest=40, fixed=t.GPU_FIXED)
code = code.replace("world = cl.init()\n", "world = cl.init()\n" + PATCH, 1)
code = code.replace('    if me == 0:  # the case', '    if True:  # the case')
code = code.replace('print("case", what', 'print("case", me, what')
Path(sys.argv[1]).write_text(code)
