#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): fft_callback_probe.py for both precisions. Results under $R: fft-callback-probe.log.
set -u
R=${R:?} PY=${PY:-python3}
for d in ${PROBE_DTYPES:-complex128 complex64}; do
  timeout ${PROBE_S:-120} $PY scripts/dev/fft_callback_probe.py --dtype $d >> "$R/fft-callback-probe.log" 2>&1
  echo "== $d rc=$?"
done
cat "$R/fft-callback-probe.log" | tail -40
exit 0
