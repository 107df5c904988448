"""HCCL operations, each defined once, as functions of a communicator and its buffers.

:class:`hcclpy.Communicator` has them as methods (``comm.all_reduce(x)`` is
``collectives.all_reduce(comm, x)``), with their persistent ``*_init`` twins. This module also holds
what the operations share: the buffer forms they accept, groups, and persistent operations."""

from ._buffers import Buffer, BufferLike, BufferT, SupportsDLPack, parse
from ._calls import PersistentOp
from ._group import active as group_active, after as after_group, group
from ._ops import (all_gather, all_gather_init, all_gather_v, all_gather_v_init, all_reduce, all_reduce_init,
                   all_to_all, all_to_all_init, all_to_all_v, all_to_all_v_init, all_to_all_vc, all_to_all_vc_init,
                   barrier, barrier_init, batch_send_recv, batch_send_recv_init, broadcast, broadcast_init, recv,
                   recv_init, reduce, reduce_init, reduce_scatter, reduce_scatter_init, reduce_scatter_v,
                   reduce_scatter_v_init, scatter, scatter_init, send, send_init)
from ._staging import release

__all__ = [
    "Buffer", "BufferLike", "BufferT", "PersistentOp", "SupportsDLPack", "after_group", "all_gather",
    "all_gather_init", "all_gather_v", "all_gather_v_init", "all_reduce", "all_reduce_init", "all_to_all",
    "all_to_all_init", "all_to_all_v", "all_to_all_v_init", "all_to_all_vc", "all_to_all_vc_init", "barrier",
    "barrier_init", "batch_send_recv", "batch_send_recv_init", "broadcast", "broadcast_init", "group",
    "group_active", "parse", "recv", "recv_init", "reduce", "reduce_init", "reduce_scatter",
    "reduce_scatter_init", "reduce_scatter_v", "reduce_scatter_v_init", "release", "scatter", "scatter_init",
    "send", "send_init",
]
