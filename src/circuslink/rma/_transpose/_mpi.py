"""Transposing puts on MPI-3 windows: one ``MPI_Put`` whose origin datatype walks the source by columns.

The origin datatype visits the block column by column (a vector of ``rows`` elements at stride
``src_ld``, resized to one element so that consecutive columns start one element apart, repeated
``cols`` times); the target datatype lays those elements out row by row of the destination (a
vector of ``cols`` rows of ``rows`` elements at stride ``dst_ld``). Both type signatures are
``rows * cols`` elements, so MPI performs the transpose itself, with no local copy, and the
datatypes are built once at commit. On a cuda world the source rows are staged device -> host
first (one 2-D copy), like every other write to an MPI-3 window.
"""

from __future__ import annotations

from typing import Any

from . import TransposeHandle


def put(h: TransposeHandle, src: Any, MPI: Any) -> tuple[list, tuple, list, tuple]:  # noqa: N803 - the module
    """(origin, target, committed datatypes to free, staging pattern) of one transposing put.

    ``src`` is the source window's MpiWindow (``host`` is its MPI memory). The staging pattern
    is (window, offset, count, block bytes, stride) of the source rows, as the window's module stages.
    """
    elem = h.elem_bytes
    word = MPI.BYTE.Create_contiguous(elem)
    column = word.Create_vector(h.rows, 1, h.src_ld)
    column_one = column.Create_resized(0, elem)  # the next column starts one element later
    origin_type = column_one.Create_contiguous(h.cols).Commit()
    target_type = word.Create_vector(h.cols, h.rows, h.dst_ld).Commit()
    for t in (column_one, column, word):  # derived types keep what they need
        t.Free()
    origin = [src.host[h.src_offset: h.src_offset + h.src_extent], 1, origin_type]
    target = (h.dst_offset, 1, target_type)
    stage = (src, h.src_offset, h.rows, h.cols * elem, h.src_ld * elem)
    return origin, target, [origin_type, target_type], stage
