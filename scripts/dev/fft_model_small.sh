#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): the tile model against the puts alone at small 2-D sizes, where a fixed cost per
# reshape would dominate: bench fft, transposing put only, no baselines, 2 and 4 ranks, 1024^2..4096^2 both
# precisions. Rows' put_alone_ms against predicted_comm_ms give the intercept (fixed cost) and the slope
# (bandwidth) of the model's error. Results under $R: fft-model-small-<n>ranks.{json,log}.
set -u
R=${R:?} PY=${PY:-python3}
for n in ${RANKS_LIST:-2 4}; do
  CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-60} timeout ${SMALL_S:-150} $PY -m circuslink bench fft -n $n \
    --schemes transpose-put --no-baselines --size ${SMALL_SIZES:-1024,2048,4096} --dims 2 --dtype both \
    --iters 10 --warmup 2 --json "$R/fft-model-small-${n}ranks.json" > "$R/fft-model-small-${n}ranks.log" 2>&1
  echo "== small n=$n rc=$?"; grep -iE "model|put" "$R/fft-model-small-${n}ranks.log" | tail -12
done
exit 0
