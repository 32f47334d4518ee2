"""Versions, back-ends and GPUs, with their peer-access and NVLink matrix."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import socket
import sys

from . import __version__
from .backends import cuda_device_count, default_backend_name


def _version(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception:
        return None
    return str(getattr(mod, "__version__", "present"))


def _nvlink_counts(n: int) -> list[list[int]] | None:
    """links[i][j]: active NVLinks from GPU i to GPU j, read through NVML (None without it)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        bus = [pynvml.nvmlDeviceGetPciInfo(h).busId for h in handles]
        bus = [b.decode() if isinstance(b, bytes) else b for b in bus]
        links = [[0] * n for _ in range(n)]
        for i, h in enumerate(handles):
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                        continue
                    remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(h, link).busId
                except Exception:
                    continue
                remote = remote.decode() if isinstance(remote, bytes) else remote
                for j, b in enumerate(bus):
                    if b.lower().lstrip("0") == remote.lower().lstrip("0"):
                        links[i][j] += 1
        return links
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _nodes(nranks: int | None, ranks_per_node: int | None) -> dict:
    """This host, the node variable, and (for ``-n``) how that many ranks would group into nodes."""
    from .world import ENV_RANKS_PER_NODE, describe_nodes, node_layout, ranks_per_node_from_env

    out: dict = {"host": socket.gethostname(), ENV_RANKS_PER_NODE: os.environ.get(ENV_RANKS_PER_NODE) or None}
    if nranks is not None:
        if ranks_per_node is not None:
            layout = node_layout(nranks, None, ranks_per_node, f"--ranks-per-node {ranks_per_node}")
        else:
            layout = node_layout(nranks, None, ranks_per_node_from_env() if nranks > 1 else None)
        out.update(nranks=nranks, nodes=layout[0], names=layout[1], how=layout[2], text=describe_nodes(*layout))
    return out


def gather(nranks: int | None = None, ranks_per_node: int | None = None) -> dict:
    info: dict = {
        "circuslink": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {m: _version(m) for m in ("numpy", "cupy", "mpi4py", "matplotlib", "cuda.bindings")},
        "tools": {t: shutil.which(t) for t in ("nvcc", "mpirun")},
        "backends": {"cpu": True, "cuda": cuda_device_count() > 0},
        "default_backend": default_backend_name(),
        "nodes": _nodes(nranks, ranks_per_node),
        "gpus": [],
    }
    n = cuda_device_count()
    if n:
        from . import mps

        st = mps.status()
        info["mps"] = {"active": st.active, "pipe_dir": st.pipe_dir, "how": st.how}
        from .backends import _partition

        info["sm_partition"] = {"mode": _partition.mode(), "green_contexts": _partition.available()}
        import cupy as cp

        rt = cp.cuda.runtime
        info["cuda"] = {"runtime": rt.runtimeGetVersion(), "driver": rt.driverGetVersion()}
        try:
            from cupy.cuda import nccl

            info["nccl"] = nccl.get_version()
        except Exception:
            info["nccl"] = None
        for i in range(n):
            p = rt.getDeviceProperties(i)
            name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
            info["gpus"].append({
                "index": i, "name": name, "sm": f"{p['major']}.{p['minor']}",
                "multiprocessors": p["multiProcessorCount"], "memory_GiB": round(p["totalGlobalMem"] / 2**30, 1),
            })
        info["peer_access"] = [[i == j or bool(rt.deviceCanAccessPeer(i, j)) for j in range(n)] for i in range(n)]
        info["nvlinks"] = _nvlink_counts(n)
    return info


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ._argtypes import output_file_or_stdout

    p.add_argument("--json", metavar="FILE", nargs="?", const="-", default=None, type=output_file_or_stdout,
                   help="write JSON instead of text to FILE; '-' or no FILE: to standard output")
    p.add_argument("-n", "--nranks", type=int, default=None, metavar="N",
                   help="also show how a job of N ranks on this machine groups into nodes")
    p.add_argument("--ranks-per-node", type=int, default=None, metavar="K",
                   help="with -n: nodes declared as circuslink run --ranks-per-node K would declare them "
                        "(default: CIRCUSLINK_RANKS_PER_NODE, else one node per host)")


def run(args: argparse.Namespace) -> int:
    if args.ranks_per_node is not None and args.nranks is None:
        from .errors import ConfigError

        raise ConfigError("info: --ranks-per-node shows a node layout for -n N ranks; give -n too")
    info = gather(args.nranks, args.ranks_per_node)
    text = json.dumps(info, indent=2) + "\n"
    if args.json == "-":
        sys.stdout.write(text)
        return 0
    _print(info)
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            from .errors import ConfigError

            raise ConfigError(f"--json {args.json}: cannot write: {exc.strerror or exc}") from None
        print(f"wrote {args.json}")
    return 0


def _print(info: dict) -> None:
    print(f"circuslink {info['circuslink']} on Python {info['python']} ({info['platform']})")
    print("packages: " + ", ".join(f"{k} {v or 'missing'}" for k, v in info["packages"].items()))
    print("tools:    " + ", ".join(f"{k} {'found' if v else 'missing'}" for k, v in info["tools"].items()))
    avail = [k for k, v in info["backends"].items() if v]
    print(f"back-ends: {', '.join(avail)} (default: {info['default_backend']})")
    nodes = info["nodes"]
    declared = nodes["CIRCUSLINK_RANKS_PER_NODE"]
    print(f"nodes: host {nodes['host']}; " + (f"CIRCUSLINK_RANKS_PER_NODE={declared} declares nodes of {declared} ranks"
          if declared else "one node per host (declare nodes on one machine: circuslink run --ranks-per-node K, "
          "or CIRCUSLINK_RANKS_PER_NODE=K under mpirun)"))
    if "text" in nodes:
        print(f"  {nodes['nranks']} ranks here: {nodes['text']}")
    if not info["gpus"]:
        print("GPUs: none visible")
        return
    print(f"CUDA runtime {info['cuda']['runtime']}, driver {info['cuda']['driver']}, NCCL {info.get('nccl')}")
    mps_info = info.get("mps") or {}
    if mps_info.get("active"):
        print(f"MPS: active ({mps_info['how']}; pipe directory {mps_info['pipe_dir']}): ranks sharing a GPU run "
              "concurrently")
    else:
        print(f"MPS: not active ({mps_info.get('how', '')}): ranks sharing a GPU are time-sliced "
              "(circuslink run starts MPS for them)")
    part = info.get("sm_partition") or {}
    if part:
        print(f"SMs of ranks sharing a GPU: CIRCUSLINK_SM_PARTITION={part['mode']} (green contexts "
              f"{'available' if part['green_contexts'] else 'not available'} here; off: MPS's cap)")
    for g in info["gpus"]:
        print(f"  GPU {g['index']}: {g['name']}, sm_{g['sm'].replace('.', '')}, {g['multiprocessors']} SMs, "
              f"{g['memory_GiB']} GiB")
    n = len(info["gpus"])
    print("peer access (P) and NVLinks between GPUs:")
    print("      " + "".join(f"GPU{j:<4}" for j in range(n)))
    for i in range(n):
        cells = []
        for j in range(n):
            if i == j:
                cells.append("  -    ")
                continue
            links = info["nvlinks"][i][j] if info.get("nvlinks") else None
            p = "P" if info["peer_access"][i][j] else "x"
            cells.append(f"{p} NV{links:<3}" if links else f"{p}      ")
        print(f"GPU{i:<3}" + "".join(cells))
