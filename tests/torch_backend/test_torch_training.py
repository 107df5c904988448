"""Training through the "hcclpy" backend ends where training through gloo does.

Each rank trains the same small model, from the same initial weights, on its own data, once with
the hcclpy default group and once with a gloo group of the same ranks; the final parameters must
agree with gloo's (within float tolerance) and be identical across ranks.
"""

from __future__ import annotations

from typing import Any, List

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import ranks  # noqa: E402
import torch_ranks as tr  # noqa: E402

STEPS = 20


def _model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _train(model: Any, rank: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        x, y = torch.randn(6, 8, generator=data), torch.randn(6, 4, generator=data)
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _ddp(group: Any, rank: int) -> List[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_model(), process_group=group)
    _train(model, rank)
    return [p.detach().clone() for p in model.parameters()]


def _fsdp(group: Any, rank: int) -> List[torch.Tensor]:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model = _model()
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _train(model, rank)
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def _both(rank: int, size: int, info: bytes, directory: str, wrapper: str) -> List[List[Any]]:
    gloo = tr.init(rank, size, directory)
    try:
        train = _ddp if wrapper == "ddp" else _fsdp
        # As NumPy arrays: torch tensors would cross the process boundary as shared memory that
        # dies with the rank.
        return [[p.numpy() for p in train(group, rank)] for group in (dist.group.WORLD, gloo)]
    finally:
        dist.destroy_process_group()


def _check(arrays: List[List[List[Any]]]) -> None:
    results = [[[torch.from_numpy(a) for a in params] for params in both] for both in arrays]
    reference = results[0][0]
    initial = [p.detach() for p in _model().parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(reference, initial)), "training did not move the parameters"
    for rank, (hcclpy_params, gloo_params) in enumerate(results):
        for index, (ours, theirs) in enumerate(zip(hcclpy_params, gloo_params)):
            assert torch.equal(ours, reference[index]), f"rank {rank} parameter {index} differs from rank 0's"
            assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6), \
                f"rank {rank} parameter {index} differs from gloo's by {(ours - theirs).abs().max().item()}"


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_ddp_trains_like_gloo(size: int, tmp_path: Any) -> None:
    _check(ranks.run_processes(_both, size, str(tmp_path), "ddp", timeout=240))


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_fully_shard_trains_like_gloo(tmp_path: Any) -> None:
    _check(ranks.run_processes(_both, 2, str(tmp_path), "fsdp", timeout=240))
