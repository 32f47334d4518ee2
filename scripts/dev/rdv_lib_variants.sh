#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the library's rendezvous pingpong (rendezvous from the smallest size) as it
# is, with a slice a team of 8 warps (CIRCUSLINK_RDV_TEAM=8: the hand-written form lost 2.2 us at 16 MiB and
# 20 us at 256 MiB to a slice a warp), with 2 blocks an SM bound instead of 3 (no register spills), both; at
# 33 and 49 blocks. Results under $R. (Ran at e978d87; the blocks-an-SM switch is gone since, it lost everywhere.)
set -u
R=${R:?} PY=${PY:-python3}
for v in base CIRCUSLINK_RDV_TEAM=8 PINGPONG_RDV_MIN_BLOCKS=2 CIRCUSLINK_RDV_TEAM=8,PINGPONG_RDV_MIN_BLOCKS=2; do
  d=$([ "$v" = base ] && echo "" || echo "$v")
  tag=$(echo "$v" | sed 's/CIRCUSLINK_RDV_//; s/PINGPONG_RDV_//; s/,.*PINGPONG_RDV_/-/; s/=//g; s/,/-/g')
  timeout 120 $PY -m circuslink run -n 2 -- $PY scripts/dev/rdv_lib.py --sizes "${SIZES:-256K,1M,4M,16M,256M}" \
    --blocks 33,49 --launch resident --defines "$d" --json "$R/rdv-lib-$tag.json" > "$R/rdv-lib-$tag.log" 2>&1
  echo "== $tag rc=$?"; grep -E "blocks|registers" "$R/rdv-lib-$tag.log" | tail -11
done
exit 0
