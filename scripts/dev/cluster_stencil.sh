#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the small stencil's compute-and-barrier floor with a rank's block spread over the
# SMs of one thread-block cluster (scripts/dev/cluster_stencil.cu), 64x64 and 112x112 float64, clusters of 1-8
# blocks. A few seconds. Results under $R.
set -u
R=${R:?}
nvcc -std=c++17 -arch=sm_90a -o "$R/cluster_stencil" scripts/dev/cluster_stencil.cu || exit 0
for size in "64 64" "112 112"; do
  timeout 60 "$R/cluster_stencil" $size 2000 | tee -a "$R/cluster-stencil.jsonl"
done
rm -f "$R/cluster_stencil"
exit 0
