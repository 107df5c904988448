"""The torch backend and graphs: collectives on CPU tensors cannot be recorded (the backend
stages them and waits), and say so; device buffers captured next to torch code replay as the
docs' Graphs page shows."""

from __future__ import annotations

from typing import Any, List

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import hcclpy  # noqa: E402
import ranks  # noqa: E402
import torch_ranks as tr  # noqa: E402


def _capture_next_to_torch(rank: int, size: int, info: bytes, directory: str) -> List[Any]:
    tr.init(rank, size, directory)
    found: List[Any] = []
    device = hcclpy.Device(rank)
    stream = device.create_stream()
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        buffer = hcclpy.zeros(4, "float32", device=device)
        with stream.capture(mode="thread_local") as graph:
            for call in (lambda: dist.all_reduce(torch.ones(4)), lambda: dist.broadcast(torch.ones(4), src=0)):
                with pytest.raises(RuntimeError, match="on CPU tensors cannot be captured"):
                    call()
            comm.all_reduce(buffer, stream=stream)
        # The recipe: torch code fills and reads the device buffer around each replay.
        for step in range(1, 3):
            buffer.copy_from(torch.full((4,), float(step * (rank + 1))).numpy(), stream=stream)
            graph.replay()
            found.append(torch.from_numpy(buffer.to_numpy()).tolist())
        graph.close()
    stream.close()
    dist.all_reduce(torch.ones(1))  # the backend works again once the capture is over
    dist.destroy_process_group()
    return found


def test_cpu_collectives_refuse_capture_and_device_buffers_replay(tmp_path: Any) -> None:
    size = 2
    total = size * (size + 1) / 2
    outcomes = ranks.run_processes(_capture_next_to_torch, size, str(tmp_path))
    assert outcomes == [[[step * total] * 4 for step in (1, 2)]] * size
