"""Lifetimes of runtime objects and communicators: close/destroy, context managers, the garbage
collector's safety net, locked constructors, borrowed streams, events, devices, RootInfo pickling."""

from __future__ import annotations

import gc
import pickle
import re
import threading
import warnings
from typing import Any, Callable, List

import numpy as np
import pytest

import hcclpy
import ranks
from hcclpy import _ffi


@pytest.fixture
def comm():
    c = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    yield c
    c.destroy()


def _no_resource_warning(action: Callable[[], Any]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


def _in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a fresh thread (its own current device) and return its result or raise."""
    out: List[Any] = []

    def body() -> None:
        try:
            out.append(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001
            out.append(("error", exc))

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(30)
    assert out, "thread did not finish"
    kind, value = out[0]
    if kind == "error":
        raise value
    return value


# ------------------------------------------------------------------------ constructors

@pytest.mark.parametrize("cls", [hcclpy.Stream, hcclpy.Event, hcclpy.DeviceArray])
def test_constructors_are_locked(cls: type) -> None:
    with pytest.raises(TypeError, match="create"):
        cls()
    with pytest.raises(TypeError):
        cls(0, device=0)


# ------------------------------------------------------------------------------ streams

def test_stream_close_twice_and_use_after_close() -> None:
    stream = hcclpy.Device(0).create_stream()
    assert not stream.closed and stream.owned and stream.device == hcclpy.Device(0)
    assert isinstance(stream.handle, int) and stream.handle > 0
    stream.close()
    stream.close()
    assert stream.closed and "closed" in repr(stream)
    event = hcclpy.Device(0).create_event()
    for use in (stream.synchronize, stream.query, lambda: stream.handle, lambda: stream.record(),
                lambda: stream.wait_event(event), lambda: stream.__enter__(), lambda: event.record(stream)):
        with pytest.raises(ValueError, match="closed Stream"):
            use()
    event.close()


def test_stream_with_block_closes() -> None:
    with hcclpy.Device(0).create_stream() as stream:
        x = hcclpy.zeros(8, "int32", device=0)
        x.fill_zero(stream=stream)
        stream.synchronize()
    assert stream.closed


def test_stream_priority_and_timeout_arguments() -> None:
    device = hcclpy.Device(0)
    with device.create_stream(priority=3) as stream:
        stream.synchronize(timeout=1.5)
        assert stream.query()
        with pytest.raises(ValueError, match="timeout"):
            stream.synchronize(timeout=-1)
        with pytest.raises(TypeError, match=r"^timeout='1' must be None \(no limit\) .*, not a str$"):
            stream.synchronize(timeout="1")
        with pytest.raises(ValueError, match=r"timeout=nan must be None \(no limit\) or a number of seconds"):
            stream.synchronize(timeout=float("nan"))
        stream.synchronize(timeout=float("inf"))  # no limit, as None
        done = stream.record()
        with pytest.raises(ValueError, match="timeout=nan"):
            done.synchronize(timeout=float("nan"))
        done.synchronize(timeout=float("inf"))
        with pytest.raises(TypeError, match="event"):
            stream.wait_event("not an event")
        with pytest.raises(TypeError, match="event"):
            stream.record("not an event")
    for priority in (8, -1, True, 1.0):
        with pytest.raises(ValueError, match="priority"):
            device.create_stream(priority=priority)


def test_collected_stream_warns() -> None:
    stream = hcclpy.Device(0).create_stream()
    with pytest.warns(ResourceWarning, match="unclosed hcclpy.Stream"):
        del stream
        gc.collect()



def _holds(stream: hcclpy.Stream, array: hcclpy.DeviceArray) -> bool:
    """Whether ``stream`` keeps ``array``'s memory alive for queued work."""
    from hcclpy.runtime import _stream

    return any(_stream.holds(item, array._alloc) for item in stream._held)


def test_buffers_of_drained_work_are_let_go_without_a_synchronize(comm: hcclpy.Communicator) -> None:
    # A stream keeps the buffers of queued operations alive; a job that only ever waits on events
    # must not make that list grow without end once the work is done.
    from hcclpy.runtime._stream import HOLD_CHECK

    stream = hcclpy.Device(0).create_stream()
    a = hcclpy.zeros(4, "float32", device=0)
    b = hcclpy.zeros(4, "float32", device=0)
    longest = 0
    for i in range(3 * HOLD_CHECK):
        if i % 3:  # two buffers held per call, then one: the check must not depend on landing on a count
            comm.all_reduce(a, b, stream=stream)
        else:
            comm.broadcast(a, 0, stream=stream)
        if i % 100 == 99:
            stream.record().synchronize()  # the work so far is done, but the stream is not synchronised
        longest = max(longest, len(stream._held) + sum(len(segment) for _, segment in stream._sealed))
    # Sealed at each check, let go at the next one once an event passed the seal: two checks' worth.
    assert longest <= 2 * HOLD_CHECK + 2, f"{longest} buffers held for work that was done"
    temporary = hcclpy.zeros(4, "float32", device=0)
    comm.all_reduce(temporary, stream=stream)
    assert _holds(stream, temporary), "a queued operation's buffer was let go"
    stream.synchronize()
    assert not stream._held and not stream._sealed
    stream.close()


def test_queued_copies_keep_their_arrays_alive() -> None:
    # A temporary passed to a copy or a memset on a stream must outlive the queued work, as the
    # buffers of a queued collective do: freed early, its memory could be reused under the copy.
    stream = hcclpy.Device(0).create_stream()
    values = np.arange(1 << 16, dtype=np.float32)
    pinned = hcclpy.pinned_empty(values.shape, "float32")
    pinned[:] = values
    dst = hcclpy.zeros(values.size, "float32", device=0)
    dst.copy_from(hcclpy.from_numpy(values, device=0), stream=stream)  # a temporary device source
    hcclpy.zeros(4, "float32", device=0).fill_zero(stream=stream)  # a temporary target
    hcclpy.zeros(values.size, "float32", device=0).copy_from(pinned, stream=stream)
    gc.collect()
    kinds = [type(held).__name__ for held in stream._held]
    assert kinds.count("DeviceArray") == 4 and kinds.count("ndarray") == 1, kinds  # dst and three temporaries
    stream.synchronize()
    assert not stream._held
    np.testing.assert_array_equal(dst.to_numpy(), values)
    stream.close()
    dst.close()


def test_a_synchronisation_keeps_what_is_queued_while_it_waits(comm: hcclpy.Communicator) -> None:
    # Another thread may queue work on the stream while this one waits for it: that work is not
    # done when the wait ends, so its buffers must stay held.
    stream = hcclpy.Device(0).create_stream()
    early, late = hcclpy.zeros(4, "float32", device=0), hcclpy.zeros(4, "float32", device=0)
    comm.all_reduce(early, stream=stream)
    wait = stream._sync

    def wait_while_another_thread_queues(handle: Any, ms: int) -> int:
        rc = wait(handle, ms)
        comm.all_reduce(late, stream=stream)
        return rc

    stream._sync = wait_while_another_thread_queues
    stream.synchronize()
    stream._sync = wait
    assert _holds(stream, late), "work queued during the wait lost its buffers"
    assert not _holds(stream, early)
    stream.synchronize()
    assert not stream._held
    stream.close()


def test_borrowed_stream_is_never_destroyed(comm: hcclpy.Communicator) -> None:
    owner = hcclpy.Device(0).create_stream()
    borrowed = hcclpy.Stream.from_handle(owner.handle, device=0, owner=owner)
    assert not borrowed.owned and borrowed.handle == owner.handle and "borrowed" in repr(borrowed)
    x = hcclpy.from_numpy(np.arange(6, dtype=np.float32), device=0)
    comm.all_reduce(x, None, "sum", stream=borrowed)
    borrowed.synchronize()
    borrowed.close()
    assert borrowed.closed
    # The underlying stream still works.
    comm.all_reduce(x, None, "max", stream=owner)
    owner.synchronize()
    assert owner.query()
    # A collected borrowed stream neither warns nor destroys.
    _no_resource_warning(lambda: hcclpy.Stream.from_handle(owner.handle, device=0))
    owner.synchronize()
    owner.close()


@pytest.mark.parametrize("handle", [0, -1, True, "0x1", 1.0, None])
def test_from_handle_rejects_bad_handles(handle: Any) -> None:
    with pytest.raises(ValueError, match="handle"):
        hcclpy.Stream.from_handle(handle, device=0)


# ------------------------------------------------------------------------------- events

def test_events_record_query_synchronize_elapsed() -> None:
    device = hcclpy.Device(0)
    with device.create_stream() as stream:
        start = stream.record()
        assert isinstance(start, hcclpy.Event) and start.device == device
        x = hcclpy.zeros(1 << 20, "float32", device=0)
        for _ in range(4):
            x.fill_zero(stream=stream)
        end = device.create_event()
        end.record(stream)
        end.synchronize(timeout=30)
        assert end.query() and start.query()
        elapsed = start.elapsed_time(end)
        assert isinstance(elapsed, float) and elapsed >= 0.0
        # Another stream waits for the event.
        with device.create_stream() as other:
            other.wait_event(end)
            other.synchronize()
        end.synchronize()  # no timeout
        assert isinstance(end.handle, int)
        with pytest.raises(TypeError, match="end"):
            start.elapsed_time("end")
        with pytest.raises(TypeError, match="stream"):
            start.record("stream")
        with pytest.raises(ValueError, match="timeout"):
            end.synchronize(timeout=-3)
        untimed = device.create_event(timing=False)
        untimed.record(stream)
        untimed.synchronize()
        with pytest.raises(ValueError, match="timing=True"):
            start.elapsed_time(untimed)
        fresh = device.create_event()
        with pytest.raises(ValueError, match=r"needs both events recorded .*; not recorded: end$"):
            start.elapsed_time(fresh)
        with pytest.raises(ValueError, match=r"not recorded: the start event$"):
            fresh.elapsed_time(start)
        for event in (start, end, untimed, fresh):
            event.close()


def test_event_record_on_default_stream() -> None:
    with hcclpy.Device(1).create_event() as event:
        event.record()
        event.synchronize()
        assert event.query()
    assert event.closed


def test_event_close_twice_and_use_after_close() -> None:
    event = hcclpy.Device(0).create_event()
    event.close()
    event.close()
    assert event.closed
    stream = hcclpy.Device(0).create_stream()
    other = hcclpy.Device(0).create_event()
    for use in (event.query, event.synchronize, lambda: event.handle, lambda: event.record(stream),
                lambda: stream.wait_event(event), lambda: other.elapsed_time(event)):
        with pytest.raises(ValueError, match="closed Event"):
            use()
    other.close()
    stream.close()


def test_collected_event_warns() -> None:
    event = hcclpy.Device(0).create_event()
    with pytest.warns(ResourceWarning, match="unclosed hcclpy.Event"):
        del event
        gc.collect()


# -------------------------------------------------------------------------- device arrays

@pytest.mark.parametrize("dtype", ranks.DTYPES)
def test_device_array_round_trip(dtype: str) -> None:
    data = ranks.make_input("roundtrip", 0, 24, dtype).reshape(2, 3, 4)
    a = hcclpy.from_numpy(data, device=2)
    assert (a.shape, a.size, a.ndim, a.device) == ((2, 3, 4), 24, 3, hcclpy.Device(2))
    assert a.dtype == hcclpy.DataType[{"float16": "FP16", "float32": "FP32", "float64": "FP64",
                                       "bfloat16": "BFP16"}.get(dtype, dtype.upper())]
    assert a.nbytes == data.nbytes and a.itemsize == data.itemsize
    assert ranks.mismatch("round trip", a.to_numpy(), data) is None
    assert ranks.mismatch("view", a[1].to_numpy(), data[1]) is None
    assert ranks.mismatch("slice", a[0:1].reshape(-1).to_numpy(), data[0].reshape(-1)) is None
    b = hcclpy.empty((2, 3, 4), dtype, device=2)
    b.copy_from(a)
    assert ranks.mismatch("device copy", b.to_numpy(), data) is None
    a.close()
    b.close()


def test_device_array_close_and_views() -> None:
    a = hcclpy.zeros(10, "int32", device=0)
    view = a[2:5]
    assert view.shape == (3,) and view.ptr == a.ptr + 8
    with pytest.raises(IndexError, match="contiguous"):
        a[::2]
    with pytest.raises(IndexError):
        a[10]
    with pytest.raises(TypeError):
        a["x"]
    for convert in (np.asarray, np.array):  # not an object array of element views
        with pytest.raises(TypeError, match=r"device memory, which NumPy cannot read.*\.to_numpy\(\)"):
            convert(a)
    # NumPy's operators leave device arrays alone: no element-wise attempt, no warning.
    structured = np.zeros(3, dtype=[("x", "f4"), ("y", "i8")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (structured == a) is False and (np.zeros(10, np.int32) == a) is False
    with pytest.raises(TypeError, match="does not support ufuncs"):
        np.add(a, 1)
    with a:
        pass
    assert a.closed and view.closed  # every view of the memory
    a.close()
    for use in (a.to_numpy, lambda: a.ptr, view.to_numpy, lambda: a.copy_from(np.zeros(10, np.int32)),
                a.fill_zero):
        with pytest.raises(ValueError, match="closed DeviceArray"):
            use()


def test_device_array_copy_arguments() -> None:
    a = hcclpy.zeros(4, "float32", device=0)
    with pytest.raises(TypeError, match="src.dtype"):
        a.copy_from(np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="src has 5 elements"):
        a.copy_from(np.zeros(5, np.float32))
    with pytest.raises(TypeError, match="src"):
        a.copy_from([0.0, 1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        a.copy_to(ro)
    with pytest.raises(ValueError, match="C-contiguous"):
        a.copy_to(np.zeros(8, np.float32)[::2])
    a.copy_from(np.arange(8, dtype=np.float32)[::2])  # non-contiguous host source: copied
    assert a.to_numpy().tolist() == [0.0, 2.0, 4.0, 6.0]
    with pytest.raises(ValueError):
        a.reshape(3)
    assert a.reshape(2, -1).shape == (2, 2)


def test_collected_device_array_does_not_warn() -> None:
    _no_resource_warning(lambda: hcclpy.zeros(16, "uint8", device=0))


def test_pinned_memory_async_copies() -> None:
    host = hcclpy.pinned_empty((3, 4), "float32")
    assert isinstance(host, np.ndarray) and host.shape == (3, 4) and host.dtype == np.float32
    host[...] = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = hcclpy.empty((3, 4), "float32", device=0)
    back = hcclpy.pinned_empty((3, 4), "float32")
    with hcclpy.Device(0).create_stream() as stream:
        a.copy_from(host, stream=stream)
        a.copy_to(back, stream=stream)
        stream.synchronize()
    assert (back == host).all()
    assert hcclpy.pinned_empty(0, "int8").shape == (0,)


# --------------------------------------------------------------------------------- devices

def test_device_identity_and_arguments() -> None:
    assert hcclpy.Device(3) is hcclpy.Device(3) and hcclpy.Device(hcclpy.Device(3)) is hcclpy.Device(3)
    assert int(hcclpy.Device(3)) == 3 and hcclpy.Device(3).id == 3 and repr(hcclpy.Device(3)) == "Device(3)"
    assert hcclpy.device_count() == hcclpy.Device.count() >= 8
    with pytest.raises(ValueError, match="device=-1"):
        hcclpy.Device(-1)
    for bad in ("0", 1.0, True, None):
        with pytest.raises(TypeError, match="device"):
            hcclpy.Device(bad)
    with pytest.raises(ValueError, match="out of range"):
        hcclpy.Device(hcclpy.device_count()).set_current()
    free, total = hcclpy.Device(0).memory_info()
    assert 0 <= free <= total
    hcclpy.Device(0).synchronize()


def test_device_context_restores_the_previous_device() -> None:
    def body() -> List[int]:
        hcclpy.Device(2).set_current()
        seen = [hcclpy.Device.current().id]
        with hcclpy.Device(5) as dev:
            assert dev is hcclpy.Device(5)
            seen.append(hcclpy.Device.current().id)
            with hcclpy.Device(6):
                seen.append(hcclpy.Device.current().id)
                x = hcclpy.zeros(4, "int8")  # allocations use the current device
                seen.append(x.device.id)
            seen.append(hcclpy.Device.current().id)
        seen.append(hcclpy.Device.current().id)
        try:
            with hcclpy.Device(4):
                raise KeyError("inside")
        except KeyError:
            pass
        seen.append(hcclpy.Device.current().id)
        return seen

    assert _in_thread(body) == [2, 5, 6, 6, 5, 2, 2]


def test_current_device_is_per_thread() -> None:
    def first() -> Any:
        before = hcclpy.Device.current()
        hcclpy.Device(7).set_current()
        return before, hcclpy.Device.current().id

    assert _in_thread(first) == (None, 7)
    assert _in_thread(hcclpy.Device.current) is None


# -------------------------------------------------------------------------------- root info

def test_root_info_bytes_and_pickle() -> None:
    info = hcclpy.RootInfo.generate(device=0)
    data = info.to_bytes()
    assert isinstance(data, bytes) and len(data) == 4108
    copy = pickle.loads(pickle.dumps(info))
    assert copy == info and hash(copy) == hash(info) and copy.to_bytes() == data
    assert hcclpy.RootInfo.from_bytes(bytearray(data)) == info
    assert hcclpy.RootInfo(memoryview(data)) == info
    assert info != hcclpy.RootInfo.generate(device=0) and info != data
    assert repr(info).startswith("<hcclpy.RootInfo ")
    # A pickled RootInfo creates a working communicator.
    comm = hcclpy.Communicator(1, copy, 0, device=0)
    comm.destroy()


# ---------------------------------------------------------------------------- communicators

def test_communicator_properties(comm: hcclpy.Communicator) -> None:
    assert (comm.rank, comm.size, comm.device) == (0, 1, hcclpy.Device(0))
    assert isinstance(comm.name, str) and comm.name and comm.name in repr(comm)
    assert isinstance(comm.handle, int) and comm.handle > 0
    assert not comm.destroyed and comm.async_error() is None
    x = hcclpy.from_numpy(np.arange(5, dtype=np.int64), device=0)
    comm.all_reduce(x, None, hcclpy.ReduceOp.PROD)  # default stream
    comm.device.default_stream.synchronize()
    assert x.to_numpy().tolist() == [0, 1, 2, 3, 4]


def test_communicator_destroy_twice_and_use_after_destroy() -> None:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    x = hcclpy.zeros(4, "float32", device=0)
    y = hcclpy.zeros(4, "float32", device=0)
    stream = hcclpy.Device(0).create_stream()
    comm.destroy()
    comm.destroy()
    assert comm.destroyed and "destroyed" in repr(comm)
    uses = [
        lambda: comm.handle, comm.async_error, lambda: comm.split([0]), lambda: comm.__enter__(),
        lambda: comm.all_reduce(x, y, hcclpy.ReduceOp.SUM, stream=stream),  # the fast path
        lambda: comm.all_reduce(x, None, "sum"), lambda: comm.broadcast(x), lambda: comm.reduce(x, y),
        lambda: comm.all_gather(x, y), lambda: comm.reduce_scatter(x, y), lambda: comm.all_to_all(x, y),
        lambda: comm.scatter(x, y), lambda: comm.barrier(), lambda: comm.all_gather_v(x, y, [4]),
        lambda: comm.reduce_scatter_v(x, y, [4]), lambda: comm.all_to_all_v(x, y, [4], [4]),
        lambda: comm.all_to_all_vc(x, y, [[4]]), lambda: comm.send(x, 0), lambda: comm.recv(x, 0),
        lambda: comm.batch_send_recv([]),
    ]
    for use in uses:
        with pytest.raises(ValueError, match="destroyed"):
            use()
    stream.close()


def test_communicator_with_block_destroys() -> None:
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as comm:
        assert not comm.destroyed
    assert comm.destroyed


def test_collected_communicator_warns_and_is_not_destroyed() -> None:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    raw = comm._handle  # the C handle, to look at it after the Python object is gone
    name = comm.name
    with pytest.warns(ResourceWarning, match="without destroy"):
        del comm
        gc.collect()
    bound = _ffi.api()
    size = _ffi.new("uint32_t *")
    assert bound.HcclGetRankSize(raw, size) == 0 and size[0] == 1, "the collector destroyed the communicator"
    text = _ffi.new("char[]", 128)
    assert bound.HcclGetCommName(raw, text) == 0 and _ffi.string(text) == name
    assert bound.HcclCommDestroy(raw) == 0  # clean up by hand


def test_a_group_keeps_its_buffers_until_it_has_run() -> None:
    """Inside hcclpy.group() the operations are not on their streams yet: a synchronisation, a
    query or many held buffers there must not let go of them (their memory would be reused)."""
    comms = hcclpy.Communicator.init_all([0, 1])
    streams = [c.device.create_stream() for c in comms]
    try:
        with hcclpy.group():
            for r, c in enumerate(comms):
                for _ in range(3):
                    _temporary_all_reduce(c, r + 1.0, streams[r])
                streams[r].synchronize()
                streams[r].query()
            gc.collect()
            canaries = [hcclpy.from_numpy(np.full(4096, 7.0, np.float32), device=c.device)
                        for c in comms for _ in range(6)]
            # The group holds its operations' buffers itself until HCCL has queued them.
            assert [len(s._held) for s in streams] == [0, 0]
        assert [len(s._held) for s in streams] == [6, 6]  # from the group's end, the streams hold them
        for s in streams:
            s.synchronize()
        assert all((c.to_numpy() == 7.0).all() for c in canaries), "a group's operation wrote into freed memory"
        assert all(len(s._held) == 0 for s in streams)
    finally:
        for s in streams:
            s.close()
        for c in comms:
            c.destroy()


def _temporary_all_reduce(comm: hcclpy.Communicator, value: float, stream: hcclpy.Stream) -> None:
    """An all_reduce whose buffers only the stream holds."""
    comm.all_reduce(hcclpy.from_numpy(np.full(4096, value, np.float32), device=comm.device),
                    hcclpy.zeros(4096, "float32", device=comm.device), stream=stream)


def test_two_threads_waiting_on_one_stream_let_go_only_of_what_their_waits_covered() -> None:
    """Two waits that end together let go of the buffers held when they began, once: not twice as
    many, which took the buffers of an operation queued since, still waiting for its peer."""
    comms = hcclpy.Communicator.init_all([0, 1])
    stream = comms[0].device.create_stream()
    real_wait = stream._sync
    entered, waited, queued = threading.Semaphore(0), threading.Barrier(3, timeout=60), threading.Event()

    def wait(cdata: Any, ms: int) -> int:  # the stream's bound wait, with a pause after it
        entered.release()
        rc = real_wait(cdata, ms)
        if rc == 0:
            waited.wait()  # both waits are done ...
            assert queued.wait(60)  # ... and the next operation is queued before they let go
        return rc

    try:
        _temporary_all_reduce(comms[0], 1.0, stream)  # rank 1 joins it below
        stream._sync = wait
        waiters = [threading.Thread(target=stream.synchronize) for _ in range(2)]
        for thread in waiters:
            thread.start()
        assert entered.acquire(timeout=60) and entered.acquire(timeout=60)
        _temporary_all_reduce(comms[1], 2.0, comms[1].device.default_stream)
        waited.wait()
        _temporary_all_reduce(comms[0], 10.0, stream)  # rank 1 is late for this one
        queued.set()
        for thread in waiters:
            thread.join(60)
        stream._sync = real_wait
        held = len(stream._held)
        gc.collect()
        canaries = [hcclpy.from_numpy(np.full(4096, 7.0, np.float32), device=comms[0].device) for _ in range(4)]
        _temporary_all_reduce(comms[1], 20.0, comms[1].device.default_stream)  # before any assert: no hang
        stream.synchronize()
        comms[1].device.default_stream.synchronize()
        assert held == 2, "the queued all_reduce's buffers were let go of"
        assert all((c.to_numpy() == 7.0).all() for c in canaries), "an all_reduce wrote into freed memory"
    finally:
        stream._sync = real_wait
        stream.close()
        for c in comms:
            c.destroy()


def test_a_group_on_another_thread_leaves_this_threads_streams_alone() -> None:
    """While another thread's group is open, a stream it did not use lets go of buffers, and its
    operations complete in the flight recorder, at each synchronisation, as without the group."""
    comms = hcclpy.Communicator.init_all([0, 1])
    grouped_stream, own_streams = comms[0].device.create_stream(), [c.device.create_stream() for c in comms]
    opened, close = threading.Event(), threading.Event()

    def hold_a_group_open() -> None:
        with hcclpy.group():
            _temporary_all_reduce(comms[0], 1.0, grouped_stream)
            opened.set()
            assert close.wait(60)

    holder = threading.Thread(target=hold_a_group_open)
    holder.start()
    try:
        assert opened.wait(60)
        assert len(grouped_stream._held) == 0  # the open group holds its operation's buffers
        for _ in range(3):
            with hcclpy.group():  # this thread's own groups too: they end within the loop
                for c, s in zip(comms, own_streams):
                    _temporary_all_reduce(c, 1.0, s)
            for s in own_streams:
                s.synchronize()
            assert [len(s._held) for s in own_streams] == [0, 0]
        # The open group's all_reduce is recorded once HCCL queues it, when the group ends.
        assert comms[0].health()["pending"] == 0
    finally:
        close.set()
        holder.join(60)
    _temporary_all_reduce(comms[1], 1.0, own_streams[1])
    for s in (grouped_stream, own_streams[1]):
        s.synchronize()
    assert len(grouped_stream._held) == 0
    for s in (grouped_stream, *own_streams):
        s.close()
    for c in comms:
        c.destroy()
        for c in comms:
            c.destroy()


def test_a_refused_device_block_leaves_the_outer_ones_intact() -> None:
    def body() -> List[Any]:
        hcclpy.Device(0).set_current()
        with hcclpy.Device(1):
            with pytest.raises(ValueError, match="out of range"):
                with hcclpy.Device(hcclpy.device_count()):
                    pass
            inner = hcclpy.Device.current()
        return [inner, hcclpy.Device.current()]

    out: List[Any] = []
    thread = threading.Thread(target=lambda: out.extend(body()))  # a thread of its own: its own device stack
    thread.start()
    thread.join(60)
    assert out == [hcclpy.Device(1), hcclpy.Device(0)]


# ------------------------------------------- queued work, closes, failures and the collector

def _threads(*bodies: Callable[[], Any], timeout: float = 60) -> List[Any]:
    """Run each body on a thread of its own (its own current device); their results, or raise the
    first error. Fails, rather than hangs, when one is still running after ``timeout`` seconds."""
    out: List[Any] = [None] * len(bodies)
    errors: List[BaseException] = []

    def run(index: int) -> None:
        try:
            out[index] = bodies[index]()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish"
    if errors:
        raise errors[0]
    return out


def _pair(config: Any = None) -> List[hcclpy.Communicator]:
    """Two communicators on devices 0 and 1, made from one thread per rank (operations time out
    after 20 s unless ``config`` says otherwise: a test that fails must not wait long)."""
    config = config or {"exec_timeout": 20}
    info = hcclpy.RootInfo.generate(device=0)
    return _threads(*(lambda r=r: hcclpy.Communicator(2, info, r, device=r, config=config) for r in range(2)))


def _peer_all_reduce(comm: hcclpy.Communicator, values: np.ndarray) -> Callable[[], np.ndarray]:
    """The peer's side of an all_reduce, on a stream of its own; returns its result."""
    def body() -> np.ndarray:
        comm.device.set_current()
        with comm.device.create_stream() as stream:
            y = hcclpy.from_numpy(values, device=comm.device)
            comm.all_reduce(y, stream=stream)
            stream.synchronize(timeout=20)
            return y.to_numpy()
    return body


@pytest.mark.timeout(120)
def test_closing_an_array_that_queued_work_uses_defers_the_free() -> None:
    # docs/objects.md: "a stream keeps the device arrays of the operations queued on it alive until it knows
    # they are done". close() from another thread must not hand their memory to a new array.
    comms = _pair()
    try:
        stream = hcclpy.Device(0).create_stream()
        x = hcclpy.from_numpy(np.ones(1024, np.float32), device=0)
        comms[0].all_reduce(x, stream=stream)  # queued: the peer has not joined yet
        _threads(x.close)
        assert x.closed and x[:4].closed  # closed for the user at once, views too
        with pytest.raises(ValueError, match="closed"):
            comms[0].all_reduce(x, stream=stream)
        z = hcclpy.from_numpy(np.full(1024, 7, np.float32), device=0)  # must not get x's memory
        peer, = _threads(_peer_all_reduce(comms[1], np.full(1024, 100, np.float32)))
        stream.synchronize(timeout=20)
        np.testing.assert_array_equal(peer, np.full(1024, 101, np.float32))
        np.testing.assert_array_equal(z.to_numpy(), np.full(1024, 7, np.float32))
        stream.close()
        # Nothing holds it any more: the next allocation frees it; nothing is left deferred.
        hcclpy.zeros(4, device=0)
        from hcclpy.runtime import _memory
        assert not _memory._deferred
        unheld = hcclpy.zeros(4, device=0)
        unheld.close()  # the common case: freed at once
        assert unheld.closed and not _memory._deferred
    finally:
        for c in comms:
            c.destroy(timeout=5)


@pytest.mark.timeout(120)
def test_a_failed_default_stream_is_replaced_for_new_communicators() -> None:
    # The documented recovery: destroy the failed communicator, create a new one. Its operations
    # without stream= use the device's default stream, which the failure must not have broken.
    old = _pair({"exec_timeout": 1})
    x = hcclpy.from_numpy(np.ones(4, np.float32), device=0)
    with hcclpy.Device(0):
        old[0].all_reduce(x)  # the peer never joins: fails after the exec timeout
        failed = hcclpy.Device(0).default_stream
        with pytest.raises(hcclpy.CommTimeoutError):
            failed.synchronize(timeout=30)
    for c in old:
        c.destroy(timeout=1)
    new = _pair()
    try:
        def rank(r: int) -> np.ndarray:
            def body() -> np.ndarray:
                new[r].device.set_current()
                y = hcclpy.from_numpy(np.full(4, r + 1.0, np.float32), device=r)
                new[r].all_reduce(y)  # the default stream
                new[r].device.default_stream.synchronize(timeout=20)
                return y.to_numpy()
            return body

        results = _threads(rank(0), rank(1))
        for result in results:
            np.testing.assert_array_equal(result, np.full(4, 3.0, np.float32))
        assert failed.closed and hcclpy.Device(0).default_stream is not failed
    finally:
        for c in new:
            c.destroy(timeout=5)


@pytest.mark.timeout(120)
def test_a_group_ending_during_a_synchronisation_keeps_its_buffers() -> None:
    # Thread B's wait returns before thread A's group ends and queues its all_reduce on the
    # stream; B must not then let go of the group's temporary buffer (its memory would be reused).
    comms = _pair()
    stream = hcclpy.Device(0).create_stream()
    wait = stream._sync
    queued, waited, ended = threading.Event(), threading.Event(), threading.Event()

    def wait_until_the_group_ended(handle: Any, ms: int) -> int:
        rc = wait(handle, ms)
        waited.set()
        assert ended.wait(20)
        return rc

    def a() -> None:
        hcclpy.Device(0).set_current()
        with hcclpy.group():
            comms[0].all_reduce(hcclpy.from_numpy(np.ones(1024, np.float32), device=0), stream=stream)
            queued.set()
            assert waited.wait(20)
        ended.set()

    def b() -> None:
        hcclpy.Device(0).set_current()
        assert queued.wait(20)
        stream._sync = wait_until_the_group_ended
        stream.synchronize()

    try:
        _threads(a, b)
        stream._sync = wait
        assert stream._held, "the group's buffer was let go"
        gc.collect()
        canary = hcclpy.from_numpy(np.full(1024, 99, np.float32), device=0)  # would reuse freed memory
        peer, = _threads(_peer_all_reduce(comms[1], np.zeros(1024, np.float32)))
        stream.synchronize(timeout=20)
        np.testing.assert_array_equal(peer, np.ones(1024, np.float32))
        np.testing.assert_array_equal(canary.to_numpy(), np.full(1024, 99, np.float32))
    finally:
        for c in comms:
            c.destroy(timeout=5)  # first: aborts work a failed test left queued
        stream.close()


class _Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.mark.timeout(120)
def test_collecting_a_stream_with_queued_work_does_not_wait_for_it() -> None:
    # The collector runs in whatever thread allocates: waiting there for a collective can wait
    # for the very thread collecting. The stream is destroyed once its work has ended, and its
    # buffers stay alive until then.
    comms = _pair()
    try:
        holder = _Cycle()
        holder.stream = hcclpy.Device(0).create_stream()
        with hcclpy.Device(0):
            comms[0].all_reduce(hcclpy.from_numpy(np.ones(1024, np.float32), device=0), stream=holder.stream)
        handle = holder.stream.handle
        del holder
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            collect = threading.Thread(target=gc.collect, daemon=True)
            collect.start()
            collect.join(20)  # a collector that waited for the work would wait for the peer below
        assert not collect.is_alive(), "collecting the stream waited for its queued work"
        from hcclpy.runtime import _stream
        assert handle in [_ffi.address(cdata) for _, cdata, _ in _stream._parked]
        canary = hcclpy.from_numpy(np.full(1024, 99, np.float32), device=0)
        peer, = _threads(_peer_all_reduce(comms[1], np.zeros(1024, np.float32)))
        np.testing.assert_array_equal(peer, np.ones(1024, np.float32))
        np.testing.assert_array_equal(canary.to_numpy(), np.full(1024, 99, np.float32))
        hcclpy.Device(0).create_stream().close()  # a later stream destroys the idle parked one
        assert not _stream._parked
    finally:
        for c in comms:
            c.destroy(timeout=5)


def test_bad_shapes_devices_and_streams_of_arrays() -> None:
    for shape in (True, False, (2, True), [np.True_]):
        with pytest.raises(TypeError, match="shape"):
            hcclpy.empty(shape)
        with pytest.raises(TypeError, match="shape"):
            hcclpy.zeros(shape)
    count = hcclpy.device_count()
    for shape in (0, 4):
        with pytest.raises(ValueError, match=f"device={count} is out of range"):
            hcclpy.empty(shape, device=count)
    other = hcclpy.Device(1).create_stream()
    closed = hcclpy.Device(0).create_stream()
    closed.close()
    for size in (0, 4):
        a = hcclpy.zeros(size, device=0)
        host = np.zeros(size, np.float32)
        for call in (lambda s: a.fill_zero(stream=s), lambda s: a.copy_from(host, stream=s),
                     lambda s: a.copy_to(host, stream=s), lambda s: a.to_numpy(stream=s)):
            with pytest.raises(TypeError, match="stream=5 must be an hcclpy.Stream or None"):
                call(5)
            with pytest.raises(ValueError, match="stream is on device 1 but this array is on device 0"):
                call(other)
            with pytest.raises(ValueError, match="closed Stream"):
                call(closed)
        np.testing.assert_array_equal(a.to_numpy(), np.zeros(size, np.float32))
    other.close()


def test_stream_waits_for_another_stream() -> None:
    comms = hcclpy.Communicator.init_all([0, 1])
    try:
        arrays = [hcclpy.from_numpy(np.full(4, 1.0 + c.rank, dtype=np.float32), device=c.device) for c in comms]
        first = comms[0].device.create_stream()
        waiting = comms[0].device.create_stream()
        comms[0].all_reduce(arrays[0], stream=first)  # cannot finish before rank 1 joins
        waiting.wait_stream(first)
        assert not first.query() and not waiting.query()  # the wait holds the second stream back
        comms[1].all_reduce(arrays[1])
        waiting.synchronize(timeout=30)
        assert first.query()  # the wait ended only once the first stream's work was done
        np.testing.assert_array_equal(arrays[0].to_numpy(), np.full(4, 3.0, dtype=np.float32))
        with pytest.raises(TypeError, match="stream must be an hcclpy.Stream, got Event"):
            waiting.wait_stream(comms[0].device.create_event())
        with comms[1].device.create_stream() as elsewhere:
            with pytest.raises(ValueError, match="stream is on device 1 but this stream is on device 0"):
                waiting.wait_stream(elsewhere)
        comms[1].device.default_stream.synchronize(timeout=30)
        for stream in (first, waiting):
            stream.close()
        with pytest.raises(ValueError, match="closed Stream"):
            waiting.wait_stream(comms[0].device.default_stream)
    finally:
        for c in comms:
            c.destroy()


def test_event_repr_says_its_state() -> None:
    device = hcclpy.Device(0)
    event = device.create_event(timing=False)
    assert re.fullmatch(r"<hcclpy\.Event 0x[0-9a-f]+, not recorded on Device\(0\)>", repr(event))
    event.record()
    assert re.fullmatch(r"<hcclpy\.Event 0x[0-9a-f]+, recorded on Device\(0\)>", repr(event))
    event.close()
    assert repr(event) == "<hcclpy.Event closed on Device(0)>"
    assert repr(device.create_event()).endswith(", not recorded, timing on Device(0)>")


def test_operations_take_a_stream_subclass() -> None:
    class NamedStream(hcclpy.Stream):
        __slots__ = ()

    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    owner = comm.device.create_stream()
    try:
        named = NamedStream.from_handle(owner.handle, device=0, owner=owner)
        x = hcclpy.from_numpy(np.arange(4, dtype=np.float32), device=0)
        comm.all_reduce(x, stream=named)  # the fast path tests the exact type: the general path takes it
        named.synchronize()
        np.testing.assert_array_equal(x.to_numpy(), np.arange(4, dtype=np.float32))
    finally:
        owner.close()
        comm.destroy()
