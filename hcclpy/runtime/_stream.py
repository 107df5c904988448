"""Streams: ordered queues of asynchronous work on one device."""

from __future__ import annotations

import math
import numbers
import threading
from functools import partial
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from .. import _ffi, _trace
from ..errors import AclErrorCode, HcclpyError
from ._device import Device, check_visible
from ._lifetime import attach
from ._waits import WAIT_SLICE_MS, wait_for, waited, wait_in_slices

__all__ = ["Stream"]

HOLD_CHECK = 1024  # beyond this many held buffers, check whether the stream has drained
_sealing = threading.RLock()  # guards every stream's sealed segments (rarely taken)
_now = _trace.now
_SYNC_TIMEOUT = int(AclErrorCode.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT)  # a timed wait's code when the work is not done


# How many hcclpy.group() blocks are open in the process (the collectives keep it). While one is,
# the operations it collected are not on their streams yet (HCCL queues them at HcclGroupEnd): a
# stream found idle says nothing about them, so no stream lets go of held buffers or marks work
# complete until every group has ended.
groups_open = 0


class _Holdings:
    """What a stream keeps alive for its queued work, in an object of its own: the registry of
    live streams lists it (so :meth:`DeviceArray.close` can tell whether queued work still uses an
    allocation), and a stream collected with work pending is parked with it (so that work keeps
    its buffers). ``held`` is always the stream's current ``_held`` list; ``sealed`` its
    ``_sealed`` list, which is never replaced, only changed in place."""

    __slots__ = ("held", "sealed", "device_id")

    def __init__(self, device_id: int) -> None:
        self.held: list = []
        self.sealed: List[Tuple[int, list]] = []
        self.device_id = device_id


# The holdings of every stream not yet destroyed (parked ones included). No lock: set.add,
# set.discard and set.copy are atomic under the GIL and never run Python code, so they are safe
# from the collector's finalizers too.
_registry: set = set()
# Streams collected with work pending, as (api, handle, holdings): destroying one would block
# until its work is done (the collector must never block), so it is destroyed once idle.
_parked: List[Tuple[Any, Any, _Holdings]] = []
_parked_lock = threading.Lock()  # taken by whoever destroys parked streams, never by a finalizer


def held_objects(device_id: int) -> Iterator[Any]:
    """Every object a stream of device ``device_id`` (open, or parked after collection) keeps alive
    for queued work. Not a fast path: it copies each list it reads, since other threads append."""
    for holdings in _registry.copy():
        if holdings.device_id == device_id:
            yield from holdings.held[:]
            for _mark, segment in holdings.sealed[:]:
                yield from segment[:]


def _whole_wait(untimed: Any) -> Any:
    """``untimed(stream)`` in the place of the timed wait ``(stream, milliseconds)``: it waits
    for all the work, so it never returns the timed wait's timeout."""
    return lambda cdata, ms: untimed(cdata)


def _sync_name() -> str:
    """The name of the function Stream.synchronize() waits with (for its failures)."""
    timed = "aclrtSynchronizeStreamWithTimeout"
    return timed if _ffi.has(timed) else "aclrtSynchronizeStream"


def _pending(bound: Any, cdata: Any) -> bool:
    """True if work queued on the stream has not finished (a stream that failed has none pending).
    A CANN without the timed wait cannot tell: its streams count as busy, so the collector parks
    them for good rather than risk a destroy that waits."""
    return (not _ffi.has("aclrtSynchronizeStreamWithTimeout")
            or bound.aclrtSynchronizeStreamWithTimeout(cdata, 0) == _SYNC_TIMEOUT)


def _release(bound: Any, cdata: Any, holdings: _Holdings, owned: bool, wait: bool) -> None:
    """Destroy an owned stream's handle (a borrowed one is only forgotten) and let go of what it
    held. ``wait=False`` (the collector) parks a stream with work pending instead: destroying it
    would wait for that work, which may be a collective waiting for the very thread collecting."""
    if owned and not wait and _pending(bound, cdata):
        _parked.append((bound, cdata, holdings))
        return
    try:
        if owned:
            _ffi.check_acl(bound.aclrtDestroyStream(cdata), "aclrtDestroyStream")
    finally:
        _registry.discard(holdings)
        holdings.held = []
        del holdings.sealed[:]


def destroy_parked() -> None:
    """Destroy the parked streams whose work has ended (never waits; errors are the runtime's,
    reported when the stream's work failed, so they are not raised again here)."""
    if not _parked:
        return
    with _parked_lock:
        for entry in _parked[:]:
            bound, cdata, holdings = entry
            if not _pending(bound, cdata):
                _parked.remove(entry)
                try:
                    _release(bound, cdata, holdings, True, True)
                except HcclpyError:
                    pass


def _timeout_ms(timeout: Optional[float], argument: str = "timeout") -> int:
    if timeout is None or timeout == math.inf:
        return -1
    # "not timeout >= 0" refuses NaN too, which every comparison calls false.
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout >= 0:
        raise ValueError(f"{argument}={timeout!r} must be None (no limit) or a number of seconds >= 0")
    return min(int(timeout * 1000 + 0.5), 2**31 - 1)


class Stream:
    """An AscendCL stream: work queued on it runs in order, asynchronously to the host.

    Create one with :meth:`Device.create_stream`, or wrap a stream owned elsewhere (for example
    torch_npu's current stream) with :meth:`from_handle`. Streams are closed by :meth:`close`, by a
    ``with`` block, or, as a safety net, when garbage collected.
    """

    __slots__ = ("__weakref__", "_handle", "_ptr_cdata", "_device", "_device_id", "_owned", "_owner", "_finalizer",
                 "_live_device", "_held", "_sealed", "_holdings", "_progress", "_sync", "_failed")

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("create streams with Device.create_stream(), or wrap an existing one with "
                        "Stream.from_handle()")

    @classmethod
    def _wrap(cls, handle: int, device: Device, owned: bool, owner: Any = None) -> "Stream":
        self = object.__new__(cls)
        self._handle = handle
        self._ptr_cdata = _ffi.cast("aclrtStream", handle)
        self._device = device
        self._device_id = device.id
        self._owned = owned
        self._owner = owner
        # The device id while open, -1 once closed: one attribute answers both questions on the
        # operations' fast path.
        self._live_device = device.id
        # Buffers of queued operations, kept alive until the stream is known to be done with them:
        # otherwise a temporary array could be freed, and its memory reused, under a queued collective.
        # The operations append to _held (from any thread); a synchronisation lets go of the ones
        # held when it began. Beyond HOLD_CHECK, _seal_held() moves them to a segment in _sealed,
        # under a mark, and lets go of a segment once the stream's progress passes its mark.
        holdings = self._holdings = _Holdings(device.id)
        self._held = holdings.held
        self._sealed = holdings.sealed
        self._progress = _trace.new_progress()  # what the flight recorder knows has completed here
        bound, cdata = _ffi.api(), self._ptr_cdata
        # Bound once: synchronize() is on the hot path. On a CANN without the timed wait, the
        # untimed one, called once with no limit (see hcclpy.runtime._waits).
        self._sync = (bound.aclrtSynchronizeStreamWithTimeout if bound.present.get("aclrtSynchronizeStreamWithTimeout")
                      else _whole_wait(bound.aclrtSynchronizeStream))
        # True once queued work failed (an error, not a wait's timeout): the stream fails for good,
        # so the device replaces a failed default stream (see Device.default_stream).
        self._failed = False
        _registry.add(holdings)
        # The collector never waits: a stream collected with work pending is parked (see _release).
        # A borrowed stream is released too, to leave the registry, but never warns.
        self._finalizer = attach(self, lambda: _release(bound, cdata, holdings, owned, False), "hcclpy.Stream",
                                 warn=owned)
        return self

    @classmethod
    def _create(cls, device: Device, priority: int = 0) -> "Stream":
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 7:
            raise ValueError(f"priority={priority!r} must be an int in 0..7")
        destroy_parked()
        bound = _ffi.api()
        out = _ffi.new("aclrtStream *")
        with device:
            if priority and bound.present.get("aclrtCreateStreamWithConfig"):
                rc, name = bound.aclrtCreateStreamWithConfig(out, priority, 0), "aclrtCreateStreamWithConfig"
            else:
                rc, name = bound.aclrtCreateStream(out), "aclrtCreateStream"
        _ffi.check_acl(rc, name)
        return cls._wrap(_ffi.address(out[0]), device, owned=True)

    @classmethod
    def from_handle(cls, handle: int, *, device: "int | Device", owner: Any = None) -> "Stream":
        """Borrow a stream created elsewhere (``handle`` is its ``aclrtStream`` as an int).

        hcclpy never destroys a borrowed stream: whoever created it must keep it alive while hcclpy
        uses it. ``owner`` is kept referenced for that purpose (for example a torch_npu stream object).

        Examples
        --------
        >>> s = hcclpy.Stream.from_handle(torch.npu.current_stream().npu_stream, device=0)
        """
        if isinstance(handle, bool) or not isinstance(handle, int) or not 0 < handle < 2**64:
            raise ValueError(f"handle={handle!r} must be a non-zero aclrtStream address (an int below 2**64)")
        dev = Device(device)
        check_visible(dev.id)
        return cls._wrap(handle, dev, owned=False, owner=owner)

    @property
    def handle(self) -> int:
        """The ``aclrtStream`` as an int."""
        self._check_open()
        return self._handle

    @property
    def device(self) -> Device:
        """The device the stream belongs to."""
        return self._device

    @property
    def closed(self) -> bool:
        """True once the stream has been closed; False otherwise."""
        return self._live_device < 0

    @property
    def owned(self) -> bool:
        """True if hcclpy created the stream (and destroys it); False for a borrowed handle."""
        return self._owned

    def _check_open(self) -> None:
        if self._live_device < 0:
            raise ValueError("operation on a closed Stream")

    def _cdata(self) -> Any:
        if self._live_device < 0:
            raise ValueError("operation on a closed Stream")
        return self._ptr_cdata

    def _hold(self, keep: Sequence[Any]) -> None:
        """Keep ``keep`` alive until the work just queued is known to be done. (The collectives do
        the same inline.)"""
        held = self._held
        held.extend(keep)
        if len(held) > HOLD_CHECK:
            self._seal_held()

    def _seal_held(self) -> None:
        """Many buffers are held for queued work. Operations are queued faster than they run, so
        the stream is rarely drained right after one, and a job that only waits on events never
        synchronises it: seal the held buffers off under a mark, and let go of the segments whose
        mark the stream's progress (from an event, a query or a synchronisation) has passed."""
        with _sealing:
            segment, self._held = self._held, []
            # After the swap: an operation whose buffers are in the segment was queued before its
            # thread read self._held, so before this mark.
            self._sealed.append((_now(), segment))  # before the query, which may raise
            self._holdings.held = self._held  # (after the append: the registry sees the segment all along)
            groups = groups_open  # before the query's C call: see synchronize()
            if not self.query() and not groups:  # (a drained stream lets go of everything)
                done = self._progress[0]
                self._sealed[:] = [s for s in self._sealed if s[0] >= done]  # a mark equal to done may be later

    def _let_go(self, held: list, count: int, upto: int) -> None:
        """Work queued before mark ``upto`` is done: let go of the first ``count`` buffers of ``held``
        (those held when the wait began; other threads may have added more since) and of the
        segments sealed before ``upto``."""
        del held[:count]
        if self._sealed:
            with _sealing:
                self._sealed[:] = [s for s in self._sealed if s[0] >= upto]

    def synchronize(self, timeout: Optional[float] = None) -> None:
        """Block until all work queued so far has finished.

        Parameters
        ----------
        timeout
            Seconds to wait at most; None (or ``math.inf``) waits for the work (collectives are
            themselves bounded by ``HCCL_EXEC_TIMEOUT``).

        Raises
        ------
        CommTimeoutError
            If ``timeout`` passed first (an :class:`~hcclpy.errors.AclError` too). The work goes
            on. With ``HCCLPY_TRACE_DIR`` set, the first such give-up after new operations were
            queued dumps the flight recorder.
        AclError
            If queued work failed; a failed collective makes the stream fail for good.
        """
        if timeout is None and self._live_device >= 0:  # the common call, with the checks inlined
            held = self._held
            count = len(held)
            upto = _now()
            # Read before the wait, not after: a group that ends during the wait queues work the
            # wait did not cover, and its buffers must stay held (see groups_open).
            groups = groups_open
            rc = self._sync(self._ptr_cdata, WAIT_SLICE_MS)  # in slices, so that Ctrl-C can end it
            if rc:
                if rc == _SYNC_TIMEOUT:
                    rc = wait_in_slices(partial(self._sync, self._ptr_cdata), -1, _SYNC_TIMEOUT)
                if rc:
                    raise self._failure(rc, _sync_name(), upto)
            if groups:
                return
            progress = self._progress
            if upto > progress[0]:
                progress[0] = upto
                progress[2] = _now()
            if self._sealed:
                self._let_go(held, count, upto)
            else:
                del held[:count]
            return
        self._synchronize(_timeout_ms(timeout))

    def _synchronize(self, ms: int) -> None:
        """:meth:`synchronize` past its fast path: wait ``ms`` milliseconds at most (-1: no limit),
        in C calls Ctrl-C can come between (see :mod:`hcclpy.runtime._waits`)."""
        cdata = self._cdata()
        held = self._held
        count = len(held)
        upto = _trace.mark()
        groups = groups_open  # before the wait: see synchronize()
        rc, name = wait_for(_ffi.api(), "aclrtSynchronizeStreamWithTimeout", "aclrtSynchronizeStream", (cdata,), ms,
                            _SYNC_TIMEOUT)
        if rc:
            raise self._failure(rc, name, upto, ms)
        if not groups:  # see groups_open
            _trace.completed(self._progress, upto)
            self._let_go(held, count, upto)

    def _failure(self, rc: int, name: str, upto: int, ms: int = -1) -> Exception:
        """The exception for a wait (of ``ms`` milliseconds) that returned ``rc``. Anything but the
        wait's own timeout means queued work failed, and the stream with it, for good."""
        if rc != _SYNC_TIMEOUT:
            self._failed = True
            _trace.failed(self._progress, upto)
            return _ffi.acl_failure(rc, name)
        return _ffi.acl_failure(rc, name, context=waited(ms))

    def query(self) -> bool:
        """True if all work queued so far has finished, without waiting; False otherwise."""
        bound = _ffi.api()
        held = self._held
        count = len(held)
        upto = _trace.mark()
        groups = groups_open  # before the C call: see synchronize()
        rc = bound.aclrtSynchronizeStreamWithTimeout(self._cdata(), 0)
        if rc == _SYNC_TIMEOUT:
            return False
        if rc:
            raise self._failure(rc, "aclrtSynchronizeStreamWithTimeout", upto)
        if not groups:  # see groups_open
            _trace.completed(self._progress, upto)
            self._let_go(held, count, upto)
        return True

    def wait_event(self, event: "Event") -> None:  # noqa: F821 (Event imported lazily)
        """Make work queued after this call wait until ``event`` completes."""
        from ._event import Event

        if not isinstance(event, Event):
            raise TypeError(f"event must be an hcclpy.Event, got {type(event).__name__}")
        _ffi.check_acl(_ffi.api().aclrtStreamWaitEvent(self._cdata(), event._cdata()), "aclrtStreamWaitEvent")

    def record(self, event: "Optional[Event]" = None) -> "Event":  # noqa: F821
        """Record ``event`` (a new timing event if None) at the current end of this stream."""
        from ._event import Event

        self._check_open()  # before an event is made for nothing
        if event is None:
            event = Event._create(self._device, True)
        elif not isinstance(event, Event):
            raise TypeError(f"event must be an hcclpy.Event or None, got {type(event).__name__}")
        event.record(self)
        return event

    def close(self) -> None:
        """Synchronise and destroy the stream (a borrowed stream is only forgotten). Idempotent."""
        self._close(wait=True)
        destroy_parked()

    def _close(self, wait: bool) -> None:
        """Close; ``wait=False`` (a failed default stream being replaced) does not wait for work
        still pending: the stream is then destroyed later, once idle, as a collected one is."""
        self._live_device = -1
        if self._finalizer.detach() is not None:  # (None: closed already)
            try:
                _release(_ffi.api(), self._ptr_cdata, self._holdings, self._owned, wait)
            finally:
                self._held = self._holdings.held

    def __enter__(self) -> "Stream":
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._handle:x}"
        return f"<hcclpy.Stream {state} on {self._device!r}{'' if self._owned else ' (borrowed)'}>"
