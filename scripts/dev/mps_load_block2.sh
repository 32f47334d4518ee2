#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): scripts/dev/mps_load_block.py uncapped (share 100, lazy loading) with the
# spinner one block or the whole GPU, and the loaded kernel plain or with local memory. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
for spin in 1x32 264x1024; do
  for lmem in 0 1; do
    flag=$(mktemp -u)
    export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 SPIN_S=${SPIN_S:-5} SPIN_BLOCKS=${spin%x*} SPIN_THREADS=${spin#*x} LOAD_LMEM=$lmem
    timeout 40 $PY scripts/dev/mps_load_block.py spin "$flag" &
    timeout 40 $PY scripts/dev/mps_load_block.py load "$flag" | tee -a "$R/mps-load-block2.jsonl"
    wait; rm -f "$flag"
  done
done
exit 0
