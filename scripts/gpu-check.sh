#!/usr/bin/env bash
# What runs on the GPU machine (the device tool's `run`): install this checkout offline, then run
# the chosen stages with every rank of every job sharing the GPU under CUDA MPS, and leave the
# results under $OUT.
#
#   scripts/gpu-check.sh [STAGE ...]      (default: all)
#
#   info            circuslink info (GPUs, MPS) and the per-rank SM budget of the kernels (diag)
#   tests           the GPU-marked tests but the slow ones (2 ranks, some 4, on the one GPU), within 9 minutes, a
#                   call of its own (on 2026-11-29 the stage was stopped at 7 minutes after 66 tests, failures' time-outs
#                   among them); $TESTS narrows them (pytest ids)
#   tests-slow      the GPU tests marked slow (size sweeps, soak, 8 and 16 ranks, QCD and FFT solves): a run of
#                   its own, within 9 minutes (not part of "all")
#   probe           the floor, 2 and 4 ranks
#   pingpong        channel pingpong against the floor and the baselines
#   stream          one-way streaming through a channel against the floor
#   stream-stress   grid-form streaming: bench stream 8-64 MiB $STRESS_RUNS times (default 4) at the default
#                   grid, then 1-256 MiB at --grid-blocks $STRESS_BLOCKS (not part of "all")
#   resources       registers, shared memory and threads the channel machinery takes
#   allreduce-like  CIRCUS's pipeline, with its trace
#   allreduce       all-reduce by algorithm against NVSHMEM's, 2, 4 and 8 ranks ($AR2_ARGS: more options for the
#                   2-rank run, e.g. --quick)
#   rma             persistent RMA queues against MPI-3 RMA and MPI p2p, 2 and 4 ranks (a ring)
#   soak            10^6 messages over 72 channels among 4 ranks, both modes, every byte checked
#   transpose       transposing put against contiguous put and local transpose + put
#   fft             the FFT's own check, about 3 minutes: its GPU tests (plans against numpy within 1e-5 / 1e-12 at
#                   2 and 4 ranks, uneven and empty boxes, c2c and r2c / c2r, slab and pencil; fft2 / fft3 on
#                   .npy files; the slab baseline), bounded by $FFT_TESTS_S (140 s; $TESTS narrows them), then
#                   bench fft --quick at 2 ranks: 8192^2 and 512^3, both precisions, against the copy-engine slab
#                   baseline and the 1-rank cuFFT ceiling, bounded by $FFT_BENCH_S (120 s; $FFT_QUICK_ARGS
#                   replaces the sizes)
#   fft-full        distributed FFT, 2-D 8192^2 and 16384^2, 3-D 512^3 and 1024^3 (a GPU of more than 110 GB only:
#                   it needs about 97 GiB), both precisions, 2 and 4 ranks,
#                   against the slab all-to-all baselines (copy engine, NVSHMEM program) and the 1-rank ceiling
#                   (about 2-3 min per rank count; the NVSHMEM program is built once, ~1 min, then cached);
#                   $FFT_RANKS (default "2 4"), $FFT_DIMS, $FFT_SIZES, $FFT_SIZES3 and $FFT_SCHEMES (default both:
#                   transpose-put,pull) narrow or widen it
#   qcd             Wilson-Dirac CG: an 8^4-per-rank solve on a 2x2 grid, per-iteration time by halo exchange, the
#                   device-resident CG's strong scaling, and the halo engines at 16^4 on 2 ranks
#   qcd-timing      the device-resident CG on one rank: per iteration at 8^4 and 16^4, and cold and warm 8^4
#                   mixed-precision solves with their stages (scripts/dev/qcd_cg_timing.py; not part of "all")
#   hops            routed channels: latency and throughput by hop count on line:8, ring:8 (8 ranks), torus:4x4, mesh:4x4 (16);
#                   the many-to-many load on torus:4x4: 10^6 packets, every byte checked (bounded by LOAD_STEP_S, 180 s)
#   nodes           2 declared nodes x 2 ranks: the transports' GPU tests (ipc, mpi, nvshmem; gateway-routed
#                   channels over mpi and nvshmem), then bench nodes: every transport between nodes side by side
#                   with NVSHMEM put-with-signal and MPI one-way, "+ one hop" references, relays, gateway-routed
#   stencil         the user-kernel path: persistent grids of 32..240 registers, the non-blocking channel calls,
#                   the stencil example's device forms and its NVSHMEM baseline (GPU tests), then bench stencil
#                   (channels beside NVSHMEM and MPI): 1, 2, 4 ranks at 64^2..8192^2 global, and 8x8..1024^2 a rank
#                   at 2, 4, 8 ranks (persistent form)
#   all             every stage above
#   smoke           every benchmark in its --quick form, each bounded to 90 s (errors show at once; not in "all")
#   before          the regression tests of the MPS hangs against an older tree ($OLD_TREE, e.g.
#                   .old/ from `git archive`): they must fail there (not part of "all")
#   rma-repro       bench rma at chains of 16 x 64 KiB..1 MiB, many cycles, old tree then this one
#   scale           machines of 4 or 8 GPUs: probe matrix, pingpong 0->k, allreduce and the RMA ring
#   x2              the two-H200 reference runs (one rank per GPU; not part of "all")
#   chvar           dev experiment: A/B variants of the channel pingpong's warp kernel (scripts/dev/channel_variants.py)
#   llab            dev experiment: the channel's small-message path against hand-written forms of its format,
#                   with a per-round-trip timeline (scripts/dev/ll_path_ab.py; not part of "all")
#   onevar          dev experiment: the one-shot all-reduce's 8-byte call against hand-written forms, 2, 4 and 8
#                   ranks (scripts/dev/oneshot_variants.py; not part of "all")
#   llpair          dev experiment: the same pingpong in one process (two blocks, or two warps of one block), and
#                   Nsight Compute's per-instruction stall samples of it (scripts/dev/ll_pair.cu; not part of "all")
#   lines           dev experiment: line formats, echo forms, fences and streaming rings side by side
#                   (scripts/dev/line_variants.py; not part of "all")
#   dev             dev experiment: the bash scripts $DEV_SCRIPT (files of this tree, separated by spaces; each a
#                   step of its own), under this run's MPS daemon, their results under $R (not part of "all")
#
# One MPS control daemon serves the whole run: the script re-executes itself under
# `circuslink mps`, which starts one (or reuses a running one) and stops it at the end, also on
# failure. Results go to $OUT/results/ (JSON + PNG) and are packed into $OUT/results.tar.gz,
# because the device tool brings back at most 8 files.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
PY=${PYTHON:-python3}
# Never use NVLink multicast on the shared machines: it can take the GPUs down.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONUNBUFFERED=1 CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-60}

if [ -z "${CIRCUSLINK_GPU_CHECK_INSTALLED:-}" ]; then
  mkdir -p "$OUT/results"
  echo "=== install (offline)" | tee -a "$OUT/gpu-check.log"
  $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$OUT/gpu-check.log" 2>&1 \
    || { echo "install failed"; tail -20 "$OUT/gpu-check.log"; exit 2; }
  export CIRCUSLINK_GPU_CHECK_INSTALLED=1
fi
if [ -z "${CIRCUSLINK_MPS:-}" ] && [ "${1:-}" != "x2" ] && [ "${1:-}" != "scale" ]; then
  exec $PY -m circuslink mps -- "$0" "$@"
fi

mkdir -p "$OUT/results"
LOG="$OUT/gpu-check.log"
exec > >(tee -a "$LOG") 2>&1
# The device machine's copy of the tree has no .git: the caller passes the commit.
if [ -z "${CIRCUSLINK_COMMIT:-}" ] && git rev-parse --short=12 HEAD >/dev/null 2>&1; then
  CIRCUSLINK_COMMIT=$(git rev-parse --short=12 HEAD)
fi
export CIRCUSLINK_COMMIT=${CIRCUSLINK_COMMIT:-unknown}
R="$OUT/results"

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(all)
want() { for s in "${stages[@]}"; do { [ "$s" = "$1" ] || { [ "$s" = all ] && [ "${2:-}" != explicit ]; }; } && return 0; done; return 1; }
status=0
step() {  # step NAME CMD...: run, time and record one step; a failure marks the run failed but goes on
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  [ "$1" = cl ] && { shift; set -- $PY -m circuslink "$@"; }  # timeout runs programs, not shell functions
  timeout -k 10 "${STEP_S:-900}" "$@"; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t0)) s)"
  [ $rc -eq 0 ] || status=1
  echo "$name rc=$rc $((SECONDS - t0))s" >> "$OUT/summary.txt"
}
cl() { $PY -m circuslink "$@"; }

nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.mem --format=csv || true
echo "MPS pipe directory: ${CUDA_MPS_PIPE_DIRECTORY:-none}"

want info && step info cl info
want info && step diag cl run -n 2 -- $PY scripts/dev/mps_diag.py
# Tests get a short device-side time-out so that a hang costs seconds, not the lease.
# SIGINT at the end of the tests' budget makes pytest print what failed so far instead of dying silently.
want tests && step tests env CIRCUSLINK_TIMEOUT=20 timeout -s INT ${TESTS_BUDGET_S:-540} $PY -m pytest -q -rfE \
  --tb=short -m "gpu and not two_gpus and not slow" -p no:cacheprovider --timeout 150 --durations=15 ${TESTS:-tests}
want tests-slow explicit && step tests-slow env CIRCUSLINK_TIMEOUT=20 timeout -s INT ${TESTS_BUDGET_S:-540} $PY -m \
  pytest -q -rfE --tb=short -m "gpu and not two_gpus and slow" -p no:cacheprovider --timeout 300 --durations=15 \
  ${TESTS:-tests}
if want smoke explicit; then
  for b in pingpong stream allreduce-like allreduce rma transpose fft; do
    step "smoke-$b" env CIRCUSLINK_TIMEOUT=20 timeout ${SMOKE_S:-90} $PY -m circuslink bench $b --quick --no-baselines \
      --json "$R/smoke-$b.json"
  done
fi
want probe && step probe-2 cl probe -n 2 --json "$R/probe-2.json"
want probe && step probe-4 cl probe -n 4 --quick --json "$R/probe-4.json"
if want dev explicit; then for s in ${DEV_SCRIPT:?the dev stage runs \$DEV_SCRIPT}; do
  step "dev-$(basename "$s" .sh)" env R="$R" PY="$PY" bash "$s"; done; fi
want pingpong && step pingpong cl bench pingpong --json "$R/pingpong.json" --plot "$R/pingpong.png"
want stream && step stream cl bench stream --json "$R/stream.json" --plot "$R/stream.png"
if want stream-stress explicit; then
  for i in $(seq 1 "${STRESS_RUNS:-4}"); do
    step "stream-stress-$i" env CIRCUSLINK_TIMEOUT=10 timeout ${STRESS_S:-60} $PY -m circuslink bench stream \
      --sizes 8M:64M --iters 10 --warmup 1 --no-baselines --json "$R/stream-stress-$i.json"
  done
  for b in ${STRESS_BLOCKS:-8 16 32 64}; do  # throughput by grid size
    for i in $(seq 1 "${STRESS_BLOCK_RUNS:-1}"); do
      step "stream-blocks-$b-$i" env CIRCUSLINK_TIMEOUT=10 timeout ${STRESS_S:-60} $PY -m circuslink bench stream \
        --sizes ${STRESS_SIZES:-1M:256M} --iters 5 --warmup 1 --no-baselines --grid-blocks "$b" \
        --json "$R/stream-blocks-$b-$i.json"
    done
  done
fi
want resources && step resources cl bench resources --json "$R/resources.json"
want allreduce-like && step allreduce-like cl bench allreduce-like --json "$R/allreduce-like.json" \
  --plot "$R/allreduce-like.png" --trace "$R/allreduce-like-trace.json"
want allreduce && step allreduce-2 cl bench allreduce -n 2 ${AR2_ARGS:-} --json "$R/allreduce-2.json" --plot "$R/allreduce-2.png"
want allreduce && step allreduce-4 cl bench allreduce -n 4 --quick --json "$R/allreduce-4.json"
want allreduce && step allreduce-8 cl bench allreduce -n 8 --quick --json "$R/allreduce-8.json"
want rma && step rma-2 cl bench rma -n 2 --json "$R/rma-2.json" --plot "$R/rma-2.png"
want rma && step rma-4 cl bench rma -n 4 --quick --json "$R/rma-4.json"
want soak && step soak cl run -n 4 -- $PY tests/soak/channels_soak.py --messages 1000000 --channels 72 \
  --json "$R/soak.json"
want transpose && step transpose cl bench transpose -n 2 --json "$R/transpose.json" --plot "$R/transpose.png"
if want fft; then
  STEP_S=$((${FFT_TESTS_S:-140} + 20)) step fft-tests env CIRCUSLINK_TIMEOUT=20 timeout -s INT ${FFT_TESTS_S:-140} \
    $PY -m pytest -q -rfE --tb=short -m "gpu and not two_gpus and not slow" -p no:cacheprovider --timeout 150 \
    --durations=10 ${TESTS:-tests/test_fft.py tests/test_fft_cli.py tests/test_fft_bench.py}
  STEP_S=${FFT_BENCH_S:-120} step fft-bench cl bench fft -n 2 --quick ${FFT_QUICK_ARGS:---size 8192 --size3 512} \
    --json "$R/fft-quick-2ranks.json" --plot "$R/fft-quick-2ranks.png"
fi
if want fft-full; then
  # 1024^3 complex128 needs about 97 GiB at 2 or 4 ranks (bench fft refuses it on an 80 GB H100 before it starts)
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  [ "${mib:-0}" -ge 110000 ] && size3=512,1024 || size3=512
  for n in ${FFT_RANKS:-2 4}; do
    STEP_S=${FFT_STEP_S:-420} step "fft-$n" cl bench fft -n $n --size ${FFT_SIZES:-8192,16384} \
      --size3 ${FFT_SIZES3:-$size3} --dims ${FFT_DIMS:-2,3} --dtype both \
      --schemes ${FFT_SCHEMES:-transpose-put,pull} --iters 10 --warmup 2 --json "$R/fft-${n}ranks.json" \
      --plot "$R/fft-${n}ranks.png"
  done
fi
want qcd && step qcd-invert cl qcd invert --dim 8 8 8 8 --gridsize 2 2 1 1 --prec double --prec-sloppy single \
  --halo rma --verify --json "$R/qcd-invert.json"
want qcd && step qcd cl bench qcd --json "$R/qcd.json" --plot "$R/qcd.png"
want qcd-timing explicit && step qcd-timing $PY scripts/dev/qcd_cg_timing.py --json "$R/qcd-cg-timing.json"
want qcd && step qcd-device cl bench qcd --cg device --halos rma-device --lattices 8,16,32 \
  --json "$R/qcd-device.json"
# ... with each rank on SMs of its own (green contexts), the mode the QCD figures of BENCHMARKS.md were measured in
want qcd && step qcd-device-green env CIRCUSLINK_SM_PARTITION=green $PY -m circuslink bench qcd --cg device \
  --halos rma-device --lattices 16,32 --json "$R/qcd-device-green.json"
# The halo engines' targets: 16^4 on 2 ranks, each engine in its fastest CG loop (bench qcd prints the verdicts).
want qcd && step qcd-engines cl bench qcd --cg host,device --lattices 16 --grids 1x1x1x1,2x1x1x1 \
  --halos rma,rma-device,mpi-rma,nvshmem --json "$R/qcd-engines.json"
want hops && step hops-line8 cl bench hops -n 8 --topology line:8 --json "$R/hops-line8.json" \
  --plot "$R/hops-line8.png"
want hops && step hops-ring8 cl bench hops -n 8 --topology ring:8 --sizes 1M --json "$R/hops-ring8.json"
want hops && step hops-torus4x4 cl bench hops -n 16 --topology torus:4x4 --json "$R/hops-torus4x4.json" \
  --plot "$R/hops-torus4x4.png"
want hops && step hops-mesh4x4 cl bench hops -n 16 --topology mesh:4x4 --sizes 1M --json "$R/hops-mesh4x4.json"
want hops && STEP_S=${LOAD_STEP_S:-180} step hops-load-torus4x4 cl bench hops -n 16 --topology torus:4x4 --load-only \
  --load-packets 1000000 --json "$R/hops-load-torus4x4.json" --plot "$R/hops-load-torus4x4.png"
want nodes && step nodes-tests env CIRCUSLINK_TIMEOUT=20 timeout -s INT ${TESTS_BUDGET_S:-540} $PY -m pytest -q -rfE \
  --tb=short -m gpu -p no:cacheprovider --timeout 300 tests/test_transport_nvshmem.py tests/test_transport_ipc.py \
  tests/test_transport_mpi.py tests/test_gateway_gpu.py
want nodes && step nodes cl bench nodes -n 4 --ranks-per-node 2 --sizes 8,64,1K,4K,64K,1M,16M,64M \
  --json "$R/nodes.json" --plot "$R/nodes.png"
want nodes && step nodes-3x2 cl bench nodes -n 6 --ranks-per-node 2 --quick --json "$R/nodes-3x2.json"
want stencil && step stencil-tests env CIRCUSLINK_TIMEOUT=20 timeout -s INT 400 $PY -m pytest -q -rfE --tb=short \
  -m gpu -p no:cacheprovider --timeout 300 tests/test_resident_gpu.py tests/test_stencil_example.py \
  tests/test_channels_try_gpu.py tests/test_stencil_bench.py
want stencil && step stencil cl bench stencil --ranks 2,4 --domains 64x64,1024x1024,8192x8192 \
  --json "$R/stencil.json" --plot "$R/stencil.png"
want stencil && step stencil-per-rank cl bench stencil --ranks 2,4,8 --per-rank --domains 8x8,64x64,1024x1024 \
  --impls channel-persistent,channel-launch --iters 100 --json "$R/stencil-per-rank.json"

want chvar explicit && step chvar cl run -n 2 -- $PY scripts/dev/channel_variants.py --json "$R/channel-variants.json"
want llab explicit && step llab cl run -n 2 -- $PY scripts/dev/ll_path_ab.py --json "$R/ll-path-ab.json"
if want onevar explicit; then for n in ${ONEVAR_RANKS:-2 4 8}; do
  step "onevar-$n" cl run -n "$n" -- $PY scripts/dev/oneshot_variants.py --samples 5 --json "$R/oneshot-variants-$n.json"
done; fi
if want llpair explicit; then
  step llpair-build nvcc -std=c++17 -arch=sm_90a -Isrc/circuslink/include -o "$OUT/ll_pair" scripts/dev/ll_pair.cu
  step llpair "$OUT/ll_pair"
  step llpair-ncu ncu --clock-control none -k lib_pair -c 1 --section SourceCounters --section WarpStateStats \
    --import-source no -f -o "$R/ll-pair" "$OUT/ll_pair" --once
  step llpair-source sh -c "ncu -i '$R/ll-pair.ncu-rep' --page source --csv --print-source sass > '$R/ll-pair-source.csv'"
  step llpair-details ncu -i "$R/ll-pair.ncu-rep" --page details
fi
want lines explicit && step lines cl run -n 2 -- $PY scripts/dev/line_variants.py --stage ${LINES_STAGE:-all} --json "$R/line-variants.json"

if want before explicit; then
  OLD=${OLD_TREE:-.old}
  step before-rma env PYTHONPATH="$PWD/$OLD/src" CIRCUSLINK_TIMEOUT=15 $PY -m pytest -q -p no:cacheprovider \
    --timeout 120 tests/test_rma_cuda.py -k late_peer
  step before-allreduce-like env PYTHONPATH="$PWD/$OLD/src" CIRCUSLINK_TIMEOUT=15 $PY -m pytest -q \
    -p no:cacheprovider --timeout 120 tests/test_allreduce_like.py -k mps_hang
fi

if want rma-repro explicit; then
  for tree in "${OLD_TREE:-.old}" .; do
    step "rma-repro-$tree" env PYTHONPATH="$PWD/$tree/src" CIRCUSLINK_TIMEOUT=15 timeout 150 $PY -m circuslink \
      bench rma -n 2 --sizes 64K:1M --chains 16 --layouts contiguous --iters 1000 --warmup 20 --no-baselines \
      --json "$R/rma-repro-$(basename $tree).json"
  done
fi

NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if want scale explicit; then  # machines of 4 or 8 GPUs, one rank per GPU
  step scale-probe cl probe --json "$R/probe-${NGPU}gpu.json"
  for k in $(seq 1 $((NGPU - 1))); do  # GPU 0 against each other GPU: rank 0 on GPU 0, rank 1 on GPU k
    step "scale-pingpong-0-$k" env CUDA_VISIBLE_DEVICES=0,$k $PY -m circuslink bench pingpong \
      --json "$R/pingpong-0-$k.json" --plot "$R/pingpong-0-$k.png"
  done
  for n in 4 8; do
    [ "$n" -le "$NGPU" ] || continue
    step "scale-allreduce-$n" cl bench allreduce -n $n --json "$R/allreduce-${n}gpu.json" \
      --plot "$R/allreduce-${n}gpu.png"
    step "scale-rma-ring-$n" cl bench rma -n $n --json "$R/rma-ring${n}.json" --plot "$R/rma-ring${n}.png"
  done
fi

if want x2 explicit; then  # two H200s joined by NVLink, one rank per GPU: the reference figures
  [ "$NGPU" -ge 2 ] || { echo "x2: needs 2 GPUs, this machine has $NGPU"; exit 2; }
  # Budget: under 10 minutes in all; each step bounded by STEP_S.
  export STEP_S=${STEP_S:-120}
  step x2-probe cl probe -n 2 --check --json "$R/x2-probe.json"
  step x2-pingpong cl bench pingpong -n 2 --json "$R/x2-pingpong.json" --plot "$R/x2-pingpong.png"
  step x2-stream cl bench stream -n 2 --json "$R/x2-stream.json" --plot "$R/x2-stream.png"
  step x2-allreduce cl bench allreduce -n 2 --json "$R/x2-allreduce.json" --plot "$R/x2-allreduce.png"
  step x2-allreduce-like cl bench allreduce-like --json "$R/x2-allreduce-like.json" --plot "$R/x2-allreduce-like.png"
  step x2-rma cl bench rma -n 2 --quick --json "$R/x2-rma.json" --plot "$R/x2-rma.png"
  step x2-transpose cl bench transpose -n 2 --quick --json "$R/x2-transpose.json"
  step x2-fft cl bench fft -n 2 --size 8192,16384 --size3 512,1024 --dtype both --json "$R/x2-fft.json" \
    --plot "$R/x2-fft.png"
  # strong scaling 1 -> 2 GPUs at 32^4 global, and per-iteration time by halo exchange at 8^4 and 16^4 local
  step x2-qcd-32-1gpu cl bench qcd -n 1 --grids 1x1x1x1 --dim 32 32 32 32 --halos rma --samples 3 --iters 20 \
    --json "$R/x2-qcd-32-1gpu.json"
  step x2-qcd-32-2gpu cl bench qcd -n 2 --grids 2x1x1x1 --dim 16 32 32 32 --halos rma,mpi-p2p,nccl --samples 3 \
    --iters 20 --json "$R/x2-qcd-32-2gpu.json"
  step x2-qcd-halo cl bench qcd -n 2 --grids 2x1x1x1 --dim 16 16 16 16 --json "$R/x2-qcd-halo.json" \
    --plot "$R/x2-qcd-halo.png"
fi

tar -czf "$OUT/results.tar.gz" -C "$OUT" results
echo "=== summary"; cat "$OUT/summary.txt" 2>/dev/null
exit $status
