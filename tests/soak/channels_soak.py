"""Channel soak: many messages of random sizes over many channels among many ranks, every byte checked.

    circuslink run -n 4 -- python tests/soak/channels_soak.py --messages 1000000 --channels 72 --json soak.json

Channels join every ordered pair of ranks (round robin until ``--channels``); a third carry every
message as low-latency packets, a third as bulk packets, a third with the default switch between
them (``--modes``), with small rings so that writers run into full rings all the time. Message m of
channel c has a size (log-uniform, 8 B to 1 MiB) and bytes that
are a pure function of (seed, c, m): writers generate them, readers check every byte, and readers
pause at random between messages. On a GPU each channel end is one block of one kernel per rank
(tests/soak/soak.cu); on the cpu back-end each end is a thread driving the reference protocol.
The run fails unless every message of every channel arrived, in order, with every byte right.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

import circuslink as cl
from circuslink import _abi as abi
from circuslink.bench import _driver as drv
from circuslink.channels import open as open_channels
from circuslink.channels.protocol import HANDLE
from circuslink.spec import Link, element_type

KERNEL = Path(__file__).with_name("soak.cu")
END = abi.Struct("SoakEnd", "soak.cu", [("tx", HANDLE), ("messages", abi.U64), ("channel", abi.U32),
                                        ("is_sender", abi.U32)], register=False)
THREADS = 256
MAX_BYTES = 1 << 20
# Which packets carry a channel's messages: every one low-latency, every one bulk, or the default
# switch (small ones low-latency, large ones bulk).
LL_MAX = {"ll": 1 << 20, "bulk": 0, "mixed": None}
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def message_key(seed: int, channel: int, m: int) -> np.uint64:
    return _mix64(np.array([seed], np.uint64) ^ _mix64(np.array([(channel << 40) ^ m], np.uint64)))[0]


def message_bytes(seed: int, channel: int, m: int) -> int:
    h = int(message_key(seed, channel, m))
    exponent = 3.0 + 17.0 * (h >> 11) * (1.0 / 9007199254740992.0)
    return int(min(max(int(np.exp2(exponent)), 8), MAX_BYTES))


def message_data(seed: int, channel: int, m: int, n: int) -> bytes:
    key = message_key(seed, channel, m)
    i = np.arange((n + 3) // 4, dtype=np.uint64)
    with np.errstate(over="ignore"):
        words = _mix64(key ^ (i * np.uint64(0xD1B54A32D192ED03))).astype(np.uint32)
    return words.tobytes()[:n]


def plan_links(nranks: int, nchannels: int, modes: list[str]) -> tuple[list[Link], dict]:
    pairs = [(a, b) for a in range(nranks) for b in range(nranks) if a != b]
    byte = element_type("uchar")
    links, options = [], {}
    for c in range(nchannels):
        a, b = pairs[c % len(pairs)]
        mode = modes[c % len(modes)]
        link = Link(f"soak{c}", f"soak{c}.in", 2 * c + 1, 2 * c + 2, a, b, byte, 1)
        links.append(link)
        # small rings (8 slots of 16 KiB): writers wait on credits constantly
        options[link.name] = {"nslots": 8, "chunk": 16 << 10}
        if LL_MAX[mode] is not None:
            options[link.name]["ll_max"] = LL_MAX[mode]
    return links, options


def split_messages(total: int, nchannels: int) -> list[int]:
    base, extra = divmod(total, nchannels)
    return [base + (1 if c < extra else 0) for c in range(nchannels)]


def run_cuda(world, channels, links, counts, seed: int, time_limit: float) -> dict:
    import cupy as cp

    mine = [(c, link, link.src_rank == world.rank) for c, link in enumerate(links)
            if world.rank in (link.src_rank, link.dst_rank)]
    ends = END.array(len(mine))
    for k, (c, link, is_sender) in enumerate(mine):
        end = channels[link.name if is_sender else link.receiver_name]
        ends[k] = (end.device_handle(), counts[c], c, int(is_sender))
    kernel = cl.compile(KERNEL.read_text()).get_function("soak")
    fits = world.backend.max_blocks(kernel, THREADS)
    if len(mine) > fits:
        raise cl.ConfigError(f"soak: rank {world.rank} has {len(mine)} channel ends but its SM share holds "
                             f"{fits} blocks at once (fewer --channels or more ranks)")
    stream = world.backend.stream
    with stream:
        d_ends = cp.asarray(ends.view(np.uint8))
        scratch = cp.zeros(len(mine) * MAX_BYTES, dtype=cp.uint8)
        received = cp.zeros(len(mine), dtype=cp.uint64)
        mismatches = cp.zeros(len(mine), dtype=cp.uint64)
        failed = cp.zeros(1, dtype=cp.int32)
    world.barrier()
    t0 = time.monotonic()
    with stream:
        kernel((len(mine),), (THREADS,), (d_ends, scratch, np.uint64(MAX_BYTES), np.uint64(seed), received,
                                          mismatches, failed))
    world.backend.wait_stream(stream, time_limit, lambda: f"soak on rank {world.rank}: its kernel did not finish")
    elapsed = time.monotonic() - t0
    channels.check()
    if int(failed.get()[0]):
        raise cl.ChannelError(f"soak: a channel call failed on rank {world.rank} (code {int(failed.get()[0])})")
    got, bad = received.get(), mismatches.get()
    return {"elapsed_s": elapsed,
            "ends": [{"channel": c, "sender": bool(s), "messages": counts[c],
                      "received": None if s else int(got[k]), "mismatches": 0 if s else int(bad[k])}
                     for k, (c, _, s) in enumerate(mine)]}


def run_cpu(world, channels, links, counts, seed: int, time_limit: float) -> dict:
    rng = np.random.default_rng(seed + world.rank)
    report, errors = [], []

    def sender(c, link):
        tx = channels[link.name]
        for m in range(counts[c]):
            tx.write(np.frombuffer(message_data(seed, c, m, message_bytes(seed, c, m)), dtype=np.uint8))

    def receiver(c, link, pauses):
        rx = channels[link.receiver_name]
        good = bad = 0
        for m in range(counts[c]):
            if pauses[m]:
                time.sleep(pauses[m])
            n = message_bytes(seed, c, m)
            got = rx.read(n).tobytes()
            want = message_data(seed, c, m, n)
            bad += sum(x != y for x, y in zip(got, want, strict=True)) if got != want else 0
            good += 1
        report.append({"channel": c, "sender": False, "messages": counts[c], "received": good, "mismatches": bad})

    def guarded(fn, *args):
        try:
            fn(*args)
        except Exception as exc:  # reported by the main thread
            errors.append(exc)

    threads = []
    for c, link in enumerate(links):
        if link.src_rank == world.rank:
            threads.append(threading.Thread(target=guarded, args=(sender, c, link)))
            report.append({"channel": c, "sender": True, "messages": counts[c], "received": None, "mismatches": 0})
        if link.dst_rank == world.rank:
            pauses = np.where(rng.random(counts[c]) < 0.25, rng.random(counts[c]) * 40e-6, 0.0)
            threads.append(threading.Thread(target=guarded, args=(receiver, c, link, pauses)))
    world.barrier()
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, time_limit - (time.monotonic() - t0)))
    if any(t.is_alive() for t in threads):
        raise cl.TimeoutError(f"soak on rank {world.rank}: still running after {time_limit:g} s")
    if errors:
        raise errors[0]
    return {"elapsed_s": time.monotonic() - t0, "ends": report}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=1_000_000, help="messages in all (default 1,000,000)")
    p.add_argument("--channels", type=int, default=72, help="channels (default 72)")
    p.add_argument("--modes", default="ll,bulk,mixed",
                   help="packets per channel, alternated over the channels: ll (all low-latency), bulk (all bulk), "
                        "mixed (the default switch); default ll,bulk,mixed")
    p.add_argument("--seed", type=int, default=None, help="seed of every size and byte (default: fresh)")
    p.add_argument("--time-limit", type=float, default=900.0, help="seconds before the run fails (default 900)")
    p.add_argument("--json", help="write the result (with device, date and commit) to this file")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in LL_MAX for m in modes):
        raise SystemExit(f"soak: --modes {args.modes!r}: use ll, bulk, mixed or a list of them")
    world = cl.init()
    if world.size < 2:
        raise SystemExit("soak: run it as several ranks, e.g. circuslink run -n 4 -- python channels_soak.py")
    fresh = int(np.random.SeedSequence().entropy % 2**62)
    seed = int(world.broadcast_object(args.seed if args.seed is not None else fresh))
    links, options = plan_links(world.size, args.channels, modes)
    counts = split_messages(args.messages, args.channels)
    channels = open_channels(world, links, options=options)
    try:
        run = run_cuda if world.device is not None else run_cpu
        result = run(world, channels, links, counts, seed, args.time_limit)
    finally:
        channels.close()
    everyone = world.allgather_object(result)
    if world.rank == 0:
        ends = [e for r in everyone for e in r["ends"]]
        readers = [e for e in ends if not e["sender"]]
        lost = sum(e["messages"] - e["received"] for e in readers)
        wrong = sum(e["mismatches"] for e in readers)
        total_bytes = sum(message_bytes(seed, c, m) for c in range(args.channels) for m in range(counts[c])) \
            if args.messages <= 20000 else None
        elapsed = max(r["elapsed_s"] for r in everyone)
        res = drv.Results("soak", world)
        res.meta.update(seed=seed, channels=args.channels, modes=modes, messages=args.messages,
                        ranks=world.size, elapsed_s=elapsed, lost=lost, wrong_bytes=wrong, bytes=total_bytes,
                        options={"nslots": 8, "chunk": 16 << 10, "ll_max": LL_MAX},
                        sizes="log-uniform 8 B .. 1 MiB", reader_pauses="a quarter of the messages, 0-40 us")
        for e in readers:
            res.add(impl="soak", bytes=sum(message_bytes(seed, e["channel"], m) for m in range(e["messages"]))
                    if e["messages"] <= 2000 else None, **e)
        print(f"soak: {args.messages} messages over {args.channels} channels ({'/'.join(modes)}) among {world.size} "
              f"ranks in {elapsed:.1f} s: {lost} lost, {wrong} wrong bytes (seed {seed})")
        if args.json:
            print(f"wrote {res.write_json(args.json)}")
        status = 0 if lost == 0 and wrong == 0 else 1
    else:
        status = 0
    world.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
