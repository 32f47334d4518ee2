#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the library's rendezvous pingpong under knobs (rdv_lib.py), then the
# hand-written one at the same sizes. Knobs: SIZES, BLOCKS, LAUNCH. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
timeout 200 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_lib.py --sizes "${SIZES:-256K,16M}" \
  --blocks "${BLOCKS:-8,33,66}" --launch "${LAUNCH:-resident,plain}" --backoff "${BACKOFF:-256}" --json "$R/rdv-lib-dev.json" > "$R/rdv-lib-dev.log" 2>&1
echo "== lib rc=$?"; tail -40 "$R/rdv-lib-dev.log"
timeout 120 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_pingpong.py --sizes "${SIZES:-256K,16M}" \
  --blocks 8,33,66 --threads 256 --json "$R/rdv-pingpong-dev2.json" > "$R/rdv-pingpong-dev2.log" 2>&1
echo "== hand rc=$?"; tail -10 "$R/rdv-pingpong-dev2.log"
exit 0
