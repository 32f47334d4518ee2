#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the few-packet channel path and the one-barrier persistent stencil.
#   pingpong at the sizes around one, two, several low-latency packets, with NVSHMEM beside it;
#   the persistent stencil at 64x64 a rank, this tree's example against $OLD_STENCIL (an older copy of
#   examples/stencil, the same headers), with the NVSHMEM stencil beside it.
# Knobs: BARRIER_AB=1 (also scripts/dev/grid_barrier_ab.py), QCD_TIMING=1 (also scripts/dev/qcd_cg_timing.py), PINGPONG=0 / STENCIL=0 (skip a part), FEW_SIZES,
# OLD_STENCIL, STENCIL_CELLS, STENCIL_RANKS, STENCIL_DOMAINS, STENCIL_IMPLS.
set -u
R=${R:?} PY=${PY:-python3}
[ -n "${BARRIER_AB:-}" ] && $PY scripts/dev/grid_barrier_ab.py --json "$R/grid-barrier-ab.json"
[ -n "${QCD_TIMING:-}" ] && $PY scripts/dev/qcd_cg_timing.py --lattices "${QCD_LATTICES:-8,16}" \
  --json "$R/qcd-cg-timing.json"
[ "${PINGPONG:-1}" = 1 ] && $PY -m circuslink bench pingpong --sizes "${FEW_SIZES:-8,120,128,240,256,512,960,1K,2K}" \
  --iters 20 --json "$R/pingpong-few.json"
# $STENCIL_CELLS (e.g. "1 2 4"): copies of this tree's example with CELLS_PER_THREAD set to each
variants=""
for c in ${STENCIL_CELLS:-}; do
  mkdir -p "/tmp/stencil-c$c" && cp examples/stencil/* "/tmp/stencil-c$c/"
  sed -i "s/^CELLS_PER_THREAD = .*/CELLS_PER_THREAD = $c/" "/tmp/stencil-c$c/stencil.py"
  variants="$variants /tmp/stencil-c$c"
done
[ "${STENCIL:-1}" = 1 ] || exit 0
for ex in ${OLD_STENCIL:-} ${variants:-examples/stencil}; do
  case "$ex" in examples/stencil) tag=new ;; /tmp/stencil-c*) tag=${ex#/tmp/stencil-} ;; *) tag=old ;; esac
  $PY -m circuslink bench stencil --ranks ${STENCIL_RANKS:-2,4,8} --per-rank --domains ${STENCIL_DOMAINS:-64x64} \
    --impls ${STENCIL_IMPLS:-channel-persistent,nvshmem} --dtypes float64 --iters 200 --example "$ex" \
    --json "$R/stencil-few-$tag.json"
done
