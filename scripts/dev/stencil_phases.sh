#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the on-chip persistent stencil's iteration phase by phase
# (scripts/dev/stencil_phases.py) at 1, 2 and 4 ranks ($PHASE_RANKS), 8x8 and 64x64 a rank, float64, channels 2
# edges deep ($DEPTHS: more). Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
for n in ${PHASE_RANKS:-1 2 4}; do
  for d in 8x8 64x64; do
    for depth in ${DEPTHS:-2}; do
      log="$R/stencil-phases-$n-$d-depth$depth.log"
      CIRCUSLINK_TIMEOUT=20 timeout 120 $PY -m circuslink run -n $n -- $PY scripts/dev/stencil_phases.py --per-rank $d \
        --depth-edges $depth > "$log" 2>&1
      echo "ranks $n, $d a rank, depth $depth edges: rc=$?"; grep "^\[" "$log" | cut -c1-400
    done
  done
done
exit 0
