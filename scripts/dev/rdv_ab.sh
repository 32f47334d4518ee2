#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the rendezvous pingpong (rdv_lib.py, 49 blocks) as it is against
# CIRCUSLINK_RDV_PEEK_ALL=1 (every reading warp loads the descriptor's units with the header, in one round) and
# against the team slice (CIRCUSLINK_RDV_TEAM=8), each at back-offs of 64 and 256 ns; then the probe with
# PEEK_ALL. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
for v in base CIRCUSLINK_RDV_PEEK_ALL=1 CIRCUSLINK_RDV_TEAM=8; do
  d=$([ "$v" = base ] && echo "" || echo "$v")
  tag=$(echo "$v" | sed 's/CIRCUSLINK_RDV_//; s/=//g')
  timeout 150 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_lib.py --sizes "${SIZES:-256K,1M,4M,16M,256M}" \
    --blocks 49 --launch resident --backoff 64,256 --defines "$d" --json "$R/rdv-ab-$tag.json" > "$R/rdv-ab-$tag.log" 2>&1
  echo "== $tag rc=$?"; grep -E "blocks" "$R/rdv-ab-$tag.log" | tail -10
done
timeout 150 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_probe.py --sizes 256K --defines CIRCUSLINK_RDV_PEEK_ALL=1 \
  --json "$R/rdv-probe-peekall.json" > "$R/rdv-probe-peekall.log" 2>&1
echo "== probe rc=$?"; tail -16 "$R/rdv-probe-peekall.log"
exit 0
