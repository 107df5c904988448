"""Work queued on a stream runs even when its rank never synchronises, as on a device.

The simulator runs a stream's work on the thread that synchronises it; work nobody waits for is
picked up by the stream's worker thread. A peer that waits for such work must not hang, whether
the worker was looking often, had spread its looks out after many synchronised calls, or had
fallen asleep after a quiet spell.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Tuple

import numpy as np
import pytest

import hcclpy
import ranks

pytestmark = pytest.mark.filterwarnings("ignore::hcclpy._ffi.SimulatorFallbackWarning")


def _peer_waits_for_unsynchronised_work(rank: int, size: int, info: bytes, flag: str,
                                        quiet: float) -> Tuple[List[float], float]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    try:
        with comm.device.create_stream() as stream:
            warm = hcclpy.from_numpy(np.ones(2, "float32"), device=comm.device)
            for _ in range(200):  # synchronised calls: the worker finds nothing and looks less often
                comm.all_reduce(warm, None, stream=stream)
                stream.synchronize()
            if rank == 0:
                time.sleep(quiet)  # long enough, when > 20 ms, for the worker to fall asleep
            small = hcclpy.from_numpy(np.full(2, rank + 1, "float32"), device=comm.device)  # eager size
            large = hcclpy.from_numpy(np.full(1 << 16, rank + 1, "float32"), device=comm.device)
            comm.all_reduce(small, None, stream=stream)
            comm.all_reduce(large, None, stream=stream)
            if rank == 1:
                stream.synchronize()  # completes only once rank 0's worker has run rank 0's part
                Path(flag).write_text("done")
            else:
                deadline = time.monotonic() + 30
                while not Path(flag).exists():  # neither synchronise nor query on this rank
                    if time.monotonic() > deadline:
                        raise AssertionError("rank 1 never finished: rank 0's queued work did not run")
                    time.sleep(0.005)
                stream.synchronize()
            return small.to_numpy().tolist(), float(large.to_numpy()[-1])
    finally:
        comm.destroy()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("quiet", [0.0, 0.1], ids=["busy", "after-a-quiet-spell"])
@pytest.mark.parametrize("mode", ranks.MODES)
def test_a_peer_waiting_for_work_nobody_synchronises_finishes(mode: str, quiet: float, tmp_path: Path) -> None:
    out = ranks.run(mode, _peer_waits_for_unsynchronised_work, 2, str(tmp_path / "rank1-done"), quiet, timeout=90)
    assert out == [([3.0, 3.0], 3.0)] * 2
