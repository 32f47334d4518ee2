#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev), ready for the next session: the rendezvous form's fixed cost (about 4.4 us
# one-way at 128-256 KiB on one H200, against 2.5 for the hand-written form), the library's pingpong_rdv as it is
# against CIRCUSLINK_RDV_ARRIVE_ACQREL=1 (one acquire-release atomic a warp, no separate fences), then the
# hand-written form, all in one call. Results under $R.
# (Run 2026-11-29 at f7ba9df: rdv-variants-s14-...json. The acquire-release switch went with the done word.)
set -u
R=${R:?} PY=${PY:-python3}
for v in default CIRCUSLINK_RDV_ARRIVE_ACQREL=1 default; do
  d=$([ "$v" = default ] && echo "" || echo "$v")
  timeout 120 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_lib.py --sizes "${SIZES:-256K,1M,4M,16M,256M}" \
    --blocks 66 --launch resident --defines "$d" --json "$R/rdv-variants-${v%%=*}.json" > "$R/rdv-variants-${v%%=*}.log" 2>&1
  echo "== $v rc=$?"; grep -E "blocks" "$R/rdv-variants-${v%%=*}.log" | tail -6
done
timeout 100 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_pingpong.py --sizes "${SIZES:-256K,1M,4M,16M,256M}" \
  --blocks 49,66 --threads 256 --json "$R/rdv-variants-hand.json" > "$R/rdv-variants-hand.log" 2>&1
echo "== hand rc=$?"; tail -10 "$R/rdv-variants-hand.log"
exit 0
