#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the persistent stencil's on-chip kernel (one block holding a rank's cells in
# shared memory) against its grid kernel, channels and NVSHMEM alike, in two runs of bench stencil: 8x8 and 64x64
# a rank (the small-domain target: <= 6 x the relaxed store+poll floor) and 112x112 (about the largest float64 block
# that fits), at 2, 4 and 8 ranks. First the example's GPU tests of both kernels. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
CIRCUSLINK_TIMEOUT=20 timeout 200 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_stencil_example.py \
  -k "persistent" > "$R/stencil-onchip-tests.log" 2>&1
echo "tests: rc=$?"; tail -3 "$R/stencil-onchip-tests.log"
for kernel in ${KERNELS:-grid onchip}; do
  timeout 240 $PY -m circuslink bench stencil --ranks ${RANKS:-2,4,8} --per-rank --domains 8x8,64x64,112x112 \
    --dtypes float64 --impls channel-persistent,nvshmem --iters 200 --persistent-kernel $kernel \
    --json "$R/stencil-persistent-$kernel.json" 2>&1 | grep -E "persistent|x the|error" | head -30
  echo "$kernel: rc=$?"
done
exit 0
