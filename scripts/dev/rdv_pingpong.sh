#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the hand-written rendezvous pingpong (rdv_pingpong.py) beside the
# channel's grid form and NVSHMEM's put-with-signal in the bench pingpong of the same call. 2 ranks under
# the launcher's MPS cap. Knobs: SIZES, BLOCKS, THREADS. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
SIZES=${SIZES:-32K,256K,1M,4M,16M,64M,256M}
timeout 240 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_pingpong.py --sizes "$SIZES" \
  --blocks "${BLOCKS:-16,33,66}" --threads "${THREADS:-256,1024}" --json "$R/rdv-pingpong-dev.json" \
  > "$R/rdv-pingpong-dev.log" 2>&1
echo "== rdv rc=$?"; cat "$R/rdv-pingpong-dev.log" | tail -60
timeout 300 $PY -m circuslink bench pingpong --sizes "$SIZES" --json "$R/pingpong-rdv-ref.json" \
  > "$R/pingpong-rdv-ref.log" 2>&1
echo "== bench rc=$?"; grep -vE "^\s*$" "$R/pingpong-rdv-ref.log" | tail -60
exit 0
