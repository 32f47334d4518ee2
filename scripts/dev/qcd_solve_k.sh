#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): a real solve's cost of the host's looks. `qcd invert --cg device --halo
# rma-device` (the resident kernel checks convergence itself after every iteration; --check-every only sets how
# often it returns to the host, so each look is a relaunch whose start the ranks meet at) at --check-every $KS
# (default "10 100 1000"), on 1 rank (the global lattice) and 2 ranks (2x1x1x1), SMs of their own a rank.
# $LATTICE: the global lattice "X Y Z T" (default 32 32 32 32); $SOLVE_ARGS: more options (default: double with
# single sloppy, --tol 1e-9 --niter 400). Each run is bounded by $SOLVE_S seconds. Results under $R:
# qcd-solve-<ranks>r-k<K>.{json,log}; the summary prints iteration_us (the iterations' seconds / their count).
# Every rank dumps its Python stacks every $DUMP_S s into $R/dumps-solve-<ranks>r-k<K>/ (scripts/dev/stall_dump),
# and the job's own time-out ($SOLVE_TIMEOUT, default 20 s; the host outwaits the device's by a grace) ends
# well before $SOLVE_S, so a stalled run says what it waited for: on 2026-12-07 (one H100) three of the four runs
# were killed at 60 s with neither (both one-rank runs then passed --halo rma-device, which they no longer do).
# Later that day (twenty-first session, two fresh machines) every run was killed inside NVRTC: the dumps show the
# double-precision modules still compiling after 50-60 s, and a killed compile caches nothing, so each run began
# again. $SOLVE_S defaults to 240 s: the first run on a machine compiles, the others load CuPy's cache.
set -u
R=${R:?} PY=${PY:-python3}
read -r X Y Z T <<< "${LATTICE:-32 32 32 32}"
for k in ${KS:-10 100 1000}; do
  for grid in "1 1 1 1" "2 1 1 1"; do
    read -r px py pz pt <<< "$grid"; n=$((px * py * pz * pt))
    f="$R/qcd-solve-${n}r-k$k"
    halo=(); [ "$n" -gt 1 ] && halo=(--halo rma-device)  # one rank: no exchange (as bench qcd's "none" rows)
    PYTHONPATH="$PWD/scripts/dev/stall_dump${PYTHONPATH:+:$PYTHONPATH}" CIRCUSLINK_DEV_DUMP_S=${DUMP_S:-10} \
    CIRCUSLINK_DEV_DUMP_DIR="$R/dumps-solve-${n}r-k$k" \
    CIRCUSLINK_SM_PARTITION=green CIRCUSLINK_TIMEOUT=${SOLVE_TIMEOUT:-20} timeout ${SOLVE_S:-240} \
      $PY -m circuslink qcd invert --cg device "${halo[@]}" --check-every "$k" \
      --dim $((X / px)) $((Y / py)) $((Z / pz)) $((T / pt)) --gridsize $px $py $pz $pt \
      ${SOLVE_ARGS:---prec double --prec-sloppy single --tol 1e-9 --niter 400} --json "$f.json" > "$f.log" 2>&1
    echo "== ${n} ranks --check-every $k rc=$?"; grep -E "^(CG|Done|per iteration|solve time)" "$f.log" | tail -4
    $PY - "$f.json" <<'PY' 2>/dev/null
import json, sys
row = json.load(open(sys.argv[1]))
row = row["rows"][0] if "rows" in row else row
print({k: row.get(k) for k in ("iterations", "time_per_iter_us", "iteration_us", "true_residual")})
PY
  done
done
exit 0
