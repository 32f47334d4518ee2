#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): scripts/dev/green_ctx.py at 2 and 4 ranks, uncapped with a green context a
# rank and without one, and capped (the launcher's default) without. JSON lines in $R/green-ctx.jsonl.
set -u
R=${R:?} PY=${PY:-python3}
for n in 2 4; do
  for v in green none capped; do
    if [ $v = capped ]; then envs=(); mode=none; else envs=(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100); mode=$v; fi
    echo "== $n ranks, $v"
    env "${envs[@]}" CIRCUSLINK_TIMEOUT=30 timeout 90 $PY -m circuslink run -n $n -- $PY scripts/dev/green_ctx.py \
      --mode $mode --json "$R/green-ctx.jsonl" 2>&1 | tail -8
  done
done
exit 0
