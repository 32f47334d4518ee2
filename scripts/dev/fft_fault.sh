#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the FFT GPU test's device faults of 2026-11-29, replayed with the seeds that
# failed, every launch synchronous (CUDA_LAUNCH_BLOCKING=1) so that the faulting kernel's own call raises; the
# job prints each case as it starts. One log a seed under $R. Knob: FFT_SEEDS ("SEED:RANKS ...").
set -u
R=${R:?} PY=${PY:-python3}
for spec in ${FFT_SEEDS:-1103810661:2 2039095828:4 405955897:4}; do
  seed=${spec%%:*} n=${spec##*:}
  CUDA_LAUNCH_BLOCKING=1 CIRCUSLINK_TEST_SEED=$seed CIRCUSLINK_TIMEOUT=20 timeout 150 $PY -m pytest -q -x \
    -p no:cacheprovider "tests/test_fft.py::test_plans_match_numpy_on_gpu[$n]" > "$R/fft-fault-$seed-$n.log" 2>&1
  echo "seed $seed, $n ranks: rc=$?"; grep -E "case \(|Error|error" "$R/fft-fault-$seed-$n.log" | head -8
done
exit 0
