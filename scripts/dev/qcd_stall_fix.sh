#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): (1) scripts/dev/mps_load_block2.sh: does a module load wait for another MPS
# client's kernel that fills the GPU, or only for one that needs the context's local memory to grow; (2) the
# device-resident CG at 32^4 on 2x2x1x1 ranks in SMs of their own, which stalled in 3 of 4 runs with a late rank
# inside a module load, now that the first device-driven hop meets the peers first ($RUNS runs; LOAD_BLOCK=0 skips
# (1)). Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
[ "${LOAD_BLOCK:-1}" = 0 ] || bash scripts/dev/mps_load_block2.sh
G=CIRCUSLINK_SM_PARTITION=green
VARIANTS="${VARIANTS:-$(for i in $(seq ${RUNS:-2}); do printf 'green-%s:32:%s ' "$i" "$G"; done)}" \
  GRIDS=${GRIDS:-1x1x1x1,2x2x1x1} BENCH_ARGS=${BENCH_ARGS:---bw-dim 8 8 8 8} bash scripts/dev/qcd_partition_ab.sh
exit 0
