#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): the FFT's pull scheme against the transposing put, in one call. (1) bench fft with
# both schemes ($FFT_ARGS, default 16384^2 both precisions, 4 ranks, the default partition), (2) each rank's phases
# of the pull (fft_timeline.py --scheme pull, complex128, each rank's zero on the GPU clock), (3)
# fft_callback_probe.py (one process: cuFFT with a JIT load callback against the plain transforms, both
# precisions), (4) meet_latency.py (one device-side meeting's cost to its last arrival, idle and busy). Each step
# bounded by $PULL_S seconds. Results under $R: fft-pull-ab.{json,log}, fft-timeline-pull.{json,log},
# fft-callback-probe-<dtype>.log, meet-latency.{json,log}.
set -u
R=${R:?} PY=${PY:-python3}
CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-60} timeout ${PULL_S:-200} $PY -m circuslink bench fft -n ${RANKS:-4} \
  --schemes transpose-put,pull ${FFT_ARGS:---size 16384 --dims 2 --dtype both --iters 10 --warmup 2} \
  --json "$R/fft-pull-ab.json" > "$R/fft-pull-ab.log" 2>&1
echo "== bench rc=$?"; tail -25 "$R/fft-pull-ab.log"
CIRCUSLINK_SM_PARTITION=${CIRCUSLINK_SM_PARTITION:-auto} CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-60} \
  timeout ${PULL_S:-200} $PY -m circuslink run -n ${RANKS:-4} -- $PY scripts/dev/fft_timeline.py --scheme pull \
  --dtype complex128 --json "$R/fft-timeline-pull.json" > "$R/fft-timeline-pull.log" 2>&1
echo "== timeline rc=$?"; tail -8 "$R/fft-timeline-pull.log"
for dt in complex128 complex64; do
  timeout ${PULL_S:-200} $PY scripts/dev/fft_callback_probe.py --dtype $dt > "$R/fft-callback-probe-$dt.log" 2>&1
  echo "== probe $dt rc=$?"; tail -12 "$R/fft-callback-probe-$dt.log"
done
CIRCUSLINK_SM_PARTITION=${CIRCUSLINK_SM_PARTITION:-auto} CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-60} \
  timeout ${PULL_S:-200} $PY -m circuslink run -n ${RANKS:-4} -- $PY scripts/dev/meet_latency.py --busy \
  --json "$R/meet-latency.json" > "$R/meet-latency.log" 2>&1
echo "== meet rc=$?"; tail -10 "$R/meet-latency.log"
exit 0
