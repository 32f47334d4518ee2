#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): bench pingpong from 32 KiB up with the rendezvous form beside the ring's grid form
# and NVSHMEM (2 ranks, the launcher's MPS cap). Knobs: SIZES. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
timeout 420 $PY -m circuslink bench pingpong --sizes "${SIZES:-32K,128K,256K,1M,4M,16M,64M,256M}" \
  --json "$R/pingpong-rdv.json" --plot "$R/pingpong-rdv.png" > "$R/pingpong-rdv.log" 2>&1
echo "== bench rc=$?"; grep -E "circuslink|nvshmem-put-signal-block|target|envelope|error|Error" "$R/pingpong-rdv.log" | tail -70
exit 0
