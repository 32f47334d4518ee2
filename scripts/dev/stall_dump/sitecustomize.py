"""Dev aid (scripts/dev/qcd_stall_dump.sh puts this folder on PYTHONPATH): every rank of a circuslink job dumps
the Python stacks of all its threads every CIRCUSLINK_DEV_DUMP_S seconds, so that a job that stalls shows where
each rank was. Not part of the library."""
import faulthandler
import os
import sys

_every = os.environ.get("CIRCUSLINK_DEV_DUMP_S")
if _every and "CIRCUSLINK_RANK" in os.environ:
    # CIRCUSLINK_DEV_DUMP_DIR: a file a rank there instead of stderr (it outlives a job that is killed)
    _dir = os.environ.get("CIRCUSLINK_DEV_DUMP_DIR")
    if _dir:
        os.makedirs(_dir, exist_ok=True)
        _out = open(os.path.join(_dir, f"rank{os.environ['CIRCUSLINK_RANK']}-{os.getpid()}.txt"), "w")  # noqa: SIM115
    else:
        _out = sys.stderr
    faulthandler.dump_traceback_later(float(_every), repeat=True, file=_out)
