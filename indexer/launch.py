"""Spawn a local process group (one process per rank) for demos, benchmarks and tests.

Real ``torch.distributed`` collectives (gloo on CPU, NCCL on GPUs), one fresh process per
rank, a file rendezvous so concurrent launches never fight over a port.
"""

from __future__ import annotations

import io
import os
import tempfile
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class RankFailed(RuntimeError):
    """A spawned rank raised; the message carries its traceback."""


def _worker(rank: int, world: int, backend: str, init_file: str, fn: Callable, args: tuple, queue: Any) -> None:
    try:
        # One process per rank shares the host's cores, as TP workers do (vLLM's workers,
        # for one, drop to a single intra-op thread). Left at the default, every rank's
        # OpenMP pool spins on all cores and host-side work on >= 32K-element tensors
        # (torch's parallel grain) stalls: seen on 2x H200 as a 5x slower replicated step.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
        try:
            # every rank has joined before any runs fn: gloo's mesh set-up can end on one rank
            # while a peer still finishes its side, and a rank whose fn returns (or raises) at
            # once would close its sockets under that peer, which then fails in
            # init_process_group instead of reporting fn's own outcome
            if backend == "nccl":
                dist.barrier(device_ids=[rank])
            else:
                dist.barrier()
            result = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        # by value: shared-memory tensors would die with this process
        buf = io.BytesIO()
        torch.save(result, buf)
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException as exc:  # noqa: BLE001 - report every failure to the parent
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_ranks(fn: Callable, world_size: int, *args: Any, backend: str = "gloo", timeout: float = 600.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes.

    Args:
        fn: Picklable (module-level) function; the process group is initialised before it
            runs (``dist.group.WORLD``) and destroyed after.
        world_size: Number of ranks.
        *args: Extra picklable arguments.
        backend: ``gloo`` or ``nccl`` (rank r uses GPU r).
        timeout: Seconds to wait for all ranks.

    Returns:
        Each rank's return value, in rank order.

    Raises:
        RankFailed: A rank raised or did not finish in time.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    fd, init_file = tempfile.mkstemp(prefix="indexer-rdzv-")
    os.close(fd)
    os.unlink(init_file)  # the file store creates it
    procs = [ctx.Process(target=_worker, args=(r, world_size, backend, init_file, fn, args, queue)) for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            try:
                rank, status, value = queue.get(timeout=timeout)
            except Exception:  # noqa: BLE001 - queue.Empty: some rank hangs
                errors.append(f"ranks {sorted(set(range(world_size)) - set(results))} did not finish within {timeout:.0f} s")
                break
            if status == "ok":
                results[rank] = torch.load(io.BytesIO(value), weights_only=False)
            else:
                errors.append(f"rank {rank}: {value}")
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        if os.path.exists(init_file):
            os.unlink(init_file)
    if errors:
        raise RankFailed("\n".join(errors))
    return [results[r] for r in range(world_size)]
