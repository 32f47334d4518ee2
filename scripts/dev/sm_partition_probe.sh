#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): can each rank get SMs of its own? Capped MPS ranks land on the same SMs
# (2026-11-29) and uncapped ones stalled the resident CG; two mechanisms would give each rank a disjoint set:
# MPS static SM partitioning (nvidia-cuda-mps-control -S, CUDA_MPS_SM_PARTITION; newer MPS releases) and CUDA green
# contexts (an SM resource split, one group a process). This only asks what the machine's driver and MPS offer,
# in a few seconds: the control daemon's version and options, a daemon started with -S in a private pipe
# directory (stopped at once), and the driver's green-context entry points through cuda-python. Output under $R.
set -u
R=${R:?} PY=${PY:-python3}
out="$R/sm-partition-probe.txt"
{
  echo "== nvidia-cuda-mps-control -v"; timeout 10 nvidia-cuda-mps-control -v 2>&1 | head -5
  echo "== help lines naming partitions"; timeout 10 nvidia-cuda-mps-control -h 2>&1 | grep -i -E "static|partition" | head
  echo "== a daemon with -S"
  dir=$(mktemp -d)
  CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log timeout 10 nvidia-cuda-mps-control -S -d 2>&1 | head -5
  echo "rc=$?"; sleep 1
  echo "sm_partition list:"; echo "sm_partition list" | CUDA_MPS_PIPE_DIRECTORY=$dir/pipe timeout 10 nvidia-cuda-mps-control 2>&1 | head -5
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$dir/pipe timeout 10 nvidia-cuda-mps-control 2>&1 | head -2
  cat "$dir"/log/control.log 2>/dev/null | tail -5
  echo "== green contexts (cuda-python)"
  timeout 60 $PY - <<'PYEOF' 2>&1 | head -30
import cuda.bindings.driver as d
names = [n for n in dir(d) if "Green" in n or "SmResource" in n or "DevResource" in n]
print("entry points:", names)
err, = d.cuInit(0)
err, dev = d.cuDeviceGet(0)
err, res = d.cuDeviceGetDevResource(dev, d.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)
print("device SM resource:", err, res.sm.smCount if err == d.CUresult.CUDA_SUCCESS else None)
err, groups, n, rest = d.cuDevSmResourceSplitByCount(4, res, 0, 32)
print("split into groups of 32 SMs:", err, n, [g.sm.smCount for g in groups[:n]] if err == d.CUresult.CUDA_SUCCESS else None)
PYEOF
} > "$out" 2>&1
cat "$out"
exit 0
