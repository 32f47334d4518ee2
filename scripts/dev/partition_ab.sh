#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): the small-message paths with the ranks sharing every SM under MPS's cap
# (CIRCUSLINK_SM_PARTITION=off, the library's default) against SMs of their own (=auto: a green context each),
# in one call. Under MPS the clients' single blocks land on the same SMs (the one-shot's were all on SM 0 or 0-1,
# BENCHMARKS.md fifth session), so a polling warp of one rank may wait behind another rank's; with SMs of their
# own they do not. Each case runs once per mode in $MODES (default "off auto"), bounded by $AB_S seconds:
#   pingpong  2 ranks, 8 and 120 B (the channels' small-message target)
#   rma       2 ranks, chains of 1 and 8 x 8 B, device-driven (plain and session) and graphed
#   hops      8 ranks, line:8 at 64 KiB (the router's per-hop cost)
#   stencil   2 and 4 ranks, 64x64 a rank, float64, the persistent channel form
# ($CASES picks which, default all four). Results under $R: partition-<case>-<mode>.{json,log}.
set -u
R=${R:?} PY=${PY:-python3}
for mode in ${MODES:-off auto}; do
  for case in ${CASES:-pingpong rma hops stencil}; do
    case $case in
      pingpong) args="bench pingpong -n 2 --sizes 8,120 --iters 15 --no-baselines" ;;
      rma) args="bench rma -n 2 --sizes 8 --chains 1,8 --layouts contiguous --no-baselines" ;;
      hops) args="bench hops -n 8 --topology line:8 --sizes 64K --no-baselines" ;;
      stencil) args="bench stencil -n 4 --ranks 2,4 --domains 64x64 --per-rank --impls channel-persistent \
        --dtypes float64 --no-baselines" ;;
      *) echo "unknown case $case"; continue ;;
    esac
    CIRCUSLINK_SM_PARTITION=$mode CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-30} timeout ${AB_S:-120} \
      $PY -m circuslink $args --json "$R/partition-$case-$mode.json" > "$R/partition-$case-$mode.log" 2>&1
    echo "== $case $mode rc=$?"; grep -E "target|one_way|per hop|us_per|time_us|rma-device|graphed" \
      "$R/partition-$case-$mode.log" | head -14
  done
done
exit 0
