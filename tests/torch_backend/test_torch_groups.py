"""Sub-groups of the "hcclpy" backend: a 2-D grid of row and column groups, groups created when
the default group is gloo, and destroying groups."""

from __future__ import annotations

from typing import Any, Dict

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import hcclpy  # noqa: E402
import ranks  # noqa: E402
import torch_ranks as tr  # noqa: E402


def _grid(rank: int, size: int, info: bytes, directory: str, rows: int, cols: int) -> Dict[str, Any]:
    tr.init(rank, size, directory)
    try:
        row, _ = dist.new_subgroups_by_enumeration([[r * cols + c for c in range(cols)] for r in range(rows)])
        col, _ = dist.new_subgroups_by_enumeration([[r * cols + c for r in range(rows)] for c in range(cols)])
        # Rows then columns: the sum over the world.
        x = torch.tensor([float(rank), 1.0])
        dist.all_reduce(x, group=row)
        dist.all_reduce(x, group=col)
        row_members = [None] * cols
        dist.all_gather_object(row_members, rank, group=row)
        col_ranks = torch.empty(rows, dtype=torch.int64)
        dist.all_gather_into_tensor(col_ranks, torch.tensor([rank]), group=col)
        comm = hcclpy.torch.communicator(row)
        result = {"world": x.tolist(), "row": row_members, "col": col_ranks.tolist(),
                  "row_comm": (comm.rank, comm.size), "group_rank": dist.get_rank(row)}
        dist.destroy_process_group(row)
        result["row_comm_destroyed"] = comm.destroyed
        # The other groups still work after one is destroyed.
        y = torch.ones(1)
        dist.all_reduce(y, group=col)
        dist.all_reduce(y)
        result["after"] = y.item()
        return result
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_two_dimensional_grid_of_groups(tmp_path: Any) -> None:
    rows, cols = 2, 3
    size = rows * cols
    out = ranks.run_processes(_grid, size, str(tmp_path), rows, cols, timeout=240)
    for rank, res in enumerate(out):
        r, c = divmod(rank, cols)
        assert res["world"] == [float(sum(range(size))), float(size)]
        assert res["row"] == [r * cols + k for k in range(cols)]
        assert res["col"] == [k * cols + c for k in range(rows)]
        assert res["row_comm"] == (c, cols) and res["group_rank"] == c
        assert res["row_comm_destroyed"]
        assert res["after"] == rows * size


def _groups_under_gloo(rank: int, size: int, info: bytes, directory: str) -> Dict[str, Any]:
    # gloo as the default group; hcclpy groups get their root info through the store.
    tr.init(rank, size, directory, backend="gloo")
    try:
        everyone = dist.new_group(backend="hcclpy")
        evens = dist.new_group([r for r in range(size) if r % 2 == 0], backend="hcclpy")
        x = torch.tensor([rank + 1.0])
        dist.all_reduce(x, group=everyone)
        result = {"everyone": x.item(), "evens": None, "backend": dist.get_backend(everyone)}
        if rank % 2 == 0:
            y = torch.tensor([rank + 1.0])
            dist.all_reduce(y, group=evens)
            result["evens"] = y.item()
        return result
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_hcclpy_groups_under_a_gloo_default_group(tmp_path: Any) -> None:
    size = 3
    out = ranks.run_processes(_groups_under_gloo, size, str(tmp_path), timeout=240)
    for rank, res in enumerate(out):
        assert res["everyone"] == sum(range(1, size + 1)) and res["backend"] == "hcclpy"
        assert res["evens"] == (1.0 + 3.0 if rank % 2 == 0 else None)
