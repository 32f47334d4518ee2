#!/usr/bin/env bash
# Dev experiment 3: compute-bound blocks capped (50 %) and uncapped, 2 ranks x 66 blocks of 1024 threads (does a
# cap put both ranks on the same SMs?); then the device-resident CG at 32^4 on 2x2x1x1, uncapped (the default
# now), $QCD_REPEAT times with a 30 s time-out (an earlier run's rank 3 once never reached the barrier).
set -u
R=${R:?} PY=${PY:-python3}
for share in 50 100; do
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$share timeout 60 $PY -m circuslink run -n 2 -- $PY scripts/dev/sm_placement.py \
    --label "work-share-$share" --work ${WORK_ROUNDS:-200000} --blocks 33,66,132 --json "$R/sm-placement.json"
done
for i in $(seq ${QCD_REPEAT:-3}); do
  CIRCUSLINK_TIMEOUT=30 timeout 100 $PY -m circuslink bench qcd --cg device --halos rma-device --lattices 32 \
    --grids 2x2x1x1 --json "$R/qcd-device-stress-$i.json" 2>&1 | grep -E 'error|rma-device  32|skipped' | cut -c1-250
done
exit 0
