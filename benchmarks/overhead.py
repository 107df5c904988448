#!/usr/bin/env python3
"""Per-call Python cost of hcclpy's operations, next to the raw cffi call and two ctypes bindings.

Everything runs in one process on a 1-rank communicator (on the simulator unless CANN is
installed); sends and receives on rank 0 of a 2-rank communicator of the process, whose rank 1
posts the matching calls after each timed loop. Every variant enqueues the same C function on the
same stream with the same preallocated device arrays; only the Python path to the call differs:

* ``raw cffi``: the ``HcclXxx`` function object hcclpy itself calls (``hcclpy._ffi.api()``), with
  pointers and handles cast to cdata once, outside the loop. This is the floor for a cffi ABI binding.
* ``hcclpy``: the public call, e.g. ``comm.all_reduce(a, b, stream=s)``: every call takes the one
  general path, which checks the arguments and builds the call each time.
* ``PersistentOp.start()``: the same operation made once with ``comm.all_reduce_init(a, b,
  stream=s)`` and started again and again (checked once, the C arguments built once).
* ``ctypes bare``: ``HcclAllReduce`` from the same ``libhccl.so`` through ctypes with
  ``argtypes``/``restype`` set, plain ints passed, no return-code check.
* ``ctypes binding (pyhccl-style)``: a binding shaped like vllm-ascend's pyhccl: a library object
  holding the ctypes functions in a dict and checking the return code (raising on failure), and a
  communicator method that builds ``c_void_p`` for both buffers, the comm and the stream on every
  call and maps the dtype and the op through small tables.

Targets (issue 28): every operation's general path <= raw cffi + 1.5 us, and every
``PersistentOp.start()`` <= raw cffi + 0.3 us. With torch installed, the torch backend's
``dist.all_reduce`` of 8 bytes is timed against torch's own dispatch floor (the same call on a
registered backend that does nothing) when ``benchmarks/torch_dispatch.py`` is present.

Method: for each variant, a tight loop of ``--calls`` calls is timed with ``time.perf_counter_ns``;
the stream is synchronised after the loop, outside the timed region. The variants are measured
round-robin (``--rounds`` rounds, the order rotated every round) after one untimed round. The table
gives the median and the minimum of the per-call times and their differences to the matching raw
cffi call: ``Δ raw (median)`` is the median over rounds of the difference within each round, which
cancels slow phases of a shared machine; ``Δ raw (min)`` is the difference of the minima. The main
thread is pinned to one CPU once the simulator's worker threads exist (``--cpu``). The header says
how busy other processes kept the CPUs meanwhile (from ``/proc/stat``).

    python benchmarks/overhead.py
    python benchmarks/overhead.py --rounds 11 --calls 20000 --json overhead.json
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import warnings
from itertools import repeat
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

HERE = Path(__file__).resolve().parent
# Run from a checkout without installing: the repository root holds the hcclpy package.
sys.path.insert(0, str(HERE.parent))

TARGET_OVER_RAW_NS = 1500.0   # an hcclpy call may cost at most this much more than the raw cffi call
TARGET_START_OVER_RAW_NS = 300.0   # PersistentOp.start() at most this much more
CLOCKS = {"wall": time.perf_counter_ns, "thread": time.thread_time_ns}


# ----------------------------------------------------------------- ctypes binding of HcclAllReduce

_HcclResult = ctypes.c_int
_buffer_type = ctypes.c_void_p
_HcclComm = ctypes.c_void_p
_aclrtStream = ctypes.c_void_p

# The tables a ctypes binding keeps: HcclDataType and HcclReduceOp values of hccl_types.h.
_CT_DTYPES = {"int8": 0, "int16": 1, "int32": 2, "float16": 3, "float32": 4, "int64": 5, "uint64": 6, "uint8": 7,
              "uint16": 8, "uint32": 9, "float64": 10, "bfloat16": 11}
_CT_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}


class CtypesHccl:
    """The library layer: ctypes functions with ``argtypes`` set, kept in a dict, return codes checked."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        all_reduce = self.lib.HcclAllReduce
        all_reduce.restype = _HcclResult
        all_reduce.argtypes = [_buffer_type, _buffer_type, ctypes.c_uint64, ctypes.c_int, ctypes.c_int, _HcclComm,
                               _aclrtStream]
        error_string = self.lib.HcclGetErrorString
        error_string.restype = ctypes.c_char_p
        error_string.argtypes = [_HcclResult]
        self._funcs = {"HcclAllReduce": all_reduce, "HcclGetErrorString": error_string}

    def check(self, result: int) -> None:
        if result != 0:
            text = self._funcs["HcclGetErrorString"](result).decode("utf-8", "replace")
            raise RuntimeError(f"HCCL error {result}: {text}")

    def hcclAllReduce(self, sendbuff: Any, recvbuff: Any, count: int, datatype: int, op: int, comm: Any,
                      stream: Any) -> None:
        self.check(self._funcs["HcclAllReduce"](sendbuff, recvbuff, count, datatype, op, comm, stream))


class CtypesCommunicator:
    """The communicator layer: ints in, ``c_void_p`` built per call, dtype and op through the tables."""

    def __init__(self, library: CtypesHccl, comm_handle: int) -> None:
        self.hccl = library
        self.comm = comm_handle

    def all_reduce(self, send_ptr: int, recv_ptr: int, count: int, dtype: str, op: str, stream_handle: int) -> None:
        self.hccl.hcclAllReduce(_buffer_type(send_ptr), _buffer_type(recv_ptr), count, _CT_DTYPES[dtype], _CT_OPS[op],
                                _HcclComm(self.comm), _aclrtStream(stream_handle))


# ----------------------------------------------------------------------------------- variants

class Variant:
    """One timed loop: ``run(n)`` makes ``n`` calls and returns the elapsed nanoseconds."""

    def __init__(self, key: str, label: str, group: str, run: Callable[[int], int], sync: Any,
                 raw: Optional[str] = None, call: str = "") -> None:
        self.key, self.label, self.group, self.run, self.sync = key, label, group, run, sync
        self.raw, self.call = raw, call
        self.samples: List[float] = []

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)


def build_variants(hcclpy: Any, api: Any, ffi: Any, comm: Any, stream: Any, a: Any, b: Any, count: int,
                   include_ops: bool, include_extras: bool, clock: Callable[[], int]) -> List[Variant]:
    """Every loop the benchmark times. Each ``run`` binds what it needs as closure variables."""
    ReduceOp = hcclpy.ReduceOp
    # The raw calls get cdata made once: cffi in ABI mode takes no int for a pointer parameter.
    ap, bp = ffi.cast("void *", a.ptr), ffi.cast("void *", b.ptr)
    h = ffi.cast("HcclComm", comm.handle)
    st = ffi.cast("aclrtStream", stream.handle)
    dt = int(a.dtype)
    n = count
    s = stream
    variants: List[Variant] = []

    # --- all_reduce: the four variants of the issue
    f = api.HcclAllReduce

    def raw_all_reduce(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            f(ap, bp, n, dt, 0, h, st)
        return clock() - t0

    def hcclpy_all_reduce(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.all_reduce(a, b, stream=s)
        return clock() - t0

    library = CtypesHccl(_hccl_path(hcclpy))
    cf = library._funcs["HcclAllReduce"]
    ai, bi, hi, si = a.ptr, b.ptr, comm.handle, stream.handle

    def ctypes_bare(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            cf(ai, bi, n, dt, 0, hi, si)
        return clock() - t0

    binding = CtypesCommunicator(library, comm.handle)
    dtype_name = a.dtype.numpy.name

    def ctypes_binding(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            binding.all_reduce(ai, bi, n, dtype_name, "sum", si)
        return clock() - t0

    variants += [
        Variant("raw_cffi", "raw cffi (floor)", "all_reduce", raw_all_reduce, s,
                call="api.HcclAllReduce(ap, bp, n, dt, 0, h, st)"),
        Variant("hcclpy", "hcclpy comm.all_reduce", "all_reduce", hcclpy_all_reduce, s, raw="raw_cffi",
                call="comm.all_reduce(a, b, stream=s)"),
        Variant("persistent", "hcclpy PersistentOp.start()", "all_reduce",
                _start_loop(comm.all_reduce_init(a, b, stream=s), clock), s, raw="raw_cffi",
                call="comm.all_reduce_init(a, b, stream=s).start()"),
        Variant("ctypes_bare", "ctypes bare (argtypes, ints)", "all_reduce", ctypes_bare, s, raw="raw_cffi",
                call="HcclAllReduce(ai, bi, n, dt, 0, hi, si)"),
        Variant("ctypes_binding", "ctypes binding (pyhccl-style)", "all_reduce", ctypes_binding, s, raw="raw_cffi",
                call='binding.all_reduce(ai, bi, n, "float32", "sum", si)'),
    ]

    if include_extras:
        default_stream = comm.device.default_stream
        op_sum = ReduceOp.SUM

        def hcclpy_op_string(k: int) -> int:
            t0 = clock()
            for _ in repeat(None, k):
                comm.all_reduce(a, b, "sum", stream=s)
            return clock() - t0

        def hcclpy_default_stream(k: int) -> int:
            t0 = clock()
            for _ in repeat(None, k):
                comm.all_reduce(a, b)
            return clock() - t0

        def hcclpy_in_place(k: int) -> int:
            t0 = clock()
            for _ in repeat(None, k):
                comm.all_reduce(a, op=op_sum, stream=s)
            return clock() - t0

        def hcclpy_untraced(k: int) -> int:
            hcclpy.trace.set_enabled(False)
            try:
                t0 = clock()
                for _ in repeat(None, k):
                    comm.all_reduce(a, b, op_sum, stream=s)
                return clock() - t0
            finally:
                hcclpy.trace.set_enabled(True)

        from hcclpy import _trace

        ring, now, info, seq, held = _trace.ring, _trace.now, comm._trace_info, comm._trace_seq, s._held
        record, keep = (info, "HcclAllReduce", n, dt, 0), (a, b)

        def python_floor(k: int) -> int:
            # What any Python wrapper pays: the C call, a flight-recorder entry, the buffers held.
            t0 = clock()
            for _ in repeat(None, k):
                if f(ap, bp, n, dt, 0, h, st):
                    raise RuntimeError("HcclAllReduce failed")
                ring.append((now(), next(seq), record, s._progress, s._handle))
                held.extend(keep)
            return clock() - t0

        variants += [
            Variant("python_floor", "a Python function: C call, record, hold", "all_reduce", python_floor, s,
                    raw="raw_cffi", call="f(...); ring.append(...); held.extend((a, b))"),
            Variant("hcclpy_untraced", "hcclpy, flight recorder off", "all_reduce", hcclpy_untraced, s,
                    raw="raw_cffi", call="comm.all_reduce(a, b, ReduceOp.SUM, stream=s) with HCCLPY_TRACE=0"),
            Variant("hcclpy_op_string", 'hcclpy, op="sum" (str)', "all_reduce", hcclpy_op_string, s, raw="raw_cffi",
                    call='comm.all_reduce(a, b, "sum", stream=s)'),
            Variant("hcclpy_default_stream", "hcclpy, stream omitted", "all_reduce", hcclpy_default_stream,
                    default_stream, raw="raw_cffi", call="comm.all_reduce(a, b)"),
            Variant("hcclpy_in_place", "hcclpy, in place (recv=None)", "all_reduce", hcclpy_in_place, s,
                    raw="raw_cffi", call="comm.all_reduce(a, op=ReduceOp.SUM, stream=s)"),
        ]

    if not include_ops:
        return variants

    # --- every other operation a 1-rank communicator can run: raw cffi next to hcclpy
    one = [n]
    zero = [0]
    counts_c = ffi.new("uint64_t[]", one)
    displs_c = ffi.new("uint64_t[]", zero)
    matrix_c = ffi.new("uint64_t[]", one)
    matrix = [[n]]
    fb, fr, fag, frs, fa2a = (api.HcclBroadcast, api.HcclReduce, api.HcclAllGather, api.HcclReduceScatter,
                              api.HcclAlltoAll)
    fbar, fagv, frsv, fa2av, fa2avc, fsc = (api.HcclBarrier, api.HcclAllGatherV, api.HcclReduceScatterV,
                                            api.HcclAlltoAllV, api.HcclAlltoAllVC, api.HcclScatter)

    # A raw cffi loop and an hcclpy loop per operation, written out the same way so that both sides
    # of a pair pay the same loop and closure costs.
    def pair(name: str, raw_run: Callable[[int], int], py_run: Callable[[int], int], raw_call: str,
             py_call: str) -> None:
        variants.append(Variant(f"raw_{name}", "raw cffi", name, raw_run, s, call=raw_call))
        variants.append(Variant(f"hcclpy_{name}", "hcclpy", name, py_run, s, raw=f"raw_{name}", call=py_call))
        # The persistent twin of the very same call: "comm.f(args)" -> "comm.f_init(args)".
        init = py_call.replace("(", "_init(", 1)
        persistent = eval(init, {"comm": comm, "a": a, "b": b, "s": s, "n": n})  # noqa: S307 - our own text
        variants.append(Variant(f"persistent_{name}", "PersistentOp.start()", name, _start_loop(persistent, clock), s,
                                raw=f"raw_{name}", call=init + ".start()"))

    def r_broadcast(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            fb(ap, n, dt, 0, h, st)
        return clock() - t0

    def p_broadcast(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.broadcast(a, root=0, stream=s)
        return clock() - t0

    def r_reduce(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            fr(ap, bp, n, dt, 0, 0, h, st)
        return clock() - t0

    def p_reduce(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.reduce(a, b, root=0, stream=s)
        return clock() - t0

    def r_all_gather(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            fag(ap, bp, n, dt, h, st)
        return clock() - t0

    def p_all_gather(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.all_gather(a, b, stream=s)
        return clock() - t0

    def r_reduce_scatter(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            frs(ap, bp, n, dt, 0, h, st)
        return clock() - t0

    def p_reduce_scatter(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.reduce_scatter(a, b, stream=s)
        return clock() - t0

    def r_all_to_all(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            fa2a(ap, n, dt, bp, n, dt, h, st)
        return clock() - t0

    def p_all_to_all(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.all_to_all(a, b, stream=s)
        return clock() - t0

    def r_barrier(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            fbar(h, st)
        return clock() - t0

    def p_barrier(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.barrier(stream=s)
        return clock() - t0

    def r_scatter(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            fsc(ap, bp, n, dt, 0, h, st)
        return clock() - t0

    def p_scatter(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.scatter(a, b, root=0, stream=s)
        return clock() - t0

    def r_all_gather_v(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            fagv(ap, n, bp, counts_c, displs_c, dt, h, st)
        return clock() - t0

    def p_all_gather_v(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.all_gather_v(a, b, one, zero, stream=s)
        return clock() - t0

    def r_reduce_scatter_v(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            frsv(ap, counts_c, displs_c, bp, n, dt, 0, h, st)
        return clock() - t0

    def p_reduce_scatter_v(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.reduce_scatter_v(a, b, one, zero, stream=s)
        return clock() - t0

    def r_all_to_all_v(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            fa2av(ap, counts_c, displs_c, dt, bp, counts_c, displs_c, dt, h, st)
        return clock() - t0

    def p_all_to_all_v(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.all_to_all_v(a, b, one, one, zero, zero, stream=s)
        return clock() - t0

    def r_all_to_all_vc(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            fa2avc(ap, matrix_c, dt, bp, dt, h, st)
        return clock() - t0

    def p_all_to_all_vc(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            comm.all_to_all_vc(a, b, matrix, stream=s)
        return clock() - t0

    pair("broadcast", r_broadcast, p_broadcast, "HcclBroadcast(ap, n, dt, 0, h, st)",
         "comm.broadcast(a, root=0, stream=s)")
    pair("reduce", r_reduce, p_reduce, "HcclReduce(ap, bp, n, dt, 0, 0, h, st)",
         "comm.reduce(a, b, root=0, stream=s)")
    pair("all_gather", r_all_gather, p_all_gather, "HcclAllGather(ap, bp, n, dt, h, st)",
         "comm.all_gather(a, b, stream=s)")
    pair("reduce_scatter", r_reduce_scatter, p_reduce_scatter, "HcclReduceScatter(ap, bp, n, dt, 0, h, st)",
         "comm.reduce_scatter(a, b, stream=s)")
    pair("all_to_all", r_all_to_all, p_all_to_all, "HcclAlltoAll(ap, n, dt, bp, n, dt, h, st)",
         "comm.all_to_all(a, b, stream=s)")
    pair("barrier", r_barrier, p_barrier, "HcclBarrier(h, st)", "comm.barrier(stream=s)")
    pair("scatter", r_scatter, p_scatter, "HcclScatter(ap, bp, n, dt, 0, h, st)",
         "comm.scatter(a, b, root=0, stream=s)")
    pair("all_gather_v", r_all_gather_v, p_all_gather_v,
         "HcclAllGatherV(ap, n, bp, counts_c, displs_c, dt, h, st)", "comm.all_gather_v(a, b, [n], [0], stream=s)")
    pair("reduce_scatter_v", r_reduce_scatter_v, p_reduce_scatter_v,
         "HcclReduceScatterV(ap, counts_c, displs_c, bp, n, dt, 0, h, st)",
         "comm.reduce_scatter_v(a, b, [n], [0], stream=s)")
    pair("all_to_all_v", r_all_to_all_v, p_all_to_all_v,
         "HcclAlltoAllV(ap, counts_c, displs_c, dt, bp, counts_c, displs_c, dt, h, st)",
         "comm.all_to_all_v(a, b, [n], [n], [0], [0], stream=s)")
    pair("all_to_all_vc", r_all_to_all_vc, p_all_to_all_vc, "HcclAlltoAllVC(ap, matrix_c, dt, bp, dt, h, st)",
         "comm.all_to_all_vc(a, b, [[n]], stream=s)")
    return variants


class PeerDrain:
    """The synchronisation of a point-to-point loop. Rank 0's sends and receives wait for rank 1:
    after the loop, rank 1 queues the matching call (raw cffi, untimed) once for every call the
    loop made, then both streams are synchronised."""

    def __init__(self, match: Callable[[], int], streams: List[Any], keep: List[Any]) -> None:
        self.match, self.streams, self.pending = match, streams, 0
        self.keep = keep  # the device arrays the raw calls address only by pointer

    def synchronize(self) -> None:
        for _ in repeat(None, self.pending):
            if self.match():
                raise SystemExit("rank 1's matching call failed: " + _last_error())
        self.pending = 0
        for stream in self.streams:
            stream.synchronize(timeout=300)


def _last_error() -> str:
    from hcclpy import _ffi
    return _ffi.string(_ffi.api().aclGetRecentErrMsg())


def peer_pair(hcclpy: Any) -> List[Any]:
    """A 2-rank communicator of this process (devices 0 and 1), rank 1 created on a thread."""
    info = hcclpy.RootInfo.generate(device=0)
    made: Dict[int, Any] = {}

    def make(rank: int) -> None:
        made[rank] = hcclpy.Communicator(2, info, rank, device=rank)

    helper = threading.Thread(target=make, args=(1,), daemon=True)
    helper.start()
    make(0)
    helper.join(timeout=60)
    if 1 not in made:
        raise SystemExit("rank 1 of the point-to-point pair did not come up within 60 s")
    return [made[0], made[1]]


def build_p2p_variants(hcclpy: Any, api: Any, ffi: Any, pair: List[Any], count: int, dtype: str,
                       clock: Callable[[], int]) -> List[Variant]:
    """Send, receive and a batch of both, timed on rank 0 of ``pair``; rank 1 answers untimed."""
    c0, c1 = pair
    s0, s1 = c0.device.create_stream(), c1.device.create_stream()
    a0, b0 = hcclpy.zeros(count, dtype, device=0), hcclpy.zeros(count, dtype, device=0)
    a1, b1 = hcclpy.zeros(count, dtype, device=1), hcclpy.zeros(count, dtype, device=1)
    a0p, b0p, a1p, b1p = (ffi.cast("void *", x.ptr) for x in (a0, b0, a1, b1))
    h0, h1 = ffi.cast("HcclComm", c0.handle), ffi.cast("HcclComm", c1.handle)
    st0, st1 = ffi.cast("aclrtStream", s0.handle), ffi.cast("aclrtStream", s1.handle)
    n, dt = count, int(a0.dtype)
    fsend, frecv, fbatch = api.HcclSend, api.HcclRecv, api.HcclBatchSendRecv
    # HcclSendRecvItem: type (0 send, 1 receive), buffer, count, dtype, peer
    items0 = ffi.new("HcclSendRecvItem[]", [(0, a0p, n, dt, 1), (1, b0p, n, dt, 1)])
    items1 = ffi.new("HcclSendRecvItem[]", [(1, b1p, n, dt, 0), (0, a1p, n, dt, 0)])
    variants: List[Variant] = []

    def pair_of(name: str, queue_raw: Callable[[int], int], queue_py: Callable[[int], int], match: Callable[[], int],
                raw_call: str, py_call: str) -> None:
        init = py_call.replace("(", "_init(", 1)
        persistent = eval(init, {"comm": c0, "a": a0, "b": b0, "s": s0})  # noqa: S307 - our own text
        for key, label, raw, call, run in (
                (f"raw_{name}", "raw cffi", None, raw_call, queue_raw),
                (f"hcclpy_{name}", "hcclpy", f"raw_{name}", py_call, queue_py),
                (f"persistent_{name}", "PersistentOp.start()", f"raw_{name}", init + ".start()",
                 _start_loop(persistent, clock))):
            drain = PeerDrain(match, [s1, s0], [a0, b0, a1, b1])

            def counted(k: int, run: Callable[[int], int] = run, drain: PeerDrain = drain) -> int:
                drain.pending += k
                return run(k)
            variants.append(Variant(key, label, name, counted, drain, raw=raw, call=call))

    def r_send(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            fsend(a0p, n, dt, 1, h0, st0)
        return clock() - t0

    def p_send(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            c0.send(a0, 1, stream=s0)
        return clock() - t0

    def r_recv(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            frecv(b0p, n, dt, 1, h0, st0)
        return clock() - t0

    def p_recv(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            c0.recv(b0, 1, stream=s0)
        return clock() - t0

    def r_batch(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            fbatch(items0, 2, h0, st0)
        return clock() - t0

    def p_batch(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            c0.batch_send_recv([("send", a0, 1), ("recv", b0, 1)], stream=s0)
        return clock() - t0

    pair_of("send", r_send, p_send, lambda: frecv(b1p, n, dt, 0, h1, st1), "HcclSend(ap, n, dt, 1, h, st)",
            "comm.send(a, 1, stream=s)")
    pair_of("recv", r_recv, p_recv, lambda: fsend(a1p, n, dt, 0, h1, st1), "HcclRecv(bp, n, dt, 1, h, st)",
            "comm.recv(b, 1, stream=s)")
    pair_of("batch_send_recv", r_batch, p_batch, lambda: fbatch(items1, 2, h1, st1),
            "HcclBatchSendRecv(items, 2, h, st)", 'comm.batch_send_recv([("send", a, 1), ("recv", b, 1)], stream=s)')
    return variants


def _start_loop(persistent: Any, clock: Callable[[], int]) -> Callable[[int], int]:
    """A timed loop of ``persistent.start()``."""
    start = persistent.start

    def run(k: int) -> int:
        t0 = clock()
        for _ in repeat(None, k):
            start()
        return clock() - t0
    return run


def _hccl_path(hcclpy: Any) -> str:
    """The ``libhccl.so`` hcclpy loaded, so that ctypes calls the very same library."""
    for lib in hcclpy.library_info()["libraries"]:
        if lib["name"].startswith("libhccl.") or Path(lib["path"]).name.startswith("libhccl."):
            return lib["path"]
    raise SystemExit(f"hcclpy loaded no libhccl: {hcclpy.library_info()['libraries']}")


# ----------------------------------------------------------------------------------- running

def pin(cpu: Optional[int]) -> Optional[int]:
    """Pin the calling thread to ``cpu`` (None: the last CPU it may run on; -1: do not pin)."""
    if cpu == -1 or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if cpu is None:
        if len(allowed) < 2:
            return None
        cpu = allowed[-1]
    # pid 0 is the calling thread: threads the simulator already started keep their own mask.
    os.sched_setaffinity(0, {cpu})
    return cpu


def measure(variants: List[Variant], calls: int, rounds: int, warmup: int, keep_gc: bool,
            progress: bool) -> None:
    for v in variants:   # warm-up: first-call costs, the simulator's worker threads, caches
        v.run(warmup)
        v.sync.synchronize()
    groups: Dict[str, List[Variant]] = {}
    for v in variants:
        groups.setdefault(v.group, []).append(v)
    gc_was_enabled = gc.isenabled()
    for r in range(rounds):
        for group in groups.values():
            shift = r % len(group)
            for v in group[shift:] + group[:shift]:   # rotate so that no variant always runs first
                # An untimed quarter loop first: what the loop before leaves behind (after the
                # point-to-point loops most) slows the next few milliseconds, which is not this
                # variant's own per-call cost.
                v.run(calls // 4)
                v.sync.synchronize()
                if not keep_gc:
                    gc.disable()
                try:
                    elapsed = v.run(calls)
                finally:
                    if gc_was_enabled:
                        gc.enable()
                v.sync.synchronize()   # outside the timed region
                v.samples.append(elapsed / calls)
        if progress:
            print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------- reporting

def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def _delta(x: float) -> str:
    return f"{x:+,.0f}"


def _paired(a: List[float], b: List[float]) -> float:
    """Median over rounds of ``a[i] - b[i]``."""
    return statistics.median(x - y for x, y in zip(a, b))


def summarise(variants: List[Variant]) -> Dict[str, Any]:
    by_key = {v.key: v for v in variants}
    rows = {}
    for v in variants:
        row: Dict[str, Any] = {"label": v.label, "group": v.group, "call": v.call, "median_ns": v.median,
                               "min_ns": v.min, "samples_ns": v.samples}
        if v.raw is not None:
            raw = by_key[v.raw]
            row["raw"] = v.raw
            # The median of the per-round differences: both loops of a round ran within a second of
            # each other, so a machine that slows down for a while moves both and cancels out.
            row["delta_median_ns"] = _paired(v.samples, raw.samples)
            row["delta_of_medians_ns"] = v.median - raw.median
            row["delta_min_ns"] = v.min - raw.min
        rows[v.key] = row
    return rows


def targets(rows: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Issue 28's targets, for every operation: the general path <= raw + 1.5 us, PersistentOp.start()
    <= raw + 0.3 us; and all_reduce against a pyhccl-style ctypes binding."""
    out = []
    for key, row in rows.items():
        if "raw" not in row or not (key in ("hcclpy", "persistent") or key.startswith(("hcclpy_", "persistent_"))):
            continue
        if row["group"] == "all_reduce" and key not in ("hcclpy", "persistent"):
            continue  # the informational all_reduce rows (op as a string, stream omitted...)
        start = key.startswith("persistent")
        limit = TARGET_START_OVER_RAW_NS if start else TARGET_OVER_RAW_NS
        what = "PersistentOp.start()" if start else "the general path"
        out.append({"target": f"{row['group']}: {what} <= raw cffi + {limit / 1000:g} us",
                    "value_ns": row["delta_median_ns"], "limit_ns": limit, "pass": row["delta_median_ns"] <= limit,
                    "text": f"{_delta(row['delta_median_ns'])} ns over raw cffi (limit +{limit:,.0f})"})
    py, ctb = rows["hcclpy"], rows["ctypes_binding"]
    versus = _paired(py["samples_ns"], ctb["samples_ns"])
    out.append({"target": "all_reduce: the general path < ctypes binding (pyhccl-style)", "value_ns": versus,
                "limit_ns": 0.0, "pass": versus < 0,
                "text": f"hcclpy {_fmt(py['median_ns'])} ns vs ctypes binding {_fmt(ctb['median_ns'])} ns "
                        f"({_delta(versus)} ns)"})
    return out


def _table(header: List[str], lines: List[List[str]], markdown: bool, align: str) -> str:
    if markdown:
        sep = ["---:" if c == "r" else "---" for c in align]
        return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, sep] + lines)
    widths = [max(len(row[i]) for row in [header] + lines) for i in range(len(header))]

    def fmt(cells: List[str]) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align)).rstrip()

    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(cells) for cells in lines])


def report(rows: Dict[str, Any], meta: Dict[str, Any], markdown: bool) -> str:
    out = []
    mark = "" if markdown else "# "
    pinned = "not pinned" if meta["pinned_cpu"] is None else f"pinned to CPU {meta['pinned_cpu']}"
    checkout = f" (checkout {meta['checkout']})" if meta.get("checkout") else ""
    out.append(f"{mark}hcclpy {meta['hcclpy']}{checkout} per-call overhead: backend {meta['backend']}, "
               f"{meta['libhccl']}")
    out.append(f"{mark}Python {meta['python']}, cffi {meta['cffi']}, {meta['calls']} calls x {meta['rounds']} rounds "
               f"per variant, count={meta['count']} {meta['dtype']}, {pinned}, "
               f"gc {'on' if meta['gc'] else 'off'} in the loops"
               + ("" if meta["clock"] == "wall" else ", clock: the main thread's CPU time"))
    others = meta.get("others_cpus")
    if others is not None:
        out.append(f"{mark}other processes kept {others:.2f} of {meta['cpus']} CPUs busy during the run"
                   + (": they competed with the benchmark, the numbers are inflated" if others > 0.2 else ""))
    out.append("")
    header = ["variant", "median ns/call", "min ns/call", "Δ raw (median)", "Δ raw (min)"]
    lines = []
    for key, row in rows.items():
        if row["group"] != "all_reduce":
            continue
        lines.append([row["label"], _fmt(row["median_ns"]), _fmt(row["min_ns"]),
                      _delta(row.get("delta_median_ns", 0.0)) if "raw" in row else "—",
                      _delta(row.get("delta_min_ns", 0.0)) if "raw" in row else "—"])
    out.append("all_reduce, out of place, explicit stream")
    out.append(_table(header, lines, markdown, "lrrrr"))
    out.append("")
    ops = [k for k, r in rows.items() if k.startswith("hcclpy_") and r["group"] != "all_reduce"]
    if ops:
        header = ["operation", "raw cffi median", "hcclpy median", "Δ median", "≤ raw + 1.5 µs",
                  "start() median", "Δ median", "≤ raw + 0.3 µs"]
        lines = []
        for key in ops:
            py = rows[key]
            raw = rows[py["raw"]]
            start = rows[key.replace("hcclpy_", "persistent_", 1)]
            lines.append([py["group"], _fmt(raw["median_ns"]), _fmt(py["median_ns"]), _delta(py["delta_median_ns"]),
                          "yes" if py["delta_median_ns"] <= TARGET_OVER_RAW_NS else "no", _fmt(start["median_ns"]),
                          _delta(start["delta_median_ns"]),
                          "yes" if start["delta_median_ns"] <= TARGET_START_OVER_RAW_NS else "no"])
        out.append("every other operation (ns per call)")
        out.append(_table(header, lines, markdown, "lrrrlrrl"))
        out.append("")
    found = targets(rows)
    for t in found:
        out.append(f"{'PASS' if t['pass'] else 'FAIL'}: {t['target']}: {t['text']}")
    missed = [t["target"] for t in found if not t["pass"]]
    out.append(f"targets met: {len(found) - len(missed)}/{len(found)}")
    return "\n".join(out)


def _torch_dispatch(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """The torch backend's 8-byte ``dist.all_reduce`` against torch's dispatch floor, printed after
    the table (``torch_dispatch.py``: 2 spawned ranks); None, saying why, without torch."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        print("# torch is not installed: no torch dispatch row")
        return None
    sys.path.insert(0, str(HERE))
    import torch_dispatch

    if hasattr(os, "sched_setaffinity"):  # the ranks it spawns must not inherit the pinning to one CPU
        os.sched_setaffinity(0, range(os.cpu_count() or 1))

    result = torch_dispatch.measure(calls=max(args.calls // 4, 50), rounds=max(args.rounds, 3))
    print()
    print(torch_dispatch.report(result))
    return result


def _checkout() -> Optional[str]:
    """The commit of the checkout this script runs from (``+`` when hcclpy has local changes), if any."""
    def run(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(HERE.parent), *cmd], capture_output=True, text=True, timeout=10)

    try:
        head = run("rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            return None
        dirty = run("status", "--porcelain", "--", "hcclpy").stdout.strip()
        return head.stdout.strip() + ("+" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_snapshot() -> Optional[tuple]:
    """(wall s, CPU s busy on the whole machine, CPU s of this process) where /proc/stat exists."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal: all but idle and iowait kept a CPU from us
    busy = sum(fields[:3]) + sum(fields[5:8])
    mine = os.times()
    return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), mine.user + mine.system


def _others(before: Optional[tuple], after: Optional[tuple]) -> Optional[float]:
    """CPUs that other processes kept busy on average between two snapshots."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return round(max(others, 0.0) / (after[0] - before[0]), 2)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000, help="calls per timed loop (default 20000)")
    parser.add_argument("--rounds", type=int, default=11, help="round-robin rounds, each variant once per round "
                        "(default 11, at least 7 recommended)")
    parser.add_argument("--count", type=int, default=64, help="elements per buffer (default 64)")
    parser.add_argument("--dtype", default="float32", help="element type (default float32)")
    parser.add_argument("--cpu", type=int, default=None, help="pin the main thread to this CPU (default: the last "
                        "allowed CPU when there are two or more; -1: do not pin)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="wall: time.perf_counter_ns "
                        "(default); thread: time.thread_time_ns, the main thread's CPU time, which leaves out the "
                        "time other processes took the CPU (a cross-check on a busy machine)")
    parser.add_argument("--no-gc", dest="gc", action="store_false", help="turn the garbage collector off in the "
                        "timed loops, as timeit does (default: on, as in a program: a binding that keeps objects "
                        "alive per call pays for it)")
    parser.add_argument("--all-reduce-only", action="store_true", help="skip the other operations")
    parser.add_argument("--no-extras", action="store_true", help="skip the informational hcclpy all_reduce rows "
                        "(op as a string, stream omitted, in place)")
    parser.add_argument("--no-torch", dest="torch", action="store_false", help="skip the torch backend's "
                        "dist.all_reduce against torch's dispatch floor (benchmarks/torch_dispatch.py, 2 ranks)")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    parser.add_argument("--json", metavar="PATH", help="write every sample and the summary to PATH")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.rounds < 1 or args.count < 1:
        parser.error("--calls, --rounds and --count must be positive")

    import cffi

    import hcclpy
    from hcclpy import _ffi
    from hcclpy._ffi import SimulatorFallbackWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulatorFallbackWarning)
        api = _ffi.api()
    snapshot = _cpu_snapshot()
    device = hcclpy.Device(0)
    device.set_current()
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    stream = device.create_stream()
    a = hcclpy.zeros(args.count, args.dtype, device=0)
    b = hcclpy.zeros(args.count, args.dtype, device=0)
    # Sends and receives need a second device for rank 1 (the simulator has eight).
    pair = [] if args.all_reduce_only or hcclpy.device_count() < 2 else peer_pair(hcclpy)
    try:
        variants = build_variants(hcclpy, api, _ffi.ffi, comm, stream, a, b, args.count,
                                  include_ops=not args.all_reduce_only, include_extras=not args.no_extras,
                                  clock=CLOCKS[args.clock])
        if pair:
            variants += build_p2p_variants(hcclpy, api, _ffi.ffi, pair, args.count, args.dtype, CLOCKS[args.clock])
        # Warm up before pinning: the simulator's stream workers start on first use and inherit the
        # mask of the thread that starts them; they should stay free to run on the other CPUs.
        measure(variants, 0, 0, warmup=min(args.calls, 2000), keep_gc=True, progress=False)
        cpu = pin(args.cpu)
        # Then one full untimed round: the first loop of `calls` enqueues grows the simulator's task
        # memory (page faults) and moves the caches to the pinned CPU.
        if not args.quiet:
            print(f"timing {len(variants)} variants x {args.rounds} rounds x {args.calls} calls ...", file=sys.stderr,
                  flush=True)
        measure(variants, args.calls, args.rounds, warmup=args.calls, keep_gc=args.gc,
                progress=not args.quiet)
    finally:
        device.synchronize()
        comm.destroy()
        for member in pair:
            member.destroy()

    rows = summarise(variants)
    meta = {"backend": hcclpy.backend(), "libhccl": _hccl_path(hcclpy), "python": platform.python_version(),
            "implementation": platform.python_implementation(), "cffi": cffi.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count(), "pinned_cpu": cpu, "calls": args.calls,
            "clock": args.clock, "rounds": args.rounds, "count": args.count, "dtype": args.dtype, "gc": args.gc,
            "hcclpy": hcclpy.__version__, "checkout": _checkout(), "others_cpus": _others(snapshot, _cpu_snapshot())}
    print(report(rows, meta, args.markdown))
    dispatch = _torch_dispatch(args) if args.torch else None
    if args.json:
        data = {"meta": meta, "variants": rows, "targets": targets(rows), "torch_dispatch": dispatch}
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
