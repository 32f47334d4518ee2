#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the device-resident CG with each rank on SMs of its own
# (CIRCUSLINK_SM_PARTITION=green: a green context a rank, its persistent grids half of what its group holds)
# against MPS's cap (off, the default), in one call: bench qcd --cg device --halos rma-device at $LATTICES
# (default 16,32) on 1, 2 and 4 ranks. The partitioned runs dump every rank's Python stacks every $DUMP_S s
# (scripts/dev/stall_dump): with grids of the whole group the CG at 32^4 on 2 ranks stalled (2026-12-07), so if
# it stalls again the log says where each rank was. Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
for v in green off; do
  dump=()
  [ $v = green ] && dump=(PYTHONPATH="$PWD/scripts/dev/stall_dump${PYTHONPATH:+:$PYTHONPATH}" CIRCUSLINK_DEV_DUMP_S=${DUMP_S:-15})
  env "${dump[@]}" CIRCUSLINK_SM_PARTITION=$v timeout ${QCD_S:-200} $PY -m circuslink bench qcd --cg device \
    --halos rma-device --lattices "${LATTICES:-16,32}" --json "$R/qcd-partition-$v.json" > "$R/qcd-partition-$v.log" 2>&1
  echo "== $v rc=$?"; grep -E "^(none|rma-device) |MISSED|met|skipped" "$R/qcd-partition-$v.log" | tail -12
done
exit 0
