#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): after a change to the rendezvous, its phases (rdv_probe.py) and its figures at
# 49 blocks (rdv_lib.py), 256 KiB to 256 MiB. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
timeout 150 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_probe.py --sizes 256K,4M \
  --json "$R/rdv-probe.json" > "$R/rdv-probe.log" 2>&1
echo "== probe rc=$?"; tail -32 "$R/rdv-probe.log"
timeout 150 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_lib.py --sizes "${SIZES:-256K,1M,4M,16M,256M}" \
  --blocks 49 --launch resident --defines "${DEFINES:-}" --json "$R/rdv-lib.json" > "$R/rdv-lib.log" 2>&1
echo "== lib rc=$?"; grep -E "blocks|registers" "$R/rdv-lib.log" | tail -6
exit 0
