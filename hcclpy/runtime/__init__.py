"""Runtime objects over AscendCL: devices, streams, events and device memory."""

from ._device import Device, DeviceLike, device_count
from ._event import Event, IpcEventHandle
from ._graph import Graph, TaskGroup, capture_thread_mode
from ._memory import (DeviceArray, HostRegistration, IpcHandle, PointerAttributes, ShapeLike, empty, from_numpy,
                      pinned_empty, pointer_attributes, register_host, zeros)
from ._settings import set_op_execute_timeout, set_op_wait_timeout
from ._stream import Stream
from ._virtual import PhysicalMemory, ShareableHandle, VirtualRange, allocation_granularity

__all__ = ["Device", "DeviceArray", "DeviceLike", "Event", "Graph", "HostRegistration", "IpcEventHandle", "IpcHandle",
           "PhysicalMemory", "PointerAttributes", "ShapeLike", "ShareableHandle", "Stream", "TaskGroup",
           "VirtualRange", "allocation_granularity", "capture_thread_mode", "device_count", "empty", "from_numpy",
           "pinned_empty", "pointer_attributes", "register_host", "set_op_execute_timeout", "set_op_wait_timeout",
           "zeros"]
