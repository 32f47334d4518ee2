#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): the low-latency start of a rank with no words (it stored through
# uninitialised registers). The new regression test against the older tree ($OLD_TREE, default .old: it must
# fail there), then on this tree with the FFT GPU tests and the RMA time-out tests. Logs under $R.
set -u
R=${R:?} PY=${PY:-python3}
OLD=${OLD_TREE:-.old}
T="tests/test_rma_cuda.py::test_small_chains_many_origins_byte_exact"
for rep in 1 2; do
  PYTHONPATH="$PWD/$OLD/src" CIRCUSLINK_TIMEOUT=15 timeout 150 $PY -m pytest -q -p no:cacheprovider -x \
    "$T[-1-3]" > "$R/ll-silent-old-$rep.log" 2>&1
  echo "old tree, silent rank, rep $rep: rc=$?"; grep -E "passed|failed|Error" "$R/ll-silent-old-$rep.log" | head -3
done
timeout 420 $PY -m pytest -q -p no:cacheprovider "$T" \
  "tests/test_rma.py::test_wait_times_out_naming_the_silent_origin" \
  "tests/test_rma.py::test_start_times_out_naming_the_target_that_never_posts" \
  "tests/test_fft.py::test_plans_match_numpy_on_gpu" -k "cuda or many_origins or gpu" > "$R/ll-silent-new.log" 2>&1
echo "this tree: rc=$?"; tail -25 "$R/ll-silent-new.log"
exit 0
