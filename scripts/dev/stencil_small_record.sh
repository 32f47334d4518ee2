#!/usr/bin/env bash
# Dev record run (gpu-check.sh dev): the persistent stencil's small domains for the record, channels beside NVSHMEM,
# the kernel each picks (on chip where a block fits), 8x8, 64x64 and 112x112 a rank, float32 and float64, 2, 4 and
# 8 ranks ($RANKS). Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
timeout 400 $PY -m circuslink bench stencil --ranks ${RANKS:-2,4,8} --per-rank --domains 8x8,64x64,112x112 \
  --dtypes float32,float64 --impls channel-persistent,nvshmem --iters 200 \
  --json "$R/stencil-small.json" --plot "$R/stencil-small.png" 2>&1 | grep -E "persistent|x the|error" | head -60
exit 0
