#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): grid_wait_ab.py (the ring grid form's waits, four variants). Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
timeout 240 $PY -m circuslink run -n 2 -- $PY scripts/dev/grid_wait_ab.py --json "$R/grid-wait-ab.json" \
  > "$R/grid-wait-ab.log" 2>&1
echo "== rc=$?"; grep -E "blocks:|Error|error" "$R/grid-wait-ab.log" | tail -30
exit 0
