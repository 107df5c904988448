"""The ``"hcclpy"`` process group: torch.distributed operations mapped onto hcclpy collectives.

Each operation checks its arguments in the caller (a ``ValueError``/``TypeError`` before anything
runs), then hands one body, written against the transport interface of :mod:`._transport`, to
the transport that matches the tensors: CPU tensors run on the group's ordered executor (in the
caller's thread when it blocks and nothing is queued), NPU tensors are queued on the current NPU
stream. Sends and receives go through per-direction channels (:mod:`._p2p`).
"""

from __future__ import annotations

import logging
import threading
import zlib
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from .. import collectives
from ..bootstrap import detect_launch
from ..communicator import Communicator
from ..config import CommConfig
from ..errors import HcclpyError
from ..rootinfo import RootInfo
from ..runtime import Device, device_count
from ..runtime._graph import captures_here
from ._dtypes import Reduction, movement, reduction
from ._errors import backend_error
from ._p2p import Channel, p2p_config
from ._transport import DeviceTransport, HostTransport, in_memory_order, npu_stream
from ._small import LIMIT as SMALL_LIMIT
from ._small import SmallAllReduce
from ._work import Done, EventWork, Executor, Work

log = logging.getLogger("hcclpy.torch")

_DRAIN_ON_SHUTDOWN = 60.0  # seconds that shutdown waits for queued operations

Body = Callable[[Any], None]


def _npu_available() -> bool:
    npu = getattr(torch, "npu", None)
    return npu is not None and npu.is_available()


def _served_devices() -> Tuple[str, ...]:
    """The device types a group serves: "npu" is a torch device type only once torch_npu is loaded."""
    return ("cpu", "npu") if getattr(torch, "npu", None) is not None else ("cpu",)


_process_device: Optional[Device] = None


def process_device(rank_hint: int) -> Device:
    """The device this process's groups use: torch_npu's current device; otherwise the launcher's
    local rank (``rank_hint``, the world rank, without a launcher), modulo the device count."""
    global _process_device
    if _process_device is None:
        if _npu_available():
            device_id = torch.npu.current_device()  # type: ignore[attr-defined]
        else:
            device_id = _local_rank(rank_hint) % device_count()
        _process_device = Device(device_id)
    return _process_device


def _local_rank(rank_hint: int) -> int:
    """The launcher's local rank, or ``rank_hint`` when no launcher describes this process.

    torch has already decided the rank and size (from its arguments, which win over the
    environment, as with gloo); the launcher's variables only place the process on a device.
    An environment that names no complete launch (``WORLD_SIZE`` without ``RANK``, say: a shell
    that exported one of them) therefore falls back to the rank instead of failing."""
    try:
        launch = detect_launch()
    except ValueError as exc:
        log.debug("no complete launcher environment (%s): device chosen from rank %d", exc, rank_hint)
        return rank_hint
    return launch.local_rank if launch.launcher != "none" else rank_hint


def _options(pg_options: Any, timeout: float) -> Tuple[Optional[CommConfig], Optional[int]]:
    """``pg_options`` (a CommConfig, a dict of its fields plus an optional ``"device"``, or None) as
    a CommConfig whose exec timeout defaults to the group's timeout, and the device asked for."""
    device = None
    if isinstance(pg_options, dict):
        pg_options = dict(pg_options)
        device = pg_options.pop("device", None)
    elif pg_options is not None and not isinstance(pg_options, CommConfig):
        raise TypeError(f"pg_options for the hcclpy backend must be an hcclpy.CommConfig or a dict of its fields, "
                        f"got {type(pg_options).__name__}")
    config = CommConfig.coerce(pg_options) or CommConfig()
    if config.exec_timeout is None:
        config = CommConfig(**{**vars(config), "exec_timeout": min(timeout, 2**31 - 1)})
    return config, device


# The layouts whose elements fill one block of memory, as NCCL accepts them: HCCL reads a tensor
# from its data pointer in memory order. Rows (the first dimension) stay outermost in all three.
_FORMATS = (torch.contiguous_format, torch.channels_last, torch.channels_last_3d)
_COMPLEX_PARTS = (torch.float16, torch.float32, torch.float64)


def _as_laid_out(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or the complex tensor it is the real view of: torch.distributed hands a complex
    tensor over as ``view_as_real``, whose pairs of reals fit no memory format."""
    if tensor.dtype in _COMPLEX_PARTS and tensor.dim() > 1 and tensor.shape[-1] == 2 and tensor.stride(-1) == 1:
        try:
            return torch.view_as_complex(tensor)
        except RuntimeError:  # strides or offset of no complex tensor
            pass
    return tensor


def _formats(tensor: torch.Tensor) -> Tuple[torch.memory_format, ...]:
    """The memory formats ``tensor`` is dense in (none: it is not dense)."""
    laid_out = _as_laid_out(tensor)
    return tuple(form for form in _FORMATS if laid_out.is_contiguous(memory_format=form))


def _dense(tensor: torch.Tensor) -> bool:
    # is_contiguous() first: with a memory_format keyword the test costs ~8 times more.
    return tensor.is_contiguous() or bool(_formats(tensor))


def _common_format(tensors: Sequence[torch.Tensor]) -> Optional[torch.memory_format]:
    """A memory format every one of ``tensors`` is dense in (contiguous if possible), or None."""
    if all(t.is_contiguous() for t in tensors):
        return torch.contiguous_format
    common = set(_FORMATS)
    for t in tensors:
        common.intersection_update(_formats(t))
    return next((form for form in _FORMATS if form in common), None)


def _format_name(tensor: torch.Tensor) -> str:
    return str(_formats(tensor)[0]).replace("torch.", "").replace("_format", "")


def _in_format_of(tensor: torch.Tensor, model: torch.Tensor) -> torch.Tensor:
    """``tensor``, or a copy of it in ``model``'s memory format when they share none (and the copy
    can have it)."""
    if _common_format([tensor, model]) is not None:
        return tensor
    try:
        return tensor.contiguous(memory_format=_formats(model)[0])
    except RuntimeError:  # a format of another number of dimensions
        return tensor


def _device_type(tensor: torch.Tensor) -> str:
    """Where ``tensor`` lives ("cpu", "npu", ...): it decides the transport."""
    return tensor.device.type


# The group of the default (world) process group: sub-groups are split from its communicator.
_world_group: Optional[ProcessGroupHcclpy] = None


def _sub_id(group_name: str) -> int:
    # Every member derives the same id from torch's group name (unique among live groups).
    return zlib.crc32(f"hcclpy/{group_name}".encode()) % 0xFFFFFFFF


class ProcessGroupHcclpy(dist.ProcessGroup):
    """A torch.distributed process group whose operations run on an hcclpy :class:`Communicator`.

    Created by ``dist.init_process_group("hcclpy")`` / ``dist.new_group(..., backend="hcclpy")``;
    users meet it as a group handle. :attr:`communicator` gives its communicator for direct hcclpy
    calls.
    """

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, *, group_name: str,
                 global_ranks: Sequence[int], pg_options: Any = None) -> None:
        super().__init__(rank, size)
        self._timeout = timeout.total_seconds()
        self._store = store
        self._label = group_name
        self._group_name = group_name
        self._group_desc = ""
        self._global_ranks = list(global_ranks) or list(range(size))
        self._config, device = _options(pg_options, self._timeout)
        self._device = Device(device) if device is not None else process_device(rank)
        # torch may give a group created again (after destroy_process_group, say) a store with the
        # same prefix, holding the last one's keys: each creation writes its keys under a number
        # of its own. Every member counts itself in once per creation, so all derive the same one.
        self._keys = f"hcclpy/{(store.add('hcclpy/creations', 1) - 1) // size}/"
        # Every member must take the same way to its communicator: splitting needs the parent's
        # device, so a group given its own device gets its own root info.
        self._comm = self._connect(list(global_ranks), may_split=device is None)
        self._host = HostTransport(self._comm)
        self._small = SmallAllReduce(self._comm)
        self._executor = Executor(f"pg{group_name}")
        self._channels: Dict[Tuple[int, int, int], Channel] = {}
        self._channels_lock = threading.Lock()
        self._closed = False

    def _connect(self, global_ranks: List[int], may_split: bool) -> Communicator:
        parent = _world_group
        if may_split and global_ranks and parent is not None and not parent._closed:
            parent._executor.drain(self._timeout)  # no operation of the parent runs while it is split
            try:
                comm = parent._comm.split(global_ranks, config=self._config, sub_id=_sub_id(self._label))
                log.info("process group %r: ranks %s split from the default group's communicator", self._label,
                         global_ranks)
                return comm
            except NotImplementedError:  # this CANN cannot split by the members alone
                pass
        if self.rank() == 0:
            info = RootInfo.generate(self._device)
            self._store.set(self._keys + "root_info", info.to_bytes())
        else:
            info = RootInfo(self._store.get(self._keys + "root_info"))
        log.info("process group %r: rank %d of %d, root info through the store", self._label, self.rank(),
                 self.size())
        return Communicator(self.size(), info, self.rank(), config=self._config, device=self._device)

    # ------------------------------------------------------------------ identity and life cycle

    def getBackendName(self) -> str:
        """The backend's name, ``"hcclpy"``."""
        return "hcclpy"

    # torch keeps group names in the backends a C++ group holds; a Python group keeps its own.
    def setGroupName(self, name: str) -> None:
        """Set the group's name (torch names groups as it creates them)."""
        self._group_name = name

    def getGroupName(self) -> str:
        """The group's name."""
        return self._group_name

    def setGroupDesc(self, description: str) -> None:
        """Set the group's description (torch's ``group_desc``)."""
        self._group_desc = description

    def getGroupDesc(self) -> str:
        """The group's description."""
        return self._group_desc

    # ------------------------------------------------------------------- torch's Backend interface
    #
    # torch gives each group one Backend per device type and hands it out by
    # ``group._get_backend(device)``. torch 2.13 lets no Python class be such a Backend (its
    # Backend type has no constructor for Python subclasses), so torch takes a Python backend's
    # creator result as the group itself (distributed_c10d: "subclass of ProcessGroup ... return
    # this process group"), registering nothing in it. This group therefore answers for its own
    # backend, on the devices it serves, with the parts of torch's Backend interface that mean
    # something here.

    @property
    def _device_types(self) -> List[torch.device]:
        """The device types this group serves: CPU, and NPU where torch_npu is loaded."""
        return [torch.device(kind) for kind in _served_devices()]

    def _get_backend(self, device: Any) -> ProcessGroupHcclpy:
        """The backend of ``device`` (a ``torch.device`` or its type): this group, for CPU and NPU
        tensors. Raises ``RuntimeError`` for another device type, as torch does (torch's own
        helpers probe for a CUDA backend and catch that)."""
        kind = device.type if isinstance(device, torch.device) else torch.device(device).type
        if kind not in _served_devices():
            raise RuntimeError(f"No backend type associated with device type {kind}: the hcclpy backend serves "
                               f"{', '.join(_served_devices())} tensors")
        return self

    def name(self) -> str:
        """The backend's name, ``"hcclpy"``."""
        return "hcclpy"

    @property
    def options(self) -> Any:
        """torch's ``Backend.Options`` of this group: backend name, timeout, group name, ranks."""
        options = _C10dBackend.Options("hcclpy", timedelta(seconds=self._timeout))
        options.group_name = self._group_name
        options.global_ranks_in_group = list(self._global_ranks)
        return options

    # Features torch asks a backend about: none of them is offered (a split goes through
    # new_group, coalescing through the *_coalesced operations, tensors are torch's own).
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    supports_shrinking = False

    def supports_tensor_alloc(self, device: Any) -> bool:
        """False: the group allocates no tensors for torch (torch's symmetric-memory interface)."""
        return False

    def eager_connect_single_device(self, device: Any) -> None:
        """Nothing to do: the communicator is formed when the group is created."""

    @property
    def communicator(self) -> Communicator:
        """The hcclpy communicator this group runs on (for direct hcclpy calls)."""
        return self._comm

    @property
    def timeout(self) -> float:
        """Seconds an operation may take: the communicator's exec timeout and ``Work.wait()``'s limit."""
        return self._timeout

    def __repr__(self) -> str:
        return f"<hcclpy.torch.ProcessGroupHcclpy {self._label!r} rank {self.rank()} of {self.size()}>"

    def shutdown(self) -> None:
        """Finish queued operations (for at most a minute), then destroy the communicators."""
        if self._closed:
            return
        self._closed = True
        global _world_group
        if _world_group is self:
            _world_group = None
        self._executor.close(_DRAIN_ON_SHUTDOWN)
        with self._channels_lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close(_DRAIN_ON_SHUTDOWN)
        self._comm.destroy()
        self._small.close()
        log.info("process group %r destroyed", self._label)

    def abort(self) -> None:
        """As :meth:`shutdown` (torch calls it when a group is aborted)."""
        self.shutdown()

    # ------------------------------------------------------------------------------ plumbing

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"process group {self._label!r} has been destroyed")

    @staticmethod
    def _refuse_capture(operation: str) -> None:
        """CPU tensors are staged through device memory and waited for: no capture records that."""
        if captures_here():
            raise RuntimeError(f"{operation} on CPU tensors cannot be captured: the hcclpy backend stages them "
                               "through device memory and waits for the result. Capture hcclpy.Communicator calls "
                               "on device buffers instead (see the docs' Graphs page)")

    def _tensors(self, tensors: Any, operation: str, argument: str) -> List[torch.Tensor]:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError(f"{operation}: {argument} must be a list of tensors, got {type(tensors).__name__}")
        for t in tensors:
            if t.layout != torch.strided:
                raise ValueError(f"{operation}: {argument} holds a {t.layout} tensor; the hcclpy backend takes "
                                 "dense tensors only")
            if t.is_conj() or t.is_neg():  # lazy views: the memory holds the values before the flip
                bit = "conjugate" if t.is_conj() else "negative"
                raise ValueError(f"{operation}: {argument} holds a tensor whose {bit} bit is set (a lazy view, its "
                                 "memory unchanged); pass tensor.resolve_conj() or tensor.resolve_neg()")
            if not _dense(t):
                raise ValueError(f"{operation}: {argument} holds a non-contiguous tensor (shape {tuple(t.shape)}, "
                                 f"strides {t.stride()}), dense in none of the contiguous, channels_last and "
                                 "channels_last_3d memory formats; pass tensor.contiguous()")
        return list(tensors)

    def _alike(self, tensors: Sequence[torch.Tensor], operation: str, one_format: bool = True) -> torch.dtype:
        """The one dtype of ``tensors``, which must also share a memory format (``one_format``):
        HCCL moves elements in memory order, which is their logical order only when the formats
        agree."""
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) > 1:
            raise TypeError(f"{operation}: the tensors must share one dtype, got {sorted(map(str, dtypes))}")
        if one_format and _common_format(tensors) is None:
            formats = sorted({_format_name(t) for t in tensors})
            raise ValueError(f"{operation}: the tensors mix memory formats ({', '.join(formats)}); HCCL moves their "
                             "elements in memory order, so give them one format (tensor.contiguous(memory_format=...))")
        return tensors[0].dtype

    def _root(self, root: int, operation: str) -> int:
        if not 0 <= root < self.size():
            raise ValueError(f"{operation}: root rank {root} is not a rank of this group (0..{self.size() - 1})")
        return root

    def _issue(self, operation: str, tensors: Sequence[torch.Tensor], outputs: List[torch.Tensor], body: Body,
               opts: Any = None) -> Work:
        """Run ``body(transport)`` for ``tensors`` and return the Work that tracks it."""
        self._check_open()
        kinds = {_device_type(t) for t in tensors}
        kind = kinds.pop() if len(kinds) == 1 else None
        description = f"{operation} on process group {self._label!r}"
        if kind == "npu":
            try:
                transport = DeviceTransport(self._comm, npu_stream(self._comm))
                body(transport)
                return EventWork(description, outputs, self._timeout, transport.record())
            except HcclpyError as exc:  # queuing failed: as torch's backends report it
                raise backend_error(exc, description) from exc
        if kind == "cpu" or not tensors:
            self._refuse_capture(operation)
            blocking = not getattr(opts, "asyncOp", True)
            return self._executor.submit(lambda: body(self._host), Work(description, outputs, self._timeout),
                                         blocking=blocking)
        where = sorted({_device_type(t) for t in tensors})
        raise ValueError(f"{operation}: the hcclpy backend takes CPU tensors or NPU tensors (torch_npu), all on one "
                         f"kind of device; got tensors on {where}")

    # ---------------------------------------------------------------------------- reductions

    def _reduction_input(self, tensor: torch.Tensor, plan: Reduction) -> torch.Tensor:
        """The tensor HCCL reduces: ``tensor`` itself, or a widened, pre-multiplied or (AVG)
        pre-divided copy. AVG divides each input before the sum, as NCCL does: a sum of float16
        values whose mean fits could overflow to inf."""
        work = tensor if plan.widen is None else tensor.to(plan.widen)
        if plan.factor is not None:
            work = torch.mul(work, plan.factor).to(work.dtype)
        if plan.divide:
            work = torch.div(work, self.size()).to(work.dtype)
        return work

    def _reduction_output(self, tensor: torch.Tensor, work: torch.Tensor, plan: Reduction) -> None:
        if work is not tensor:
            tensor.copy_(work)

    def _reduce(self, transport: Any, tensor: torch.Tensor, plan: Reduction, root: Optional[int]) -> None:
        """All-reduce (``root`` None) or reduce ``tensor`` in place."""
        comm = self._comm
        work = self._reduction_input(tensor, plan)
        if root is None:
            transport.elementwise(work, work, plan.dtype, work.numel() * plan.unit,
                                  lambda s, r, st: collectives.all_reduce(comm, s, None, plan.op, stream=st))
        else:
            is_root = root == self.rank()
            transport.elementwise(work, work if is_root else None, plan.dtype, work.numel() * plan.unit,
                                  lambda s, r, st: collectives.reduce(comm, s, r, plan.op, root, stream=st))
            if not is_root:
                return
        self._reduction_output(tensor, work, plan)

    def allreduce(self, tensors: Any, opts: Any = None) -> Work:
        """``dist.all_reduce``: reduce each tensor across ranks, in place.

        A small blocking all-reduce of one CPU tensor takes a short path (no executor hand-off)
        when the group has nothing queued."""
        if opts is None:
            opts = dist.AllreduceOptions()
        if not opts.asyncOp and type(tensors) is list and len(tensors) == 1:
            done = self._small_allreduce(tensors[0], opts.reduceOp)
            if done is not None:
                return done
        tensors = self._tensors(tensors, "allreduce", "tensors")
        plans = [reduction(opts.reduceOp, t.dtype, "allreduce") for t in tensors]

        def body(transport: Any) -> None:
            for tensor, plan in zip(tensors, plans):
                self._reduce(transport, tensor, plan, None)
        return self._issue("allreduce", tensors, tensors, body, opts)

    def _small_allreduce(self, tensor: Any, reduce_op: Any) -> Optional[Any]:
        """A blocking all-reduce of one small dense CPU tensor by a reduction HCCL runs as it is,
        on the short path (:mod:`._small`), when the group has nothing else running or queued;
        None when it does not qualify (the general path then runs it, with the same result)."""
        # (is_cpu, not device.type: reading .device makes a torch.device, about a microsecond)
        if not (isinstance(tensor, torch.Tensor) and tensor.is_cpu and tensor.layout == torch.strided
                and tensor.is_contiguous() and 0 < tensor.nbytes <= SMALL_LIMIT
                and not tensor.is_conj() and not tensor.is_neg()):
            return None
        plan = reduction(reduce_op, tensor.dtype, "allreduce")
        if not plan.as_is:
            return None
        self._check_open()
        self._refuse_capture("allreduce")
        if not self._executor.claim():
            return None
        try:
            self._small.run(tensor.data_ptr(), tensor.nbytes, tensor.numel(), plan.dtype, plan.op)
        except Exception as exc:  # the operation's failure, raised by wait() as on the general path
            failed = Work(f"allreduce on process group {self._label!r}", [tensor], self._timeout)
            failed.finish(exc)
            return failed
        finally:
            self._executor.release()
        return Done([tensor])

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Work:
        """``dist.all_reduce_coalesced``: :meth:`allreduce` of several tensors, as one operation."""
        return self.allreduce(tensors, opts or dist.AllreduceCoalescedOptions())

    def reduce(self, tensors: Any, opts: Any = None) -> Work:
        """``dist.reduce``: reduce each tensor across ranks into the root's (``opts.rootRank``)."""
        opts = opts or dist.ReduceOptions()
        tensors = self._tensors(tensors, "reduce", "tensors")
        root = self._root(opts.rootRank, "reduce")
        plans = [reduction(opts.reduceOp, t.dtype, "reduce") for t in tensors]

        def body(transport: Any) -> None:
            for tensor, plan in zip(tensors, plans):
                self._reduce(transport, tensor, plan, root)
        return self._issue("reduce", tensors, tensors, body, opts)

    def _reduce_scatter_body(self, sources: List[torch.Tensor], output: torch.Tensor, op: Any,
                             operation: str) -> Body:
        """Reduce the concatenation of ``sources`` (one block per rank, maybe uneven) into ``output``."""
        plan = reduction(op, output.dtype, operation)
        self._alike(sources + [output], operation)
        counts = [s.numel() for s in sources]
        if len(counts) != self.size() or counts[self.rank()] != output.numel():
            raise ValueError(f"{operation}: the input must hold {self.size()} blocks with this rank's block "
                             f"({output.numel()} elements) the size of the output; got blocks of {counts}")
        comm = self._comm
        counts = [count * plan.unit for count in counts]
        if len(set(counts)) == 1:
            def launch(s: Any, r: Any, st: Any) -> Any:
                return collectives.reduce_scatter(comm, s, r, plan.op, stream=st)
        else:
            def launch(s: Any, r: Any, st: Any) -> Any:
                return collectives.reduce_scatter_v(comm, s, r, counts, None, plan.op, stream=st)

        def body(transport: Any) -> None:
            inputs = [self._reduction_input(s, plan) for s in sources]
            result = output if plan.widen is None else torch.empty_like(output, dtype=plan.widen)
            transport.whole(inputs, sum(counts), [result], output.numel() * plan.unit, plan.dtype, launch)
            self._reduction_output(output, result, plan)
        return body

    def reduce_scatter(self, outputs: Any, input_lists: Any, opts: Any = None) -> Work:
        """``dist.reduce_scatter``: rank ``r``'s output receives the reduction of every rank's ``input_list[r]``."""
        opts = opts or dist.ReduceScatterOptions()
        outputs = self._tensors(outputs, "reduce_scatter", "output")
        bodies = [self._reduce_scatter_body(self._tensors(inputs, "reduce_scatter", "input_list"), out,
                                            opts.reduceOp, "reduce_scatter")
                  for out, inputs in zip(outputs, input_lists)]
        every = outputs + [t for inputs in input_lists for t in inputs]
        return self._issue("reduce_scatter", every, outputs, _all(bodies), opts)

    def _split(self, tensor: torch.Tensor, operation: str) -> List[torch.Tensor]:
        """``tensor`` as ``size`` equal blocks of its elements in memory order: blocks of rows when
        the rows divide evenly (they keep the tensor's memory format), else of its flat elements."""
        if tensor.numel() % self.size():
            raise ValueError(f"{operation}: the larger tensor must hold {self.size()} equal blocks; it has "
                             f"{tensor.numel()} elements")
        if tensor.numel() and tensor.shape[0] % self.size() == 0:
            return list(tensor.chunk(self.size()))
        if not tensor.is_contiguous():
            raise ValueError(f"{operation}: a {_format_name(tensor)} tensor is cut into blocks of rows, so its first "
                             f"dimension ({tensor.shape[0]}) must be a multiple of {self.size()}; pass "
                             "tensor.contiguous() to cut its elements in order")
        flat = in_memory_order(tensor)
        return list(flat.chunk(self.size())) if tensor.numel() else [flat] * self.size()

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        """``dist.reduce_scatter_tensor``: ``output`` receives this rank's block of the reduction of every rank's ``input``."""
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Work:
        """:meth:`reduce_scatter_single` of several tensor pairs, as one operation."""
        opts = opts or dist.ReduceScatterOptions()
        operation = "reduce_scatter_tensor"
        outputs = self._tensors(outputs, operation, "output")
        inputs = self._tensors(inputs, operation, "input")
        bodies = [self._reduce_scatter_body(self._split(inp, operation), out, opts.reduceOp, operation)
                  for out, inp in zip(outputs, inputs)]
        return self._issue(operation, outputs + inputs, outputs, _all(bodies), opts)

    # ------------------------------------------------------------------------- data movement

    def broadcast(self, tensors: Any, opts: Any = None) -> Work:
        """``dist.broadcast``: copy the root's tensors (``opts.rootRank``) into every other rank's."""
        opts = opts or dist.BroadcastOptions()
        tensors = self._tensors(tensors, "broadcast", "tensors")
        root = self._root(opts.rootRank, "broadcast")
        is_root = root == self.rank()
        comm = self._comm

        def body(transport: Any) -> None:
            for tensor in tensors:
                dtype, unit = movement(tensor.dtype)
                transport.elementwise(tensor if is_root else None, None if is_root else tensor, dtype,
                                      tensor.numel() * unit,
                                      lambda s, r, st: collectives.broadcast(comm, s, root, stream=st))
        return self._issue("broadcast", tensors, tensors, body, opts)

    def _gather_body(self, source: torch.Tensor, outputs: List[torch.Tensor], operation: str) -> Body:
        """Every rank's ``source`` into ``outputs`` (one per rank, maybe uneven: all-gather-v)."""
        self._alike(outputs + [source], operation)
        dtype, unit = movement(source.dtype)
        counts = [o.numel() * unit for o in outputs]
        if len(counts) != self.size() or counts[self.rank()] != source.numel() * unit:
            raise ValueError(f"{operation}: the output must hold {self.size()} blocks with this rank's block "
                             f"the size of the input ({source.numel()} elements); got blocks of "
                             f"{[o.numel() for o in outputs]}")
        comm = self._comm
        if len(set(counts)) == 1:
            def launch(s: Any, r: Any, st: Any) -> Any:
                return collectives.all_gather(comm, s, r, stream=st)
        else:
            def launch(s: Any, r: Any, st: Any) -> Any:
                return collectives.all_gather_v(comm, s, r, counts, stream=st)
        return lambda transport: transport.whole([source], counts[self.rank()], outputs, sum(counts), dtype, launch)

    def allgather(self, output_lists: Any, inputs: Any, opts: Any = None) -> Work:
        """``dist.all_gather``: ``output_lists[i][r]`` receives rank ``r``'s ``inputs[i]`` (one
        list of outputs per input tensor: ``[tensor][rank]``)."""
        operation = "all_gather"
        inputs = self._tensors(inputs, operation, "input")
        outputs = [self._tensors(outs, operation, "output list") for outs in self._lists(output_lists, operation)]
        if len(outputs) != len(inputs):
            raise ValueError(f"{operation}: one output list per input tensor, got {len(outputs)} output lists for "
                             f"{len(inputs)} inputs")
        return self._gather_lists(operation, inputs, outputs, opts)

    def allgather_coalesced(self, output_lists: Any, inputs: Any, opts: Any = None) -> Work:
        """``dist.all_gather_coalesced``: ``output_lists[r][i]`` receives rank ``r``'s
        ``inputs[i]`` (one list per rank: ``[rank][tensor]``, the transpose of ``allgather``)."""
        operation = "all_gather_coalesced"
        inputs = self._tensors(inputs, operation, "input_tensor_list")
        per_rank = [self._tensors(outs, operation, "output_tensor_lists") for outs in
                    self._lists(output_lists, operation)]
        if len(per_rank) != self.size() or any(len(outs) != len(inputs) for outs in per_rank):
            raise ValueError(f"{operation}: output_tensor_lists must hold {self.size()} lists (one per rank) of "
                             f"{len(inputs)} tensors (one per input), got lists of {[len(o) for o in per_rank]}")
        by_input = [[per_rank[r][i] for r in range(self.size())] for i in range(len(inputs))]
        return self._gather_lists(operation, inputs, by_input, opts)

    @staticmethod
    def _lists(output_lists: Any, operation: str) -> List[Any]:
        if not isinstance(output_lists, (list, tuple)):
            raise TypeError(f"{operation}: the outputs must be a list of lists of tensors, got "
                            f"{type(output_lists).__name__}")
        return list(output_lists)

    def _gather_lists(self, operation: str, inputs: List[torch.Tensor], outputs: List[List[torch.Tensor]],
                      opts: Any) -> Work:
        """Gather every rank's ``inputs[i]`` into ``outputs[i]`` (one tensor per rank)."""
        bodies = [self._gather_body(inp, outs, operation) for inp, outs in zip(inputs, outputs)]
        written = [t for outs in outputs for t in outs]
        return self._issue(operation, inputs + written, written, _all(bodies), opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        """``dist.all_gather_into_tensor``: ``output`` receives every rank's ``input``, in rank order."""
        return self.all_gather_single_coalesced([output], [input], opts)

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Work:
        """:meth:`all_gather_single` of several tensor pairs, as one operation."""
        operation = "all_gather_into_tensor"
        outputs = self._tensors(outputs, operation, "output")
        inputs = self._tensors(inputs, operation, "input")
        bodies = [self._gather_body(inp, self._split(out, operation), operation) for out, inp in zip(outputs, inputs)]
        return self._issue(operation, outputs + inputs, outputs, _all(bodies), opts)

    def all_gather_uneven(self, output: torch.Tensor, input: torch.Tensor, split_sizes: Sequence[int],
                          async_op: bool) -> Work:
        """``output`` = every rank's ``input`` along the first dimension, rank ``r`` giving
        ``split_sizes[r]`` rows (see :func:`hcclpy.torch.all_gather_into_tensor_uneven`)."""
        operation = "all_gather_into_tensor_uneven"
        output, input = self._tensors([output, input], operation, "tensors")
        blocks = self._rows(output, split_sizes, operation)
        return self._issue(operation, [output, input], [output], self._gather_body(input, blocks, operation),
                           _Async(async_op))

    def reduce_scatter_uneven(self, output: torch.Tensor, input: torch.Tensor, split_sizes: Sequence[int],
                              op: Any, async_op: bool) -> Work:
        """``output`` = the reduction of block ``rank`` of every rank's ``input``, rank ``r``'s block
        being ``split_sizes[r]`` rows (see :func:`hcclpy.torch.reduce_scatter_tensor_uneven`)."""
        operation = "reduce_scatter_tensor_uneven"
        output, input = self._tensors([output, input], operation, "tensors")
        body = self._reduce_scatter_body(self._rows(input, split_sizes, operation), output, op, operation)
        return self._issue(operation, [output, input], [output], body, _Async(async_op))

    def _rows(self, tensor: torch.Tensor, split_sizes: Optional[Sequence[int]], operation: str) -> List[torch.Tensor]:
        """``tensor`` cut along its first dimension into one block per rank."""
        if split_sizes is None or len(split_sizes) == 0:
            return self._split(tensor, operation)
        sizes = [int(s) for s in split_sizes]
        if len(sizes) != self.size() or any(s < 0 for s in sizes) or tensor.dim() == 0 \
                or sum(sizes) != tensor.shape[0]:
            raise ValueError(f"{operation}: split sizes {list(split_sizes)} must be {self.size()} non-negative row "
                             f"counts adding up to the first dimension of a tensor of shape {tuple(tensor.shape)}")
        return list(tensor.split(sizes))

    def alltoall(self, outputs: Any, inputs: Any, opts: Any = None) -> Work:
        """``dist.all_to_all``: ``outputs[j]`` receives rank ``j``'s ``inputs[rank]``."""
        operation = "all_to_all"
        outputs = self._tensors(outputs, operation, "output_tensor_list")
        inputs = self._tensors(inputs, operation, "input_tensor_list")
        if len(outputs) != self.size() or len(inputs) != self.size():
            raise ValueError(f"{operation}: both tensor lists must have {self.size()} tensors (one per rank), got "
                             f"{len(outputs)} outputs and {len(inputs)} inputs")
        body = self._all_to_all_body(inputs, outputs, operation)
        return self._issue(operation, outputs + inputs, outputs, body, opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],
                          input_split_sizes: Sequence[int], opts: Any = None) -> Work:
        """``dist.all_to_all_single``: blocks of ``input`` along the first dimension go to each rank
        (``input_split_sizes`` rows each; empty: equal blocks), ``output`` receives theirs
        (``output_split_sizes``)."""
        operation = "all_to_all_single"
        output, input = self._tensors([output, input], operation, "tensors")
        body = self._all_to_all_body(self._rows(input, input_split_sizes, operation),
                                     self._rows(output, output_split_sizes, operation), operation)
        return self._issue(operation, [output, input], [output], body, opts)

    alltoall_base = all_to_all_single
    """torch's other name of :meth:`all_to_all_single`."""

    def _all_to_all_body(self, sources: List[torch.Tensor], targets: List[torch.Tensor], operation: str) -> Body:
        self._alike(sources + targets, operation)
        dtype, unit = movement(sources[0].dtype)
        send = [t.numel() * unit for t in sources]
        recv = [t.numel() * unit for t in targets]
        comm = self._comm
        if len(set(send)) == 1 and send == recv:
            def launch(s: Any, r: Any, st: Any) -> Any:
                return collectives.all_to_all(comm, s, r, stream=st)
        else:
            def launch(s: Any, r: Any, st: Any) -> Any:
                return collectives.all_to_all_v(comm, s, r, send, recv, stream=st)
        return lambda transport: transport.whole(sources, sum(send), targets, sum(recv), dtype, launch)

    def scatter(self, outputs: Any, input_lists: Any, opts: Any = None) -> Work:
        """``dist.scatter``: rank ``r``'s output receives the root's ``input_list[r]`` (``opts.rootRank``)."""
        opts = opts or dist.ScatterOptions()
        operation = "scatter"
        outputs = self._tensors(outputs, operation, "output")
        root = self._root(opts.rootRank, operation)
        is_root = root == self.rank()
        output = outputs[0]
        dtype, unit = movement(output.dtype)
        count = output.numel() * unit
        sources: Optional[List[torch.Tensor]] = None
        if is_root:
            # Only the root sees the list: it takes it in the output's format rather than refuse
            # it, which would leave the other ranks waiting in the collective.
            sources = [_in_format_of(s, output)
                       for s in self._tensors(input_lists[0] if input_lists else [], operation, "scatter_list")]
            self._alike(sources + [output], operation, one_format=False)
            if len(sources) != self.size() or any(s.numel() != output.numel() for s in sources):
                raise ValueError(f"{operation}: scatter_list must hold {self.size()} tensors of {output.numel()} "
                                 f"elements (the output's size), got sizes {[s.numel() for s in sources]}")
        comm = self._comm

        def body(transport: Any) -> None:
            transport.whole(sources, count * self.size(), [output], count, dtype,
                            lambda s, r, st: collectives.scatter(comm, s, r, root, stream=st))
        return self._issue(operation, outputs + (sources or []), outputs, body, opts)

    def gather(self, output_lists: Any, inputs: Any, opts: Any = None) -> Work:
        """``dist.gather``: the root's ``output_list[r]`` receives rank ``r``'s input (``opts.rootRank``)."""
        opts = opts or dist.GatherOptions()
        operation = "gather"
        source = self._tensors(inputs, operation, "input")[0]
        root = self._root(opts.rootRank, operation)
        dtype, unit = movement(source.dtype)
        count = source.numel() * unit
        if root == self.rank():
            targets = self._tensors(output_lists[0] if output_lists else [], operation, "gather_list")
            self._alike(targets + [source], operation, one_format=False)
            if len(targets) != self.size() or any(t.numel() != source.numel() for t in targets):
                raise ValueError(f"{operation}: gather_list must hold {self.size()} tensors of {source.numel()} "
                                 f"elements (the input's size), got sizes {[t.numel() for t in targets]}")
            # As for scatter, the root receives in the input's format, through a copy where needed.
            landing = [t if peer == root else _in_format_of(t, source) for peer, t in enumerate(targets)]
            items = [("recv", t, dtype, count, peer) for peer, t in enumerate(landing) if peer != root]

            def body(transport: Any) -> None:
                targets[root].copy_(source)
                transport.batch(items)
                for target, landed in zip(targets, landing):
                    if landed is not target:
                        target.copy_(landed)
            return self._issue(operation, targets + [source], targets, body, opts)
        return self._issue(operation, [source], [], lambda transport: transport.batch(
            [("send", source, dtype, count, root)]), opts)

    def barrier(self, opts: Any = None) -> Work:
        """``dist.barrier``: a Work that completes once every rank has reached the barrier."""
        return self._issue("barrier", [], [], lambda transport: transport.barrier(), opts)

    # ---------------------------------------------------------------------------- point to point

    def _channel(self, source: int, target: int, tag: int) -> Channel:
        with self._channels_lock:
            self._check_open()
            channel = self._channels.get((source, target, tag))
            if channel is None:
                channel = self._channels[(source, target, tag)] = Channel(
                    self._store, self._keys, source, target, tag, self.rank(), self._device,
                    p2p_config(self._config, self._timeout), self._label, self._timeout)
            return channel

    def _peer(self, peer: int, operation: str) -> int:
        if not 0 <= peer < self.size() or peer == self.rank():
            raise ValueError(f"{operation}: peer {peer} must be another rank of this group (0..{self.size() - 1}, "
                             f"not {self.rank()})")
        return peer

    def _transfer(self, operation: str, tensors: Any, peer: int, sending: bool, tag: int) -> Work:
        self._check_open()
        if isinstance(tag, bool) or not isinstance(tag, int):
            raise TypeError(f"{operation}: tag must be an int, got {type(tag).__name__}")
        tensor = self._tensors(tensors, operation, "tensor")[0]
        peer = self._peer(peer, operation)
        where = _device_type(tensor)
        if where not in ("cpu", "npu"):
            raise ValueError(f"{operation}: the hcclpy backend takes CPU or NPU tensors, got one on {where}")
        dtype, unit = movement(tensor.dtype)
        item = ("send" if sending else "recv", tensor, dtype, tensor.numel() * unit)
        channel = self._channel(self.rank(), peer, tag) if sending else self._channel(peer, self.rank(), tag)
        work = Work(f"{operation} with rank {peer} on process group {self._label!r}", [tensor], self._timeout)
        if where == "cpu":
            def body(comm: Communicator) -> None:
                HostTransport(comm).batch([(*item, 1 - comm.rank)])
        else:
            try:
                ready = DeviceTransport(self._comm, npu_stream(self._comm)).record()  # the tensor's data is there
            except HcclpyError as exc:
                raise backend_error(exc) from exc

            def body(comm: Communicator) -> None:
                stream = channel.stream()
                stream.wait_event(ready)
                DeviceTransport(comm, stream).batch([(*item, 1 - comm.rank)])
                stream.synchronize()
        return channel.submit(body, work)

    def send(self, tensors: Any, dst: int, tag: int = 0) -> Work:
        """``dist.send``: send the tensor to rank ``dst`` (tags tell transfers between the same ranks apart)."""
        return self._transfer("send", tensors, dst, True, tag)

    def recv(self, tensors: Any, src: int, tag: int = 0) -> Work:
        """``dist.recv`` from rank ``src``: receive into the tensor."""
        return self._transfer("recv", tensors, src, False, tag)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Work:
        """``dist.recv`` without ``src``: refused (HCCL receives from a named peer).

        Raises
        ------
        ValueError
            Always.
        """
        raise ValueError("recv without a source rank is not supported by the hcclpy backend: HCCL receives from "
                         "a named peer; pass src")


class _Async:
    """Options of the functions hcclpy.torch adds (torch passes its own options objects)."""

    def __init__(self, async_op: bool) -> None:
        self.asyncOp = async_op


def _all(bodies: List[Body]) -> Body:
    def body(transport: Any) -> None:
        for each in bodies:
            each(transport)
    return body


def create(options: Any, pg_options: Any) -> ProcessGroupHcclpy:
    """The backend's creator, called by torch for every group with this process in it."""
    global _world_group
    ranks = list(options.global_ranks_in_group)
    try:
        group = ProcessGroupHcclpy(options.store, options.group_rank, options.group_size, options.timeout,
                                   group_name=str(options.group_id), global_ranks=ranks, pg_options=pg_options)
    except HcclpyError as exc:  # the communicator could not be formed (timeout, library): a backend failure
        raise backend_error(exc) from exc
    if not ranks:  # the default group
        _world_group = group
    return group
