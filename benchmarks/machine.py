"""What the machine under a benchmark gives: single-core copy bandwidth, and whether its two vCPUs
are two cores or two hyperthreads of one core.

On a VM the two vCPUs may run on separate physical cores or on the two hyperthreads of one core,
and the host can move them from one arrangement to the other within minutes. On one core they
share its loads and stores: a 2-rank collective of 64 MiB then has one core's memory bandwidth
for both ranks and takes up to twice as long, while a copy made by one process alone runs as fast
as ever. The benchmarks print this probe before and after they run, so that a reader can tell the
two apart (the probe cannot see a change in between).

    python benchmarks/machine.py       # prints the probe
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from dataclasses import dataclass
from typing import Any, List

COPY_BYTES = 64 << 20
SHARED_CORE_SLOWDOWN = 1.3  # two copies at once this much slower than one: one core for both


def _copy_seconds(repeats: int, barrier: Any = None) -> List[float]:
    """Seconds per 64 MiB copy (``np.copyto``, memory to memory), ``repeats`` times; with a
    barrier, each copy starts when the other process's does."""
    import numpy as np

    source = np.ones(COPY_BYTES // 4, np.float32)
    target = np.empty_like(source)
    np.copyto(target, source)  # page faults and caches out of the way
    samples = []
    for _ in range(repeats):
        if barrier is not None:
            barrier.wait()
        started = time.perf_counter()
        np.copyto(target, source)
        samples.append(time.perf_counter() - started)
    return samples


def _copy_with_peer(barrier: Any, repeats: int, results: Any) -> None:
    results.put(_copy_seconds(repeats, barrier))


def memcpy_bandwidth(repeats: int = 7) -> float:
    """Single-core copy bandwidth of 64 MiB, GB/s copied (median of ``repeats``)."""
    return COPY_BYTES / statistics.median(_copy_seconds(repeats)) / 1e9


@dataclass(frozen=True)
class Copying:
    """64 MiB copies by one process alone and by two processes at the same moment (GB/s copied,
    per process)."""

    alone_gbs: float
    together_gbs: float

    @property
    def slowdown(self) -> float:
        return self.alone_gbs / self.together_gbs

    @property
    def shared_core(self) -> bool:
        """True when the two vCPUs behave as hyperthreads of one physical core."""
        return self.slowdown >= SHARED_CORE_SLOWDOWN

    def describe(self) -> str:
        layout = "hyperthreads of one core" if self.shared_core else "separate cores"
        return (f"vCPUs: {layout} (64 MiB copy: {self.alone_gbs:.1f} GB/s alone, {self.together_gbs:.1f} GB/s "
                f"each with two at once, {self.slowdown:.2f}x)")

    def as_dict(self) -> dict:
        return {"alone_gbs": self.alone_gbs, "together_gbs": self.together_gbs, "shared_core": self.shared_core}


def copying(repeats: int = 7) -> Copying:
    """Measure :class:`Copying`: one process copying alone, then two processes (forked, one per
    vCPU as the scheduler places them) copying at the same moment."""
    alone = memcpy_bandwidth(repeats)
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(2, timeout=60), context.Queue()
    workers = [context.Process(target=_copy_with_peer, args=(barrier, repeats, results)) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        slowest = max(statistics.median(results.get(timeout=120)) for _ in workers)
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
    return Copying(alone, COPY_BYTES / slowest / 1e9)


if __name__ == "__main__":
    print(copying().describe())
