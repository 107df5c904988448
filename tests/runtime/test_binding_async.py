"""Work queued on a stream runs even when its rank never synchronises, as on a device.

The simulator runs a stream's work on the thread that synchronises it; work nobody waits for is
picked up by the stream's worker thread. A peer that waits for such work must not hang, whether
the worker was looking often, had spread its looks out after many synchronised calls, or had
fallen asleep after a quiet spell.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Tuple

import numpy as np
import pytest

import hcclpy
import ranks

pytestmark = pytest.mark.filterwarnings("ignore::hcclpy.SimulatorFallbackWarning")


def _peer_waits_for_unsynchronised_work(rank: int, size: int, info: bytes, flag: str,
                                        quiet: float) -> Tuple[List[float], float]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    try:
        with comm.device.create_stream() as stream:
            warm = hcclpy.from_numpy(np.ones(2, "float32"), device=comm.device)
            for _ in range(200):  # synchronised calls: the worker finds nothing and looks less often
                comm.all_reduce(warm, None, stream=stream)
                stream.synchronize()
            if rank == 0:
                time.sleep(quiet)  # long enough, when > 20 ms, for the worker to fall asleep
            small = hcclpy.from_numpy(np.full(2, rank + 1, "float32"), device=comm.device)  # eager size
            large = hcclpy.from_numpy(np.full(1 << 16, rank + 1, "float32"), device=comm.device)
            comm.all_reduce(small, None, stream=stream)
            comm.all_reduce(large, None, stream=stream)
            if rank == 1:
                stream.synchronize()  # completes only once rank 0's worker has run rank 0's part
                Path(flag).write_text("done")
            else:
                deadline = time.monotonic() + 30
                while not Path(flag).exists():  # neither synchronise nor query on this rank
                    if time.monotonic() > deadline:
                        raise AssertionError("rank 1 never finished: rank 0's queued work did not run")
                    time.sleep(0.005)
                stream.synchronize()
            return small.to_numpy().tolist(), float(large.to_numpy()[-1])
    finally:
        comm.destroy()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("quiet", [0.0, 0.1], ids=["busy", "after-a-quiet-spell"])
@pytest.mark.parametrize("mode", ranks.MODES)
def test_a_peer_waiting_for_work_nobody_synchronises_finishes(mode: str, quiet: float, tmp_path: Path) -> None:
    out = ranks.run(mode, _peer_waits_for_unsynchronised_work, 2, str(tmp_path / "rank1-done"), quiet, timeout=90)
    assert out == [([3.0, 3.0], 3.0)] * 2


def _interrupted_waits(rank: int, size: int, info: bytes, folder: str) -> dict:
    """Rank 0 queues an all_reduce before rank 1 calls, and is sent SIGINT during each kind of
    wait; rank 1 calls only once all three were interrupted."""
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    out: dict = {}
    try:
        with comm.device.create_stream() as stream:
            x = hcclpy.from_numpy(np.full(64, rank + 1.0, "float32"), device=comm.device)
            if rank == 0:
                comm.all_reduce(x, None, stream=stream)
                event = comm.device.create_event()
                event.record(stream)
                waits = {"stream": stream.synchronize, "event": event.synchronize,
                         "device": comm.device.synchronize}
                for name, wait in waits.items():
                    ranks.interrupt_soon(0.3)
                    started = time.monotonic()
                    try:
                        wait()
                        out[name] = "returned"
                    except KeyboardInterrupt:
                        out[name] = "interrupted"
                    out[name + " waited long enough"] = time.monotonic() - started >= 0.25
                Path(folder, "interrupted").touch()
                event.synchronize()  # the interrupted waits left the all_reduce queued: it completes
                event.close()
            else:
                deadline = time.monotonic() + 60
                while not Path(folder, "interrupted").exists():
                    assert time.monotonic() < deadline, "rank 0 was never interrupted"
                    time.sleep(0.01)
                comm.all_reduce(x, None, stream=stream)
            stream.synchronize()
            out["result"] = x.to_numpy().tolist()
            return out
    finally:
        comm.destroy()


@pytest.mark.timeout(120)
def test_ctrl_c_ends_a_wait_for_a_collective_whose_peer_is_late(tmp_path: Path) -> None:
    # HCCL_EXEC_TIMEOUT of 60 s: without the interrupts, rank 0's first wait would last that long
    # (rank 1 calls only once rank 0 was interrupted three times).
    first, second = ranks.run_processes(_interrupted_waits, 2, str(tmp_path), timeout=100,
                                        env={"HCCL_EXEC_TIMEOUT": "60"})
    assert {k: first[k] for k in ("stream", "event", "device")} == dict.fromkeys(("stream", "event", "device"),
                                                                                   "interrupted"), first
    assert all(first[k + " waited long enough"] for k in ("stream", "event", "device")), first
    assert first["result"] == second["result"] == [3.0] * 64


def test_an_event_recorded_on_an_idle_stream_is_reached_at_once() -> None:
    # As on a device: the record does not wait for a synchronisation (or the stream's worker) to
    # run, so an event that starts a timed loop is stamped when it was recorded, not when the
    # loop's calls were synchronised (which left their queueing out of the time measured).
    device = hcclpy.Device(0)
    with device.create_stream() as stream:
        event = device.create_event()
        try:
            event.record(stream)  # the first record on a stream starts its worker, which takes a while
            event.synchronize()
            for _ in range(5):
                event.record(stream)
                assert event.query(), "the record on an idle stream waited to be run"
        finally:
            event.close()


def test_a_wait_that_gives_up_says_how_long_it_waited() -> None:
    # The waits go to C in slices of 0.1 s: the message is about the whole wait, not the last slice.
    comms = hcclpy.Communicator.init_all([0, 1])
    try:
        x = hcclpy.from_numpy(np.ones(4, np.float32), device=comms[0].device)
        stream = comms[0].device.create_stream()
        comms[0].all_reduce(x, stream=stream)  # rank 1 never joins
        event = comms[0].device.create_event()
        event.record(stream)
        for waitable, api in ((stream, "aclrtSynchronizeStreamWithTimeout"), (event, "aclrtSynchronizeEventWithTimeout")):
            with pytest.raises(hcclpy.CommTimeoutError) as info:
                waitable.synchronize(timeout=0.35)
            assert str(info.value).startswith(f"gave up after 0.35 s: {api} failed: "), str(info.value)
        event.close()
    finally:
        for comm in comms:
            comm.destroy(timeout=0)


def test_waits_without_a_limit_work_on_a_cann_without_the_timed_waits() -> None:
    # The timed waits are optional symbols: without them a wait with no limit is one untimed call
    # (which Ctrl-C cannot end), and a wait with a limit says the function is missing.
    import gc

    from hcclpy import _ffi

    bound = _ffi.api()
    timed = ("aclrtSynchronizeStreamWithTimeout", "aclrtSynchronizeEventWithTimeout",
             "aclrtSynchronizeDeviceWithTimeout")
    saved = {name: getattr(bound, name) for name in timed}
    # The collector releases streams of earlier tests with the timed wait (to ask whether work is
    # pending): it runs first, and not while the functions are missing.
    gc.collect()
    gc.disable()
    try:
        for name in timed:
            bound.present[name] = False
            setattr(bound, name, _ffi._missing(name, "an older CANN"))
        device = hcclpy.Device(0)
        with device.create_stream() as stream:
            x = hcclpy.from_numpy(np.ones(4, np.float32), device=device)
            comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
            try:
                comm.all_reduce(x, stream=stream)
                stream.synchronize()
                event = device.create_event()
                event.record(stream)
                event.synchronize()
                device.synchronize()
                for waitable in (stream, event):
                    with pytest.raises(hcclpy.UnsupportedError, match="WithTimeout is not exported by an older CANN"):
                        waitable.synchronize(timeout=1)
                event.close()
            finally:
                comm.destroy()
        # A stream left to the collector cannot be asked whether work is pending: it is parked,
        # not destroyed (which could wait) and not an error in the finalizer.
        from hcclpy.runtime import _stream
        unraisable: list = []
        hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
        try:
            before = len(_stream._parked)
            forgotten = device.create_stream()
            with pytest.warns(ResourceWarning, match="unclosed hcclpy.Stream"):
                del forgotten
                gc.collect()
            assert not unraisable and len(_stream._parked) == before + 1
        finally:
            sys.unraisablehook = hook
    finally:
        for name, function in saved.items():
            bound.present[name] = True
            setattr(bound, name, function)
        gc.enable()
    _stream.destroy_parked()  # with the timed wait back, the idle parked stream goes
    assert len(_stream._parked) == before
