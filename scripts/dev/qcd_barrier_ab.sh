#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev, DEV_SCRIPT=scripts/dev/qcd_barrier_ab.sh): the device-resident CG's time per
# iteration with this tree's grid_sync, then with an older grid.cuh swapped in, then with this tree's again (so the
# run-to-run drift shows beside the difference). Make the older header first, in the tree that is sent:
#   git show 9e7c44e:src/circuslink/include/circuslink/grid.cuh > scripts/dev/old_grid.cuh
set -u
R=${R:?} PY=${PY:-python3}
G=src/circuslink/include/circuslink/grid.cuh
[ -f scripts/dev/old_grid.cuh ] || { echo "scripts/dev/old_grid.cuh: make it first (see this script's header)"; exit 2; }
cp $G /tmp/new_grid.cuh
trap 'cp /tmp/new_grid.cuh $G' EXIT
$PY scripts/dev/qcd_cg_timing.py --lattices 8,16 --solve-lattice 0 --json "$R/qcd-cg-timing-flip.json"
cp scripts/dev/old_grid.cuh $G
$PY scripts/dev/qcd_cg_timing.py --lattices 8,16 --solve-lattice 0 --json "$R/qcd-cg-timing-twoword.json"
cp /tmp/new_grid.cuh $G
$PY scripts/dev/qcd_cg_timing.py --lattices 8 --solve-lattice 0 --json "$R/qcd-cg-timing-flip-again.json"
