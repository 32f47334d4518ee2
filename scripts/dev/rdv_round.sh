#!/usr/bin/env bash
# Dev run (gpu-check.sh dev): rdv_tests.sh (the rendezvous GPU test: its failing seed, then fresh ones), then
# rdv_lib.sh (the library's rendezvous pingpong by the non-leading warps' back-off). Results under $R.
set -u
bash scripts/dev/rdv_tests.sh
bash scripts/dev/rdv_lib.sh
