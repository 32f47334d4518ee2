#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the device-resident CG (bench qcd --cg device --halos rma-device) on 1, 2 and
# 4 ranks under variants, in one call. $VARIANTS: "name:lattices[:VAR=value+VAR=value+--option=value...]" separated
# by spaces (a value may hold commas: CIRCUSLINK_DEVICE_DEFINES=A=1,B=2; an entry starting with -- is an option of
# bench qcd: --check-every=100); the default, on SMs of their own a rank (green):
#   green:16,32             the library's defaults (direct faces; one pass a hop where the sites fit the threads)
#   green-1pass:16,32       ... one pass a hop everywhere (CIRCUSLINK_QCD_ONE_PASS=1)
#   green-2pass:16,32       ... two passes everywhere (CIRCUSLINK_QCD_ONE_PASS=0)
#   green-whole:16,32       ... grids of the whole group, not half (CIRCUSLINK_PARTITION_GRID=whole)
#   green-copy:16,32        ... the faces copied by the RMA queue (CIRCUSLINK_QCD_DIRECT_FACES=0)
#   green-sys:16,32         ... the sums over ranks (and the RMA counters) at .sys scope (CIRCUSLINK_SYS_FENCES=1)
#   green-trace:32          ... with the per-hop trace (CIRCUSLINK_QCD_DEV_TRACE=16), summed by qcd_trace.py
#   green-facegrid:32       ... copied faces, every block copying its share first (CIRCUSLINK_QCD_FACE_GRID=1)
#   alone-halo:32           ... without the halo exchanges (CIRCUSLINK_QCD_DEV_ALONE=1: timing only)
#   alone:32                ... without the exchanges and the sums over ranks (CIRCUSLINK_QCD_DEV_ALONE=3)
# Partitioned runs dump every rank's Python stacks every $DUMP_S s into $R/dumps-<name>/ (scripts/dev/stall_dump),
# so a stalled rank's place survives the run's end. $GRIDS: the rank grids (bench qcd --grids); $BENCH_ARGS: more
# options. Each run is bounded by $QCD_S seconds. Results under $R: qcd-partition-<name>.{json,log}, and the
# trace's files under $R/trace-<name>/.
set -u
R=${R:?} PY=${PY:-python3}
G=CIRCUSLINK_SM_PARTITION=green D=CIRCUSLINK_DEVICE_DEFINES
VARIANTS=${VARIANTS:-"green:16,32:$G green-1pass:16,32:$G+CIRCUSLINK_QCD_ONE_PASS=1
  green-2pass:16,32:$G+CIRCUSLINK_QCD_ONE_PASS=0 green-whole:16,32:$G+CIRCUSLINK_PARTITION_GRID=whole green-copy:16,32:$G+CIRCUSLINK_QCD_DIRECT_FACES=0
  green-sys:16,32:$G+CIRCUSLINK_SYS_FENCES=1
  green-trace:32:$G+$D=CIRCUSLINK_QCD_DEV_TRACE=16 green-facegrid:32:$G+CIRCUSLINK_QCD_DIRECT_FACES=0+$D=CIRCUSLINK_QCD_FACE_GRID=1
  alone-halo:32:$G+$D=CIRCUSLINK_QCD_DEV_ALONE=1
  alone:32:$G+$D=CIRCUSLINK_QCD_DEV_ALONE=3"}
for v in $VARIANTS; do
  IFS=: read -r name lattices vars <<< "$v"
  settings=() envs=() args=()
  IFS=+ read -r -a settings <<< "${vars:-}"
  for e in "${settings[@]}"; do  # an option of bench qcd (--check-every=100) or a VAR=value
    case "$e" in --*) args+=("$e");; *) envs+=("$e");; esac
  done
  # the job's own waits give up well before $QCD_S kills it (a killed job takes the MPS server down with it)
  envs+=(CIRCUSLINK_QCD_DEV_TRACE_DIR="$R/trace-$name" CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-40})
  case " ${envs[*]} " in *SM_PARTITION=green*)
    envs+=(PYTHONPATH="$PWD/scripts/dev/stall_dump${PYTHONPATH:+:$PYTHONPATH}" CIRCUSLINK_DEV_DUMP_S=${DUMP_S:-15}
          CIRCUSLINK_DEV_DUMP_DIR="$R/dumps-$name");;
  esac
  env "${envs[@]}" timeout ${QCD_S:-200} $PY -m circuslink bench qcd --cg device --halos rma-device \
    --lattices "$lattices" --grids "${GRIDS:-1x1x1x1,2x1x1x1,2x2x1x1}" ${BENCH_ARGS:-} "${args[@]}" --json "$R/qcd-partition-$name.json" > "$R/qcd-partition-$name.log" 2>&1
  echo "== $name rc=$? (${envs[*]} ${args[*]})"; grep -E "^(none|rma-device) |MISSED|met|skipped" "$R/qcd-partition-$name.log" | tail -12
  [ -d "$R/trace-$name" ] && $PY scripts/dev/qcd_trace.py "$R/trace-$name"
done
exit 0
