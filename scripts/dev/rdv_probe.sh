#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): rdv_probe.py, one round trip's phases at four sizes. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
timeout 150 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_probe.py --sizes "${SIZES:-256K,1M,4M,16M}" \
  --json "$R/rdv-probe.json" > "$R/rdv-probe.log" 2>&1
echo "== rc=$?"; cat "$R/rdv-probe.log" | tail -80
exit 0
