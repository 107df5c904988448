"""Devices. The current device belongs to the calling thread, as in AscendCL."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import numpy as np

from .. import _ffi
from ..errors import AclErrorCode, HcclpyError, UnsupportedError
from ._waits import wait_for

if TYPE_CHECKING:
    from ._event import Event
    from ._stream import Stream

__all__ = ["Device", "device_count"]


def device_count() -> int:
    """Number of devices visible to this process (``ASCEND_RT_VISIBLE_DEVICES`` applies)."""
    bound = _ffi.api()
    count = _ffi.new("uint32_t *")
    _ffi.check_acl(bound.aclrtGetDeviceCount(count), "aclrtGetDeviceCount")
    return int(count[0])


def current_device_id() -> Optional[int]:
    """The calling thread's current device id, or None if it has not set one."""
    bound = _ffi.api()
    out = _ffi.new("int32_t *")
    return int(out[0]) if bound.aclrtGetDevice(out) == 0 else None


def visible_devices(count: int) -> str:
    """How many devices are visible, in words for error messages."""
    return "no device is visible" if count == 0 else f"{count} device(s) are visible (0..{count - 1})"


def check_visible(device_id: int, argument: str = "device") -> None:
    """Raise ValueError unless ``device_id`` is a device visible now (a check for the calls that
    would not reach a C call refusing it, or would reach it with a less clear message)."""
    count = device_count()
    if not 0 <= device_id < count:
        raise ValueError(f"{argument}={device_id} is out of range: {visible_devices(count)}")


def set_current_device(device_id: int) -> None:
    """Make ``device_id`` current on the calling thread (validated first)."""
    check_visible(device_id)
    _ffi.check_acl(_ffi.api().aclrtSetDevice(device_id), "aclrtSetDevice")


class Device:
    """One NPU (or simulated device), by logical id.

    ``Device(i)`` is cheap and returns the same object for the same id. It holds no per-thread state:
    :meth:`set_current` (or ``with device:``) changes the *calling thread's* current device, which is
    what allocations and new streams use. Each thread that works with a device must make it current.
    A ``with`` block restores the device that was current before it; on a thread that had none,
    the block's device stays current (AscendCL cannot make a thread deviceless again), and so do
    the methods that need their device current (:meth:`memory_info`, :meth:`create_stream`, ...).

    Examples
    --------
    >>> dev = hcclpy.Device(0)
    >>> with dev:                       # current on this thread inside the block
    ...     x = hcclpy.zeros(1024, "float32")
    """

    _instances: Dict[int, Device] = {}
    _lock = threading.Lock()
    _default_streams: Dict[int, Stream] = {}
    _local = threading.local()

    __slots__ = ("_id",)

    def __new__(cls, device_id: DeviceLike = 0) -> Device:
        if isinstance(device_id, Device):
            return device_id
        if isinstance(device_id, np.integer):
            device_id = int(device_id)
        if not isinstance(device_id, int) or isinstance(device_id, bool):
            raise TypeError(f"device={device_id!r} must be an int device id, got {type(device_id).__name__}")
        if device_id < 0:
            raise ValueError(f"device={device_id} is negative; device ids start at 0")
        with cls._lock:
            instance = cls._instances.get(device_id)
            if instance is None:
                instance = super().__new__(cls)
                instance._id = device_id
                cls._instances[device_id] = instance
            return instance

    @property
    def id(self) -> int:
        """The logical device id."""
        return self._id

    def __repr__(self) -> str:
        return f"Device({self._id})"

    def __int__(self) -> int:
        return self._id

    def __index__(self) -> int:
        return self._id

    @classmethod
    def current(cls) -> Optional[Device]:
        """The calling thread's current device, or None."""
        device_id = current_device_id()
        return None if device_id is None else cls(device_id)

    @staticmethod
    def count() -> int:
        """Number of visible devices."""
        return device_count()

    def set_current(self) -> None:
        """Make this device current on the calling thread.

        Raises
        ------
        ValueError
            If the id is not a visible device.
        """
        set_current_device(self._id)

    def __enter__(self) -> Device:
        stack: List[Optional[int]] = self._local.__dict__.setdefault("stack", [])
        previous = current_device_id()
        self.set_current()  # may refuse the id: only then is there an __exit__ to undo it
        stack.append(previous)
        return self

    def __exit__(self, *exc: object) -> None:
        previous = self._local.stack.pop()
        if previous is not None and previous != self._id:
            set_current_device(previous)

    def synchronize(self) -> None:
        """Wait for all work queued on this device's streams."""
        with self:
            _ffi.check_acl(*wait_for(_ffi.api(), "aclrtSynchronizeDeviceWithTimeout", "aclrtSynchronizeDevice", (),
                                     -1, AclErrorCode.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT))

    def memory_info(self) -> Tuple[int, int]:
        """``(free, total)`` device memory in bytes."""
        free = _ffi.new("size_t *")
        total = _ffi.new("size_t *")
        with self:
            _ffi.check_acl(_ffi.api().aclrtGetMemInfo(1, free, total), "aclrtGetMemInfo")  # ACL_HBM_MEM
        return int(free[0]), int(total[0])

    def create_stream(self, *, priority: int = 0) -> Stream:
        """A new stream on this device (``priority`` 0..7, 0 is the default)."""
        from ._stream import Stream

        return Stream._create(self, priority)

    def can_access_peer(self, peer: DeviceLike) -> bool:
        """Whether this device can reach ``peer``'s memory (``aclrtDeviceCanAccessPeer``).

        Raises
        ------
        ValueError
            ``peer`` is this device.
        UnsupportedError
            On a CANN without peer access.
        """
        other = self._peer(peer, "aclrtDeviceCanAccessPeer")
        can = _ffi.new("int32_t *")
        _ffi.check_acl(_ffi.api().aclrtDeviceCanAccessPeer(can, self._id, other._id), "aclrtDeviceCanAccessPeer")
        return bool(can[0])

    def enable_peer_access(self, peer: DeviceLike) -> None:
        """Let this device reach ``peer``'s memory (``aclrtDeviceEnablePeerAccess``; one direction:
        ``peer.enable_peer_access(self)`` opens the other). Makes this device current on the
        calling thread.

        Raises
        ------
        ValueError
            ``peer`` is this device.
        AclError
            Access was already enabled, or the devices cannot reach each other.
        """
        other = self._peer(peer, "aclrtDeviceEnablePeerAccess")
        with self:
            _ffi.check_acl(_ffi.api().aclrtDeviceEnablePeerAccess(other._id, 0), "aclrtDeviceEnablePeerAccess")

    def disable_peer_access(self, peer: DeviceLike) -> None:
        """Take back :meth:`enable_peer_access` (``aclrtDeviceDisablePeerAccess``)."""
        other = self._peer(peer, "aclrtDeviceDisablePeerAccess")
        with self:
            _ffi.check_acl(_ffi.api().aclrtDeviceDisablePeerAccess(other._id), "aclrtDeviceDisablePeerAccess")

    def _peer(self, peer: DeviceLike, function: str) -> Device:
        """``peer`` as another device, checked before ``function`` is called."""
        other = Device(peer)
        if other is self:
            raise ValueError(f"peer={peer!r} is this device; peer access is between two devices")
        if not _ffi.api().present.get(function):
            raise UnsupportedError(f"{function} (CANN 8.x) is not in the loaded CANN")
        return other

    def create_event(self, *, timing: bool = True, ipc: bool = False) -> Event:
        """A new event on this device; ``timing=False`` events cannot measure elapsed time;
        ``ipc=True`` events can be waited for by other processes (:meth:`Event.ipc_handle`)."""
        from ._event import Event

        if not isinstance(timing, bool):
            raise TypeError(f"timing={timing!r} must be True or False")
        if not isinstance(ipc, bool):
            raise TypeError(f"ipc={ipc!r} must be True or False")
        return Event._create(self, timing, ipc)

    @property
    def default_stream(self) -> Stream:
        """A stream hcclpy creates per device and process, used wherever ``stream=None``.

        Every communicator of the device in the process shares it: communicators used concurrently
        from several threads must each pass a ``stream=`` of their own (work queued in crossed
        orders on one stream deadlocks). Queued work that failed makes a stream fail for good; a
        default stream that did (as a synchronisation or query raised) is replaced by a new one
        here, so a communicator created after the failure starts on a working stream. The failed
        one is closed (destroyed once its work has ended).
        """
        stream = self._default_streams.get(self._id)
        if stream is None or stream._live_device < 0 or stream._failed:
            with self._lock:
                stream = self._default_streams.get(self._id)
                if stream is None or stream._live_device < 0 or stream._failed:
                    if stream is not None:
                        # Closed, so that the operations' cached default stream is seen as stale
                        # (they look again when theirs is closed) and nothing is queued on it again.
                        try:
                            stream._close(wait=False)
                        except HcclpyError:  # its failure was reported already; the new stream matters
                            pass
                    stream = self.create_stream()
                    self._default_streams[self._id] = stream
        return stream


DeviceLike = Union[int, "np.integer[Any]", Device]
"""What a ``device`` argument takes: a logical device id (an ``int``, NumPy's too) or a
:class:`Device`."""


def _forget_streams_after_fork() -> None:
    # Streams of the parent process do not exist in a forked child.
    Device._default_streams = {}
    Device._lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_streams_after_fork)
