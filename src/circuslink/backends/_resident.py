"""Kernels that stay resident for a job on their own stream (the forwarding agent, a relay's proxy kernel).

A resident kernel keeps its state in device memory and ends a launch only when asked: the host's stop word,
its own error, a **yield word** the host sets, or the longest launch it was given (``slice``, a bound for
device-wide synchronizations the host does not see). :class:`ResidentKernel` is the one mechanism that keeps
such a kernel running: a host thread keeps a second launch queued behind the running one (so a launch that
ends is followed by the next within microseconds), and :meth:`paused` lets a device-wide synchronization of
this process (``cudaDeviceSynchronize`` in the back-end's alloc and free) return at once: it sets the yield
word, stops queueing, waits (bounded) for the launches to end, and starts them again afterwards. The back-end
registers every resident kernel of the process (``backend.resident``) and pauses them all around its own
device-wide synchronizations.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

_POLL_S = 0.0002  # how often the host thread looks at its queued launches


class ResidentKernel:
    """Keep ``launch()`` running on ``stream`` until :meth:`stop` or ``failed()``; ``set_yield(bool)`` writes the
    kernel's yield word (None: its launches end by themselves within a slice)."""

    def __init__(self, backend: Any, device: int, stream: Any, launch: Callable[[], None], name: str,
                 failed: Callable[[], bool], set_yield: Callable[[bool], None] | None = None) -> None:
        self.backend = backend
        self.stream = stream
        self._launch = launch
        self._failed = failed
        self._set_yield = set_yield
        self._running = True
        self._hold = threading.Event()  # set: launch nothing (paused)
        self._queued: list[Any] = []
        self._lock = threading.Lock()
        self._launch_one()  # the first launch is queued before the constructor returns
        self._thread = threading.Thread(target=self._keep_running, args=(device,), daemon=True, name=name)
        self._thread.start()
        registry = getattr(backend, "resident", None)
        if registry is not None:
            registry.add(self)

    def _launch_one(self) -> None:
        import cupy as cp

        with self.stream:
            self._launch()
            event = cp.cuda.Event(disable_timing=True)
            event.record(self.stream)
        self._queued.append(event)

    def _keep_running(self, device: int) -> None:
        import cupy as cp

        self.backend.bind_thread()  # this rank's context (its SMs of its own, where it has them) on this thread
        with cp.cuda.Device(device):
            while self._running and not self._failed():
                with self._lock:
                    self._queued = [e for e in self._queued if not e.done]
                    if not self._hold.is_set() and len(self._queued) < 2 and self._running:
                        self._launch_one()
                        continue
                time.sleep(_POLL_S)

    def idle(self) -> bool:
        """No launch of it is queued or running."""
        with self._lock:
            self._queued = [e for e in self._queued if not e.done]
            return not self._queued

    @contextlib.contextmanager
    def paused(self, timeout: float) -> Iterator[None]:
        """No launch runs inside the block (a device-wide synchronization returns); bounded by ``timeout``."""
        if not self._running:
            yield
            return
        self._hold.set()
        if self._set_yield is not None:
            self._set_yield(True)
        try:
            deadline = time.monotonic() + timeout
            while not self.idle() and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            yield
        finally:
            if self._set_yield is not None and self._running:
                self._set_yield(False)
            self._hold.clear()

    def stop(self, timeout: float | None) -> None:
        """Launch no more (the caller has set the kernel's stop word); join the host thread (bounded)."""
        self._running = False
        self._hold.set()
        registry = getattr(self.backend, "resident", None)
        if registry is not None:
            registry.discard(self)
        if timeout != 0 and self._thread.is_alive():
            self._thread.join(timeout)


class Registry:
    """The resident kernels of one back-end (weakly held); :meth:`paused` pauses them all."""

    def __init__(self) -> None:
        self._kernels: weakref.WeakSet[ResidentKernel] = weakref.WeakSet()

    def add(self, kernel: ResidentKernel) -> None:
        self._kernels.add(kernel)

    def discard(self, kernel: ResidentKernel) -> None:
        self._kernels.discard(kernel)

    @contextlib.contextmanager
    def paused(self, timeout: float = 30.0) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for kernel in list(self._kernels):
                stack.enter_context(kernel.paused(timeout))
            yield
