#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): bench fft with the ranks sharing the GPU under MPS's cap (the default) against
# SMs of their own a rank (CIRCUSLINK_SM_PARTITION=green), in one call. Under the cap MPS places every rank on the
# same SMs (four ranks at 25 % all on SMs 0-31, mps.py), so a reshape's puts of all ranks share a quarter of the GPU.
# $MODES: the partition modes (default "off green"; "default": none set, the command's own default); $RANKS (default 4); $FFT_ARGS: the cases (default 16384^2,
# both precisions). Each run is bounded by $FFT_S seconds. Results under $R: fft-partition-<mode>-<n>ranks.{json,log}.
set -u
R=${R:?} PY=${PY:-python3}
for n in ${RANKS:-4}; do
  for m in ${MODES:-off green}; do
    f="$R/fft-partition-$m-${n}ranks"
    part=(CIRCUSLINK_SM_PARTITION=$m); [ "$m" = default ] && part=(-u CIRCUSLINK_SM_PARTITION)
    env "${part[@]}" CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-60} timeout ${FFT_S:-240} $PY -m circuslink bench \
      fft -n $n ${FFT_ARGS:---size 16384 --dims 2 --dtype both --iters 10 --warmup 2} --json "$f.json" > "$f.log" 2>&1
    echo "== $m $n ranks rc=$?"; tail -25 "$f.log"
    grep -o '"sm_partition": *"[a-z]*"' "$f.json" | head -1
  done
done
exit 0
