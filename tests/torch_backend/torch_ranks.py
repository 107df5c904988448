"""Helpers for torch.distributed tests: each rank runs the "hcclpy" default group and, to check
results against, a gloo group of the same ranks.

Rank functions run through :func:`ranks.run_processes` (spawned processes with a hard timeout);
they rendezvous through a file store in the test's temporary directory, so no port is needed.
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

import hcclpy.torch  # noqa: F401  (registers the backend)

REDUCTIONS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
              "MAX": dist.ReduceOp.MAX}


def init(rank: int, size: int, directory: str, *, backend: str = "hcclpy", timeout: float = 60.0,
         pg_options: Any = None) -> Any:
    """Start the default group (``backend``) through a file store in ``directory``; return a gloo
    group of every rank to compare with."""
    dist.init_process_group(backend, init_method=f"file://{os.path.join(directory, 'store')}", rank=rank,
                            world_size=size, timeout=timedelta(seconds=timeout), pg_options=pg_options)
    return dist.new_group(backend="gloo")


def data(rank: int, shape: Sequence[int], dtype: torch.dtype, seed: int = 0, *, small: bool = False) -> torch.Tensor:
    """A tensor that depends on ``rank`` and ``seed``; ``small`` keeps products from overflowing."""
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=gen).bool()
    if dtype.is_complex:
        return torch.randn(tuple(shape), generator=gen, dtype=dtype)
    if dtype.is_floating_point:
        if small:
            return (1.0 + torch.rand(tuple(shape), generator=gen)).to(dtype)
        return torch.randn(tuple(shape), generator=gen).to(dtype)
    if small:
        return torch.randint(1, 3, tuple(shape), generator=gen).to(dtype)
    low, high = (0, 200) if dtype == torch.uint8 else (-50, 50)
    return torch.randint(low, high, tuple(shape), generator=gen).to(dtype)


def everyone(tensor: torch.Tensor, group: Any) -> List[torch.Tensor]:
    """Every rank's ``tensor`` (moved by gloo), in rank order."""
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, tensor.contiguous(), group=group)
    return out


_FOLD = {"SUM": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum}


def reduced(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction of ``tensors`` in their own dtype (bool: SUM is or, PRODUCT is and)."""
    if op == "AVG":  # each divided first, as NCCL does (and the hcclpy backend)
        return functools.reduce(torch.add, [t / len(tensors) for t in tensors])
    if tensors[0].dtype == torch.bool and op in ("SUM", "PRODUCT"):
        return functools.reduce(torch.logical_or if op == "SUM" else torch.logical_and, tensors)
    return functools.reduce(_FOLD[op], tensors)


def mismatch(name: str, got: torch.Tensor, want: torch.Tensor) -> Optional[str]:
    """None when equal (within rounding for floating point), else a description."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{name}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}"
    if got.dtype.is_floating_point or got.dtype.is_complex:
        loose = got.dtype in (torch.float16, torch.bfloat16)
        ok = torch.allclose(got.to(torch.complex128 if got.dtype.is_complex else torch.float64),
                            want.to(torch.complex128 if got.dtype.is_complex else torch.float64),
                            rtol=2e-2 if loose else 1e-5, atol=2e-2 if loose else 1e-6)
    else:
        ok = torch.equal(got, want)
    return None if ok else f"{name}: got {got.flatten()[:8].tolist()}..., want {want.flatten()[:8].tolist()}..."


def run_cases(cases: Sequence[Callable[[], List[Optional[str]]]]) -> List[str]:
    """Run every case; collect the mismatches and the exceptions (one failing case does not hide
    the others)."""
    problems: List[str] = []
    for case in cases:
        try:
            problems.extend(p for p in case() if p)
        except Exception as exc:  # noqa: BLE001 - reported with the case's name
            problems.append(f"{getattr(case, '__name__', case)} raised {type(exc).__name__}: {exc}")
    return problems
