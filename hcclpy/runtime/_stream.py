"""Streams: ordered queues of asynchronous work on one device."""

from __future__ import annotations

import threading
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Sequence, Tuple

from .. import _ffi, _trace
from ..errors import AclErrorCode, HcclpyError, HostFunctionError, UnsupportedError
from ._device import Device, DeviceLike, check_visible
from ._lifetime import CLOSES, attach
from ._waits import WAIT_SLICE_MS, seconds, wait_for, waited, wait_in_slices

if TYPE_CHECKING:
    from ._event import Event

__all__ = ["Stream"]

HOLD_CHECK = 1024  # beyond this many held buffers, check whether the stream has drained
_now = _trace.now
_STREAM_COMPLETE = 0  # ACL_STREAM_STATUS_COMPLETE
_FAILURE_MODES = {"continue": 0, "stop": 1}  # ACL_CONTINUE_ON_FAILURE, ACL_STOP_ON_FAILURE
_SYNC_TIMEOUT = int(AclErrorCode.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT)  # a timed wait's code when the work is not done


class _Holdings:
    """What a stream keeps alive for its queued work, in an object of its own: the registry of
    live streams lists it (so :meth:`DeviceArray.close` can tell whether queued work still uses an
    allocation), and a stream collected with work pending is parked with it (so that work keeps
    its buffers). ``held`` is always the stream's current ``_held`` list; ``sealed`` its
    ``_sealed`` list, which is never replaced, only changed in place."""

    __slots__ = ("held", "sealed", "device_id", "stream")

    def __init__(self, device_id: int, stream: Any = None) -> None:
        self.held: list = []
        self.sealed: List[Tuple[int, list]] = []
        self.device_id = device_id
        self.stream = stream  # a weak reference to the stream (None: parked, or no stream's)

    def objects(self) -> Iterator[Any]:
        """What it holds now (copies of the lists: other threads append)."""
        yield from self.held[:]
        for _mark, segment in self.sealed[:]:
            yield from segment[:]


def holds(item: Any, target: Any) -> bool:
    """Whether a held ``item`` keeps ``target``, an allocation, alive: it is ``target``, or names it
    as its ``_alloc`` (a DeviceArray, or the operations' description of one)."""
    return item is target or getattr(item, "_alloc", None) is target


def holder(device_id: int) -> _Holdings:
    """A keep-alive list of its own for device ``device_id``, seen by :meth:`DeviceArray.close` as
    a stream's is, for work not queued on any stream yet; give it back with :func:`drop_holder`."""
    holdings = _Holdings(device_id)
    _registry.add(holdings)
    return holdings


def drop_holder(holdings: _Holdings) -> None:
    """Forget a keep-alive list made by :func:`holder` (what it held is no longer needed there)."""
    _registry.discard(holdings)
    holdings.held = []


def users(target: Any, device_id: int) -> List[Stream]:
    """The open streams of device ``device_id`` whose queued work holds ``target`` (see :func:`holds`)."""
    found = []
    for holdings in _registry.copy():
        if holdings.device_id == device_id and holdings.stream is not None:
            stream = holdings.stream()
            if stream is not None and any(holds(item, target) for item in holdings.objects()):
                found.append(stream)
    return found


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
            yield from holdings.objects()


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
    limit = seconds(timeout, argument)
    return -1 if limit is None else min(int(limit * 1000 + 0.5), 2**31 - 1)


class Stream:
    """An AscendCL stream: work queued on it runs in order, asynchronously to the host.

    Create one with :meth:`Device.create_stream`, or wrap a stream owned elsewhere (for example
    torch_npu's current stream) with :meth:`from_handle`. Streams are closed by :meth:`close`, by a
    ``with`` block, or, as a safety net, when garbage collected.
    """

    __slots__ = ("__weakref__", "_handle", "_ptr_cdata", "_device", "_device_id", "_owned", "_owner", "_finalizer",
                 "_live_device", "_held", "_dropped", "_sealed", "_turn", "_holdings", "_progress",
                 "_sync", "_failed", "_host_failures", "_graph")

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("create streams with Device.create_stream(), or wrap an existing one with "
                        "Stream.from_handle()")

    @classmethod
    def _wrap(cls, handle: int, device: Device, owned: bool, owner: Any = None) -> Stream:
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
        holdings = self._holdings = _Holdings(device.id, weakref.ref(self))
        self._held = holdings.held
        self._sealed = holdings.sealed
        # How many buffers have left the front of _held since the stream was made (let go of, or
        # sealed): a wait notes the position its work ends at, as _dropped + len(_held), and lets go
        # of what is still before it. Two threads whose waits end together so let go of the same
        # buffers once, not twice as many (a count would also drop buffers of work queued since).
        self._dropped = 0
        self._turn = [True]  # taken to remove buffers from the front of _held, or to seal (see _let_go)
        self._progress = _trace.new_progress()  # what the flight recorder knows has completed here
        bound, cdata = _ffi.api(), self._ptr_cdata
        # Bound once: synchronize() is on the hot path. On a CANN without the timed wait, the
        # untimed one, called once with no limit (see hcclpy.runtime._waits).
        self._sync = (bound.aclrtSynchronizeStreamWithTimeout if bound.present.get("aclrtSynchronizeStreamWithTimeout")
                      else _whole_wait(bound.aclrtSynchronizeStream))
        # True once queued work failed (an error, not a wait's timeout): the stream fails for good,
        # so the device replaces a failed default stream (see Device.default_stream).
        self._failed = False
        self._host_failures: List[HostFunctionError] = []  # raised by queued host functions, not yet reported
        self._graph: Any = None  # the Graph recording what is queued here, while it captures (see _graph.py)
        _registry.add(holdings)
        # The collector never waits: a stream collected with work pending is parked (see _release).
        # A borrowed stream is released too, to leave the registry, but never warns.
        self._finalizer = attach(self, lambda: _release(bound, cdata, holdings, owned, False), "hcclpy.Stream",
                                 warn=owned)
        return self

    @classmethod
    def _create(cls, device: Device, priority: int = 0) -> Stream:
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
    def from_handle(cls, handle: int, *, device: DeviceLike, owner: Any = None) -> Stream:
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
        """Keep ``keep`` alive until the work just queued is known to be done (while the stream
        captures: as long as the graph lives). (The collectives do the same inline.)"""
        if self._graph is not None:
            self._graph._hold(keep)
            return
        held = self._held
        held.extend(keep)
        if len(held) > HOLD_CHECK:
            self._seal_held()

    def _seal_held(self) -> None:
        """Many buffers are held for queued work. Operations are queued faster than they run, so
        the stream is rarely drained right after one, and a job that only waits on events never
        synchronises it: seal the held buffers off under a mark, and let go of the segments whose
        mark the stream's progress (from an event, a query or a synchronisation) has passed. (When
        another thread is letting go of buffers, the next operation seals them instead.)"""
        try:
            self._turn.pop()  # see _let_go()
        except IndexError:
            return
        try:
            segment, self._held = self._held, []
            # After the swap: an operation whose buffers are in the segment was queued before its
            # thread read self._held, so before this mark.
            self._sealed.append((_now(), segment))
            self._holdings.held = self._held  # (after the append: the registry sees the segment all along)
            self._dropped += len(segment)  # after the swap: see _held_end()
        finally:
            self._turn.append(True)
        if not self.query():  # (a drained stream lets go of everything)
            self._let_go(0, self._progress[0])  # a segment's mark equal to the progress may be later

    def _held_end(self) -> int:
        """The position just past the buffers held now: a wait that begins after this call covers
        their work. No lock: _dropped is read first, and whatever lets go of buffers or seals them
        moves them before it adds to _dropped, so a concurrent change can only make the answer
        smaller (buffers kept a while longer), never larger."""
        return self._dropped + len(self._held)

    def _let_go(self, end: int, upto: int) -> None:
        """Work queued before mark ``upto`` is done, that of the buffers held before position
        ``end`` (see :meth:`_held_end`) too: let go of those buffers and of the segments sealed
        before ``upto``. One thread at a time: when another is letting go, or sealing, this one
        leaves its buffers to the stream's next wait."""
        # Whoever pops the True from _turn may change the front of _held, _dropped and _sealed,
        # until it puts it back. A list's pop() is atomic: it does what a lock's non-blocking
        # acquire does, at a fifth of the cost, on the path of every synchronisation.
        try:
            self._turn.pop()
        except IndexError:
            return
        try:
            count = end - self._dropped  # another thread's wait may have let go of some already
            if count > 0:
                del self._held[:count]
                self._dropped = end
            if self._sealed:
                self._sealed[:] = [s for s in self._sealed if s[0] >= upto]
        finally:
            self._turn.append(True)

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
            end = self._dropped + len(self._held)  # _held_end(), inlined
            upto = _now()
            rc = self._sync(self._ptr_cdata, WAIT_SLICE_MS)  # in slices, so that Ctrl-C can end it
            if rc:
                if rc == _SYNC_TIMEOUT:
                    rc = wait_in_slices(partial(self._sync, self._ptr_cdata), -1, _SYNC_TIMEOUT)
                if rc:
                    raise self._failure(rc, _sync_name(), upto)
            progress = self._progress
            if upto > progress[0]:
                progress[0] = upto
                progress[2] = _now()
            if self._host_failures:
                self._let_go(end, upto)
                raise self._host_failures.pop(0)
            if self._sealed:
                self._let_go(end, upto)
                return
            turn = self._turn  # _let_go(), inlined
            try:
                turn.pop()
            except IndexError:
                return
            try:
                count = end - self._dropped
                if count > 0:
                    del self._held[:count]
                    self._dropped = end
            finally:
                turn.append(True)
            return
        self._synchronize(_timeout_ms(timeout))

    def _synchronize(self, ms: int) -> None:
        """:meth:`synchronize` past its fast path: wait ``ms`` milliseconds at most (-1: no limit),
        in C calls Ctrl-C can come between (see :mod:`hcclpy.runtime._waits`)."""
        cdata = self._cdata()
        end = self._held_end()
        upto = _trace.mark()
        rc, name = wait_for(_ffi.api(), "aclrtSynchronizeStreamWithTimeout", "aclrtSynchronizeStream", (cdata,), ms,
                            _SYNC_TIMEOUT)
        if rc:
            raise self._failure(rc, name, upto, ms)
        _trace.completed(self._progress, upto)
        self._let_go(end, upto)
        if self._host_failures:
            raise self._host_failures.pop(0)

    def _failure(self, rc: int, name: str, upto: int, ms: int = -1) -> Exception:
        """The exception for a wait (of ``ms`` milliseconds) that returned ``rc``. Anything but the
        wait's own timeout means queued work failed, and the stream with it, for good."""
        if rc != _SYNC_TIMEOUT:
            self._failed = True
            _trace.failed(self._progress, upto)
            return _ffi.acl_failure(rc, name)
        return _ffi.acl_failure(rc, name, context=waited(ms))

    def query(self) -> bool:
        """True if all work queued so far has finished, without waiting; False otherwise
        (``aclrtStreamQuery``, or a wait of no time on a CANN without it).

        Raises
        ------
        AclError
            If queued work failed.
        HostFunctionError
            If a host function queued on this stream raised (once per such function).
        """
        bound = _ffi.api()
        end = self._held_end()
        upto = _trace.mark()
        if bound.present.get("aclrtStreamQuery"):
            status = _ffi.new("aclrtStreamStatus *")
            rc, name = bound.aclrtStreamQuery(self._cdata(), status), "aclrtStreamQuery"
            if not rc and status[0] != _STREAM_COMPLETE:
                return False
        else:
            rc, name = bound.aclrtSynchronizeStreamWithTimeout(self._cdata(), 0), "aclrtSynchronizeStreamWithTimeout"
            if rc == _SYNC_TIMEOUT:
                return False
        if rc:
            raise self._failure(rc, name, upto)
        _trace.completed(self._progress, upto)
        self._let_go(end, upto)
        if self._host_failures:
            raise self._host_failures.pop(0)
        return True

    @property
    def id(self) -> int:
        """The stream's id (``aclrtStreamGetId``), unique among the process's streams.

        Raises
        ------
        UnsupportedError
            On a CANN without ``aclrtStreamGetId``.
        """
        bound = _ffi.api()
        if not bound.present.get("aclrtStreamGetId"):
            raise UnsupportedError("Stream.id needs aclrtStreamGetId (CANN 8.x), which this CANN does not provide")
        value = _ffi.new("int32_t *")
        _ffi.check_acl(bound.aclrtStreamGetId(self._cdata(), value), "aclrtStreamGetId")
        return int(value[0])

    def set_failure_mode(self, mode: str) -> None:
        """What this stream does with its later work once a task on it failed
        (``aclrtSetStreamFailureMode``; once per stream): ``"continue"`` runs it (CANN's default),
        ``"stop"`` runs none of it. Either way the failure is raised by the next
        :meth:`synchronize`. (The simulator's streams stop unless told to continue: see the docs'
        C-programs page.)

        Raises
        ------
        ValueError
            ``mode`` is neither ``"continue"`` nor ``"stop"``.
        AclError
            The mode of this stream was set already.
        UnsupportedError
            On a CANN without ``aclrtSetStreamFailureMode``.
        """
        code = _FAILURE_MODES.get(mode) if isinstance(mode, str) else None
        if code is None:
            raise ValueError(f"mode={mode!r} must be 'continue' or 'stop'")
        bound = _ffi.api()
        if not bound.present.get("aclrtSetStreamFailureMode"):
            raise UnsupportedError("Stream.set_failure_mode needs aclrtSetStreamFailureMode (CANN 8.x), which this "
                                   "CANN does not provide")
        _ffi.check_acl(bound.aclrtSetStreamFailureMode(self._cdata(), code), "aclrtSetStreamFailureMode")

    def launch_host_func(self, fn: Callable[[], Any]) -> None:
        """Queue ``fn()`` (a Python callable taking no argument) on this stream: it runs once the
        work queued before it has finished, on a runtime thread, and the work queued after it waits
        until it returns (``aclrtLaunchHostFunc``).

        ``fn`` must not synchronise a stream or queue work (CANN forbids it in host functions). If
        it raises, the stream's later work still runs, and the exception is raised, as the cause
        of a :class:`HostFunctionError`, by the stream's next :meth:`synchronize` or
        :meth:`query`. The stream keeps ``fn`` alive until then.

        Raises
        ------
        TypeError
            ``fn`` is not callable.
        UnsupportedError
            On a CANN without ``aclrtLaunchHostFunc``.

        Examples
        --------
        >>> stream.launch_host_func(lambda: print("the copy before me is done"))
        """
        if not callable(fn):
            raise TypeError(f"fn must be a callable taking no argument, got {type(fn).__name__}")
        bound = _ffi.api()
        if not bound.present.get("aclrtLaunchHostFunc"):
            raise UnsupportedError("Stream.launch_host_func needs aclrtLaunchHostFunc (CANN 8.x), which this CANN "
                                   "does not provide")
        failures = self._host_failures

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the next synchronize() or query()
                error = HostFunctionError(f"host function {fn!r} queued on {self!r} raised {type(exc).__name__}: "
                                          f"{exc}")
                error.__cause__ = exc
                failures.append(error)

        function, handle = _ffi.host_function(run)
        self._check_open()
        _ffi.check_acl(bound.aclrtLaunchHostFunc(self._cdata(), function, handle), "aclrtLaunchHostFunc")
        self._hold((handle,))  # the handle keeps run(), and fn, alive until the stream is past it

    def capture(self, mode: str = "global") -> Any:
        """Record, instead of running, the work queued on this stream in a ``with`` block, into
        the :class:`~hcclpy.Graph` the block gets (``aclmdlRICaptureBegin`` ... ``End``); replay
        it with :meth:`Graph.replay`.

        ``mode`` says which threads may call what a capture forbids (synchronous copies, copies of
        pageable host memory): ``"global"`` none, ``"thread_local"`` all but this one,
        ``"relaxed"`` all. During a global capture, hcclpy operations queued by this thread on a
        stream that does not capture raise, as do operations on NumPy arrays (they wait for their
        result) and hcclpy.group() blocks.

        Raises
        ------
        ValueError
            ``mode`` is unknown, or the stream is closed or capturing already.
        UnsupportedError
            On a CANN without stream capture.
        """
        from ._graph import Graph

        return Graph._begin(self, mode)

    def wait_event(self, event: Event) -> None:
        """Make work queued after this call wait until ``event`` completes."""
        from ._event import Event  # at run time here: _event imports this module

        if not isinstance(event, Event):
            raise TypeError(f"event must be an hcclpy.Event, got {type(event).__name__}")
        _ffi.check_acl(_ffi.api().aclrtStreamWaitEvent(self._cdata(), event._cdata()), "aclrtStreamWaitEvent")
        graph = event._captured
        if graph is not None and graph._state == "capturing" and self._graph is None:
            graph._join(self)  # waiting for work of a capture joins it (CANN does the same in C)

    def wait_stream(self, stream: Stream) -> None:
        """Make work queued after this call wait until the work queued on ``stream`` so far is
        done (an event recorded on ``stream``, then :meth:`wait_event`)."""
        from ._event import Event

        if not isinstance(stream, Stream):
            raise TypeError(f"stream must be an hcclpy.Stream, got {type(stream).__name__}")
        if stream._device_id != self._device_id:
            raise ValueError(f"stream is on device {stream._device_id} but this stream is on "
                             f"device {self._device_id}; a stream waits for streams of its own device")
        self._check_open()
        event = Event._create(self._device, False)
        try:
            event.record(stream)
            self.wait_event(event)
        except BaseException:
            event.close()
            raise
        self._hold((event,))  # the wait reads the event: it lives until this stream is known past it

    def record(self, event: Optional[Event] = None) -> Event:
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
        CLOSES[0] += 1
        if self._finalizer.detach() is not None:  # (None: closed already)
            try:
                _release(_ffi.api(), self._ptr_cdata, self._holdings, self._owned, wait)
            finally:
                self._held = self._holdings.held

    def __enter__(self) -> Stream:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._handle:x}"
        return f"<hcclpy.Stream {state} on {self._device!r}{'' if self._owned else ' (borrowed)'}>"
