#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): what the ranks' MPS share does to where their blocks run, and to the
# device-resident CG on 2 and 4 ranks.
#   scripts/dev/sm_placement.py at 2 and 4 ranks, with the launcher's share (100 / ranks percent) and with
#   CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 (no cap);
#   bench qcd --cg device --halos rma-device at $QCD_DEVICE_LATTICES (default 16,32) with each, unless QCD=0.
# Knobs: PLACE_BLOCKS2, PLACE_BLOCKS4 (blocks a rank), QCD=0, SHARE_ENV (extra env for the uncapped runs).
set -u
R=${R:?} PY=${PY:-python3}
for share in default 100; do
  if [ $share = default ]; then envs=(); else envs=(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 ${SHARE_ENV:-}); fi
  env "${envs[@]}" timeout 120 $PY -m circuslink run -n 2 -- $PY scripts/dev/sm_placement.py --label "share-$share" \
    --blocks "${PLACE_BLOCKS2:-33,66,132,264}" --json "$R/sm-placement.json"
  env "${envs[@]}" timeout 120 $PY -m circuslink run -n 4 -- $PY scripts/dev/sm_placement.py --label "share-$share" \
    --blocks "${PLACE_BLOCKS4:-8,33,66,132}" --json "$R/sm-placement.json"
done
[ "${QCD:-1}" = 1 ] || exit 0
for share in default 100; do
  if [ $share = default ]; then envs=(); else envs=(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 ${SHARE_ENV:-}); fi
  env "${envs[@]}" timeout 240 $PY -m circuslink bench qcd --cg device --halos rma-device \
    --lattices "${QCD_DEVICE_LATTICES:-16,32}" --json "$R/qcd-device-share-$share.json"
done
exit 0
