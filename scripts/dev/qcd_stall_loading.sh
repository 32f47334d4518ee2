#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): is the uncapped stall of the device-resident CG (32^4, 2x2x1x1) a module
# load that waits for the other ranks' kernels? Those spin on the late rank's first halo exchange while it still
# loads a kernel (scripts/dev/qcd_stall_dump.sh found the late rank inside cupy's compile-and-load). A/B, all
# uncapped, in order: lazy loading (CUDA's default) on a fresh kernel cache, lazy again with the cache warm (no
# compile, still a load), then CUDA_MODULE_LOADING=EAGER twice; pNN variants run at
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=NN instead of 100, each on a fresh kernel cache (CUPY_CACHE_DIR). Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
run() {  # name, env...
  local name=$1; shift
  env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CIRCUSLINK_TIMEOUT=20 "$@" timeout ${RUN_S:-80} $PY -m circuslink bench qcd \
    --cg device --halos rma-device --lattices 32 --grids 2x2x1x1 --json "$R/qcd-load-$name.json" \
    > "$R/qcd-load-$name.log" 2>&1
  echo "== $name rc=$? $(grep -E 'skipped|^rma-device +32' "$R/qcd-load-$name.log" | tail -1 | cut -c1-200)"
}
for v in ${VARIANTS:-lazy-fresh lazy-warm eager-1 eager-2}; do
  case $v in
    lazy*) run "$v" ;;
    eager*) run "$v" CUDA_MODULE_LOADING=EAGER ;;
    p*) pct=${v#p}; pct=${pct%%-*}; run "$v" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct CUPY_CACHE_DIR="$(mktemp -d)" ;;
  esac
done
exit 0
