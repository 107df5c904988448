"""A thread's own capture mode (``hcclpy.capture_thread_mode``, ``aclmdlRICaptureThreadExchangeMode``):
a thread out of global mode may copy synchronously while another thread captures in global mode,
and the capture survives; a thread in global mode is refused and the capture invalidated; the
capturing thread itself only when relaxed; the previous mode comes back after the block, blocks
nest, the mode is per thread, and bad modes are refused."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

import numpy as np
import pytest

import hcclpy


@pytest.fixture()
def comm() -> Any:
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as c:
        yield c


def _during_a_global_capture(comm: hcclpy.Communicator, other_thread: Callable[[], None]) -> Optional[hcclpy.Graph]:
    """Capture an all_reduce in global mode while ``other_thread`` runs on another thread; the
    graph, or None when the capture was invalidated (the end of the block raised AclError)."""
    stream = comm.device.create_stream()
    x = hcclpy.from_numpy(np.ones(4, np.float32), device=0)
    errors: List[BaseException] = []

    def run() -> None:
        try:
            other_thread()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    try:
        with stream.capture(mode="global") as graph:
            comm.all_reduce(x, stream=stream)
            worker = threading.Thread(target=run)
            worker.start()
            worker.join(30)
            assert not worker.is_alive()
    except hcclpy.AclError as exc:
        assert exc.name == "ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED", exc
        return None
    finally:
        if errors:
            raise errors[0]
    graph.replay()
    stream.synchronize()
    assert x.to_numpy().tolist() == [1.0] * 4  # a 1-rank sum: the replay ran
    graph.close()
    stream.close()
    return graph


@pytest.mark.parametrize("mode", ["relaxed", "thread_local"])
def test_a_thread_out_of_global_mode_copies_while_another_captures_globally(comm: hcclpy.Communicator,
                                                                            mode: str) -> None:
    target = hcclpy.zeros(4, "float32", device=0)
    seen: List[str] = []

    def copy() -> None:
        with hcclpy.capture_thread_mode(mode) as previous:
            seen.append(previous)
            target.copy_from(np.full(4, 5, np.float32))  # synchronous: refused to a thread in global mode

    assert _during_a_global_capture(comm, copy) is not None
    assert seen == ["global"] and target.to_numpy().tolist() == [5.0] * 4


def test_a_thread_in_global_mode_is_refused_and_the_capture_invalidated(comm: hcclpy.Communicator) -> None:
    target = hcclpy.zeros(4, "float32", device=0)
    refused: List[str] = []

    def copy() -> None:
        with pytest.raises(hcclpy.AclError) as info:
            target.copy_from(np.full(4, 5, np.float32))
        refused.append(info.value.name)

    assert _during_a_global_capture(comm, copy) is None
    assert refused == ["ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT"]


@pytest.mark.parametrize("mode, allowed", [("relaxed", True), ("thread_local", False)])
def test_the_capturing_thread_itself_is_allowed_only_when_relaxed(comm: hcclpy.Communicator, mode: str,
                                                                   allowed: bool) -> None:
    stream = comm.device.create_stream()
    target = hcclpy.zeros(4, "float32", device=0)
    with hcclpy.capture_thread_mode(mode):
        if allowed:
            with stream.capture(mode="thread_local") as graph:
                target.copy_from(np.full(4, 5, np.float32))
            graph.close()
            assert target.to_numpy().tolist() == [5.0] * 4
        else:
            with pytest.raises(hcclpy.AclError, match="ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED"):
                with stream.capture(mode="thread_local"):
                    with pytest.raises(hcclpy.AclError, match="ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT"):
                        target.copy_from(np.full(4, 5, np.float32))
    stream.close()


def test_the_previous_mode_comes_back_and_blocks_nest() -> None:
    with hcclpy.capture_thread_mode("thread_local") as first:
        with hcclpy.capture_thread_mode("relaxed") as second:
            with hcclpy.capture_thread_mode("global") as third:
                pass
        with hcclpy.capture_thread_mode("relaxed") as again:
            pass
    with hcclpy.capture_thread_mode("global") as after:
        pass
    assert (first, second, third, again, after) == ("global", "thread_local", "relaxed", "thread_local", "global")


def test_the_mode_is_the_calling_threads_own() -> None:
    seen: List[str] = []

    def other() -> None:
        with hcclpy.capture_thread_mode("global") as previous:
            seen.append(previous)

    with hcclpy.capture_thread_mode("relaxed"):
        worker = threading.Thread(target=other)
        worker.start()
        worker.join(30)
    assert seen == ["global"]


@pytest.mark.parametrize("mode", ["Global", "local", "", None, 0])
def test_bad_modes_are_refused(mode: Any) -> None:
    with pytest.raises(ValueError, match=f"mode={mode!r} must be one of 'global', 'thread_local', 'relaxed'"):
        with hcclpy.capture_thread_mode(mode):
            pass
