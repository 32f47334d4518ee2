#!/usr/bin/env bash
# What runs on the GPU machine (the device tool's `run`): install this checkout offline,
# run the GPU-marked tests, the probe and the benchmarks, and leave everything under $OUT.
#
#   scripts/gpu-check.sh [STAGE ...]     stages: info tests probe pingpong allreduce-like allreduce rma all
#                                        scale (4- and 8-GPU machines: probe matrix, pingpong 0->k,
#                                        allreduce and the RMA ring at 4 and 8 GPUs; not in "all")
#
# Results go to $OUT/results/ (JSON + PNG, the format of benchmarks/results/) and are also
# packed into $OUT/results.tar.gz, because the device tool brings back at most 8 files.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/results"
LOG="$OUT/gpu-check.log"
exec > >(tee -a "$LOG") 2>&1

# Never use NVLink multicast on the shared machines (KINDS.md): it can take the GPUs down.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONUNBUFFERED=1 CIRCUSLINK_TIMEOUT=${CIRCUSLINK_TIMEOUT:-60}
PY=${PYTHON:-python3}
# The device machine's copy of the tree has no .git: the caller passes the commit.
if [ -z "${CIRCUSLINK_COMMIT:-}" ] && git rev-parse --short=12 HEAD >/dev/null 2>&1; then
  CIRCUSLINK_COMMIT=$(git rev-parse --short=12 HEAD)
fi
export CIRCUSLINK_COMMIT=${CIRCUSLINK_COMMIT:-unknown}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(all)
want() { for s in "${stages[@]}"; do [ "$s" = "$1" ] || [ "$s" = all ] && return 0; done; return 1; }
status=0
step() {  # step NAME CMD...: run, time and record one step; a failure marks the run failed but goes on
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@"; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t0)) s)"
  [ $rc -eq 0 ] || status=1
  echo "$name rc=$rc $((SECONDS - t0))s" >> "$OUT/summary.txt"
}

echo "=== install (offline)"
$PY -m pip install -q --no-index --no-deps --no-build-isolation -e . || { echo "install failed"; exit 2; }
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.mem --format=csv || true

want info && step info $PY -m circuslink info
# Tests get a short device-side time-out so that a hang costs seconds, not the lease.
want tests && step tests env CIRCUSLINK_TIMEOUT=20 $PY -m pytest -q -m gpu -p no:cacheprovider --timeout 150 \
  --durations=15 tests
want probe && step probe $PY -m circuslink probe --json "$OUT/results/probe.json"
want pingpong && step pingpong $PY -m circuslink bench pingpong --json "$OUT/results/pingpong.json" \
  --plot "$OUT/results/pingpong.png"
want allreduce-like && step allreduce-like $PY -m circuslink bench allreduce-like \
  --json "$OUT/results/allreduce-like.json" --plot "$OUT/results/allreduce-like.png" \
  --trace "$OUT/results/allreduce-like-trace.json"
want allreduce && step allreduce $PY -m circuslink bench allreduce --json "$OUT/results/allreduce.json" \
  --plot "$OUT/results/allreduce.png"
want rma && step rma $PY -m circuslink bench rma --json "$OUT/results/rma.json" --plot "$OUT/results/rma.png"

# Machines of more than 2 GPUs (issue 6): not part of "all"; run `scripts/gpu-check.sh scale`.
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if printf '%s\n' "${stages[@]}" | grep -qx scale; then
  step scale-probe $PY -m circuslink probe --json "$OUT/results/probe-${NGPU}gpu.json"
  for k in $(seq 1 $((NGPU - 1))); do  # GPU 0 against each other GPU: rank 0 on GPU 0, rank 1 on GPU k
    step "scale-pingpong-0-$k" env CUDA_VISIBLE_DEVICES=0,$k $PY -m circuslink bench pingpong \
      --json "$OUT/results/pingpong-0-$k.json" --plot "$OUT/results/pingpong-0-$k.png"
  done
  for n in 4 8; do
    [ "$n" -le "$NGPU" ] || continue
    step "scale-allreduce-$n" $PY -m circuslink bench allreduce -n $n --json "$OUT/results/allreduce-${n}gpu.json" \
      --plot "$OUT/results/allreduce-${n}gpu.png"
    step "scale-rma-ring-$n" $PY -m circuslink bench rma -n $n --json "$OUT/results/rma-ring${n}.json" \
      --plot "$OUT/results/rma-ring${n}.png"
  done
fi

tar -czf "$OUT/results.tar.gz" -C "$OUT" results
echo "=== summary"; cat "$OUT/summary.txt" 2>/dev/null
exit $status
