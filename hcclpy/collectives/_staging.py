"""Device scratch memory for operations on NumPy arrays, one set per communicator.

An operation whose buffers are NumPy arrays runs as on device buffers: its inputs are copied to
scratch buffers of the communicator's device, the same C call runs on a stream of hcclpy's own,
and its outputs are copied back into the arrays (see :func:`hcclpy.collectives._calls.launch`).
The scratch grows to the largest size used, in steps, so steady-state calls allocate nothing;
:func:`release` gives it back.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Dict, Optional, Set, Tuple

from .._comm_core import CommCore
from ..errors import AclError, HcclpyError
from ..runtime import DeviceArray, Stream, empty
from ..runtime._waits import seconds
from ..types import DataType
from . import _group

if TYPE_CHECKING:
    from ..communicator import Communicator

__all__ = ["Staging", "release"]


def _size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to one of 8 steps per power of two: sizes that grow a little at a
    time reallocate rarely, and at most an eighth of a buffer is never used."""
    nbytes = max(nbytes, 1)
    step = 1 << max((nbytes - 1).bit_length() - 4, 0)
    return -(-nbytes // step) * step


class Staging:
    """A communicator's stream and scratch buffers for NumPy arrays.

    A call takes it with :func:`acquire`, locked, and gives it back with :func:`give_back`."""

    def __init__(self, comm: CommCore) -> None:
        # Calls from several threads take turns. An RLock knows its owner: a signal handler that
        # interrupts a call on this thread can be told from another thread's call (see release),
        # and a lock an interrupt left taken can be given back.
        self.lock = threading.RLock()
        self.closed = False
        self.close_pending = False  # release() asked while a call held it: that call closes it when it ends
        # A call ended by an exception (Ctrl-C in a wait, say) may have left work queued on the
        # stream that still reads or writes the scratch: the next call waits for it first.
        self.unsettled = False
        self.in_use: Set[str] = set()  # the scratch slots the call holding the lock has taken
        self.device = comm.device
        self.stream: Stream = self.device.create_stream()
        self._buffers: Dict[str, DeviceArray] = {}
        self._views: Dict[Tuple[str, int, DataType], DeviceArray] = {}

    def buffer(self, slot: str, count: int, dtype: DataType) -> DeviceArray:
        """``count`` elements of scratch named ``slot`` (reused; grown in steps of at most an eighth).

        When the device has no room for a larger buffer, the scratch of the slots the current call
        has not used is given back, and the allocation tried once more at the exact size."""
        self.in_use.add(slot)
        key = (slot, count, dtype)
        view = self._views.get(key)
        if view is not None:  # jobs repeat their sizes: most calls end here
            return view
        nbytes = max(count * dtype.itemsize, 1)
        current = self._buffers.get(slot)
        if current is None or current.nbytes < nbytes:
            if current is not None:
                current.close()
                self._views = {k: v for k, v in self._views.items() if k[0] != slot}
                del self._buffers[slot]
            try:
                current = empty(_size_class(nbytes), "uint8", device=self.device)
            except AclError:  # no room: give back the scratch this call does not use, ask for the exact size
                for name in [name for name in self._buffers if name not in self.in_use]:
                    self._buffers.pop(name).close()
                self._views = {k: v for k, v in self._views.items() if k[0] in self._buffers}
                current = empty(nbytes, "uint8", device=self.device)
            self._buffers[slot] = current
        if len(self._views) >= 64:  # bounded: a job that varies its sizes endlessly keeps 64 views
            self._views.clear()
        view = self._views[key] = current[: count * dtype.itemsize].view(dtype)
        return view

    def wait(self) -> None:
        """Wait until the stream's work is done (or raise its failure). Ctrl-C can end the wait
        (see :mod:`hcclpy.runtime._waits`): the work stays queued, and the next call waits for it
        first (``unsettled``)."""
        self.stream._synchronize(-1)

    def renew_stream(self) -> None:
        """Put a new stream in the place of a failed one (every wait on which fails)."""
        failed, self.stream = self.stream, self.device.create_stream()
        try:
            failed._close(wait=False)
        except HcclpyError:  # its failure was raised by the call it failed
            pass

    def close(self) -> None:
        self.closed = True
        try:
            self.stream.close()  # first: it waits for queued work that may still use the scratch
        finally:  # a failed stream reports its failure on closing: the rest goes all the same
            self._views.clear()
            for buf in self._buffers.values():
                buf.close()
            self._buffers.clear()


# Re-entrant: a signal handler that releases a staging may interrupt this thread while it makes one.
_creating = threading.RLock()


def acquire(comm: CommCore) -> Staging:
    """The communicator's staging with its lock taken (give it back with :func:`give_back`). One
    that :func:`release` closed while this thread waited for the lock is replaced by a new one; a
    communicator being destroyed is refused as a destroyed one is."""
    if _group.active():
        # The call would copy out a result the deferred operation has not produced yet.
        raise RuntimeError("NumPy arrays cannot be used inside hcclpy.group(): their calls block until the result "
                           "is back, but the group's operations run only when it ends. Use device arrays "
                           "(hcclpy.DeviceArray) in the group, or make this call outside it")
    while True:
        if comm._handle is None or comm._closing:
            comm._refuse_use()
        staging = comm._host_state or _new(comm)
        lock = staging.lock
        if lock._is_owned():
            # This thread is inside a NumPy call on the communicator already: a signal handler
            # interrupted it. Taking the RLock again would hand the same scratch to both calls.
            raise RuntimeError(f"a NumPy operation on communicator '{comm._name}' cannot run while this thread is "
                               "inside another one (a signal handler interrupted it); run it after that call ends")
        try:
            lock.acquire()
            if staging.close_pending and not staging.closed:
                staging.close()  # release() gave up on it while this call waited: closing it falls to us
            if not (staging.closed or comm._closing):
                staging.in_use.clear()
                if staging.unsettled:  # the work a call ended by an exception left queued ends first
                    try:
                        staging.wait()
                    except HcclpyError:
                        # It failed, and the stream with it for good. The call said so, or HCCL
                        # will, with the cause, if the communicator is broken: start afresh.
                        staging.renew_stream()
                    staging.unsettled = False
                return staging
            lock.release()
        except BaseException:
            # An exception (KeyboardInterrupt, a signal handler's) right after the lock was taken:
            # give it back, or every later call and destroy() would wait for it forever.
            if lock._is_owned():
                lock.release()
            raise


def give_back(staging: Staging) -> None:
    """Give back the staging :func:`acquire` took; close it if :func:`release` asked to meanwhile
    (from a signal handler on this thread, or another thread that could not wait)."""
    staging.lock.release()
    if staging.close_pending:
        close(staging, 0)


def _new(comm: CommCore) -> Staging:
    """The communicator's staging, made if it has none."""
    with _creating:
        if comm._closing:  # destroy() has begun: a staging made now would outlive the communicator
            comm._refuse_use()
        state = comm._host_state
        if state is None:
            state = comm._host_state = Staging(comm)
    return state


def release(comm: Communicator, timeout: Optional[float] = None) -> bool:
    """Give back a communicator's staging memory (device scratch and its stream).

    The scratch grows to the largest array staged; after a one-off large operation this returns it
    without destroying the communicator. The next NumPy call allocates what it needs again.
    ``Communicator.destroy`` calls it.

    Parameters
    ----------
    comm
        The communicator.
    timeout
        Seconds to wait at most for a NumPy call on another thread that is using the staging to
        end; None (the default) waits until it ends (by its exec timeout at the latest).

    Returns
    -------
    bool
        True when the memory is given back; False when a NumPy call still holds it (another
        thread's, past ``timeout``, or this thread's, interrupted by a signal handler that called
        this): that call gives it back when it ends.

    Raises
    ------
    TypeError
        If ``comm`` is not a communicator, or ``timeout`` is neither None nor a number.
    ValueError
        If ``timeout`` is negative, NaN or infinite.

    Examples
    --------
    >>> hcclpy.host.release(comm)   # after a one-off 4 GiB all_reduce of a NumPy array
    True
    """
    if not isinstance(comm, CommCore):
        raise TypeError(f"comm must be an hcclpy.Communicator, got {type(comm).__name__}")
    timeout = seconds(timeout, finite=True)
    staging = detach(comm)
    return staging is None or close(staging, timeout)


def detach(comm: CommCore) -> Optional[Staging]:
    """Take the staging off ``comm`` (the next NumPy call makes a new one) and return it."""
    with _creating:
        staging, comm._host_state = comm._host_state, None
    return staging


def close(staging: Staging, timeout: Optional[float]) -> bool:
    """Close ``staging`` once no call holds it: wait ``timeout`` seconds at most (None: no limit)
    for the call holding it. False when one still does: it closes the staging when it ends."""
    # Set before trying the lock: a call that gives it back after the try sees the flag (give_back).
    staging.close_pending = True
    lock = staging.lock
    if lock._is_owned():  # a signal handler on the thread inside a call: the call's scratch stays
        return False
    if not lock.acquire(timeout=-1 if timeout is None else timeout):
        return False
    try:
        if not staging.closed:
            staging.close()
    finally:
        lock.release()
    return True
