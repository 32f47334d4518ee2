#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): why the device-resident CG at 32^4 on a 2x2x1x1 grid stalls uncapped
# (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100; 2 of 2 runs on 2026-11-29 after the RMA fix, never capped): a rank's
# first halo post never came, or a rank never reached a host allgather. A/B on the one thing that differs in how
# the ranks' persistent grids start: a cooperative launch (the default: the driver starts every block together or
# waits) against a plain launch of the same checked grid (CIRCUSLINK_COOPERATIVE=0); and a time-out of 90 s
# instead of 20 (a rank late by more than 20 s, e.g. still compiling, passes then; a deadlock does not); then the
# capped default once. Knobs: REPS (default 2), RUN_S (a run's bound, 200 s), VARIANTS (default "coop plain 90s capped"). Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
run() {  # name, env... (CIRCUSLINK_TIMEOUT defaults to 20 s)
  local name=$1; shift
  env CIRCUSLINK_TIMEOUT=20 "$@" timeout ${RUN_S:-200} $PY -m circuslink bench qcd --cg device --halos rma-device \
    --lattices 32 --grids 2x2x1x1 --json "$R/qcd-stall-$name.json" > "$R/qcd-stall-$name.log" 2>&1
  echo "$name: rc=$? $(grep -E 'skipped|rma-device +32' "$R/qcd-stall-$name.log" | tail -2 | cut -c1-240)"
}
want() { case " ${VARIANTS:-coop plain 90s capped} " in *" $1 "*) return 0;; esac; return 1; }
for rep in $(seq 1 ${REPS:-2}); do
  want coop && run "uncapped-coop-$rep" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100
  want plain && run "uncapped-plain-$rep" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CIRCUSLINK_COOPERATIVE=0
  want 90s && run "uncapped-90s-$rep" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CIRCUSLINK_TIMEOUT=90
done
want capped && run capped
exit 0
