#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the transposing put of the 2-D FFT, inside the start launch (held to the
# blocks that may wait on peers at once: CIRCUSLINK_RMA_LAUNCH=kernel, the old default) against a kernel node of
# its own with a full wave of blocks (the graph launch, now auto's choice for large transposing puts); capped
# (the launcher's default) and uncapped (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100). 8192^2 complex64, 2 ranks, the
# copy-engine slab baseline beside it. Knobs: VARIANTS, SIZE, DTYPE, CHUNKS. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
run() {  # name, env...
  local name=$1; shift
  env "$@" timeout 150 $PY -m circuslink bench fft -n 2 --size ${SIZE:-8192} --dims 2 --dtype ${DTYPE:-complex64} \
    --alltoall copy-engine --baseline-chunks 1,4 ${CHUNKS:+--chunks $CHUNKS} --json "$R/fft-put-$name.json" \
    > "$R/fft-put-$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "^transpose-put|^baseline-copy|^fftn-1rank|target" "$R/fft-put-$name.log" | cut -c1-200
}
want() { case " ${VARIANTS:-kernel graph kernel-uncapped graph-uncapped} " in *" $1 "*) return 0;; esac; return 1; }
want kernel && run kernel CIRCUSLINK_RMA_LAUNCH=kernel
want graph && run graph
want kernel-uncapped && run kernel-uncapped CIRCUSLINK_RMA_LAUNCH=kernel CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100
want graph-uncapped && run graph-uncapped CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100
exit 0
