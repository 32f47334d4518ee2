#!/usr/bin/env bash
# Dev experiment (gpu-check.sh dev): bench stream's rendezvous form took 290 us a 256 MiB message at its default
# grid (the stream's whole budget) against 201 us one-way in the pingpong's rendezvous at 49 blocks; the stream at
# 33, 49 and 66 blocks (16-256 MiB, no baselines). Results under $R.
set -u
R=${R:?} PY=${PY:-python3}
for b in 33 49 66; do
  timeout 150 $PY -m circuslink bench stream --sizes 16M,64M,256M --grid-blocks $b --no-baselines \
    --json "$R/stream-rdv-blocks-$b.json" > "$R/stream-rdv-blocks-$b.log" 2>&1
  echo "== $b blocks rc=$?"; grep -E "circuslink-rdv|circuslink-grid" "$R/stream-rdv-blocks-$b.log" | grep -v "^$" | tail -9
done
exit 0
