"""Benchmarks: ours against the physical floor and the baselines (NCCL, NVSHMEM, MPI).

Every benchmark is a small module on top of one driver (:mod:`circuslink.bench._driver`:
sizes, common options, one results format, tables and plots) and calls the baselines of
:mod:`circuslink.bench.baselines` in the same run, so every ratio is taken side by side.
"""
