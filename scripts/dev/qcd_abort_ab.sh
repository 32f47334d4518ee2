#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev), ready for the next session: does the uncapped device-resident CG stall
# (32^4 on 2x2x1x1, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100: 2 of 2 runs stalled on 2026-11-29) come from its grid
# barriers' waits reading the host's abort word? Every block's waiting thread reads it every 256 polls
# (Deadline), up to 4 x 132 blocks at once: the signature of the two defects of the fourteenth session (the
# rendezvous' and the grid forms' waits, fixed by reading it at every 16th check). Three runs as the library is,
# three with CIRCUSLINK_DEVICE_DEFINES=CIRCUSLINK_DEADLINE_ABORT_EVERY=16. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
for v in default CIRCUSLINK_DEADLINE_ABORT_EVERY=16; do
  d=$([ "$v" = default ] && echo "" || echo "$v")
  for rep in 1 2 3; do
    CIRCUSLINK_DEVICE_DEFINES="$d" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CIRCUSLINK_TIMEOUT=20 timeout 100 \
      $PY -m circuslink bench qcd --cg device --halos rma-device --lattices 32 --grids 2x2x1x1 \
      --json "$R/qcd-abort-ab-${v%%=*}-$rep.json" > "$R/qcd-abort-ab-${v%%=*}-$rep.log" 2>&1
    echo "== $v rep $rep rc=$?"; tail -3 "$R/qcd-abort-ab-${v%%=*}-$rep.log"
  done
done
exit 0
