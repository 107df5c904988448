"""Runtime objects over AscendCL: devices, streams, events and device memory."""

from ._device import Device, DeviceLike, device_count
from ._event import Event
from ._memory import DeviceArray, ShapeLike, empty, from_numpy, pinned_empty, zeros
from ._stream import Stream

__all__ = ["Device", "DeviceArray", "DeviceLike", "Event", "ShapeLike", "Stream", "device_count", "empty",
           "from_numpy", "pinned_empty", "zeros"]
