"""HCCL operations on device buffers; :class:`hcclpy.Communicator` exposes them as methods."""

from ._buffers import Buffer, resolve
from ._ops import (after_group, all_gather, all_gather_v, all_reduce, all_to_all, all_to_all_v, all_to_all_vc, barrier,
                   batch_send_recv, broadcast, group, group_active, recv, register_host, reduce, reduce_scatter, reduce_scatter_v, scatter, send)

__all__ = [
    "Buffer", "after_group", "all_gather", "all_gather_v", "all_reduce", "all_to_all", "all_to_all_v", "all_to_all_vc", "barrier",
    "batch_send_recv", "broadcast", "group", "group_active", "recv", "register_host", "reduce", "reduce_scatter", "reduce_scatter_v", "resolve",
    "scatter", "send",
]
