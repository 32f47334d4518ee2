#!/usr/bin/env bash
# Dev record run (gpu-check.sh dev): the transposing put inside the start launch (CIRCUSLINK_RMA_LAUNCH=kernel, the
# old default) against its own kernel node (auto's graph): bench transpose at 64 and 256 MiB complex64, and the
# 2-D FFT at 8192^2 complex64 (scripts/dev/fft_put_ab.sh), 2 ranks, the launcher's cap. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
for v in kernel graph; do
  echo "== bench transpose, $v"
  env CIRCUSLINK_RMA_LAUNCH=$v timeout 120 $PY -m circuslink bench transpose -n 2 --sizes 64M,256M --dtypes complex64 \
    --iters 20 --loop 5 --model-bytes 0 --json "$R/transpose-put-$v.json" 2>&1 | grep -E "^(transpose-put|contiguous|local)"
done
VARIANTS="kernel graph" bash scripts/dev/fft_put_ab.sh
exit 0
