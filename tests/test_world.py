"""World: ranks find each other; barrier, allgather and bcast work; failures are named."""

from __future__ import annotations

import pytest

import circuslink as cl


def test_single_process_world():
    world = cl.init(backend="cpu")
    try:
        assert (world.rank, world.size) == (0, 1)
        assert world.allgather_object(b"x") == [b"x"]
        assert world.allgather_object({"a": 1}) == [{"a": 1}]
        world.barrier()
        buf = world.alloc(64)
        buf.local[:] = 7
        assert buf.peer(0)[63] == 7
        buf.close()
    finally:
        world.close()


@pytest.mark.parametrize("n", [2, 4])
def test_ranks_see_each_other(spmd, n):
    job = spmd(n, """
        import os, circuslink as cl
        w = cl.init()
        assert w.backend.name == "cpu"
        ranks = w.allgather_object(w.rank)
        assert ranks == list(range(w.size)), ranks
        assert w.allgather_object(bytes([w.rank]) * 3) == [bytes([r]) * 3 for r in range(w.size)]
        assert w.broadcast_object(("root", w.rank), root=w.size - 1) == ("root", w.size - 1)
        for _ in range(20):
            w.barrier()
        pids = w.allgather_object(os.getpid())
        assert len(set(pids)) == w.size
        print("ok", w.rank, w.size)
        w.close()
    """).check()
    for r in range(n):
        assert f"[{r}] ok {r} {n}" in job.stdout


def test_rank_that_raises_ends_the_job_and_is_named(spmd):
    job = spmd(4, """
        import circuslink as cl
        w = cl.init()
        w.barrier()
        if w.rank == 2:
            raise RuntimeError("rank two gives up")
        w.barrier()
        w.close()
    """)
    assert job.returncode != 0
    assert "rank 2 exited with code 1" in job.stderr
    assert "rank two gives up" in job.stderr


def test_killed_rank_is_named(spmd):
    job = spmd(3, """
        import os, signal, circuslink as cl
        w = cl.init()
        w.barrier()
        if w.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        w.barrier()
    """)
    assert job.returncode != 0
    assert "rank 1 was killed by SIGKILL" in job.stderr


def test_stuck_rank_trips_the_barrier_timeout(spmd):
    job = spmd(3, """
        import time, circuslink as cl
        w = cl.init()
        if w.rank == 2:
            time.sleep(30)
        w.barrier(timeout=2)
    """, job_timeout=60)
    assert job.returncode != 0
    assert "timed out" in job.stderr
    assert "rank(s) 2 did not arrive" in job.stderr


def test_rank_that_exits_early_is_reported_to_waiters(spmd):
    job = spmd(2, """
        import sys, circuslink as cl
        w = cl.init()
        if w.rank == 1:
            sys.exit(0)
        w.barrier(timeout=30)
    """, job_timeout=60)
    assert job.returncode != 0
    assert "rank 1 exited with code 0 before joining barrier" in job.stderr


def test_bad_inputs_give_clear_errors():
    world = cl.init(backend="cpu")
    try:
        with pytest.raises(cl.ConfigError, match="nbytes"):
            world.alloc(0)
        with pytest.raises(cl.ConfigError, match="root"):
            world.broadcast_object(1, root=3)
        with pytest.raises(cl.ConfigError, match="unknown back-end"):
            from circuslink.backends import select_backend

            select_backend("tpu", world)
    finally:
        world.close()


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_world_under_mpirun(spmd, n):
    job = spmd(n, """
        import numpy as np, circuslink as cl
        w = cl.init()
        assert w.launched_by == "mpirun" and w.mpi_comm is not None
        assert w.allgather_object(w.rank) == list(range(w.size))
        b = w.alloc(4096)
        b.local[:] = w.rank + 1
        w.barrier()
        assert [int(b.peer(r)[100]) for r in range(w.size)] == [r + 1 for r in range(w.size)]
        w.close()
        print("mpi ok", w.rank)
    """, launcher="mpirun", tag=True).check()
    for r in range(n):  # by rank tag: two ranks' lines may interleave in mpirun's untagged output
        assert f"mpi ok {r}" in job.rank_lines(r), job.output


def test_launcher_tags_output_and_passes_identity(spmd):
    job = spmd(3, """
        import os
        print("rank", os.environ["CIRCUSLINK_RANK"], "of", os.environ["CIRCUSLINK_SIZE"])
    """).check()
    for r in range(3):
        assert f"[{r}] rank {r} of 3" in job.stdout


def test_cli_errors_are_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "circuslink", "run", "-n", "0", "--", "true"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "circuslink: error: -n must be a positive number of ranks, got 0"
    proc = subprocess.run([sys.executable, "-m", "circuslink", "run", "-n", "1", "--", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "cannot start" in proc.stderr
