#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): fft_timeline.py (each rank's phases of a forward 2-D FFT, per chunk count) with the
# FFT's default partition (SMs of their own a rank). $RANKS (4), $TL_ARGS (the script's options), $TL_S (bound).
# Results under $R: fft-timeline.{json,log}.
set -u
R=${R:?} PY=${PY:-python3}
CIRCUSLINK_SM_PARTITION=${CIRCUSLINK_SM_PARTITION:-auto} CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-60} timeout ${TL_S:-200} \
  $PY -m circuslink run -n ${RANKS:-4} -- $PY scripts/dev/fft_timeline.py ${TL_ARGS:-} --json "$R/fft-timeline.json" \
  > "$R/fft-timeline.log" 2>&1
echo "== rc=$?"; tail -40 "$R/fft-timeline.log"
exit 0
