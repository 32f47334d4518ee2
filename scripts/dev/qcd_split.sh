#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the resident CG with its hops split over 1-8 lanes a site.
#   the GPU tests of the device-resident CG ($QCD_TESTS, pytest ids; none if unset), each bounded;
#   scripts/dev/qcd_cg_timing.py with the split chosen by the lattice, then with CIRCUSLINK_QCD_HOP_SPLIT=1
#   (every hop one site a thread, as before), same call, same GPU;
#   bench qcd --cg device --halos rma-device at $QCD_DEVICE_LATTICES (default 8,16,32) unless QCD_DEVICE=0.
set -u
R=${R:?} PY=${PY:-python3}
if [ -n "${QCD_TESTS:-}" ]; then
  timeout "${QCD_TESTS_S:-240}" $PY -m pytest -q -x -p no:cacheprovider $QCD_TESTS 2>&1 | tail -25
fi
$PY scripts/dev/qcd_cg_timing.py --lattices "${QCD_LATTICES:-8,16}" --solve-lattice "${QCD_SOLVE:-8}" \
  --json "$R/qcd-cg-timing-split.json"
[ "${QCD_AB:-1}" = 1 ] && CIRCUSLINK_QCD_HOP_SPLIT=1 $PY scripts/dev/qcd_cg_timing.py \
  --lattices "${QCD_LATTICES:-8,16}" --solve-lattice 0 --json "$R/qcd-cg-timing-nosplit.json"
[ "${QCD_DEVICE:-1}" = 1 ] && $PY -m circuslink bench qcd --cg device --halos rma-device \
  --lattices "${QCD_DEVICE_LATTICES:-8,16,32}" --json "$R/qcd-device.json"
exit 0
