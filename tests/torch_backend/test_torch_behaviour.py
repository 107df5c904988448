"""How the "hcclpy" backend behaves around the operations: init methods, options, asynchronous
work, timeouts, failures and refused arguments."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any, Dict, List

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import hcclpy  # noqa: E402
import ranks  # noqa: E402
import torch_ranks as tr  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_method(rank: int, size: int, info: bytes, method: str, port: int, directory: str) -> float:
    if method == "env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
        dist.init_process_group("hcclpy")
    elif method == "tcp":
        dist.init_process_group("hcclpy", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    else:
        dist.init_process_group("hcclpy", init_method=f"file://{directory}/store", rank=rank, world_size=size)
    try:
        x = torch.tensor([rank + 1.0])
        dist.all_reduce(x)
        return x.item()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_init_methods(method: str, tmp_path: Any) -> None:
    out = ranks.run_processes(_init_method, 2, method, _free_port(), str(tmp_path), timeout=90)
    assert out == [3.0, 3.0]


def _explicit_arguments(rank: int, size: int, info: bytes, directory: str, world_size_variable: str) -> float:
    # A shell that exported WORLD_SIZE (or a launcher's partial environment): torch takes the rank
    # and size from the arguments, as gloo does, and so must the backend.
    os.environ.pop("RANK", None)
    os.environ["WORLD_SIZE"] = world_size_variable
    dist.init_process_group("hcclpy", init_method=f"file://{directory}/store", rank=rank, world_size=size)
    try:
        x = torch.tensor([rank + 1.0])
        dist.all_reduce(x)
        return x.item()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size_variable", ["2", "5"])
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_explicit_rank_and_size_win_over_the_environment(world_size_variable: str, tmp_path: Any) -> None:
    out = ranks.run_processes(_explicit_arguments, 2, str(tmp_path), world_size_variable, timeout=90)
    assert out == [3.0, 3.0]


def _backends(rank: int, size: int, info: bytes, directory: str) -> Dict[str, Any]:
    gloo = tr.init(rank, size, directory)
    try:
        found: Dict[str, Any] = {}
        for name, group in (("hcclpy", dist.group.WORLD), ("sub", dist.new_group([0, 1])), ("gloo", gloo)):
            backend = group._get_backend(torch.device("cpu"))
            found[name] = {"rank": backend.rank(), "size": backend.size(), "name": backend.name(),
                           "devices": [d.type for d in group._device_types], "splits": backend.supports_splitting}
            try:
                group._get_backend(torch.device("cuda"))
                found[name]["cuda"] = "a backend"
            except RuntimeError:  # what torch's helpers expect of a group without that device
                found[name]["cuda"] = "RuntimeError"
        options = dist.group.WORLD._get_backend(torch.device("cpu")).options
        found["options"] = [options.backend, options._timeout.total_seconds(), list(options.global_ranks_in_group)]
        found["get_backend"] = dist.get_backend()
        return found
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_group_gives_its_cpu_backend_as_gloo_does(tmp_path: Any) -> None:
    for rank, found in enumerate(ranks.run_processes(_backends, 2, str(tmp_path), timeout=90)):
        assert found["hcclpy"] == {"rank": rank, "size": 2, "name": "hcclpy", "devices": ["cpu"], "splits": False,
                                   "cuda": "RuntimeError"}, found
        assert found["sub"] == found["hcclpy"], found
        assert found["gloo"]["rank"] == rank and found["gloo"]["name"] == "gloo", found  # gloo serves CUDA too
        assert found["options"] == ["hcclpy", 60.0, [0, 1]], found
        assert found["get_backend"] == "hcclpy"


def _receive_first(rank: int, size: int, info: bytes, port: int) -> List[float]:
    # A TCP store: its client serves one request at a time, which a blocking wait for a channel's
    # root info once turned into a deadlock when both ranks received before they sent.
    dist.init_process_group("hcclpy", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=30))
    try:
        peer, got = 1 - rank, []
        for round_ in range(8):
            group = dist.new_group(backend="hcclpy")  # fresh channels: the root infos travel again
            inbox = torch.empty(4)
            works = [dist.irecv(inbox, peer, group=group), dist.isend(torch.full((4,), 10.0 * rank + round_), peer,
                                                                    group=group)]
            for work in works:
                work.wait()
            got.append(inbox[0].item())
        return got
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_both_ranks_may_receive_before_they_send(tmp_path: Any) -> None:
    first, second = ranks.run_processes(_receive_first, 2, _free_port(), timeout=90)
    assert first == [10.0 + r for r in range(8)] and second == [float(r) for r in range(8)]


def _tagged(rank: int, size: int, info: bytes, directory: str) -> List[float]:
    tr.init(rank, size, directory)
    try:
        if rank == 0:
            works = [dist.isend(torch.full((3,), 1.0), 1, tag=1), dist.isend(torch.full((3,), 2.0), 1, tag=2)]
            for work in works:
                work.wait()
            return []
        second, first = torch.zeros(3), torch.zeros(3)
        works = [dist.irecv(second, 0, tag=2), dist.irecv(first, 0, tag=1)]  # posted in the other order
        for work in works:
            work.wait()
        return first.tolist() + second.tolist()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_sends_and_receives_match_by_tag(tmp_path: Any) -> None:
    assert ranks.run_processes(_tagged, 2, str(tmp_path), timeout=90)[1] == [1.0] * 3 + [2.0] * 3


def _unmatched_send(rank: int, size: int, info: bytes, directory: str) -> str:
    # The hcclpy group alone: rank 1 destroys it at once, and a gloo group beside it would race
    # that (rank 1 leaving while rank 0 still connects its gloo pairs).
    dist.init_process_group("hcclpy", init_method=f"file://{directory}/store", rank=rank, world_size=size,
                            timeout=timedelta(seconds=3))
    outcome = "no send"
    if rank == 0:
        try:
            dist.isend(torch.ones(3), 1).wait()  # rank 1 never posts the receive
            outcome = "no error"
        except RuntimeError as exc:  # as from torch's own backends
            outcome = f"{type(exc).__name__}, an hcclpy timeout: {isinstance(exc, hcclpy.CommTimeoutError)}"
    dist.destroy_process_group()  # must not wait for HCCL_CONNECT_TIMEOUT (set far beyond the test's limit)
    return outcome


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_send_nobody_receives_does_not_hold_up_destroy(tmp_path: Any) -> None:
    out = ranks.run_processes(_unmatched_send, 2, str(tmp_path), env={"HCCL_CONNECT_TIMEOUT": "600"}, timeout=90)
    assert out == ["BackendTimeoutError, an hcclpy timeout: True", "no send"]


def _unmatched_send_in_a_subgroup(rank: int, size: int, info: bytes, directory: str) -> str:
    tr.init(rank, size, directory, timeout=600.0)
    quick = dist.new_group([0, 1], timeout=timedelta(seconds=2))
    outcome = "no send"
    if rank == 0:
        try:
            dist.send(torch.ones(3), 1, group=quick)  # rank 1 never posts the receive
            outcome = "no error"
        except RuntimeError as exc:
            outcome = type(exc).__name__
    dist.destroy_process_group()  # neither the default group's 600 s nor the store's bound the pending send
    return outcome


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_send_nobody_receives_times_out_by_its_group_and_destroy_ends_it(tmp_path: Any) -> None:
    out = ranks.run_processes(_unmatched_send_in_a_subgroup, 2, str(tmp_path), timeout=60)
    assert out == ["BackendTimeoutError", "no send"]


def _created_again(rank: int, size: int, info: bytes, port: int) -> List[float]:
    # The store outlives each group (as torchrun's agent store does), and torch gives the group
    # created again the same prefix: each creation must find its own root infos there.
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, timeout=timedelta(seconds=30))
    got = []
    for round_ in range(3):
        dist.init_process_group("hcclpy", store=store, rank=rank, world_size=size, timeout=timedelta(seconds=30))
        try:
            x = torch.tensor([rank + 10.0 * round_])
            dist.all_reduce(x)
            inbox = torch.zeros(1)
            works = [dist.isend(x.clone(), 1 - rank), dist.irecv(inbox, 1 - rank)]
            for work in works:
                work.wait()
            got += [x.item(), inbox.item()]
        finally:
            dist.destroy_process_group()
    return got


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_default_group_can_be_created_again(tmp_path: Any) -> None:
    out = ranks.run_processes(_created_again, 2, _free_port(), timeout=90)
    want = [v for round_ in range(3) for v in (1.0 + 20.0 * round_,) * 2]
    assert out == [want, want]


def _options(rank: int, size: int, info: bytes, directory: str) -> Dict[str, Any]:
    config = hcclpy.CommConfig(name="trainer_world", exec_timeout=77)
    tr.init(rank, size, directory, pg_options=config)
    try:
        world = hcclpy.torch.communicator()
        sub = dist.new_group([0, 1], pg_options={"device": size - 1 - rank, "buffer_size_mb": 64})
        x = torch.ones(2)
        dist.all_reduce(x, group=sub)
        sub_comm = hcclpy.torch.communicator(sub)
        return {"name": world.name, "timeout": dist.group.WORLD.timeout, "world_device": world.device.id,
                "sub_device": sub_comm.device.id, "sum": x.tolist(), "backend": dist.get_backend()}
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_pg_options_configure_the_communicators(tmp_path: Any) -> None:
    out = ranks.run_processes(_options, 2, str(tmp_path), timeout=90)
    for rank, res in enumerate(out):
        assert res["name"] == "trainer_world"
        assert res["timeout"] == 60.0  # the group's timeout (the config's exec timeout is the library's)
        assert res["world_device"] == rank and res["sub_device"] == 1 - rank
        assert res["sum"] == [2.0, 2.0] and res["backend"] == "hcclpy"


def _overlap(rank: int, size: int, info: bytes, directory: str) -> Dict[str, Any]:
    gloo = tr.init(rank, size, directory)
    try:
        x = torch.full((1000,), float(rank + 1))
        if rank == 0:
            work = dist.all_reduce(x, async_op=True)
            # Rank 1 has not started its part: the work cannot be done, and a short wait says so.
            pending = not work.is_completed()
            try:
                work.wait(timeout=timedelta(seconds=0.3))
                short_wait = "returned"
            except dist.DistBackendError as exc:  # as from torch's own backends
                short_wait = f"timed out: {type(exc).__name__}, {isinstance(exc, hcclpy.CommTimeoutError)}"
            computed = (torch.ones(64, 64) @ torch.ones(64, 64)).sum().item()  # the caller goes on working
            dist.barrier(group=gloo)  # now rank 1 joins
            finished = work.wait()
            return {"pending": pending, "short_wait": short_wait, "computed": computed, "finished": finished,
                    "result": x[0].item(), "completed": work.is_completed()}
        dist.barrier(group=gloo)
        dist.all_reduce(x)
        return {"result": x[0].item()}
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_async_work_overlaps_with_the_caller(tmp_path: Any) -> None:
    first, second = ranks.run_processes(_overlap, 2, str(tmp_path), timeout=90)
    assert first == {"pending": True, "short_wait": "timed out: BackendTimeoutError, True", "computed": 64.0 ** 3, "finished": True,
                     "result": 3.0, "completed": True}
    assert second == {"result": 3.0}


def _small_after_queued(rank: int, size: int, info: bytes, directory: str) -> List[float]:
    # A small blocking all-reduce takes a short path of its own, but only when nothing of the
    # group is queued: behind queued operations it waits its turn, in the same order on every
    # rank (HCCL pairs the ranks' calls by their order).
    tr.init(rank, size, directory)
    try:
        out = []
        for _ in range(5):
            large = torch.full((1 << 20,), float(rank + 1))
            works = [dist.all_reduce(large, async_op=True), dist.all_reduce(large[:4], async_op=True)]
            small = torch.full((2,), 10.0 * (rank + 1))
            dist.all_reduce(small, op=dist.ReduceOp.MAX)
            for work in works:
                work.wait()
            out += [small[0].item(), large[0].item(), large[-1].item()]
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_small_blocking_all_reduce_waits_for_the_queued_ones(tmp_path: Any) -> None:
    size = 2
    once = np.sum([np.full(1 << 20, float(r + 1)) for r in range(size)], axis=0)
    twice = once.copy()
    twice[:4] = np.sum([once[:4]] * size, axis=0)  # the first 4 elements are all-reduced again
    small = np.max([np.full(2, 10.0 * (r + 1)) for r in range(size)], axis=0)
    want = [float(small[0]), float(twice[0]), float(twice[-1])] * 5
    assert ranks.run_processes(_small_after_queued, size, str(tmp_path), timeout=90) == [want, want]


def _futures(rank: int, size: int, info: bytes, directory: str) -> Dict[str, Any]:
    tr.init(rank, size, directory, timeout=30.0)
    try:
        late = 0
        for _ in range(200):  # a future taken before wait() is done once wait() returns
            work = dist.all_reduce(torch.ones(8), async_op=True)
            future = work.get_future()
            work.wait()
            late += not future.done()
        # A callback that runs a collective and waits for it, as DDP's communication hooks do
        # (PowerSGD): the operation it queues must not wait for the thread running the callback.
        first = dist.all_reduce(torch.ones(1 << 20), async_op=True)

        def callback(future: Any) -> torch.Tensor:
            return dist.all_reduce(torch.full((2,), future.value()[0][0].item()), async_op=True).get_future().wait()[0]

        chained = first.get_future().then(callback).wait()
        return {"late": late, "chained": chained.tolist()}
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_futures_settle_before_wait_returns_and_their_callbacks_may_run_collectives(tmp_path: Any) -> None:
    out = ranks.run_processes(_futures, 2, str(tmp_path), timeout=90)
    assert out == [{"late": 0, "chained": [4.0, 4.0]}] * 2


def _described(exc: BaseException) -> Dict[str, Any]:
    """What a handler of a torch backend's failure can read off ``exc``."""
    return {"type": type(exc).__name__, "torch": isinstance(exc, dist.DistBackendError),
            "hcclpy timeout": isinstance(exc, hcclpy.CommTimeoutError), "api": exc.api, "code": exc.code,
            "name": exc.name, "detail": exc.detail, "cause": type(exc.__cause__).__name__,
            "cause api": getattr(exc.__cause__, "api", None), "message": str(exc)}


def _timeout(rank: int, size: int, info: bytes, directory: str, async_op: bool) -> Any:
    gloo = tr.init(rank, size, directory, timeout=2.0)
    try:
        if rank == 0:
            try:
                work = dist.all_reduce(torch.ones(4), async_op=async_op)  # rank 1 never joins
                if work is not None:
                    work.wait()
                return "returned"
            except dist.DistBackendError as exc:  # as torch users catch their backends' failures
                return _described(exc)
            finally:
                dist.barrier(group=gloo)
        dist.barrier(group=gloo)
        return "waited"
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_group_timeout_ends_an_operation_a_peer_never_joins(async_op: bool, tmp_path: Any) -> None:
    out = ranks.run_processes(_timeout, 2, str(tmp_path), async_op, timeout=90)
    assert out[1] == "waited"
    got = out[0]
    assert isinstance(got, dict), got
    assert got["type"] == "BackendTimeoutError" and got["torch"] and got["hcclpy timeout"], got
    # The C function, its code and the library's text travel with it; the hcclpy error is its cause.
    assert got["cause"] in ("HcclTimeoutError", "AclTimeoutError"), got
    assert got["api"] and got["api"] == got["cause api"] and isinstance(got["code"], int) and got["name"], got
    assert "allreduce on process group" in got["message"] and " Timed out " in got["message"], got
    assert got["detail"] in got["message"], got


def _lazy_views(rank: int, size: int, info: bytes, directory: str) -> List[str]:
    tr.init(rank, size, directory)
    try:
        negative = (torch.tensor([1 + 2j]) * (rank + 1)).conj().imag  # its memory holds +2, +4
        outcomes = []
        for name, call in [("all_gather", lambda: dist.all_gather([torch.zeros(1)] * size, negative)),
                           ("send", lambda: dist.send(negative, 1 - rank)),
                           ("broadcast", lambda: dist.broadcast(torch._neg_view(torch.ones(2)), 0))]:
            try:
                call()
                outcomes.append(f"{name}: ran")
            except ValueError as exc:
                outcomes.append(f"{name}: {exc}")
        dist.all_gather(gathered := [torch.zeros(1) for _ in range(size)], negative.resolve_neg())
        outcomes.append(str([t.item() for t in gathered]))
        return outcomes
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_tensors_with_the_negative_bit_are_refused(tmp_path: Any) -> None:
    """Their memory does not hold their values (x.conj().imag reads +2 where the tensor is -2): the
    backend moved the memory, so the values arrived with the wrong sign."""
    out = ranks.run_processes(_lazy_views, 2, str(tmp_path), timeout=90)
    assert out[0] == out[1]
    assert out[0][0] == ("all_gather: all_gather: input holds a tensor whose negative bit is set (a lazy view, "
                         "its memory unchanged); pass tensor.resolve_conj() or tensor.resolve_neg()"), out[0][0]
    assert out[0][1].startswith("send: "), out[0][1]
    assert out[0][2].startswith("broadcast: broadcast: tensors holds a tensor whose negative bit is set")
    assert out[0][3] == "[-2.0, -4.0]"


def _mismatched_receive(rank: int, size: int, info: bytes, directory: str) -> List[str]:
    tr.init(rank, size, directory, timeout=20.0)
    try:
        work = dist.isend(torch.ones(4), 1) if rank == 0 else dist.irecv(torch.empty(3), 0)
        try:
            work.wait()
            return {"type": "no error"}
        except dist.DistBackendError as exc:
            return _described(exc)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_failed_operation_raises_from_wait_as_torch_backends_do(tmp_path: Any) -> None:
    for got in ranks.run_processes(_mismatched_receive, 2, str(tmp_path), timeout=90):
        assert got["type"] == "BackendError" and got["torch"], got
        # The failure is reported by the first call that meets the failed stream: HCCL's or ACL's.
        assert got["cause"] in ("HcclError", "AclError") and got["api"] == got["cause api"], got
        assert "posted a receive of 3" in got["message"] and got["name"] and got["code"], got


def _refusals(rank: int, size: int, info: bytes, directory: str) -> List[str]:
    tr.init(rank, size, directory)
    messages = []
    cases = [
        lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND),
        lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.AVG),
        lambda: dist.all_reduce(torch.ones(2, dtype=torch.complex64).real, op=dist.ReduceOp.MAX),
        lambda: dist.reduce(torch.ones(2, dtype=torch.complex64), 0, op=dist.ReduceOp.MAX),
        lambda: dist.reduce_scatter_tensor(torch.empty(1, dtype=torch.complex128), torch.ones(2, dtype=torch.complex128),
                                           op=dist.ReduceOp.PRODUCT),
        lambda: dist.all_reduce(torch.ones(4, 4).t()),
        lambda: dist.recv(torch.ones(2)),
        lambda: dist.reduce_scatter(torch.empty(2), [torch.ones(3), torch.ones(3)]),
        lambda: dist.all_gather_into_tensor(torch.empty(5), torch.ones(2)),
        lambda: hcclpy.torch.all_gather_into_tensor_uneven(torch.empty(4, 2), torch.ones(1, 2), [1, 2]),
        lambda: dist.all_gather_into_tensor(torch.empty(4, 3, 2, 2),
                                            torch.ones(2, 3, 2, 2).contiguous(memory_format=torch.channels_last)),
        lambda: dist.all_gather_into_tensor(torch.empty(3, 2, 2, 2).contiguous(memory_format=torch.channels_last),
                                            torch.ones(1, 2, 3, 2).contiguous(memory_format=torch.channels_last)),
        # [rank][tensor]: one list per rank (2), each with one tensor per input (3)
        lambda: dist.all_gather_coalesced([[torch.empty(1)] * 2] * 3, [torch.ones(1)] * 2),
        lambda: dist.all_gather_coalesced([[torch.empty(1)] * 3] * 2, [torch.ones(1)] * 2),
    ]
    try:
        for case in cases:
            try:
                case()
                messages.append("accepted")
            except (ValueError, TypeError) as exc:
                messages.append(f"{type(exc).__name__}: {exc}")
        # Nothing above reached HCCL: the group still works.
        x = torch.ones(1)
        dist.all_reduce(x)
        messages.append(f"sum {x.item()}")
        return messages
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_unsupported_combinations_are_refused_before_they_run(tmp_path: Any) -> None:
    out = ranks.run_processes(_refusals, 2, str(tmp_path), timeout=90)
    messages = out[0]
    expected = ["ReduceOp.BAND", "ReduceOp.AVG needs a floating-point tensor", "non-contiguous",
                "reduce with ReduceOp.MAX is not supported on complex tensors (torch.complex64)",
                "reduce_scatter_tensor with ReduceOp.PRODUCT is not supported on complex tensors",
                "non-contiguous", "recv without a source rank", "blocks", "equal blocks", "split sizes",
                "mix memory formats (channels_last, contiguous)",
                "a channels_last tensor is cut into blocks of rows, so its first dimension (3) must be a multiple of 2",
                "all_gather_coalesced: output_tensor_lists must hold 2 lists (one per rank) of 2 tensors (one per "
                "input), got lists of [2, 2, 2]",
                "got lists of [3, 3]"]
    assert len(messages) == len(expected) + 1, messages
    for message, fragment in zip(messages, expected):
        assert fragment in message and message.startswith(("ValueError", "TypeError")), (fragment, message)
    assert messages[-1] == "sum 2.0"
