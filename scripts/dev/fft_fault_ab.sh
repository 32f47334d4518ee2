#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the FFT GPU test's device faults, A/B on the RMA queues' low-latency lines
# (CIRCUSLINK_RMA_LOW_LATENCY=1, the default, against 0: the fenced protocol), each seed REPS times, every launch
# synchronous; the job (scripts/dev/fft_fault_job.py) names the queue whose start or wait raised. Logs under $R.
set -u
R=${R:?} PY=${PY:-python3}
$PY scripts/dev/fft_fault_job.py "$R/fft_job.py"
for rep in $(seq 1 ${REPS:-2}); do
  for ll in ${LLS:-1 0}; do
    for spec in ${FFT_SEEDS:-1103810661:2 2039095828:4 405955897:4}; do
      seed=${spec%%:*} n=${spec##*:} log="$R/fft-ab-ll$ll-$seed-$n-$rep.log"
      CUDA_LAUNCH_BLOCKING=1 CIRCUSLINK_RMA_LOW_LATENCY=$ll CIRCUSLINK_TEST_SEED=$seed CIRCUSLINK_TIMEOUT=20 \
        timeout 120 python3 -m circuslink run -n "$n" -- $PY "$R/fft_job.py" > "$log" 2>&1
      echo "ll=$ll seed $seed, $n ranks, rep $rep: rc=$? $(grep -c 'checked' "$log") checked"
      grep -E "QUEUE-FAULT" "$log" | cut -c1-900 | head -4
    done
  done
done
exit 0
