#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the halo engines' verdicts alone (gpu-check's qcd-engines step): 16^4 on 1 and
# 2 ranks, each engine in its fastest CG loop. $ENGINE_ENV: more VAR=value settings (e.g. CIRCUSLINK_SM_PARTITION=green);
# bounded by $ENGINES_S seconds. Results under $R: qcd-engines.{json,log}.
set -u
R=${R:?} PY=${PY:-python3}
env ${ENGINE_ENV:-} CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-40} timeout ${ENGINES_S:-200} $PY -m circuslink bench qcd \
  --cg host,device --lattices 16 --grids 1x1x1x1,2x1x1x1 --halos rma,rma-device,mpi-rma,nvshmem \
  --json "$R/qcd-engines.json" > "$R/qcd-engines.log" 2>&1
echo "== qcd engines rc=$?"; tail -30 "$R/qcd-engines.log"
exit 0
