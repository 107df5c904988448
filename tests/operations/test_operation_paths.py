"""One definition, one meaning: every operation through every path gives the NumPy reference's
result, and the same mistake raises the same exception type on every path.

The paths: device arrays on a stream, NumPy arrays (staged), device arrays inside
``hcclpy.group()``, persistent operations (``*_init`` then ``start()``, twice) on device arrays
and on NumPy arrays. Reads of a device array right after queuing work that writes it see the
result without any synchronisation.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import hcclpy
import ranks

PATHS = ["device", "numpy", "group", "persistent", "persistent-numpy"]
DTYPES = ["float32", "int32", "float16", "bfloat16", "int8", "float64"]
OPS = ["sum", "prod", "max", "min"]


class Path:
    """How one rank turns NumPy inputs into the buffers of a path, runs a call, and reads results."""

    def __init__(self, name: str, comm: hcclpy.Communicator, stream: hcclpy.Stream) -> None:
        self.name, self.comm, self.stream = name, comm, stream
        self.numpy = name in ("numpy", "persistent-numpy")

    def buffer(self, array: np.ndarray) -> Any:
        return array.copy() if self.numpy else hcclpy.from_numpy(array, device=self.comm.device)

    def read(self, buf: Any) -> np.ndarray:
        return buf if self.numpy else buf.to_numpy()

    def run(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """``comm.<operation>(*args, **kwargs)`` the path's way (the device paths pass the stream)."""
        comm = self.comm
        if not self.numpy:
            kwargs["stream"] = self.stream
        if self.name == "group" and operation != "batch_send_recv":  # (HCCL refuses a batch in a group)
            with hcclpy.group():
                return getattr(comm, operation)(*args, **kwargs)
        if self.name.startswith("persistent"):
            with getattr(comm, operation + "_init")(*args, **kwargs) as persistent:
                persistent.start()  # twice: the calls below are idempotent, so a second start changes nothing
                return persistent.start()
        return getattr(comm, operation)(*args, **kwargs)


def _every_operation(rank: int, size: int, info: bytes, path_name: str, dtype: str, count: int, op: str,
                     root: int) -> List[str]:
    """Run every operation on path ``path_name`` and return what differs from the reference."""
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    path = Path(path_name, comm, stream)
    problems: List[str] = []
    count = max(count, 2)  # the uneven layouts below take up to 2 * size elements of count * size
    # Integer products overflow quickly: prod runs on small counts of small values (make_input).
    inputs = [ranks.make_input("paths", r, count * size, dtype, op) for r in range(size)]
    mine = inputs[rank]
    reduced = ranks.reduce_reference(inputs, op, dtype)

    def check(name: str, got: Any, want: Optional[np.ndarray]) -> None:
        if want is None:
            if got is not None:
                problems.append(f"{name}: returned {got!r}, expected None")
            return
        problem = ranks.mismatch(f"{path_name} {name}", path.read(got).reshape(-1), want.reshape(-1))
        if problem:
            problems.append(problem)

    try:
        out = path.buffer(np.zeros_like(mine))
        check("all_reduce", path.run("all_reduce", path.buffer(mine), out, op), reduced)
        out = path.buffer(np.zeros_like(mine))
        got = path.run("reduce", path.buffer(mine), out, op, root)
        check("reduce", got, reduced if rank == root else None)
        buf = path.buffer(mine)
        check("broadcast", path.run("broadcast", buf, root), inputs[root])
        block = mine[:count]
        out = path.buffer(np.zeros(count * size, mine.dtype))
        check("all_gather", path.run("all_gather", path.buffer(block), out),
              np.concatenate([x[:count] for x in inputs]))
        out = path.buffer(np.zeros(count, mine.dtype))
        check("reduce_scatter", path.run("reduce_scatter", path.buffer(mine), out, op),
              reduced[rank * count:(rank + 1) * count])
        out = path.buffer(np.zeros(count, mine.dtype))
        check("scatter", path.run("scatter", path.buffer(inputs[root]) if rank == root else None, out, root),
              inputs[root][rank * count:(rank + 1) * count])
        out = path.buffer(np.zeros_like(mine))
        check("all_to_all", path.run("all_to_all", path.buffer(mine), out),
              np.concatenate([x[rank * count:(rank + 1) * count] for x in inputs]))
        # Uneven: rank r owns r + 1 elements of each block layout.
        counts = [r + 1 for r in range(size)]
        out = path.buffer(np.zeros(sum(counts), mine.dtype))
        check("all_gather_v", path.run("all_gather_v", path.buffer(mine[:rank + 1]), out, recv_counts=counts),
              np.concatenate([x[:r + 1] for r, x in enumerate(inputs)]))
        starts = np.cumsum([0] + counts)
        sent = np.concatenate([x[:sum(counts)] for x in inputs]).reshape(size, -1)
        want = ranks.reduce_reference(list(sent), op, dtype)[starts[rank]:starts[rank + 1]]
        out = path.buffer(np.zeros(rank + 1, mine.dtype))
        check("reduce_scatter_v", path.run("reduce_scatter_v", path.buffer(mine[:sum(counts)]), out,
                                           send_counts=counts, op=op), want)
        # all_to_all_v: rank i sends (i + j) % 2 + 1 elements to rank j.
        matrix = [[(i + j) % 2 + 1 for j in range(size)] for i in range(size)]
        send_counts, recv_counts = matrix[rank], [matrix[i][rank] for i in range(size)]
        want = np.concatenate([inputs[i][sum(matrix[i][:rank]):sum(matrix[i][:rank + 1])] for i in range(size)])
        out = path.buffer(np.zeros(sum(recv_counts), mine.dtype))
        check("all_to_all_v", path.run("all_to_all_v", path.buffer(mine[:sum(send_counts)]), out,
                                       send_counts=send_counts, recv_counts=recv_counts), want)
        out = path.buffer(np.zeros(sum(recv_counts), mine.dtype))
        check("all_to_all_vc", path.run("all_to_all_vc", path.buffer(mine[:sum(send_counts)]), out,
                                        send_count_matrix=matrix), want)
        # A ring: send to the next rank, receive from the previous one.
        after, before = (rank + 1) % size, (rank - 1) % size
        out = path.buffer(np.zeros_like(mine))
        path.run("batch_send_recv", [("send", path.buffer(mine), after), ("recv", out, before)])
        check("batch_send_recv", out, inputs[before])
        # Items to the rank itself among them: its k-th send to itself lands in its k-th receive from itself.
        out, mirror = path.buffer(np.zeros_like(mine)), path.buffer(np.zeros_like(mine))
        head = path.buffer(np.zeros_like(mine[:2]))
        path.run("batch_send_recv", [("send", path.buffer(mine), rank), ("send", path.buffer(mine), after),
                                     ("recv", out, before), ("send", path.buffer(mine[:2]), rank),
                                     ("recv", mirror, rank), ("recv", head, rank)])
        check("batch_send_recv with the ring", out, inputs[before])
        check("batch_send_recv to itself", mirror, mine)
        check("batch_send_recv to itself, second pair", head, mine[:2])
        if not path.name.startswith("persistent"):  # a persistent pair would need both in one start
            out = path.buffer(np.zeros_like(mine))
            pair = [("send", path.buffer(mine), after), ("recv", out, before)]
            if path.name == "group":  # both in one group, which keeps them from waiting for each other
                with hcclpy.group():
                    for kind, buf, peer in pair:
                        path.run(kind, buf, peer)
            else:
                for kind, buf, peer in (pair if rank == 0 else pair[::-1]):  # rank 0 starts the ring
                    path.run(kind, buf, peer)
            check("send/recv", out, inputs[before])
        path.run("barrier")
        stream.synchronize()
    finally:
        stream.close()
        comm.destroy()
    return problems


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(size=st.sampled_from([2, 3]), dtype=st.sampled_from(DTYPES), count=st.integers(1, 40),
       op=st.sampled_from(OPS), root=st.integers(0, 2))
def test_every_operation_on_every_path_matches_numpy(path: str, size: int, dtype: str, count: int, op: str,
                                                      root: int) -> None:
    out = ranks.run_threads(_every_operation, size, path, dtype, count, op, root % size, timeout=120)
    problems = [f"rank {r}: {p}" for r, found in enumerate(out) for p in found]
    assert not problems, "\n".join(problems[:20])


@pytest.mark.slow
def test_every_path_in_processes() -> None:
    """The same, with each rank a process (the NumPy and persistent paths: the staging and the
    persistent operations' held buffers across processes)."""
    for path in ("numpy", "persistent"):
        out = ranks.run_processes(_every_operation, 3, path, "float32", 17, "sum", 1, timeout=120)
        problems = [f"rank {r}: {p}" for r, found in enumerate(out) for p in found]
        assert not problems, "\n".join(problems[:20])


# ------------------------------------------------------------------------- the same mistake

def _mistakes(comm: hcclpy.Communicator, path: Path) -> Dict[str, Callable[[], Any]]:
    """Bad calls every path can make, by name."""
    b = path.buffer
    x, y = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    return {
        "op average": lambda: path.run("all_reduce", b(x), b(y), "avg"),
        "op a dtype": lambda: path.run("all_reduce", b(x), b(y), hcclpy.DataType.FP32),
        "root out of range": lambda: path.run("broadcast", b(x), 5),
        "root a float": lambda: path.run("reduce", b(x), b(y), "sum", 0.5),
        "counts differ": lambda: path.run("all_reduce", b(x), b(y[:4])),
        "dtypes differ": lambda: path.run("all_reduce", b(x), b(y.astype(np.int32))),
        "a list as a buffer": lambda: path.run("all_reduce", [1.0, 2.0]),
        "not a multiple of size": lambda: path.run("reduce_scatter", b(x[:7]), b(y[:3])),
        "counts of the wrong length": lambda: path.run("all_gather_v", b(x[:2]), b(y), recv_counts=[2, 2, 2]),
        "negative counts": lambda: path.run("all_to_all_v", b(x), b(y), send_counts=[-1, 1], recv_counts=[1, 1]),
        "counts past the buffer": lambda: path.run("reduce_scatter_v", b(x), b(y), send_counts=[8, 8]),
        "matrix of the wrong shape": lambda: path.run("all_to_all_vc", b(x), b(y), send_count_matrix=[[1]]),
        "peer is this rank": lambda: path.run("send", b(x), comm.rank),
        "batch kind": lambda: path.run("batch_send_recv", [("put", b(x), 1)]),
        "batch to itself unpaired": lambda: path.run("batch_send_recv", [("send", b(x), comm.rank)]),
        "batch to itself of two dtypes": lambda: path.run("batch_send_recv", [("send", b(x), comm.rank),
                                                                              ("recv", b(y.astype(np.int32)),
                                                                               comm.rank)]),
        "recv from itself": lambda: path.run("recv", b(y), comm.rank),
        "output twice": lambda: path.run("all_gather", b(x), b(y), out=b(y)),
        "send and recv overlap": lambda: path.run("all_to_all", *(lambda a: (a[:4], a[2:6]))(b(np.zeros(8, np.float32)))),
    }


def _mistake_types(rank: int, size: int, info: bytes) -> Dict[str, Dict[str, str]]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    seen: Dict[str, Dict[str, str]] = {}
    try:
        for name in PATHS:
            path = Path(name, comm, stream)
            for mistake, make in _mistakes(comm, path).items():
                if name == "group" and mistake.startswith("batch"):
                    continue  # a batch inside a group is refused as such first (RuntimeError)
                try:
                    make()
                except Exception as exc:  # noqa: BLE001 - the type is what is compared
                    seen.setdefault(mistake, {})[name] = type(exc).__name__
                else:
                    seen.setdefault(mistake, {})[name] = "no exception"
        stream.synchronize()  # nothing was queued: every mistake was refused before any C call
    finally:
        stream.close()
        comm.destroy()
    return seen


def test_the_same_mistake_raises_the_same_type_on_every_path() -> None:
    for rank, seen in enumerate(ranks.run_threads(_mistake_types, 2, timeout=60)):
        for mistake, by_path in seen.items():
            types = set(by_path.values())
            assert len(types) == 1 and "no exception" not in types, (rank, mistake, by_path)


# ------------------------------------------------------------------------- reads after queuing

def _read_right_after(rank: int, size: int, info: bytes, count: int) -> List[str]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    problems = []
    own = comm.device.create_stream()
    try:
        for stream in (None, own):
            x = hcclpy.from_numpy(np.full(count, rank + 1, np.float32), device=rank)
            comm.all_reduce(x, stream=stream)  # queued: the peers may not even have joined yet
            got = x.to_numpy()  # no synchronisation: the read waits for the work that writes x
            if not np.all(got == sum(range(1, size + 1))):
                problems.append(f"stream {stream}: to_numpy right after all_reduce read {got[:4]}...")
            y = hcclpy.zeros(count, "float32", device=rank)
            comm.all_reduce(x, y, "max", stream=stream)
            target = np.empty(count, np.float32)
            y.copy_to(target)  # copy_to too
            if not np.all(target == sum(range(1, size + 1))):
                problems.append(f"stream {stream}: copy_to right after all_reduce read {target[:4]}...")
            # A host write must not change what queued work still reads: x is all_reduce's input.
            z = hcclpy.zeros(count, "float32", device=rank)
            comm.all_reduce(x, z, stream=stream)
            x.copy_from(np.zeros(count, np.float32))
            if not np.all(z.to_numpy() == size * sum(range(1, size + 1))):
                problems.append(f"stream {stream}: copy_from overwrote the input of queued work")
        # With an explicit stream, the copy is ordered on that stream after the writer's work.
        other = comm.device.create_stream()
        x = hcclpy.from_numpy(np.full(count, rank + 1, np.float32), device=rank)
        comm.all_reduce(x, stream=own)
        got = x.to_numpy(stream=other)
        if not np.all(got == sum(range(1, size + 1))):
            problems.append(f"to_numpy(stream=other) read {got[:4]}...")
        other.close()
    finally:
        own.close()
        comm.destroy()
    return problems


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_reading_a_device_array_right_after_queued_work_sees_its_result(mode: str) -> None:
    # 4 Mi elements: the collective takes long enough that a read not ordered after it sees old data.
    out = ranks.run(mode, _read_right_after, 2, 4 << 20, timeout=120)
    problems = [f"rank {r}: {p}" for r, found in enumerate(out) for p in found]
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- persistent operations

def _persistent(rank: int, size: int, info: bytes) -> List[str]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    problems: List[str] = []
    try:
        x = hcclpy.from_numpy(np.full(4, rank + 1.0, np.float32), device=rank)
        step = comm.all_reduce_init(x, op="sum", stream=stream)
        assert step.operation == "HcclAllReduce" and step.result is x and "HcclAllReduce" in repr(step)
        for _ in range(3):
            assert step.start() is x
        total = float(sum(range(1, size + 1)))
        want = total * size ** 2  # in place, three times: (sum) then times size, twice
        if not np.all(x.to_numpy() == want):
            problems.append(f"three in-place starts gave {x.to_numpy()}, expected {want}")
        # Another stream for one start; the one it was made with for the next.
        other = comm.device.create_stream()
        x.copy_from(np.full(4, rank + 1.0, np.float32))
        step.start(stream=other)
        other.synchronize()
        if not np.all(x.to_numpy() == total):
            problems.append(f"a start on another stream gave {x.to_numpy()}")
        other.close()
        # It holds its buffers: a temporary made only for it stays alive.
        held = comm.all_reduce_init(hcclpy.from_numpy(np.full(2, rank + 1.0, np.float32), device=rank),
                                    stream=stream)
        import gc

        gc.collect()
        held.start()
        if not np.all(held.result.to_numpy() == total):
            problems.append("a persistent operation's own buffer was freed")
        held.close()
        held.close()  # idempotent
        with pytest.raises(ValueError, match="closed PersistentOp"):
            held.start()
        # Inside a group, like any operation.
        with hcclpy.group():
            step.start()
        stream.synchronize()
        step.close()
        # A NumPy persistent operation stages at each start.
        a = np.full(3, rank + 1.0)
        with comm.all_reduce_init(a) as host_step:
            assert host_step.start() is a
        if not np.all(a == total):
            problems.append(f"NumPy persistent all_reduce gave {a}")
        # Its device array closed: refused.
        y = hcclpy.zeros(4, "float32", device=rank)
        gone = comm.all_reduce_init(y, stream=stream)
        y.close()
        with pytest.raises(ValueError, match="closed"):
            gone.start()
        # A bad stream at start is refused as on every call.
        z = hcclpy.zeros(4, "float32", device=rank)
        bad = comm.all_reduce_init(z)
        with pytest.raises(TypeError, match="stream must be an hcclpy.Stream"):
            bad.start(stream=5)  # type: ignore[arg-type]
        bad.close()
        stream.synchronize()
        return problems
    finally:
        stream.close()
        comm.destroy()


def test_persistent_operations_start_again_and_again() -> None:
    for rank, problems in enumerate(ranks.run_threads(_persistent, 2, timeout=60)):
        assert not problems, (rank, problems)


def test_a_persistent_operation_refuses_to_start_after_its_communicator_is_gone() -> None:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    x = hcclpy.zeros(4, "float32", device=0)
    step = comm.all_reduce_init(x)
    step.start()
    comm.destroy()
    with pytest.raises(ValueError, match="destroyed"):
        step.start()
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    step = comm.broadcast_init(x, 0)
    comm.abort()
    with pytest.raises(ValueError, match=r"was aborted \(Communicator.abort\(\)\)"):
        step.start()
    with pytest.raises(ValueError, match=r"was aborted \(Communicator.abort\(\)\)"):
        comm.all_reduce(x)
    comm.destroy()


def test_a_persistent_batch_is_refused_inside_a_group() -> None:
    comms = hcclpy.Communicator.init_all([0, 1])
    try:
        xs = [hcclpy.zeros(4, "float32", device=c.device) for c in comms]
        batches = [c.batch_send_recv_init([("send", xs[r], 1 - r)]) for r, c in enumerate(comms)]
        with hcclpy.group():
            with pytest.raises(RuntimeError, match="batch_send_recv cannot run inside hcclpy.group"):
                batches[0].start()
    finally:
        for c in comms:
            c.destroy()


def test_omitted_outputs_are_in_place_or_new_alike_on_numpy_and_device() -> None:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    try:
        for make, read in ((lambda a: a.copy(), lambda a: a), (hcclpy.from_numpy, lambda a: a.to_numpy())):
            a = make(np.arange(6, dtype=np.float32).reshape(2, 3))
            assert comm.all_reduce(a) is a
            assert comm.reduce(a, root=0) is a
            assert comm.broadcast(a, 0) is a
            gathered = comm.all_gather(a)
            assert gathered is not a and tuple(gathered.shape) == (1, 2, 3)
            np.testing.assert_array_equal(read(gathered).reshape(-1), np.arange(6))
            scattered = comm.reduce_scatter(a)
            assert tuple(scattered.shape) == (2, 3)
            uneven = comm.all_gather_v(a, recv_counts=[6], recv_displs=[2])
            np.testing.assert_array_equal(read(uneven), np.r_[0, 0, np.arange(6)])  # zeros between blocks
    finally:
        comm.destroy()


def test_an_output_that_cannot_be_written_is_refused_naming_it() -> None:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    try:
        frozen = np.ones(4, np.float32)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="^send is read-only, but all_reduce writes its result there"):
            comm.all_reduce(frozen)
        np.testing.assert_array_equal(comm.all_reduce(frozen, np.zeros(4, np.float32)), 1)  # read only: fine
        strided = np.ones(8, np.float32)[::2]
        with pytest.raises(ValueError, match="^recv is not C-contiguous, but all_gather writes its result there"):
            comm.all_gather(np.ones(4, np.float32), strided)
        with pytest.raises(ValueError, match="^recv is read-only, but reduce_scatter writes its result there"):
            comm.reduce_scatter(np.ones(4, np.float32), frozen)
    finally:
        comm.destroy()


def test_threads_share_a_communicator_on_numpy_arrays() -> None:
    """Calls from several threads on one communicator's staging take turns."""
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    errors: List[BaseException] = []

    def work(value: float) -> None:
        try:
            for _ in range(50):
                a = np.full(100, value)
                assert comm.all_reduce(a) is a and np.all(a == value)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(float(i),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    comm.destroy()
    assert not errors, errors
