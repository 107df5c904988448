"""Work objects and the ordered executor that runs a process group's host-staged operations.

Operations on CPU tensors block while they run (their data is staged through device memory), so
they run on an :class:`Executor`: one thread per process group that runs tasks in the order they
were issued. A blocking call made while nothing is queued runs in the calling thread instead,
which saves the thread hand-off on the common path; an ``async_op=True`` call is queued and its
:class:`Work` completes when the executor has run it.
"""

from __future__ import annotations

import collections
import threading
from datetime import timedelta
from typing import Any, Callable, Deque, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.futures import Future

from ..errors import AclError, AclErrorCode
from ._errors import BackendTimeoutError, backend_error, timed_out


# The operation itself fails by the group's timeout (the communicator's exec timeout). A wait
# without a timeout of its own allows it this much longer, so that the failure the operation
# reports (HCCL's function, code and text) is what wait() raises, rather than a bare timeout of
# the wait that happened to expire first.
_OUTCOME_GRACE = 2.0


def seconds(timeout: Any, default: float) -> float:
    """A wait limit in seconds: ``timeout`` (a timedelta or seconds) when positive, else ``default``."""
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    return float(timeout) if timeout is not None and timeout > 0 else default


class Work(dist.Work):
    """The handle of one operation: ``wait()``, ``is_completed()``, ``get_future()``, ``result()``.

    ``wait()`` blocks until the operation has finished (at most the process group's timeout, or the
    ``timeout`` given) and raises the operation's exception if it failed.
    """

    def __init__(self, description: str, outputs: List[torch.Tensor], timeout: float,
                 on_wait: Optional[Callable[[], None]] = None) -> None:
        super().__init__()
        self._description = description
        self._outputs = outputs
        self._timeout = timeout
        self._on_wait = on_wait  # starts the operation when it waits for a wait (held sends)
        self._done = threading.Event()  # set once the outcome is known and the future settled
        self._finished = False  # the outcome is known (under _lock)
        self._error: Optional[BaseException] = None
        self._future: Optional[Future] = None
        self._lock = threading.Lock()

    # Called by whoever ran the operation.
    def finish(self, error: Optional[BaseException] = None) -> None:
        """Record the outcome (the first one stands), settle the future if one was asked for, then
        let ``wait()`` return: a future taken before ``wait()`` is done when it returns.

        Settling a future runs its callbacks (``then``), which may queue operations of this
        process group and wait for them, as DDP's communication hooks do. On the executor's
        thread that would wait forever for the thread itself, so there a thread of its own settles
        it."""
        if error is not None:
            error = backend_error(error, self._description)  # hcclpy's failures reach torch users as DistBackendError
        with self._lock:
            if self._finished:
                return
            self._finished, self._error = True, error
            future = self._future
        if future is None:
            self._done.set()
        elif getattr(_executor_thread, "running", False):
            threading.Thread(target=self._settle, args=(future,), name="hcclpy-future", daemon=True).start()
        else:
            self._settle(future)

    def _settle(self, future: Future) -> None:
        try:
            _settle(future, self._outputs, self._error)
        finally:
            self._done.set()

    def _start(self) -> None:
        on_wait, self._on_wait = self._on_wait, None
        if on_wait is not None:
            on_wait()

    def wait(self, timeout: Any = None) -> bool:
        """Block until the operation has finished; True, or its exception raised.

        Parameters
        ----------
        timeout
            The longest wait (seconds or a ``timedelta``); None: the process group's timeout.

        Raises
        ------
        BackendTimeoutError
            If the operation has not finished in time.
        BackendError
            If the operation failed.
        """
        self._start()
        limit = seconds(timeout, self._timeout + _OUTCOME_GRACE)
        if not self._done.wait(limit):
            raise self._timed_out(limit)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """Whether the operation has finished (successfully or not), without waiting."""
        self._start()
        return self._done.is_set()

    def _timed_out(self, limit: float) -> BackendTimeoutError:
        return BackendTimeoutError(f"{self._description}: " + timed_out(
            f"not finished within {limit:g} s: the timeout given to wait, or else the process group's timeout and "
            f"{_OUTCOME_GRACE:g} s for the operation to report its own failure"))

    def is_success(self) -> bool:
        """Whether the operation has finished without an error."""
        return self._done.is_set() and self._error is None

    def exception(self) -> Optional[BaseException]:
        """The operation's exception, or None (not finished, or succeeded)."""
        return self._error

    def result(self) -> List[torch.Tensor]:
        """Wait (as :meth:`wait`), then return the operation's output tensors."""
        self.wait()
        return self._outputs

    def get_future(self) -> Future:
        """A ``torch.futures.Future`` completed with the output tensors (or the exception) when the
        operation finishes, as DDP's communication hooks use it."""
        self._start()
        with self._lock:
            created = self._future is None
            if created:
                self._future = Future()
            settle_now = created and self._finished  # finish() found no future to settle
        if settle_now:
            _settle(self._future, self._outputs, self._error)
        return self._future

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self._done.is_set() else "pending"
        return f"<hcclpy.torch.Work {self._description} ({state})>"


class EventWork(Work):
    """The Work of an operation queued on a device stream: done when ``event`` (recorded after
    it) has completed. ``wait()`` blocks the host until then; a future is completed by a watcher
    thread started when first asked for."""

    def __init__(self, description: str, outputs: List[torch.Tensor], timeout: float, event: Any) -> None:
        super().__init__(description, outputs, timeout)
        self._event = event
        self._watcher: Optional[threading.Thread] = None

    def _settle_from_event(self, timeout: float) -> None:
        """Finish once the event completes; a wait that gives up first raises BackendTimeoutError
        and leaves the Work pending (the operation goes on, and may yet succeed)."""
        try:
            self._event.synchronize(timeout)
        except AclError as exc:
            if exc.code == AclErrorCode.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT:
                raise self._timed_out(timeout) from exc
            self.finish(exc)  # the operation failed
        except BaseException as exc:
            self.finish(exc)
        else:
            self.finish()

    def _watch(self) -> None:
        """The watcher thread of the future: the group's timeout ends the operation for it."""
        try:
            self._settle_from_event(self._timeout)
        except BackendTimeoutError as exc:
            self.finish(exc)

    def wait(self, timeout: Any = None) -> bool:
        if not self._finished:
            self._settle_from_event(seconds(timeout, self._timeout + _OUTCOME_GRACE))
        return super().wait(timeout)

    def is_completed(self) -> bool:
        if not self._done.is_set():
            try:
                reached = self._event.query()
            except BaseException as exc:  # the stream failed before the event: done, with that failure
                self.finish(exc)
            else:
                if reached:
                    self.finish()
        return self._done.is_set()

    def get_future(self) -> Future:
        future = super().get_future()
        with self._lock:
            if not self._finished and self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="hcclpy-event-work", daemon=True)
                self._watcher.start()
        return future


def _settle(future: Future, outputs: List[torch.Tensor], error: Optional[BaseException]) -> None:
    if error is None:
        future.set_result(outputs)
    else:
        future.set_exception(error)


class Done(dist.Work):
    """The Work of an operation that succeeded before it was returned (a blocking call on the
    short path): nothing to wait for, so none of :class:`Work`'s events and locks, which would
    cost more than the operation."""

    def __init__(self, outputs: List[torch.Tensor]) -> None:
        super().__init__()
        self._outputs = outputs

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Optional[BaseException]:
        return None

    def result(self) -> List[torch.Tensor]:
        return self._outputs

    def get_future(self) -> Future:
        future: Future = Future()
        future.set_result(self._outputs)
        return future

    def __repr__(self) -> str:
        return "<hcclpy.torch.Work (done)>"


_executor_thread = threading.local()  # running: this thread is an executor's (see Work.finish)


class Executor:
    """Runs tasks one at a time, in submission order, on a thread of its own (started when first
    needed); a blocking task submitted while the executor is idle runs in the caller's thread.

    Two conditions share one lock, so that each wake-up has a reason: the thread waits on
    ``_queued`` for tasks, :meth:`drain` waits on ``_idle``. A task run in the caller's thread
    (:meth:`claim` ... :meth:`release`) wakes neither when nothing is queued and nobody drains:
    waking the idle thread for nothing would cost a thread switch per call."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._queued = threading.Condition(self._lock)  # a task was queued, or the executor closed
        self._idle = threading.Condition(self._lock)  # nothing runs: drain() looks again
        self._queue: Deque[Tuple[Callable[[], None], Work]] = collections.deque()
        self._busy = False  # a task is running (here or in the caller's thread)
        self._draining = 0  # threads in drain(): a task's end with none to tell skips notify_all
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def submit(self, task: Callable[[], None], work: Work, *, blocking: bool) -> Work:
        """Run ``task`` after everything submitted before; ``work`` finishes with its outcome."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"process group {self._name} has been shut down")
            inline = blocking and not self._busy and not self._queue
            if inline:
                self._busy = True
            else:
                self._queue.append((task, work))
                self._start_thread()
                self._queued.notify()
        if inline:
            try:
                _run(task, work)
            finally:
                self.release()
        return work

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"hcclpy-{self._name}", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        _executor_thread.running = True
        while True:
            with self._lock:
                while self._busy or not self._queue:
                    if self._closed and not self._queue:
                        return
                    self._queued.wait(1.0)
                task, work = self._queue.popleft()
                self._busy = True
            try:
                _run(task, work)
            finally:
                with self._lock:
                    self._finished()

    def _finished(self) -> None:
        """A task ended (the lock is held): let the next one run, and tell who drains."""
        self._busy = False
        if self._draining:
            self._idle.notify_all()

    def claim(self) -> bool:
        """Take the executor for a task the caller runs itself, if nothing runs or waits (False
        otherwise: the task must be submitted, to keep the order); :meth:`release` gives it back."""
        with self._lock:
            if self._busy or self._queue or self._closed:
                return False
            self._busy = True
            return True

    def release(self) -> None:
        with self._lock:
            self._finished()
            if self._queue:  # queued by other threads meanwhile, while the executor was claimed
                self._start_thread()
                self._queued.notify()

    def drain(self, timeout: float) -> bool:
        """Wait until every submitted task has run; False if ``timeout`` seconds passed first."""
        with self._lock:
            self._draining += 1
            try:
                return self._idle.wait_for(lambda: not self._busy and not self._queue, timeout)
            finally:
                self._draining -= 1

    def close(self, timeout: float) -> None:
        """Run what is queued (for at most ``timeout`` seconds), then stop the thread."""
        self.drain(timeout)
        with self._lock:
            self._closed = True
            self._queued.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)


def _run(task: Callable[[], None], work: Work) -> None:
    try:
        task()
    except BaseException as exc:  # the operation's failure belongs to its Work
        work.finish(exc)
    else:
        work.finish()
