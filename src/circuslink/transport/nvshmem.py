"""The nvshmem transport: registered here, implemented in the next commit (until then it never runs)."""

from __future__ import annotations

from typing import Any

from ._base import Capabilities, Context, Scope, Transport


class NvshmemTransport(Transport):
    capabilities = Capabilities(device_initiated=True, scope=Scope.NETWORK, mapped=False, compiled_relay=True)

    @classmethod
    def unavailable(cls, context: Context) -> str | None:
        if not context.runs_kernels:
            return "it needs a back-end that runs kernels (GPUs)"
        return "not built yet on this branch"

    @classmethod
    def connect(cls, world: Any, peers: list[int], nbytes: int, nsignals: int, timeout: float) -> Any:
        raise AssertionError("never chosen: unavailable")
