#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): where each rank is when the device-resident CG at 32^4 on a 2x2x1x1 grid
# stalls uncapped (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100): every rank dumps its Python stacks every $DUMP_S
# seconds (scripts/dev/stall_dump/sitecustomize.py), CUDA_MPS logs kept. REPS runs (default 2). Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
for rep in $(seq 1 ${REPS:-2}); do
  env PYTHONPATH="$PWD/scripts/dev/stall_dump${PYTHONPATH:+:$PYTHONPATH}" CIRCUSLINK_DEV_DUMP_S=${DUMP_S:-10} \
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CIRCUSLINK_TIMEOUT=${TIMEOUT_S:-30} timeout ${RUN_S:-90} \
    $PY -m circuslink bench qcd --cg device --halos rma-device --lattices 32 --grids 2x2x1x1 \
    --json "$R/qcd-dump-$rep.json" > "$R/qcd-dump-$rep.log" 2>&1
  echo "== rep $rep rc=$? $(grep -E 'skipped|rma-device +32' "$R/qcd-dump-$rep.log" | tail -1 | cut -c1-200)"
done
[ -n "${CUDA_MPS_LOG_DIRECTORY:-}" ] && tail -30 "$CUDA_MPS_LOG_DIRECTORY"/server.log 2>/dev/null | cut -c1-200
exit 0
