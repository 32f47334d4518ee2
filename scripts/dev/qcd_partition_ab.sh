#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the device-resident CG with each rank on SMs of its own (a green context a
# rank, the launcher's default where the driver offers them) against MPS's cap (CIRCUSLINK_SM_PARTITION=off), in
# one call: bench qcd --cg device --halos rma-device at $LATTICES (default 16,32) on 1, 2 and 4 ranks.
set -u
R=${R:?} PY=${PY:-python3}
for v in green off; do
  CIRCUSLINK_SM_PARTITION=$v timeout ${QCD_S:-200} $PY -m circuslink bench qcd --cg device --halos rma-device \
    --lattices "${LATTICES:-16,32}" --json "$R/qcd-partition-$v.json" > "$R/qcd-partition-$v.log" 2>&1
  echo "== $v rc=$?"; grep -E "us|error|Error" "$R/qcd-partition-$v.log" | tail -12
done
exit 0
