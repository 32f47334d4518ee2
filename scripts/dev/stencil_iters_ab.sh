#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): does the persistent stencil's time per iteration carry the ranks' launch skew?
# Its clocks are events around each rank's launch after a host barrier, so a rank that starts late adds its lag to
# the first iteration of every loop; divided by --iters, that lag is the same size as a small domain's iteration.
# A/B: --iters 200 against 2000 at 2 and 4 ranks, 8x8 and 64x64 a rank, the on-chip kernel, channels and NVSHMEM.
# Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
for iters in 200 2000; do
  timeout 240 $PY -m circuslink bench stencil --ranks 2,4 --per-rank --domains 8x8,64x64 --dtypes float64 \
    --impls channel-persistent,nvshmem --iters $iters --persistent-kernel onchip \
    --json "$R/stencil-iters-$iters.json" 2>&1 | grep -E "persistent +float64" | head -30
  echo "iters $iters: rc=$?"
done
exit 0
