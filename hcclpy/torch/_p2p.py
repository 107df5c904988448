"""Point-to-point traffic of a process group: one channel per direction and peer.

HCCL sends are rendezvous (a send finishes when the peer's matching receive has taken the data)
and the operations of one communicator run one after another. Two ranks that both send first and
receive second would therefore wait for each other forever on a shared communicator. Each
direction of each pair of ranks gets its own two-rank communicator instead, with its own ordered
executor: sends to a peer and receives from it progress independently, in the order they were
posted, whatever the peer does meanwhile (the semantics of gloo, and what ``batch_isend_irecv``
promises). Each tag gets channels of its own, so that messages match by tag, then in posting
order, as with gloo. As torch_npu does for its point-to-point communicators, they are created on
first use with a small buffer (``P2P_HCCL_BUFFSIZE`` MB, default 20), through the process group's
store: the receiver says there that it is ready, and only then does the sender make the root info
and publish it. So the sender waits for a receive that never comes within the group's timeout,
not ``HCCL_CONNECT_TIMEOUT``, and a root info is used as soon as it is made (HCCL gives up on
one nobody joins within ``HCCL_CONNECT_TIMEOUT``), however late the receive is posted.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from .. import _environment
from ..communicator import Communicator
from ..config import CommConfig
from ..rootinfo import RootInfo
from ..runtime import Device, Stream
from ._errors import BackendTimeoutError, timed_out
from ._work import Executor, Work

_P2P_BUFFER_MB = 20


def _p2p_buffer_mb() -> int:
    """``P2P_HCCL_BUFFSIZE``: MB of buffer for each point-to-point communicator (default 20)."""
    return _environment.count("P2P_HCCL_BUFFSIZE", _P2P_BUFFER_MB, int, 1,
                     f"a whole number of MB, 1 or more (default {_P2P_BUFFER_MB})")


def p2p_config(base: Optional[CommConfig], exec_timeout: float) -> CommConfig:
    """The configuration of point-to-point communicators: the group's, with a small buffer."""
    values = {} if base is None else {k: v for k, v in vars(base).items() if v is not None}
    values.pop("name", None)  # names are unique per communicator: let the library choose
    values["buffer_size_mb"] = _p2p_buffer_mb()
    values.setdefault("exec_timeout", exec_timeout)
    return CommConfig(**values)


class Channel:
    """Traffic with tag ``tag`` from group rank ``source`` to group rank ``target``, seen from one
    of the two. ``prefix`` keeps the store keys of one group's creation apart from another's;
    ``timeout``: the group's, how long the first transfer waits for the peer to post its side."""

    def __init__(self, store: Any, prefix: str, source: int, target: int, tag: int, me: int, device: Device,
                 config: CommConfig, group_name: str, timeout: float) -> None:
        self._store = store
        self._timeout = timeout
        self._closing = threading.Event()  # close() was called: a wait for the peer ends
        self._key = f"{prefix}p2p/{source}-{target}/{tag}"
        self._sending = me == source
        self._device = device
        self._config = config
        self._comm: Optional[Communicator] = None
        self._stream: Optional[Stream] = None
        self._lock = threading.Lock()
        self._executor = Executor(f"{group_name}-p2p-{source}-{target}-{tag}")

    def _connect(self) -> Communicator:
        # Runs in this channel's executor: creation waits for the peer without blocking anything else.
        with self._lock:
            if self._comm is None:
                if self._sending:  # rank 0 of the pair
                    self._wait_for(self._key + "/ready", "posted no receive (did it post the matching receive?)")
                    self._store.delete_key(self._key + "/ready")  # a later creation waits for a fresh one
                    info = RootInfo.generate(self._device)
                    self._store.set(self._key, info.to_bytes())
                else:
                    self._store.delete_key(self._key)  # a root info from a creation that failed before
                    self._store.set(self._key + "/ready", b"1")
                    info = RootInfo(self._wait_for(self._key, "published no root info (did it post the matching send?)"))
                self._comm = Communicator(2, info, 0 if self._sending else 1, config=self._config,
                                          device=self._device)
            return self._comm

    def _wait_for(self, key: str, failure: str) -> bytes:
        """The value of ``key`` once the peer has set it, within the group's timeout (or until the
        channel is closed)."""
        # Polled, not a blocking get: a TCPStore client serves one request at a time, and a get
        # waiting for this pair's key would hold back the sets of the other directions by the
        # same client, so two ranks that both receive first would each wait for the other's set
        # until the store timed out.
        deadline = time.monotonic() + self._timeout
        pause = 0.0005
        while not self._store.check([key]):
            if time.monotonic() > deadline:
                raise BackendTimeoutError(f"{self._key}: " + timed_out(f"the peer {failure} within the group's "
                                                                       f"timeout of {self._timeout:g} s"))
            if self._closing.wait(pause):
                raise RuntimeError(f"{self._key}: the process group was destroyed while this rank waited for the "
                                   f"peer, which {failure}")
            pause = min(pause * 2, 0.02)
        return self._store.get(key)

    def stream(self) -> Stream:
        """The stream NPU transfers of this channel run on (created on first use)."""
        if self._stream is None:
            self._stream = self._device.create_stream()
        return self._stream

    def submit(self, body: Callable[[Communicator], None], work: Work) -> Work:
        """Queue ``body(comm)`` (one send or receive on the pair's communicator, where the peer is
        rank ``1 - comm.rank``) after the earlier traffic of this direction."""
        return self._executor.submit(lambda: body(self._connect()), work, blocking=False)

    def close(self, timeout: float) -> None:
        self._closing.set()  # a transfer still waiting for the peer to post its side will not get it
        self._executor.close(timeout)
        with self._lock:
            if self._comm is not None:
                self._comm.destroy()
                self._comm = None
            if self._stream is not None:
                self._stream.close()
                self._stream = None
