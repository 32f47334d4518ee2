"""3-D FFT of a .npy file over R ranks, slabs or pencils, with transposing puts: ``circuslink fft3``.

    circuslink fft3 --input X.npy --output Y.npy -n R [--decomposition auto|slab|pencil] [--grid P0xP1]
                    [--inverse | --r2c | --c2r [--last-size N]] [--layout natural|transposed]
                    [--scale none|full|symmetric] [--scheme transpose-put|local-transpose] [--chunks K]

The options, the input and the output are those of ``circuslink fft2`` (see circuslink.apps.fft.cli) for a
3-D array: Y = numpy.fft.fftn(X) (ifftn, rfftn, irfftn). ``--layout transposed`` writes Y as the ranks hold
it after the last transform: Y.transpose(1, 2, 0) for slabs, Y.transpose(2, 1, 0) for pencils.
"""

from __future__ import annotations

import argparse

from .cli import add_command_arguments, run_command


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_command_arguments(p, 3)


def run(args: argparse.Namespace) -> int:
    return run_command(args, 3)
