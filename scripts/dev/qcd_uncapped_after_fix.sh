#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the device-resident CG at 32^4 on a 2x2 grid and 16^4 on 2x1, uncapped
# (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100), after the low-latency start fix: does the stall of 2026-11-29 return?
set -u
R=${R:?} PY=${PY:-python3}
for rep in 1 2; do
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CIRCUSLINK_TIMEOUT=20 timeout 100 $PY -m circuslink bench qcd --cg device \
    --halos rma-device --lattices 32 --grids 2x2x1x1 --json "$R/qcd-device-uncapped-2x2-fix-$rep.json" 2>&1 | tail -8
  echo "rep $rep rc=$?"
done
exit 0
