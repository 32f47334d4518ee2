#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): bench fft with the ranks sharing the GPU under MPS's cap (the default) against
# SMs of their own a rank (CIRCUSLINK_SM_PARTITION=green), in one call. Under the cap MPS places every rank on the
# same SMs (four ranks at 25 % all on SMs 0-31, mps.py), so a reshape's puts of all ranks share a quarter of the GPU.
# $MODES: the partition modes (default "off green"; "default": none set, the command's own default); $RANKS (default 4); $FFT_ARGS: the cases (default 16384^2,
# both precisions). A mode may carry settings after a colon, e.g. "default:CIRCUSLINK_BENCH_HANDSHAKE=0" (the old
# clock: the host barrier alone; several settings separated by commas); its files are then named after them. Each run is bounded by $FFT_S seconds. Results under $R: fft-partition-<mode>-<n>ranks.{json,log}.
set -u
R=${R:?} PY=${PY:-python3}
for n in ${RANKS:-4}; do
  for entry in ${MODES:-off green}; do
    IFS=: read -r m extra <<< "$entry"
    tag=$m; [ -n "${extra:-}" ] && tag="$m-$(echo "$extra" | tr -c 'A-Za-z0-9' '-' | tr 'A-Z' 'a-z' | sed 's/circuslink-//; s/-*$//')"
    f="$R/fft-partition-$tag-${n}ranks"
    part=(CIRCUSLINK_SM_PARTITION=$m); [ "$m" = default ] && part=(-u CIRCUSLINK_SM_PARTITION)
    [ -n "${extra:-}" ] && part+=(${extra//,/ })
    env "${part[@]}" CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-60} timeout ${FFT_S:-240} $PY -m circuslink bench \
      fft -n $n ${FFT_ARGS:---size 16384 --dims 2 --dtype both --iters 10 --warmup 2} --json "$f.json" > "$f.log" 2>&1
    echo "== $tag $n ranks rc=$?"; tail -25 "$f.log"
    grep -o '"sm_partition": *"[a-z]*"' "$f.json" | head -1
  done
done
exit 0
