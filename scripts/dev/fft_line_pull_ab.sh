#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): the FFT pull with its own line kernel against the pull through cuFFT's load callback
# and the transposing put, in one call. (1) fft_line_pull_probe.py (one process: the kernels alone against the
# callback, cuFFT without a pull and a copy; $PROBE_CASES, DIMS:SIZE split 4 ways (default 512^3 and 16384^2;
# "": none), both precisions, and 1024^3 where $PROBE_1024 is set; once per value of $PROBE_GROUPS, the cluster
# kernel's CIRCUSLINK_FFT_CLUSTER_GROUP in bytes, default "64"); (2) per rank count in $AB_RANKS (default "4 2"): bench
# fft of $FFT_ARGS (default 16384^2 and 512^3, both precisions) with the puts and the pull on its own kernel,
# then the pull alone with CIRCUSLINK_FFT_PULL_KERNEL=callback ($AB_KERNELS, default "own callback", picks
# which; "four-step" too). Each step bounded by $AB_S seconds. Results under $R:
# fft-line-pull-probe-<size>-<dtype>.log, fft-line-pull-<kernel>-<ranks>ranks.{json,log}.
set -u
R=${R:?} PY=${PY:-python3}
for group in ${PROBE_GROUPS:-64}; do
  tag=; [ "$group" = 64 ] || tag=-group$group
  for case in ${PROBE_CASES-3:512 2:16384} ${PROBE_1024:+3:1024}; do
    dims=${case%%:*} size=${case##*:}
    for dt in complex64 complex128; do
      CIRCUSLINK_DEVICE_DEFINES=CIRCUSLINK_FFT_CLUSTER_GROUP=$group timeout ${AB_S:-150} \
        $PY scripts/dev/fft_line_pull_probe.py --dims $dims --size $size --dtype $dt \
        > "$R/fft-line-pull-probe-$size-$dt$tag.log" 2>&1
      echo "== probe $size $dt$tag rc=$?"; tail -9 "$R/fft-line-pull-probe-$size-$dt$tag.log"
    done
  done
done
for ranks in ${AB_RANKS:-4 2}; do
  for kernel in ${AB_KERNELS:-own callback}; do
    schemes=transpose-put,pull nobase=; [ $kernel != own ] && schemes=pull nobase=--no-baselines
    CIRCUSLINK_FFT_PULL_KERNEL=$kernel CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-60} timeout ${AB_S:-150} \
      $PY -m circuslink bench fft -n $ranks --schemes $schemes ${nobase:-} \
      ${FFT_ARGS:---size 16384 --size3 512 --dims 2,3 --dtype both --iters 10 --warmup 2} \
      --json "$R/fft-line-pull-$kernel-${ranks}ranks.json" > "$R/fft-line-pull-$kernel-${ranks}ranks.log" 2>&1
    echo "== bench $kernel $ranks ranks rc=$?"; tail -22 "$R/fft-line-pull-$kernel-${ranks}ranks.log"
  done
done
exit 0
