#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the device-resident CG (bench qcd --cg device --halos rma-device) on 1, 2 and
# 4 ranks under variants, in one call. $VARIANTS: "name:lattices[:VAR=value,...]" separated by spaces; default
#   green:16,32:CIRCUSLINK_SM_PARTITION=green          each rank on SMs of its own (a green context a rank)
#   green-team:16,32:...,CIRCUSLINK_QCD_FACE_BLOCKS=auto   ... a team of blocks copies the faces (rma_start_team)
#   green-team-lanes:16:...,CIRCUSLINK_DEVICE_DEFINES=CIRCUSLINK_QCD_SUM_LANES=32   ... and the sums a lane a rank
#   off:16:CIRCUSLINK_SM_PARTITION=off                  MPS's cap (the default)
# Partitioned runs dump every rank's Python stacks every $DUMP_S s (scripts/dev/stall_dump): with grids of the
# whole group the CG at 32^4 on 2 ranks stalled (2026-12-07), so if it stalls again the log says where each rank
# was. $GRIDS: the rank grids (bench qcd --grids); $BENCH_ARGS: more options. Each run is bounded by $QCD_S seconds. Results under $R: qcd-partition-<name>.{json,log}.
set -u
R=${R:?} PY=${PY:-python3}
G=CIRCUSLINK_SM_PARTITION=green T=CIRCUSLINK_QCD_FACE_BLOCKS=auto L=CIRCUSLINK_DEVICE_DEFINES=CIRCUSLINK_QCD_SUM_LANES=32
VARIANTS=${VARIANTS:-"green:16,32:$G green-team:16,32:$G,$T green-team-lanes:16:$G,$T,$L off:16:CIRCUSLINK_SM_PARTITION=off"}
for v in $VARIANTS; do
  IFS=: read -r name lattices vars <<< "$v"
  envs=()
  IFS=, read -r -a envs <<< "${vars:-}"
  case " ${envs[*]} " in *SM_PARTITION=green*)
    envs+=(PYTHONPATH="$PWD/scripts/dev/stall_dump${PYTHONPATH:+:$PYTHONPATH}" CIRCUSLINK_DEV_DUMP_S=${DUMP_S:-15}
          CIRCUSLINK_DEV_DUMP_DIR="$R/dumps-$name");;
  esac
  env "${envs[@]}" timeout ${QCD_S:-200} $PY -m circuslink bench qcd --cg device --halos rma-device \
    --lattices "$lattices" --grids "${GRIDS:-1x1x1x1,2x1x1x1,2x2x1x1}" ${BENCH_ARGS:-} --json "$R/qcd-partition-$name.json" > "$R/qcd-partition-$name.log" 2>&1
  echo "== $name rc=$? (${envs[*]})"; grep -E "^(none|rma-device) |MISSED|met|skipped" "$R/qcd-partition-$name.log" | tail -12
done
exit 0
