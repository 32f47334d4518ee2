"""Dev experiment (scripts/dev/mps_load_block.sh, mps_load_block2.sh): under MPS, does a client's module load wait
for another client's running kernel? One process ("spin") runs a kernel that busy-waits SPIN_S seconds on the GPU
clock; the other ("load"), once that kernel runs, loads a freshly compiled module and launches its kernel, timing
each step (compile before, load, get_function, first launch to done). If the load (or the first launch, under lazy
loading) takes about the spin's remaining time, a load waits for the other client's kernel: what stalls the
device-resident CG when a rank compiles while its peers' halo kernels already wait for it. Prints one JSON line.
SPIN_BLOCKS x SPIN_THREADS: the spinner's grid (1 x 32 by default; 264 x 1024 fills an H100). LOAD_LMEM=1: the
loaded kernel keeps 16 KiB a thread in local memory (the driver may have to grow the context's local memory)."""
import json
import os
import sys
import time

import cupy as cp

mode, flag = sys.argv[1], sys.argv[2]
spin_s = float(os.environ.get("SPIN_S", "6"))
blocks, threads = int(os.environ.get("SPIN_BLOCKS", "1")), int(os.environ.get("SPIN_THREADS", "32"))
lmem = os.environ.get("LOAD_LMEM", "0") == "1"

if mode == "spin":
    k = cp.RawKernel(r'''
extern "C" __global__ void spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}''', "spin")
    k((blocks,), (threads,), (cp.uint64(int(spin_s * 1e9)),))  # compiled and launched: the module was loaded before
    t0 = time.perf_counter()
    open(flag, "w").close()
    cp.cuda.Device().synchronize()
    print(json.dumps({"mode": mode, "spin_s": round(time.perf_counter() - t0, 3)}), flush=True)
else:
    from cupy.cuda import compiler, function

    name = f"fresh_{os.getpid()}"
    if lmem:
        body = ("volatile float f[4096]; for (int i = 0; i < 4096; ++i) f[i] = a[(threadIdx.x + i) & 31]; "
                "a[threadIdx.x] += f[(threadIdx.x * 7) & 4095];")
    else:
        body = "a[threadIdx.x] += 1.0f;"
    src = 'extern "C" __global__ void ' + name + "(float* a) { " + body + " }"
    t0 = time.perf_counter()
    ptx, _ = compiler.compile_using_nvrtc(src, (), "90", "fresh.cu")
    compile_s = time.perf_counter() - t0
    a = cp.zeros(32, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    while not os.path.exists(flag):
        time.sleep(0.01)
    time.sleep(0.2)  # the spin kernel is running now
    t0 = time.perf_counter()
    mod = function.Module()
    mod.load(ptx)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn = mod.get_function(name)
    get_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn((1,), (32,), (a,))
    cp.cuda.Device().synchronize()
    launch_s = time.perf_counter() - t0
    print(json.dumps({"mode": mode, "loading": os.environ.get("CUDA_MODULE_LOADING", "default"),
                      "share": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "unset"),
                      "spin": f"{blocks}x{threads}", "lmem": int(lmem),
                      "compile_s": round(compile_s, 3), "load_s": round(load_s, 3), "get_function_s": round(get_s, 3),
                      "first_launch_s": round(launch_s, 3), "spin_s": spin_s}), flush=True)
