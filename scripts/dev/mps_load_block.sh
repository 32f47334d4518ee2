#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): scripts/dev/mps_load_block.py at MPS shares 100 (uncapped) and 50 (the
# launcher's cap for 2 ranks), lazy and eager loading. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
for share in 100 50; do
  for loading in LAZY EAGER; do
    flag=$(mktemp -u)
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$share CUDA_MODULE_LOADING=$loading timeout 60 $PY scripts/dev/mps_load_block.py spin "$flag" &
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$share CUDA_MODULE_LOADING=$loading timeout 60 $PY scripts/dev/mps_load_block.py load "$flag" \
      | tee -a "$R/mps-load-block.jsonl"
    wait; rm -f "$flag"
  done
done
exit 0
