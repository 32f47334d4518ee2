#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): which of the library rendezvous' differences from the hand-written form
# costs it the mid sizes (1-16 MiB, data in L2): every warp polling with back-off instead of one thread a
# block (RDV_POLL_WARPS), a slice a warp instead of a block (RDV_SLICE_WARP), plain stores instead of st.cg
# (RDV_STORE_PLAIN), an arrival a warp instead of a block (RDV_ARRIVE_WARP); one at a time, then all. Results
# under $R.
set -u
R=${R:?} PY=${PY:-python3}
for v in base RDV_POLL_WARPS=1 RDV_SLICE_WARP=1 RDV_STORE_PLAIN=1 RDV_ARRIVE_WARP=1 \
         RDV_POLL_WARPS=1,RDV_SLICE_WARP=1,RDV_STORE_PLAIN=1,RDV_ARRIVE_WARP=1; do
  d=$([ "$v" = base ] && echo "" || echo "$v")
  tag=$(echo "${v}" | sed 's/=1//g; s/RDV_//g; s/,/+/g')
  timeout 100 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_pingpong.py --sizes "${SIZES:-1M,4M,16M,256M}" \
    --blocks 49 --threads 256 --samples 7 --defines "$d" --json "$R/rdv-hand-$tag.json" > "$R/rdv-hand-$tag.log" 2>&1
  echo "== $tag rc=$?"; grep -E " B " "$R/rdv-hand-$tag.log" | tail -4
done
exit 0
