"""Events: markers recorded on a stream, for ordering and timing."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from .. import _ffi, _trace
from ..errors import AclErrorCode, UnsupportedError
from ._device import Device
from ._lifetime import attach, close_now
from ._stream import _timeout_ms
from ._waits import wait_for, waited

if TYPE_CHECKING:
    from ._stream import Stream

__all__ = ["Event", "IpcEventHandle"]


class IpcEventHandle(NamedTuple):
    """What another process needs to wait for an :class:`Event` of this one: made by
    :meth:`Event.ipc_handle`, picklable, opened with :meth:`Event.ipc_open`."""

    data: bytes
    """The ``aclrtIpcEventHandle`` bytes."""
    pid: int
    """The process that records the event."""


class Event:
    """An AscendCL event. Create one with :meth:`Device.create_event` or :meth:`Stream.record`.

    Examples
    --------
    >>> start, end = stream.record(), None
    >>> comm.all_reduce(x, y, stream=stream)
    >>> end = stream.record()
    >>> end.synchronize(); print(start.elapsed_time(end), "ms")
    """

    __slots__ = ("__weakref__", "_cdata_ptr", "_device", "_timing", "_finalizer", "_recorded", "_ipc",
                 "_opened", "_captured")

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("create events with Device.create_event() or Stream.record()")

    @classmethod
    def _create(cls, device: Device, timing: bool, ipc: bool = False) -> Event:
        bound = _ffi.api()
        out = _ffi.new("aclrtEvent *")
        with device:
            if ipc:
                if not bound.present.get("aclrtIpcGetEventHandle"):
                    raise UnsupportedError("events shared between processes need aclrtIpcGetEventHandle (CANN 8.5), "
                                           "which this CANN does not provide")
                flags = _ffi.ACL_EVENT_IPC | _ffi.ACL_EVENT_SYNC | (_ffi.ACL_EVENT_TIME_LINE if timing else 0)
                rc, name = bound.aclrtCreateEventExWithFlag(out, flags), "aclrtCreateEventExWithFlag"
            elif bound.present.get("aclrtCreateEventWithFlag"):
                flags = _ffi.ACL_EVENT_SYNC | (_ffi.ACL_EVENT_TIME_LINE if timing else 0)
                rc, name = bound.aclrtCreateEventWithFlag(out, flags), "aclrtCreateEventWithFlag"
            else:
                rc, name = bound.aclrtCreateEvent(out), "aclrtCreateEvent"
        _ffi.check_acl(rc, name)
        return cls._adopt(out[0], device, timing, ipc, opened=False)

    @classmethod
    def _adopt(cls, cdata: Any, device: Device, timing: bool, ipc: bool, opened: bool) -> Event:
        """The Event of the live ``aclrtEvent`` ``cdata``, destroyed when closed."""
        bound = _ffi.api()
        self = object.__new__(cls)
        self._cdata_ptr = cdata
        self._device = device
        self._timing = bool(timing)
        self._ipc = ipc
        self._opened = opened
        self._captured: Any = None  # the Graph whose capture recorded it last
        self._recorded: Any = None  # (the stream's progress, the flight recorder's mark) at the last record

        def release() -> None:
            _ffi.check_acl(bound.aclrtDestroyEvent(cdata), "aclrtDestroyEvent")

        self._finalizer = attach(self, release, "hcclpy.Event")
        return self

    def _cdata(self) -> Any:
        if not self._finalizer.alive:
            raise ValueError("operation on a closed Event")
        return self._cdata_ptr

    @property
    def handle(self) -> int:
        """The ``aclrtEvent`` as an int."""
        return _ffi.address(self._cdata())

    @property
    def device(self) -> Device:
        """The device the event was created on."""
        return self._device

    @property
    def closed(self) -> bool:
        """True once the event has been closed; False otherwise."""
        return not self._finalizer.alive

    def ipc_handle(self) -> IpcEventHandle:
        """A handle through which another process waits for this event (``aclrtIpcGetEventHandle``;
        the event must come from ``Device.create_event(ipc=True)``): pass it (it pickles) to a
        process that calls :meth:`Event.ipc_open`.

        Raises
        ------
        ValueError
            The event is closed, was not created with ``ipc=True``, or was itself opened from
            another process.
        """
        if self._opened:
            raise ValueError("this event was opened from another process: only the process that made it shares it")
        cdata = self._cdata()
        if not self._ipc:
            raise ValueError("only an event from Device.create_event(ipc=True) is shared between processes")
        handle = _ffi.new("aclrtIpcEventHandle *")
        _ffi.check_acl(_ffi.api().aclrtIpcGetEventHandle(cdata, handle), "aclrtIpcGetEventHandle")
        return IpcEventHandle(bytes(_ffi.buffer(handle)), os.getpid())

    @staticmethod
    def ipc_open(handle: IpcEventHandle, *, device: Optional[Any] = None) -> Event:
        """The event another process shared with :meth:`ipc_handle`, to wait for here
        (:meth:`Stream.wait_event`, :meth:`synchronize`, :meth:`query`); it is recorded in the
        process that made it, and has no time to measure here.

        Raises
        ------
        TypeError
            ``handle`` is not an :class:`IpcEventHandle`.
        AclError
            The handle's process has ended or destroyed the event.
        """
        if not isinstance(handle, IpcEventHandle):
            raise TypeError(f"handle must be an hcclpy.IpcEventHandle from Event.ipc_handle, got "
                            f"{type(handle).__name__}")
        bound = _ffi.api()
        if not bound.present.get("aclrtIpcOpenEventHandle"):
            raise UnsupportedError("Event.ipc_open needs aclrtIpcOpenEventHandle (CANN 8.5), which this CANN does "
                                   "not provide")
        target = (Device.current() or Device(0)) if device is None else Device(device)
        raw = _ffi.new("aclrtIpcEventHandle *")
        _ffi.memmove(raw, handle.data, min(len(handle.data), _ffi.sizeof("aclrtIpcEventHandle")))
        out = _ffi.new("aclrtEvent *")
        with target:
            _ffi.check_acl(bound.aclrtIpcOpenEventHandle(raw[0], out), "aclrtIpcOpenEventHandle",
                           context=f"opening an event of process {handle.pid}")
        return Event._adopt(out[0], target, False, True, opened=True)

    def record(self, stream: Optional[Stream] = None) -> None:
        """Record the event at the current end of ``stream`` (the device's default stream if None)."""
        from ._stream import Stream

        if self._opened:
            raise ValueError("this event was opened from another process (Event.ipc_open): it is recorded there, "
                             "and waited for here")
        if stream is None:
            stream = self._device.default_stream
        elif not isinstance(stream, Stream):
            raise TypeError(f"stream must be an hcclpy.Stream or None, got {type(stream).__name__}")
        if stream._device_id != self._device.id:
            raise ValueError(f"stream is on device {stream._device_id} but the event was created on device "
                             f"{self._device.id}; record it on a stream of its own device")
        upto = _trace.mark()  # before the call: work queued after the record must not count as before it
        _ffi.check_acl(_ffi.api().aclrtRecordEvent(self._cdata(), stream._cdata()), "aclrtRecordEvent")
        self._captured = stream._graph
        self._recorded = None if stream._graph is not None else (stream._progress, upto)

    def _seen_complete(self) -> None:
        # Everything queued on the recorded stream before the record is done.
        if self._recorded is not None:
            _trace.completed(*self._recorded)

    def _failure(self, rc: int, name: str, ms: int = -1) -> Exception:
        """The exception for a wait (of ``ms`` milliseconds) or query that returned ``rc``.
        Anything but the wait's own timeout means the recording stream failed before the record:
        the work queued on it before the record did not all run."""
        if rc != AclErrorCode.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT:
            if self._recorded is not None:
                _trace.failed(*self._recorded)
            return _ffi.acl_failure(rc, name)
        return _ffi.acl_failure(rc, name, context=waited(ms))

    def query(self) -> bool:
        """True if the work before the event's last record has finished; False otherwise, and for
        an event never recorded (as AscendCL answers NOT_READY for it).

        Raises
        ------
        AclError
            If the stream that recorded the event failed before reaching the record."""
        status = _ffi.new("aclrtEventRecordedStatus *")
        rc = _ffi.api().aclrtQueryEventStatus(self._cdata(), status)
        if rc:
            raise self._failure(rc, "aclrtQueryEventStatus")
        done = int(status[0]) == 1  # ACL_EVENT_RECORDED_STATUS_COMPLETE
        if done:
            self._seen_complete()
        return done

    def synchronize(self, timeout: Optional[float] = None) -> None:
        """Block until the event completes (``timeout`` in seconds; None or ``math.inf`` waits for the work).

        Raises
        ------
        CommTimeoutError
            If ``timeout`` passed first.
        AclError
            If the stream that recorded the event failed before reaching the record (the work
            queued on it before the record did not all run).
        """
        self._synchronize(_timeout_ms(timeout))

    def _synchronize(self, ms: int) -> None:
        """:meth:`synchronize` for ``ms`` milliseconds at most (-1: no limit), in C calls Ctrl-C can
        come between (see :mod:`hcclpy.runtime._waits`)."""
        rc, name = wait_for(_ffi.api(), "aclrtSynchronizeEventWithTimeout", "aclrtSynchronizeEvent",
                            (self._cdata(),), ms, AclErrorCode.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT)
        if rc:
            raise self._failure(rc, name, ms)
        self._seen_complete()

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to ``end``; both must be recorded and complete.

        Raises
        ------
        ValueError
            If either event was created with ``timing=False``, or has never been recorded.
        """
        if not isinstance(end, Event):
            raise TypeError(f"end must be an hcclpy.Event, got {type(end).__name__}")
        if not (self._timing and end._timing):
            raise ValueError("elapsed_time needs two events created with timing=True")
        if self._device is not end._device:
            raise ValueError(f"elapsed_time needs two events of one device, got {self._device!r} and {end._device!r}")
        start_cdata, end_cdata = self._cdata(), end._cdata()  # (closed events are refused first)
        unrecorded = [name for name, event in (("the start event", self), ("end", end)) if event._recorded is None]
        if unrecorded:
            raise ValueError(f"elapsed_time needs both events recorded with Event.record(stream); not recorded: "
                             f"{', '.join(unrecorded)}")
        ms = _ffi.new("float *")
        _ffi.check_acl(_ffi.api().aclrtEventElapsedTime(ms, start_cdata, end_cdata), "aclrtEventElapsedTime")
        return float(ms[0])

    def close(self) -> None:
        """Destroy the event. Idempotent."""
        close_now(self._finalizer)

    def __enter__(self) -> Event:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            state = "closed"
        else:
            state = f"0x{self.handle:x}, {'recorded' if self._recorded is not None else 'not recorded'}"
        return f"<hcclpy.Event {state}{', timing' if self._timing else ''} on {self._device!r}>"
