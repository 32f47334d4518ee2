"""Argument types the command line shares (argparse ``type=``): each refuses a bad value with one line."""

from __future__ import annotations

import argparse
import math


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be zero or more")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def output_file(text: str) -> str:
    """A file the command will write: its folder must exist (it is never created) and be writable, and the path
    must not be a folder. Checked when the command line is read, before any work."""
    import os

    if not text:
        raise argparse.ArgumentTypeError("an empty file name")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text!r}: folder {folder!r} does not exist (it is not created)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: folder {folder!r} is not writable")
    return text


def output_file_or_stdout(text: str) -> str:
    """:func:`output_file`, or ``-`` for standard output."""
    return text if text == "-" else output_file(text)
