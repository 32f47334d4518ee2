#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): Nsight Compute's per-instruction stall samples of the resident CG kernel
# (single precision) on one rank at $QCD_NCU_LATTICE^4 (default 8), outside MPS (ncu does not profile MPS
# clients): the fourth launch of scripts/dev/qcd_cg_timing.py, then its source page as CSV and its details;
# QCD_THEN_SPLIT=1: scripts/dev/qcd_split.sh after it.
set -u
R=${R:?} PY=${PY:-python3}
L=${QCD_NCU_LATTICE:-8}
nomps=$(mktemp -d)
CUDA_MPS_PIPE_DIRECTORY=$nomps CUDA_MPS_LOG_DIRECTORY=$nomps ncu --clock-control none -k regex:qcd_cg_resident \
  -s 3 -c 1 --section SourceCounters --section WarpStateStats --section LaunchStats --import-source no \
  -f -o "$R/cg-resident-$L" $PY scripts/dev/qcd_cg_timing.py --lattices "$L" --solve-lattice 0 2>&1 | tail -15
ncu -i "$R/cg-resident-$L.ncu-rep" --page source --csv --print-source sass > "$R/cg-resident-$L-source.csv"
ncu -i "$R/cg-resident-$L.ncu-rep" --page details 2>&1 | head -120
rm -rf "$nomps"
[ "${QCD_THEN_SPLIT:-0}" = 1 ] && bash scripts/dev/qcd_split.sh
exit 0
