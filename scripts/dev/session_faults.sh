#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the GPU defects open on 2026-11-29 in one call. The FFT accuracy test's
# device faults replayed with their seeds (scripts/dev/fft_fault.sh), then the RMA time-out tests on the GPU
# (the start test now on the posted line form; the wait test's host-against-device message). Logs under $R.
set -u
R=${R:?} PY=${PY:-python3}
bash scripts/dev/fft_fault.sh
timeout 200 $PY -m pytest -q -p no:cacheprovider -k cuda \
  "tests/test_rma.py::test_wait_times_out_naming_the_silent_origin" \
  "tests/test_rma.py::test_start_times_out_naming_the_target_that_never_posts" > "$R/rma-timeouts.log" 2>&1
echo "rma time-out tests: rc=$?"; tail -30 "$R/rma-timeouts.log"
exit 0
