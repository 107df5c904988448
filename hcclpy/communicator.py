"""Communicators: creating, splitting and destroying them, and their operations as methods."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import warnings
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _ffi, collectives, trace
from .collectives import _staging
from ._comm_core import CommCore
from .config import CommConfig, ConfigLike
from .errors import CommTimeoutError, HcclError, HcclResult, UnsupportedError, communicator_error
from .rootinfo import ROOT_INFO_BYTES, RootInfo
from .runtime import Device, device_count, empty
from .runtime._device import DeviceLike, check_visible, visible_devices
from .runtime._lifetime import CLOSES
from .runtime._waits import seconds
from .types import DataType

__all__ = ["Communicator"]

_UINT32_MAX = 0xFFFFFFFF
_NON_MEMBER = 0xFFFFFFFF  # the sub-communicator id of ranks outside a split
# Sub-communicator ids: the user's sub_id values are below _NON_MEMBER (they fit a uint32_t, as
# torch_npu's do); a collective split takes _AUTO_SUB_ID + k for the parent's k-th collective split
# (the same k on every parent rank, since they all split in the same order), so the two never meet.
_AUTO_SUB_ID = 1 << 32
_ABORT_GRACE = 5.0  # seconds aborted operations get to be released before destroy() reports them
log = logging.getLogger("hcclpy")
_NAME_BYTES = 128


# HcclConfigGetInfo's items, by the name config_info() takes: the HcclConfigType, what `info` is
# ("text", or the C type of a pointer to it) and infoLen (for a string, the least HCCL takes:
# HCCL_COMM_ALGO_MAX_LENGTH, UDI_MAX_LENGTH).
_CONFIG_ITEMS: Dict[str, Tuple[int, str, int]] = {
    "op_expansion_mode": (0, "HcclOpExpansionMode *", 4), "algorithm": (1, "text", 1600),
    "ub_multi_channel_num": (2, "uint32_t *", 4), "deterministic": (3, "uint32_t *", 4), "udi": (4, "text", 128),
}
# HcclOpExpansionMode (what HcclConfigGetInfo answers; not the numbering of the config's field).
_EXPANSION_MODES = {-1: "invalid", 0: "ai_cpu", 1: "aiv", 2: "host", 3: "host_ts", 4: "ccu_ms", 5: "ccu_sched",
                    6: "aiv_only"}
_HETEROG_MODES = {-1: "invalid", 0: "homogeneous", 1: "mix_a2_a3"}


def _root_infos(value: Sequence[Any], nranks: int) -> List[bytes]:
    """The root infos of a scalable bootstrap, one per root, as bytes (checked before any C call)."""
    roots = []
    for index, info in enumerate(value):
        if isinstance(info, RootInfo):
            roots.append(info.to_bytes())
            continue
        try:
            roots.append(RootInfo(info).to_bytes())
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"root_info[{index}]: {exc}") from None
    if not roots or len(roots) > nranks:
        raise ValueError(f"root_info lists {len(roots)} root infos; a communicator of {nranks} rank"
                         f"{'s' * (nranks != 1)} takes 1 to {nranks} (one per root)")
    for index, data in enumerate(roots):
        if data in roots[:index]:
            raise ValueError(f"root_info[{roots.index(data)}] and root_info[{index}] are the same root info: each "
                             "root makes its own (RootInfo.generate(scalable=True)) and every rank lists them in "
                             "the same order")
    return roots


def _named(config: Optional[CommConfig], name: str) -> Optional[CommConfig]:
    """``config`` naming the communicator ``name``, unless it names it already (the user's name
    wins); a name too long for HCCL is left to the library."""
    if (config is not None and config.name) or len(name.encode()) >= _NAME_BYTES:
        return config
    named = dataclasses.replace(config) if config is not None else CommConfig()
    named.name = name
    return named


def _create_sub(handle: Any, members: Sequence[int], sub_id: int, rank: int,
                config: Optional[CommConfig]) -> Tuple[int, Any]:
    """``HcclCreateSubCommConfig``: the ranks ``members`` of communicator ``handle`` (none: this rank
    is not one of them) as sub-communicator ``sub_id``, where this rank is ``rank``. Returns the
    return code and the cell the new handle was written to."""
    out = _ffi.new("HcclComm *")
    ranks = _ffi.new("uint32_t[]", list(members)) if members else _ffi.NULL
    rc = _ffi.api().HcclCreateSubCommConfig(_ffi.new("HcclComm *", handle), len(members), ranks, sub_id, rank,
                                            (config or CommConfig()).to_c(), out)
    return rc, out


def _warn_not_destroyed(name: str) -> None:
    # Destroying a communicator is collective: the collector must never do it behind the other ranks.
    warnings.warn(f"communicator '{name}' was garbage collected without destroy(); its resources stay until the "
                  "process exits", ResourceWarning, stacklevel=2)


def _positive_int(value: Any, argument: str, low: int = 1, high: int = _UINT32_MAX) -> int:
    """``value`` as an int in ``[low, high]`` (NumPy ints too; HCCL takes it as a uint32_t)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{argument}={value!r} must be an int >= {low}")
    if value > high:
        raise ValueError(f"{argument}={value!r} must be an int in [{low}, {high}]")
    return int(value)


def _deadline(timeout: Any) -> Optional[float]:
    """The ``time.monotonic()`` by which ``timeout`` seconds have passed; None for no limit."""
    limit = seconds(timeout)
    return None if limit is None else time.monotonic() + limit


def _remaining(deadline: Optional[float]) -> Optional[float]:
    """Seconds left until ``deadline`` (at least 1 ms, a wait's shortest), or None for no limit."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.001)


def _per_operation(items: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Per operation type of ``items`` (flight-recorder records): ``count``, ``bytes`` and
    ``average_latency_us`` (None when none was seen complete)."""
    operations: Dict[str, Dict[str, Any]] = {}
    for item in items:
        stats = operations.setdefault(item["op"], {"count": 0, "bytes": 0, "_latency": 0, "_timed": 0})
        stats["count"] += 1
        stats["bytes"] += item["count"] * (DataType[item["dtype"].upper()].itemsize if item["dtype"] else 0)
        if item["completed_by_ns"] is not None:
            stats["_latency"] += item["completed_by_ns"] - item["queued_ns"]
            stats["_timed"] += 1
    for stats in operations.values():
        timed, latency = stats.pop("_timed"), stats.pop("_latency")
        stats["average_latency_us"] = latency / timed / 1e3 if timed else None
    return operations


def _device_for(device: Any) -> Device:
    if device is not None:
        dev = Device(device)
        check_visible(dev.id)
        return dev
    return Device.current() or Device(0)


def _rank_table_path(path: Any, argument: str) -> str:
    """``path`` (str, bytes or os.PathLike) as text, checked to name an existing rank-table file
    (HCCL would cut a path at a NUL byte, or report a missing file only as a failed init).

    Raises TypeError for another type, ValueError for an empty path, one with a NUL byte or of
    4096 bytes or more, FileNotFoundError / IsADirectoryError when it names no file."""
    if not isinstance(path, (str, bytes)) and not hasattr(path, "__fspath__"):
        raise TypeError(f"{argument} must be a path to the rank table (str or os.PathLike), got "
                        f"{type(path).__name__}")
    text = os.fsdecode(os.fspath(path))
    if not text or "\0" in text or len(os.fsencode(text)) >= 4096:
        raise ValueError(f"{argument}={text!r} must be a non-empty path of fewer than 4096 bytes with no NUL byte")
    if os.path.isdir(text):
        raise IsADirectoryError(f"{argument}={text!r} is a directory; name the rank-table file")
    if not os.path.isfile(text):
        raise FileNotFoundError(f"{argument}={text!r}: no such rank-table file")
    return text


class Communicator(CommCore):
    """An HCCL communicator: ``size`` ranks, one per device, that run collectives together.

    Every rank creates its communicator with the same ``nranks`` and :class:`RootInfo` (made once,
    on one rank, and shipped to the others) and its own ``rank``::

        info = hcclpy.RootInfo.generate(device=0)              # rank 0, then send to the others
        comm = hcclpy.Communicator(4, info, rank, device=rank)
        comm.all_reduce(x, y, stream=s)
        s.synchronize()
        comm.destroy()

    Large jobs can bootstrap from several roots (``HcclCommInitRootInfoScalable``, CANN 9.x): each
    root makes ``RootInfo.generate(scalable=True)``, and every rank passes the list of all roots'
    infos, in the same order, as ``root_info``::

        comm = hcclpy.Communicator(4096, [info_0, info_1, info_2, info_3], rank, device=local_rank)

    ``destroy()`` (or a ``with`` block) must be called on every rank: the garbage collector never
    destroys a communicator, it only warns. Operations are the methods below; each takes buffers
    first, then ``op``/``root``/``peer``, then the keyword-only ``stream`` (default: the device's
    hcclpy stream), and returns once the work is queued.

    Parameters
    ----------
    nranks
        Number of ranks.
    root_info
        The :class:`RootInfo` (or its bytes) from rank 0; or a list of the root infos of the
        scalable bootstrap, one per root (1 to ``nranks`` of them), the same list on every rank.
    rank
        This rank, in ``[0, nranks)``.
    config
        A :class:`CommConfig` or a dict of its fields.
    device
        Device of this rank; default: the calling thread's current device, else 0.

    Raises
    ------
    TypeError, ValueError
        For a bad ``nranks``, ``rank`` or root info (a list that repeats one, or has more root
        infos than ranks), before any C call.
    UnsupportedError
        For a list of root infos when the loaded HCCL has no ``HcclCommInitRootInfoScalable``.
    HcclError
        If initialisation fails (an ``HcclTimeoutError`` after ``HCCL_CONNECT_TIMEOUT`` if ranks are
        missing).
    """

    __slots__ = ("_finalizer", "_splits", "_is_sub", "_config", "_destroying")

    def __init__(self, nranks: int, root_info: Union[RootInfo, bytes, List[Union[RootInfo, bytes]],
                                                     Tuple[Union[RootInfo, bytes], ...]],
                 rank: int, *, config: ConfigLike = None, device: Optional[DeviceLike] = None) -> None:
        nranks = _positive_int(nranks, "nranks")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < nranks:
            raise ValueError(f"rank={rank!r} must be an int in [0, {nranks})")
        roots, one = None, None  # the scalable bootstrap's root infos, or the C root info
        if isinstance(root_info, (list, tuple)):
            roots = _root_infos(root_info, nranks)
        else:
            one = (root_info if isinstance(root_info, RootInfo) else RootInfo.from_bytes(root_info))._cdata()
        cfg = CommConfig.coerce(config)
        dev = _device_for(device)
        bound = _ffi.api()
        if roots is not None and not bound.present["HcclCommInitRootInfoScalable"]:
            raise UnsupportedError("a list of root infos needs HcclCommInitRootInfoScalable (CANN 9.x), which this "
                                   "CANN does not provide: pass one RootInfo")
        out = _ffi.new("HcclComm *")
        with dev:
            if roots is not None:
                listed = _ffi.new("HcclRootInfo[]", len(roots))
                _ffi.buffer(listed)[:] = b"".join(roots)
                # The function takes no NULL config: the default one, as HcclCommConfigInit makes it.
                rc = bound.HcclCommInitRootInfoScalable(nranks, len(roots), listed, int(rank), 0,
                                                        (cfg or CommConfig()).to_c(), out)
                name = "HcclCommInitRootInfoScalable"
            elif cfg is not None:
                rc = bound.HcclCommInitRootInfoConfig(nranks, one, int(rank), cfg.to_c(), out)
                name = "HcclCommInitRootInfoConfig"
            else:
                rc, name = bound.HcclCommInitRootInfo(nranks, one, int(rank), out), "HcclCommInitRootInfo"
        _ffi.check_hccl(rc, name, context=f"creating rank {rank} of {nranks} on {dev!r}")
        if collectives.group_active():
            # HCCL creates grouped communicators at HcclGroupEnd, all at once.
            self._bind(None, int(rank), nranks, dev, cfg.name if cfg is not None and cfg.name else "")
            self._closed_by = "not created yet: a communicator made inside hcclpy.group() exists once the group ends"

            def adopt(succeeded: bool) -> None:
                if succeeded:
                    self._adopt(out[0], dev, cfg, rank=int(rank), size=nranks)
                else:
                    self._closed_by = "never created: its hcclpy.group() failed"

            collectives.after_group(adopt)
            return
        self._adopt(out[0], dev, cfg, rank=int(rank), size=nranks)

    @classmethod
    def _from_handle(cls, handle: Any, device: Device, config: Optional[CommConfig], *, rank: Optional[int] = None,
                     size: Optional[int] = None, is_sub: bool = False) -> Communicator:
        self = object.__new__(cls)
        self._adopt(handle, device, config, rank=rank, size=size, is_sub=is_sub)
        return self

    def _adopt(self, handle: Any, device: Device, config: Optional[CommConfig], *, rank: Optional[int],
               size: Optional[int], is_sub: bool = False) -> None:
        bound = _ffi.api()
        if bound.present["HcclGetRankId"]:
            value = _ffi.new("uint32_t *")
            _ffi.check_hccl(bound.HcclGetRankId(handle, value), "HcclGetRankId")
            rank = int(value[0])
            _ffi.check_hccl(bound.HcclGetRankSize(handle, value), "HcclGetRankSize")
            size = int(value[0])
        name = config.name if config is not None and config.name else ""
        if bound.present["HcclGetCommName"]:
            text = _ffi.new("char[]", _NAME_BYTES)
            _ffi.check_hccl(bound.HcclGetCommName(handle, text), "HcclGetCommName")
            name = _ffi.string(text)
        if rank is None or size is None:
            raise HcclError("this HCCL cannot report rank and size of the communicator", code=HcclResult.HCCL_E_NOT_SUPPORT,
                            name="HCCL_E_NOT_SUPPORT", api="HcclGetRankId")
        self._bind(handle, rank, size, device, name)
        self._splits = 0
        self._is_sub = is_sub
        # Held by the thread destroying the communicator: a second destroyer waits for it (an
        # RLock, so that a signal handler interrupting destroy() on the same thread is told apart).
        self._destroying = threading.RLock()
        self._config = config
        self._finalizer = weakref.finalize(self, _warn_not_destroyed, name)
        self._finalizer.atexit = False
        log.info("communicator '%s' created: rank %d of %d on %r%s", name, rank, size, device,
                 " (sub-communicator)" if is_sub else "")

    # ----------------------------------------------------------------- other constructors

    @classmethod
    def from_rank_table(cls, path: Union[str, os.PathLike[str]], rank: int, *, config: ConfigLike = None,
                        device: Optional[DeviceLike] = None) -> Communicator:
        """Create a communicator from a rank-table JSON file (``HcclCommInitClusterInfo``).

        No root info is exchanged: the table lists every rank's server and device. ``device`` must be
        the device the table assigns to ``rank``.

        Raises
        ------
        TypeError, ValueError
            For a ``path`` that is not a path (or is empty, or holds a NUL byte), or a bad ``rank``.
        FileNotFoundError, IsADirectoryError
            When ``path`` names no file (before any C call).
        HcclError
            If HCCL cannot create the communicator from the table.
        """
        rank = _positive_int(rank, "rank", 0)
        text = _rank_table_path(path, "path")
        cfg = CommConfig.coerce(config)
        dev = _device_for(device)
        bound = _ffi.api()
        out = _ffi.new("HcclComm *")
        with dev:
            if cfg is not None:
                rc = bound.HcclCommInitClusterInfoConfig(os.fsencode(text), rank, cfg.to_c(), out)
                name = "HcclCommInitClusterInfoConfig"
            else:
                rc, name = bound.HcclCommInitClusterInfo(os.fsencode(text), rank, out), "HcclCommInitClusterInfo"
        _ffi.check_hccl(rc, name, context=f"rank {rank} from rank table {text}")
        return cls._from_handle(out[0], dev, cfg, rank=rank)

    @classmethod
    def init_all(cls, devices: Sequence[Any]) -> List[Communicator]:
        """One communicator per device, all in this process (``HcclCommInitAll``); rank ``i`` runs on
        ``devices[i]``. Drive them from one thread with :func:`hcclpy.group`, or one thread each."""
        if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
            raise TypeError(f"devices must be a sequence of devices (ids or hcclpy.Device), one per rank, got "
                            f"{devices!r} ({type(devices).__name__})")
        ids = [Device(d).id for d in devices]
        if not ids:
            raise ValueError("devices must list at least one device")
        if len(set(ids)) != len(ids):
            raise ValueError(f"devices={ids} lists a device twice")
        count = device_count()
        if max(ids) >= count:
            raise ValueError(f"devices={ids}: {visible_devices(count)}")
        bound = _ffi.api()
        comms = _ffi.new("HcclComm[]", len(ids))
        _ffi.check_hccl(bound.HcclCommInitAll(len(ids), _ffi.new("int32_t[]", ids), comms), "HcclCommInitAll")
        return [cls._from_handle(comms[i], Device(d), None, rank=i, size=len(ids)) for i, d in enumerate(ids)]

    def split(self, ranks: Sequence[int], *, config: ConfigLike = None,
              sub_id: Optional[int] = None) -> Optional[Communicator]:
        """Create a sub-communicator of the parent ranks ``ranks`` (sorted; position = sub-rank).

        Without ``sub_id`` the split is collective over the parent: every parent rank calls it, with
        the same ``ranks``, in the same order relative to other splits; members get the
        sub-communicator, the others None. With ``sub_id`` only the members call it; that needs
        ``HcclCreateSubCommConfig`` and a parent that is not itself a sub-communicator.

        ``sub_id`` is a number in ``[0, 2**32 - 2]`` that every member passes and no other split of
        this parent in progress uses (``2**32 - 1`` marks non-members in HCCL). Collective splits
        take their ids from ``2**32`` up, so they never meet a ``sub_id``.

        Raises
        ------
        ValueError
            Bad ``ranks``, or ``sub_id`` not an int in ``[0, 2**32 - 2]``, or this rank not in
            ``ranks`` when ``sub_id`` is given.
        UnsupportedError
            ``sub_id`` given where the library cannot split without the whole parent.

        Examples
        --------
        >>> evens = comm.split(range(0, comm.size, 2))
        >>> pair = comm.split([0, 1], sub_id=7)   # called by ranks 0 and 1 only
        """
        try:
            given = list(ranks)  # once: an iterator gives its ranks only once
        except TypeError:
            raise TypeError(f"ranks must be a sequence of ints, got {ranks!r}") from None
        if any(isinstance(r, bool) or not isinstance(r, (int, np.integer)) for r in given):
            raise ValueError(f"ranks must hold ints, got {given!r}")
        members = [int(r) for r in given]
        if not members or any(not 0 <= r < self._size for r in members) or members != sorted(set(members)):
            raise ValueError(f"ranks={given!r} must be distinct, increasing ranks of the parent "
                             f"(0..{self._size - 1})")
        self._live_handle()
        if self._aborted:  # HCCL would split the suspended communicator: the child could never run
            raise ValueError(f"communicator '{self._name}' was aborted: it cannot be split; destroy it (on every "
                             "rank) and create a new one")
        if sub_id is not None:
            return self._split_members_only(members, sub_id,
                                            _named(CommConfig.coerce(config), f"{self._name}.split(id={sub_id})"))
        # Named by its place among the parent's collective splits, which every rank counts alike.
        cfg = _named(CommConfig.coerce(config), f"{self._name}.split({self._splits})")
        handle = self._live_handle()
        self._splits += 1
        member = self._rank in members
        if _ffi.api().present["HcclCreateSubCommConfig"] and not self._is_sub:
            if member:
                rc, out = _create_sub(handle, members, _AUTO_SUB_ID + self._splits, members.index(self._rank), cfg)
            else:
                rc, out = _create_sub(handle, [], _NON_MEMBER, 0, cfg)
            # A parent the library cannot split (the simulator's across servers) says so on every rank:
            # they all take the way below together.
            if rc != HcclResult.HCCL_E_NOT_SUPPORT:
                _ffi.check_hccl(rc, "HcclCreateSubCommConfig", context=f"splitting '{self._name}' into {members}")
                if not member:
                    return None
                return Communicator._from_handle(out[0], self._device, cfg, is_sub=True)
        # Nested splits, libraries without HcclCreateSubCommConfig and parents it cannot split: the first
        # member makes a root info and the parent broadcasts it.
        payload = empty(ROOT_INFO_BYTES, "uint8", device=self._device)
        try:
            if self._rank == members[0]:
                payload.copy_from(np.frombuffer(RootInfo.generate(self._device).to_bytes(), dtype=np.uint8))
            stream = self._device.default_stream
            collectives.broadcast(self, payload, root=members[0], stream=stream)
            stream.synchronize()
            info = RootInfo(payload.to_numpy().tobytes())
        finally:
            payload.close()
        if not member:
            return None
        sub = Communicator(len(members), info, members.index(self._rank), config=cfg, device=self._device)
        sub._is_sub = True
        return sub

    def _split_members_only(self, members: List[int], sub_id: Any, cfg: Optional[CommConfig]) -> Communicator:
        if isinstance(sub_id, bool) or not isinstance(sub_id, (int, np.integer)) or not 0 <= sub_id < _NON_MEMBER:
            raise ValueError(f"sub_id={sub_id!r} must be an int in [0, {_NON_MEMBER - 1}] ({_NON_MEMBER} marks the "
                             "ranks outside a split; collective splits use ids from 2**32 up)")
        if self._rank not in members:
            raise ValueError(f"ranks={members!r} must include this rank ({self._rank}) when sub_id is given: "
                             "only members call a split by id")
        handle = self._live_handle()
        if not _ffi.api().present["HcclCreateSubCommConfig"] or self._is_sub:
            raise UnsupportedError(
                f"splitting '{self._name}' by sub_id needs HcclCreateSubCommConfig and a parent that is not a "
                f"sub-communicator ({'it is one' if self._is_sub else 'this CANN lacks the function'}); "
                "split without sub_id, collectively over the parent")
        rc, out = _create_sub(handle, members, int(sub_id), members.index(self._rank), cfg)
        if rc == HcclResult.HCCL_E_NOT_SUPPORT:
            raise UnsupportedError(f"splitting '{self._name}' by sub_id: {_ffi.hccl_failure(rc, 'HcclCreateSubCommConfig')}"
                                   "; split without sub_id, collectively over the parent")
        _ffi.check_hccl(rc, "HcclCreateSubCommConfig", context=f"splitting '{self._name}' into {members}")
        return Communicator._from_handle(out[0], self._device, cfg, is_sub=True)

    # ----------------------------------------------------------------------- lifecycle

    def async_error(self) -> Optional[HcclError]:
        """The error that broke the communicator (for example a dead peer), or None if it is healthy.

        The exception is returned, not raised; its message describes the communicator's error (the
        query itself succeeded). When another rank broke the communicator — it failed, or aborted it
        (``HCCL_E_REMOTE``, or a suspension this rank did not ask for) — it is a
        :class:`~hcclpy.RemoteRankError`, as this rank's operations then fail.
        """
        bound = _ffi.api()
        code = _ffi.new("HcclResult *")
        _ffi.check_hccl(bound.HcclGetCommAsyncError(self._live_handle(), code), "HcclGetCommAsyncError")
        if code[0] == 0:
            # Aborted with nothing in flight: no operation failed, but every later one will.
            return self._abort_error(bound) if self._aborted else None
        # A suspension this rank did not ask for was another rank's abort (older simulators and
        # libraries report it as such rather than as HCCL_E_REMOTE).
        remote = code[0] == HcclResult.HCCL_E_REMOTE or (code[0] == HcclResult.HCCL_E_SUSPENDING and not self._aborted)
        return communicator_error(int(code[0]), self._name, remote=remote, recent=_ffi._recent_message(bound),
                                  library_text=_ffi.hccl_text(int(code[0]), bound))

    def _abort_error(self, bound: Any) -> HcclError:
        code = int(HcclResult.HCCL_E_SUSPENDING)
        return communicator_error(code, self._name, remote=False, recent="aborted on this rank by abort()",
                                  library_text=_ffi.hccl_text(code, bound))

    def health(self) -> Dict[str, Any]:
        """What the flight recorder (:mod:`hcclpy.trace`) knows of this rank's operations on the
        communicator, over the operations the recorder still holds (this communicator's only, not
        those of an earlier one of the same name).

        Returns
        -------
        dict
            ``pending`` (operations queued and not yet seen complete, point-to-point calls
            included), ``last_completed`` and ``first_pending`` (collectives' sequence numbers, the
            same on every rank, or None), ``issued`` (the last collective's number, 0 for none),
            ``p2p_issued`` (the number of the last send, receive or batch of them, which are
            numbered apart; 0 for none), ``last_error`` (:meth:`async_error`) and ``operations``: per
            operation type, ``count``, ``bytes`` (each rank's buffer) and ``average_latency_us``
            (from queueing to when hcclpy saw it complete: an upper bound; None when none
            completed).

        Examples
        --------
        >>> comm.health()["pending"]
        0
        """
        items = trace.records(self)
        collectives = [r for r in items if r["seq"] is not None]
        done = [r["seq"] for r in collectives if r["state"] == "completed"]
        waiting = [r["seq"] for r in collectives if r["state"] != "completed"]
        return {"pending": sum(r["state"] != "completed" for r in items), "last_completed": max(done, default=None),
                "first_pending": min(waiting, default=None), "issued": max((r["seq"] for r in collectives), default=0),
                "p2p_issued": max((r["p2p_seq"] for r in items if r["p2p_seq"] is not None), default=0),
                "last_error": self.async_error(), "operations": _per_operation(items)}

    # ----------------------------------------------------------------------- queries

    def _handle_with(self, function: str, what: str) -> Any:
        """The live handle, and the C library that has ``function`` (else UnsupportedError)."""
        handle = self._live_handle()
        if not self._api.present[function]:
            raise UnsupportedError(f"{what} needs {function} (CANN 9.x), which this CANN does not provide")
        return handle

    def config_info(self, item: str) -> Union[str, int]:
        """One item of the configuration HCCL runs the communicator with (``HcclConfigGetInfo``).

        Parameters
        ----------
        item
            ``"op_expansion_mode"``: where HCCL expands operations, by name: ``"ai_cpu"``,
            ``"aiv"``, ``"host"``, ``"host_ts"``, ``"ccu_ms"``, ``"ccu_sched"``, ``"aiv_only"``
            or ``"invalid"`` (HCCL's ``HcclOpExpansionMode``, which numbers the modes unlike
            :attr:`CommConfig.op_expansion_mode`; ``"host"`` by default on the simulator, which
            expands every operation on the host).
            ``"algorithm"``: the algorithm selection string (:attr:`CommConfig.algorithm`, else
            ``HCCL_ALGO``; ``""`` without either). ``"ub_multi_channel_num"``: the number of UB
            channels a transfer uses (int). ``"deterministic"``: 0 off, 1 on, 2 strict ordering
            (:attr:`CommConfig.deterministic`, else ``HCCL_DETERMINISTIC``). ``"udi"``: the
            user-defined information of the config (:attr:`CommConfig.udi`; ``""`` without one).

        Returns
        -------
        str or int
            The item's value.

        Raises
        ------
        ValueError
            For an unknown ``item`` (before any C call), or a destroyed communicator.
        UnsupportedError
            When the loaded HCCL has no ``HcclConfigGetInfo``.
        HcclError
            When this HCCL does not answer the item (the first releases knew
            ``op_expansion_mode`` only).

        Examples
        --------
        >>> comm.config_info("op_expansion_mode")
        'host'
        >>> comm.config_info("deterministic")
        0
        """
        entry = _CONFIG_ITEMS.get(item) if isinstance(item, str) else None
        if entry is None:
            raise ValueError(f"item={item!r} must be one of {', '.join(map(repr, _CONFIG_ITEMS))}")
        handle = self._handle_with("HcclConfigGetInfo", "Communicator.config_info")
        code, kind, size = entry
        info = _ffi.new("char[]", size) if kind == "text" else _ffi.new(kind)
        _ffi.check_hccl(self._api.HcclConfigGetInfo(handle, code, size, info), "HcclConfigGetInfo",
                        context=f"{item} of '{self._name}'")
        if kind == "text":
            return _ffi.string(info)
        value = int(info[0])
        return _EXPANSION_MODES.get(value, f"unknown ({value})") if code == 0 else value

    def hccl_buffer(self) -> Tuple[int, int]:
        """The address and size in bytes of the communicator's HCCL buffer on this rank
        (``HcclGetHcclBuffer``): device memory of its device that HCCL owns.

        The first call makes the buffer (twice :attr:`CommConfig.buffer_size_mb`, else
        ``HCCL_BUFFSIZE``: 400 MB by default); later calls return the same one, until the
        communicator is destroyed, which frees it. Operations take it as a ``(ptr, count,
        dtype)`` buffer. HCCL lets a communicator have this buffer or registered user memory,
        not both. Never free it.

        Returns
        -------
        tuple of int
            ``(address, nbytes)``.

        Raises
        ------
        ValueError
            For a destroyed communicator.
        UnsupportedError
            When the loaded HCCL has no ``HcclGetHcclBuffer``.
        HcclError
            When HCCL cannot make the buffer (``HCCL_E_OOM`` if the device lacks the memory).

        Examples
        --------
        >>> address, nbytes = comm.hccl_buffer()
        >>> comm.all_reduce((address, 1024, "float32"), stream=s)   # in place, in HCCL's buffer
        """
        handle = self._handle_with("HcclGetHcclBuffer", "Communicator.hccl_buffer")
        address, size = _ffi.new("void **"), _ffi.new("uint64_t *")
        with self._device:  # HCCL makes the buffer on the calling thread's current device
            rc = self._api.HcclGetHcclBuffer(handle, address, size)
        _ffi.check_hccl(rc, "HcclGetHcclBuffer", context=f"the HCCL buffer of '{self._name}'")
        return _ffi.address(address[0]), int(size[0])

    @property
    def heterogeneous_mode(self) -> str:
        """How the chips of the communicator's ranks mix (``HcclGetHeterogMode``):
        ``"homogeneous"`` (one chip type on every rank; always on the simulator), ``"mix_a2_a3"``
        (Atlas A2 and A3 chips together) or ``"invalid"``.

        Raises
        ------
        ValueError
            For a destroyed communicator.
        UnsupportedError
            When the loaded HCCL has no ``HcclGetHeterogMode``.

        Examples
        --------
        >>> comm.heterogeneous_mode
        'homogeneous'
        """
        handle = self._handle_with("HcclGetHeterogMode", "Communicator.heterogeneous_mode")
        mode = _ffi.new("HcclHeterogMode *")
        _ffi.check_hccl(self._api.HcclGetHeterogMode(handle, mode), "HcclGetHeterogMode",
                        context=f"the heterogeneous mode of '{self._name}'")
        return _HETEROG_MODES.get(int(mode[0]), f"unknown ({int(mode[0])})")

    def abort(self) -> None:
        """Stop the communicator on this rank, from any thread (``HcclCommSuspend``).

        Operations in flight fail at once (``HCCL_E_SUSPENDING``), so a thread stuck waiting for a
        collective is released with an exception; later calls are refused; the other ranks' pending
        operations fail with a remote error naming this rank. :meth:`async_error` reports what
        failed. Call :meth:`destroy` afterwards to free the communicator: it gives the stopped
        operations a few seconds to be released. On a communicator already destroyed it does
        nothing: a watchdog that fires after a normal end has nothing to stop.

        Raises
        ------
        UnsupportedError
            When the loaded HCCL has no ``HcclCommSuspend``.

        Examples
        --------
        >>> threading.Timer(5.0, comm.abort).start()   # a watchdog for a stuck collective
        """
        handle = self._handle
        if handle is None:
            return
        bound = _ffi.api()
        if not bound.present["HcclCommSuspend"]:
            raise UnsupportedError("Communicator.abort needs HcclCommSuspend, which this CANN does not provide")
        # Marked first: the suspend releases the waits of other threads at once, and their next
        # call must already be refused as a call on an aborted communicator.
        self._aborted = True
        try:
            _ffi.check_hccl(bound.HcclCommSuspend(handle), "HcclCommSuspend", context=f"aborting '{self._name}'")
        except BaseException:
            self._aborted = False
            raise
        CLOSES[0] += 1  # persistent operations on it look again, and refuse to start
        log.warning("communicator '%s' aborted on rank %d", self._name, self._rank)

    def destroy(self, timeout: Optional[float] = None) -> None:
        """Destroy the communicator (call it on every rank). Idempotent: a second call, from any
        thread, returns once the communicator is destroyed (a second thread calling it meanwhile
        waits for the first).

        Work queued on hcclpy's default stream is waited for first; work on your own streams must be
        synchronised before, unless ``timeout`` is given or the communicator was aborted. After an
        abort (yours or the timeout's), destroy waits up to a few seconds for the stopped
        operations to be released.

        No other thread may be inside a call on the communicator meanwhile (as for
        ``HcclCommDestroy``, whose handle such a call would use after it is freed): end those
        calls first, or :meth:`abort` the communicator, the one call meant for another thread.

        Parameters
        ----------
        timeout
            Seconds to wait at most for this communicator's queued work, on the default stream and
            on your own streams. If some is still in flight then (a peer that never joins, say), the
            communicator is aborted first (:meth:`abort`: the work fails here at once, and on the
            other ranks with a remote error), then destroyed. None (the default) waits for the
            default stream as long as it takes (its operations end by their exec timeout, never
            when that is 0) and reports work on other streams at once.

        Raises
        ------
        HcclError
            ``HCCL_E_AGAIN`` if operations are still in flight on other streams (without
            ``timeout``), or were not released a few seconds after an abort.
        TypeError, ValueError
            If ``timeout`` is neither None nor a number of seconds >= 0.
        RuntimeError
            Inside :func:`hcclpy.group` on this thread: the group's operations run when it ends.

        Notes
        -----
        A NumPy call in progress on another thread counts as queued work: ``timeout`` bounds the
        wait for it too. A signal handler may call destroy while its thread is inside a NumPy
        call: that call gives its staging memory back when it ends.

        Examples
        --------
        >>> try:
        ...     stream.synchronize(timeout=60)
        ... except hcclpy.CommTimeoutError:
        ...     comm.destroy(timeout=0)     # stuck: abort, then destroy
        """
        if self._handle is None:
            return
        deadline = _deadline(timeout)
        if collectives.group_active():
            # The group's operations on it run when the group ends: on a destroyed handle then.
            raise RuntimeError(f"communicator '{self._name}' cannot be destroyed inside hcclpy.group(): the group's "
                               "operations run when it ends; destroy it after the with block")
        lock = self._destroying
        if lock._is_owned():  # a signal handler interrupted this thread's destroy(), which goes on after it
            return
        # Another thread's destroy() ends by its own timeout (and grace); this one waits as long.
        if not lock.acquire(timeout=-1 if deadline is None else _remaining(deadline) + _ABORT_GRACE):
            raise HcclError(f"destroying '{self._name}': another thread's destroy() of it did not end within "
                            f"{timeout:g} s (+{_ABORT_GRACE:g} s)", code=HcclResult.HCCL_E_AGAIN,
                            name="HCCL_E_AGAIN", api="HcclCommDestroy")
        try:
            handle = self._handle
            if handle is None:  # destroyed by the thread this one waited for
                return
            self._closing = True  # no NumPy call starts from now on (hcclpy.collectives._staging)
            try:
                self._release_staging(deadline)
                self._wait_stream(Device._default_streams.get(self._device_id), deadline)
                self._destroy_handle(handle, deadline)
            except BaseException:
                self._closing = False  # still alive: usable again
                raise
            log.info("communicator '%s' destroyed on rank %d", self._name, self._rank)
            self._handle = None
            self._closed_by = "destroyed"
            CLOSES[0] += 1  # persistent operations on it look again, and refuse to start
            self._finalizer.detach()
        finally:
            lock.release()
        # A NumPy call that began as destroy did may have made a new staging after the first release.
        _staging.release(self, timeout=0)

    def _release_staging(self, deadline: Optional[float]) -> None:
        """Give back the NumPy staging (hcclpy.collectives._staging) before the handle goes: wait for a NumPy call
        on another thread until ``deadline``, then abort it; a NumPy call on this thread (that a
        signal handler calling destroy interrupted) closes the staging itself when it ends, and its
        queued work is waited for as the default stream's is."""
        staging = self._host_state
        if staging is not None and staging.unsettled and not staging.lock._is_owned():
            # A call that Ctrl-C interrupted left its collective queued on the staging stream, and
            # destroying the stream would wait for it in one C call, past any timeout: wait here
            # instead, in slices, until the deadline; then abort it.
            if not self._wait_stream(staging.stream, deadline) and not self._aborted:
                self._abort_for_destroy()
        staging = _staging.detach(self)
        if staging is None or _staging.close(staging, _remaining(deadline)):
            return
        if staging.lock._is_owned():
            self._wait_stream(staging.stream, deadline)
        elif deadline is not None:
            # The call outlasted the timeout: an abort fails its operation at once, and it lets go.
            if not self._aborted:
                self._abort_for_destroy()
            _staging.close(staging, _ABORT_GRACE)

    def _wait_stream(self, stream: Any, deadline: Optional[float]) -> bool:
        """Wait for ``stream`` (a stream or None) until ``deadline`` (None: as long as it takes);
        False if its work was still running then. A stream that fails or is slow does not stop
        the teardown."""
        if stream is None or stream.closed:
            return True
        try:
            stream.synchronize(timeout=_remaining(deadline))
        except CommTimeoutError:
            return stream._failed  # failed work (an exec timeout) has ended; else the wait gave up
        except Exception:  # noqa: BLE001 - a failed stream must not prevent teardown
            pass
        return True

    def _destroy_handle(self, handle: Any, deadline: Optional[float]) -> None:
        """``HcclCommDestroy``, tried again while operations in flight (``HCCL_E_AGAIN``) may still
        end: until ``deadline``, which then aborts the communicator, and for a grace after an abort."""
        released_by: Optional[float] = None  # the end of the grace, once aborted
        pause = 0.001
        while True:
            rc = self._api.HcclCommDestroy(handle)
            if rc != HcclResult.HCCL_E_AGAIN:
                break
            now = time.monotonic()
            if self._aborted:
                released_by = released_by or now + _ABORT_GRACE
                if now >= released_by:
                    break
            elif deadline is None:
                break  # work on the caller's streams: theirs to synchronise
            elif now >= deadline:
                if not self._abort_for_destroy():
                    break
                continue
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        _ffi.check_hccl(rc, "HcclCommDestroy", context=f"destroying '{self._name}'")

    def _abort_for_destroy(self) -> bool:
        """Abort the communicator because destroy's timeout passed; False if this HCCL cannot."""
        if not self._api.present["HcclCommSuspend"]:
            return False
        log.warning("communicator '%s': work still in flight when destroy's timeout passed; aborting it",
                    self._name)
        self.abort()
        self._wait_stream(Device._default_streams.get(self._device_id), time.monotonic() + _ABORT_GRACE)
        return True

    def __enter__(self) -> Communicator:
        self._live_handle()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        state = "destroyed" if self._handle is None else f"rank {self._rank} of {self._size}"
        return f"<hcclpy.Communicator '{self._name}' {state} on {self._device!r}>"

    # ------------------------------------------------------------------------- operations
    #
    # The functions of hcclpy.collectives, as methods (each defined once there): device buffers
    # are queued on ``stream``; NumPy arrays are staged through the device, blocking. Each has a
    # persistent twin, ``*_init``, that checks the call once and returns a PersistentOp.

    all_reduce = collectives.all_reduce
    broadcast = collectives.broadcast
    reduce = collectives.reduce
    all_gather = collectives.all_gather
    all_gather_v = collectives.all_gather_v
    reduce_scatter = collectives.reduce_scatter
    reduce_scatter_v = collectives.reduce_scatter_v
    all_to_all = collectives.all_to_all
    all_to_all_v = collectives.all_to_all_v
    all_to_all_vc = collectives.all_to_all_vc
    scatter = collectives.scatter
    send = collectives.send
    recv = collectives.recv
    batch_send_recv = collectives.batch_send_recv
    barrier = collectives.barrier

    all_reduce_init = collectives.all_reduce_init
    broadcast_init = collectives.broadcast_init
    reduce_init = collectives.reduce_init
    all_gather_init = collectives.all_gather_init
    all_gather_v_init = collectives.all_gather_v_init
    reduce_scatter_init = collectives.reduce_scatter_init
    reduce_scatter_v_init = collectives.reduce_scatter_v_init
    all_to_all_init = collectives.all_to_all_init
    all_to_all_v_init = collectives.all_to_all_v_init
    all_to_all_vc_init = collectives.all_to_all_vc_init
    scatter_init = collectives.scatter_init
    send_init = collectives.send_init
    recv_init = collectives.recv_init
    batch_send_recv_init = collectives.batch_send_recv_init
    barrier_init = collectives.barrier_init
