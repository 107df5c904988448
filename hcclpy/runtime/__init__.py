"""Runtime objects over AscendCL: devices, streams, events and device memory."""

from ._device import Device, device_count
from ._event import Event
from ._memory import DeviceArray, empty, from_numpy, pinned_empty, zeros
from ._stream import Stream

__all__ = ["Device", "DeviceArray", "Event", "Stream", "device_count", "empty", "from_numpy", "pinned_empty",
           "zeros"]
