#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the transposing put's tile kernel against the copy ceiling
# (scripts/dev/transpose_kernel_ab.cu): one process alone, then two at once (uncapped, then capped at 50 %
# each as the launcher runs 2 ranks). Results under $R.
set -u
R=${R:?}
nvcc -std=c++17 -arch=sm_90a -I src/circuslink/include -o "$R/tk" scripts/dev/transpose_kernel_ab.cu || exit 0
echo "== alone"; timeout 60 "$R/tk" | tee "$R/tk-alone.jsonl"
for share in 100 50; do
  echo "== two at $share %"
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$share timeout 60 "$R/tk" > "$R/tk-$share-a.jsonl" &
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$share timeout 60 "$R/tk" > "$R/tk-$share-b.jsonl"
  wait; cat "$R/tk-$share-a.jsonl"
done
rm -f "$R/tk"
exit 0
