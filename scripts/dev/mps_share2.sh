#!/usr/bin/env bash
# Dev experiment 2: the uncapped share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100) with the rule's half (margin)
# and full 1/k share; the 32^4 2x2x1x1 stall with a 20 s device time-out; pingpong capped and uncapped.
# (CIRCUSLINK_DEV_FULL_SHARE=1 was a temporary switch in backends/_occupancy.py for that one call, not kept:
#  without it the second run measures the half share again.)
set -u
R=${R:?} PY=${PY:-python3}
U=(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100)
env "${U[@]}" CIRCUSLINK_TIMEOUT=20 timeout 120 $PY -m circuslink bench qcd --cg device --halos rma-device \
  --lattices 32 --grids 2x2x1x1 --json "$R/qcd-device-repro.json" 2>&1 | tail -30
env "${U[@]}" CIRCUSLINK_DEV_FULL_SHARE=1 CIRCUSLINK_TIMEOUT=20 timeout 200 $PY -m circuslink bench qcd --cg device \
  --halos rma-device --lattices 16,32 --json "$R/qcd-device-full.json" 2>&1 | tail -22
for share in default 100; do
  if [ $share = default ]; then envs=(); else envs=("${U[@]}"); fi
  env "${envs[@]}" timeout 150 $PY -m circuslink bench pingpong --sizes 8,2K,64K,1M,16M,256M --iters 20 \
    --json "$R/pingpong-share-$share.json" 2>&1 | grep -v '^\[' | tail -30
done
exit 0
