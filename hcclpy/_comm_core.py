"""What a communicator is to the operations: a live HCCL handle with its rank, size and device.

:class:`hcclpy.Communicator` builds on this; the collective functions accept any instance, so they
do not depend on how a communicator was created.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, NoReturn, Tuple

from . import _ffi
from .runtime import Device

__all__ = ["CommCore"]

# How many communicators of each (name, size, rank) this process has created: a communicator's
# place in that count tells it apart from others of its name in the flight recorder.
_created: Dict[Tuple[str, int, int], int] = {}
_created_lock = threading.Lock()


def _instance(name: str, size: int, rank: int) -> int:
    """Count one more communicator ``name`` of ``size`` ranks created for ``rank`` in this process
    and return its number (1 for the first). Ranks create the communicators of one name in the same
    order (creation is collective), so the k-th on one rank is the k-th on every rank."""
    key = (name, size, rank)
    with _created_lock:
        _created[key] = number = _created.get(key, 0) + 1
    return number


class CommCore:
    """A live ``HcclComm``: ``rank``, ``size``, ``device`` and the handle the C calls take."""

    __slots__ = ("__weakref__", "_handle", "_api", "_profile", "_rank", "_size", "_device", "_device_id", "_name",
                 "_closed_by", "_closing", "_aborted", "_host_state", "_default_stream", "_trace_info", "_trace_seq",
                 "_trace_p2p")

    def _bind(self, handle: Any, rank: int, size: int, device: Device, name: str) -> None:
        self._handle = handle
        self._api = _ffi.api()
        self._profile = self._api.profile  # the simulator's product profile; None: no limits
        self._rank = rank
        self._size = size
        self._device = device
        self._device_id = device.id
        self._name = name
        self._closed_by = ""
        self._closing = False  # destroy() has begun: no new NumPy call may start (collectives._staging)
        self._aborted = False  # abort() stopped it: operations are refused until it is destroyed
        self._host_state: Any = None  # staging for NumPy arrays, created on first use (collectives._staging)
        self._default_stream: Any = None  # the device's default stream, looked up on first use
        # What the flight recorder stores of this communicator (its name, rank, size and which
        # communicator of that name it is; 0 until it exists), and how it numbers its operations:
        # collectives, which every rank issues in the same order, apart from sends and receives.
        self._trace_info = (name, rank, size, _instance(name, size, rank) if handle is not None else 0)
        self._trace_seq = itertools.count(1)
        self._trace_p2p = itertools.count(1)

    @property
    def rank(self) -> int:
        """This rank's id in the communicator."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._size

    @property
    def device(self) -> Device:
        """The device this rank runs on."""
        return self._device

    @property
    def name(self) -> str:
        """The communicator's name (the same on every rank)."""
        return self._name

    @property
    def handle(self) -> int:
        """The ``HcclComm`` as an int."""
        return _ffi.address(self._live_handle())

    @property
    def destroyed(self) -> bool:
        """True once the communicator has been destroyed; False otherwise."""
        return self._handle is None

    def _live_handle(self) -> Any:
        handle = self._handle
        if handle is None:
            self._refuse_use()
        return handle

    def _refuse_use(self) -> NoReturn:
        """Raise the ValueError that says the communicator is gone, stopped (or not created yet)."""
        if self._aborted and self._handle is not None:
            raise ValueError(f"communicator '{self._name}' was aborted (Communicator.abort()): destroy it and build "
                             "a new one")
        raise ValueError(f"communicator '{self._name}' was {self._closed_by or 'destroyed'}")
