#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): the rendezvous GPU test replayed with the seed of its 2026-11-29 failure (a late
# reading warp's peek waited for a ring packet whose slot had been reused: a deadlock), then with fresh seeds.
set -u
R=${R:?} PY=${PY:-python3}
T="tests/test_channels_rdv_gpu.py::test_rendezvous_and_ring_messages_mixed_byte_exact_gpu"
CIRCUSLINK_TEST_SEED=1206379216 CIRCUSLINK_TIMEOUT=30 timeout 150 $PY -m pytest -q -p no:cacheprovider -m gpu "$T" 2>&1 | tail -4
for i in 1 2 3; do
  CIRCUSLINK_TIMEOUT=30 timeout 150 $PY -m pytest -q -p no:cacheprovider -m gpu "$T" 2>&1 | tail -4
done
exit 0
