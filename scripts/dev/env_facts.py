"""Facts about the GPU machine that the code relies on (run once per new image by gpu-check)."""
import glob
import os
import subprocess

import cupy as cp
import numpy as np

print("cupy", cp.__version__, "runtime", cp.cuda.runtime.runtimeGetVersion(), "nccl", __import__("cupy.cuda.nccl").cuda.nccl.get_version())
# Does CuPy pass a numpy structured scalar to a kernel by value?
src = r'''
struct H { unsigned long long p; int a; int b; float c; int pad; };
extern "C" __global__ void k(H h, int* out) { out[0] = h.a; out[1] = h.b; out[2] = (int)(h.c * 10); out[3] = (int)(h.p & 0xffff); }
'''
m = cp.RawModule(code=src, options=("-std=c++17",))
dt = np.dtype([("p", np.uint64), ("a", np.int32), ("b", np.int32), ("c", np.float32), ("pad", np.int32)])
h = np.zeros((), dtype=dt)
h["p"], h["a"], h["b"], h["c"] = 0x1234, 7, -3, 2.5
out = cp.zeros(4, dtype=cp.int32)
try:
    m.get_function("k")((1,), (1,), (h[()], out))
    print("struct-by-value:", out.get().tolist(), "(expect [7, -3, 25, 4660])")
except Exception as e:
    print("struct-by-value failed:", type(e).__name__, e)
import site
for sp in site.getsitepackages():
    for d in ("nvidia/nvshmem", "nvidia/nccl"):
        p = os.path.join(sp, d)
        if os.path.isdir(p):
            print(p, sorted(os.listdir(p)), sorted(glob.glob(p + "/lib/*"))[:20])
for cmd in (["mpicc", "--showme:compile"], ["mpicc", "--showme:link"], ["mpirun", "--version"], ["nvcc", "--version"]):
    try:
        print(" ".join(cmd), "->", subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()[:2])
    except Exception as e:
        print(cmd, e)
try:
    import pynvml  # noqa
    print("pynvml ok")
except Exception as e:
    print("pynvml", e)
print(subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout)
