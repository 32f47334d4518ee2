#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): scripts/dev/fft_push_probe.py (the first stage's transforms with a store callback
# writing the owners' transposed slabs, against the plain transforms) at 16384^2, 2 and 4 ranks' cuts, both
# precisions. Results under $R: fft-push-probe-<ranks>-<dtype>.log.
set -u
R=${R:?} PY=${PY:-python3}
for n in 2 4; do
  for dt in complex128 complex64; do
    timeout ${PUSH_S:-90} $PY scripts/dev/fft_push_probe.py --ranks $n --dtype $dt ${PUSH_ARGS:-} \
      > "$R/fft-push-probe-$n-$dt.log" 2>&1
    echo "== push n=$n $dt rc=$?"; cat "$R/fft-push-probe-$n-$dt.log" | tail -12
  done
done
exit 0
