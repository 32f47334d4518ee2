"""The PNG waveform: send and receive activity of each rank over time.

Drawn like the logic-analyser capture of CIRCUS's Fig. 18: one row per rank and
direction, a filled bar wherever that direction is active, so overlap between a rank's
receiving and sending shows as bars stacked above each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ConfigError
from . import _layout as L

if TYPE_CHECKING:
    from ._model import Trace

_ROWS = (("send", L.SEND, "#1f77b4"), ("recv", L.RECV, "#ff7f0e"), ("compute", L.COMPUTE, "#2ca02c"))
_USER_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def plot_waveform(
    trace: Trace, path: str, title: str | None = None, ranks: Sequence[int] | None = None
) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plot_waveform needs matplotlib: pip install matplotlib") from None
    ranks = list(range(trace.meta.nranks)) if ranks is None else list(ranks)
    for r in ranks:
        trace._check_rank(r)
    rows = []  # (label, intervals, instants, colour), top to bottom
    # Send / receive always (the waveform's point), compute when marked, and user events by name.
    user_ids = sorted({int(e) for e in trace.events["event"] if int(e) >= L.USER})
    kinds = list(_ROWS) + [(trace.name(e), e, _USER_COLOURS[i % len(_USER_COLOURS)]) for i, e in enumerate(user_ids)]
    for r in ranks:
        for name, event, colour in kinds:
            iv = trace.intervals(r, event)
            ticks = [s.start for s in trace.spans(r) if s.event == event and not s.paired]
            if event not in (L.SEND, L.RECV) and len(iv) == 0 and not ticks:
                continue  # optional rows only when this rank recorded them
            rows.append((f"rank {r} {name}", iv, ticks, colour))
    end_ns = max([float(iv[-1, 1]) for _, iv, _, _ in rows if len(iv)] +
                 [float(max(t)) for _, _, t, _ in rows if t] + [1.0])
    min_width = end_ns / 2000.0  # spans shorter than a pixel would vanish; keep them visible
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.4))
    for i, (_label, iv, ticks, colour) in enumerate(rows):
        y = len(rows) - 1 - i
        if len(iv):
            bars = [(a / 1000.0, max(b - a, min_width) / 1000.0) for a, b in iv]
            ax.broken_barh(bars, (y + 0.15, 0.7), facecolors=colour, alpha=0.55)
        if ticks:  # one tick per packet / chunk event: the texture of the stream
            ax.vlines([t / 1000.0 for t in ticks], y + 0.15, y + 0.85, colors=colour, linewidth=0.6)
        ax.axhline(y + 0.15, color="0.8", linewidth=0.5)
    end_us = end_ns / 1000.0
    ax.set_yticks([len(rows) - 1 - i + 0.5 for i in range(len(rows))])
    ax.set_yticklabels([label for label, _, _, _ in rows])
    ax.set_ylim(0, max(1, len(rows)))
    ax.set_xlim(0, end_us * 1.02)
    ax.set_xlabel("time (us, rank 0's clock)")
    residual = max((trace.meta.residual_ns(r) for r in ranks), default=0)
    default_title = f"circuslink trace ({len(ranks)} ranks, clocks aligned within {residual / 1000:.2f} us)"
    ax.set_title(title or default_title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
