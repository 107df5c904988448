"""A torch.distributed backend on hcclpy: ``dist.init_process_group("hcclpy")``.

Importing this module registers the backend ``"hcclpy"`` (through
``torch.distributed.Backend.register_backend``) for CPU and NPU tensors. CPU tensors are staged
through device memory, so the same program runs on a laptop over the simulator and on Ascend NPUs;
NPU tensors (torch_npu) are used in place, on the current NPU stream.

Examples
--------
>>> import torch, torch.distributed as dist
>>> import hcclpy.torch
>>> dist.init_process_group("hcclpy")            # env://, tcp:// or file:// as usual
>>> t = torch.ones(4)
>>> dist.all_reduce(t)
>>> dist.destroy_process_group()

Beyond torch.distributed, this module offers uneven all-gather and reduce-scatter (as torch_npu
does) and access to a group's :class:`hcclpy.Communicator`.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from ..communicator import Communicator
from ._errors import BackendError, BackendMismatchError, BackendRemoteError, BackendTimeoutError
from ._process_group import ProcessGroupHcclpy, create
from ._work import Work

__all__ = ["BACKEND", "BackendError", "BackendMismatchError", "BackendRemoteError", "BackendTimeoutError",
           "ProcessGroupHcclpy", "Work", "all_gather_into_tensor_uneven", "communicator",
           "reduce_scatter_tensor_uneven"]

BACKEND = "hcclpy"
"""The name this module registers the backend under: ``dist.init_process_group(BACKEND)``."""

if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu", "npu"])


def _group(group: Optional[Any], function: str) -> ProcessGroupHcclpy:
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if not isinstance(pg, ProcessGroupHcclpy):
        raise TypeError(f"{function} needs a process group of the hcclpy backend, got {pg!r}")
    return pg


def communicator(group: Optional[Any] = None) -> Communicator:
    """The :class:`hcclpy.Communicator` behind ``group`` (default: the default group), for calling
    hcclpy directly (NumPy arrays, device arrays, streams) alongside torch.distributed.

    Examples
    --------
    >>> comm = hcclpy.torch.communicator()
    >>> comm.all_reduce(np.ones(3))
    """
    return _group(group, "communicator").communicator


def all_gather_into_tensor_uneven(output: torch.Tensor, input: torch.Tensor,
                                  output_split_sizes: Optional[Sequence[int]] = None, group: Optional[Any] = None,
                                  async_op: bool = False) -> Optional[Work]:
    """Gather every rank's ``input`` into ``output`` along the first dimension, with ranks
    contributing different numbers of rows (HcclAllGatherV).

    Parameters
    ----------
    output : torch.Tensor
        Receives the rows of rank 0, then rank 1, ...; its first dimension is ``sum(output_split_sizes)``.
    input : torch.Tensor
        This rank's rows: ``output_split_sizes[rank]`` of them, shaped like ``output``'s rows.
    output_split_sizes : sequence of int, optional
        Rows per rank; None or empty means equal blocks.
    group : ProcessGroup, optional
        An hcclpy group (default: the default group).
    async_op : bool
        Return a Work to wait on instead of blocking.

    Raises
    ------
    ValueError
        When the sizes do not add up to ``output``'s first dimension or disagree with ``input``.

    Examples
    --------
    >>> # rank r contributes r + 1 rows of 4 elements
    >>> out = torch.empty(sum(range(1, n + 1)), 4)
    >>> all_gather_into_tensor_uneven(out, torch.full((rank + 1, 4), rank), [r + 1 for r in range(n)])
    """
    work = _group(group, "all_gather_into_tensor_uneven").all_gather_uneven(output, input, output_split_sizes,
                                                                           async_op)
    return work if async_op else work.wait() and None


def reduce_scatter_tensor_uneven(output: torch.Tensor, input: torch.Tensor,
                                 input_split_sizes: Optional[Sequence[int]] = None, op: Any = dist.ReduceOp.SUM,
                                 group: Optional[Any] = None, async_op: bool = False) -> Optional[Work]:
    """Reduce ``input`` across ranks and give rank ``r`` the reduction of its block: the first
    dimension of ``input`` is cut into blocks of ``input_split_sizes`` rows (HcclReduceScatterV).

    Parameters
    ----------
    output : torch.Tensor
        This rank's block of the result: ``input_split_sizes[rank]`` rows.
    input : torch.Tensor
        The full tensor on every rank; its first dimension is ``sum(input_split_sizes)``.
    input_split_sizes : sequence of int, optional
        Rows per rank; None or empty means equal blocks.
    op : torch.distributed.ReduceOp
        SUM, PRODUCT, MIN, MAX, AVG (floating point) or PREMUL_SUM.
    group : ProcessGroup, optional
        An hcclpy group (default: the default group).
    async_op : bool
        Return a Work to wait on instead of blocking.

    Raises
    ------
    ValueError
        When the sizes do not add up to ``input``'s first dimension or disagree with ``output``.

    Examples
    --------
    >>> out = torch.empty(rank + 1, 4)
    >>> reduce_scatter_tensor_uneven(out, torch.ones(sum(range(1, n + 1)), 4), [r + 1 for r in range(n)])
    """
    work = _group(group, "reduce_scatter_tensor_uneven").reduce_scatter_uneven(output, input, input_split_sizes,
                                                                              op, async_op)
    return work if async_op else work.wait() and None
