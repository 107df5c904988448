"""Pitched 2-D copies (``DeviceArray.copy_2d``) against NumPy slicing: host to device, device to
host and device to device, now and on a stream; every bad argument refused before any C call with
a message that names it; ``DataType.size`` against CANN's ``aclDataTypeSize``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hcclpy
from hcclpy import _ffi
from hcclpy.runtime import _memory

DTYPES = ["uint8", "int16", "float32", "float64"]


def _window(array: hcclpy.DeviceArray, row: int, column: int, columns: int) -> hcclpy.DeviceArray:
    """The bytes of a device matrix of ``columns`` columns from element (row, column) on."""
    return array.view("uint8")[(row * columns + column) * array.itemsize:]


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(DTYPES), direction=st.sampled_from(["h2d", "d2h", "d2d", "d2d-dst"]),
       source=st.tuples(st.integers(1, 6), st.integers(1, 7)), target=st.tuples(st.integers(1, 6), st.integers(1, 7)),
       data=st.data(), on_stream=st.booleans())
def test_a_2d_copy_equals_numpy_slicing(dtype: str, direction: str, source: Any, target: Any, data: Any,
                                        on_stream: bool) -> None:
    (rows, columns), (rows_to, columns_to) = source, target
    height = data.draw(st.integers(0, min(rows, rows_to)), label="height")
    width = data.draw(st.integers(0, min(columns, columns_to)), label="width")
    r, c = data.draw(st.integers(0, rows - height)), data.draw(st.integers(0, columns - width))
    r_to, c_to = data.draw(st.integers(0, rows_to - height)), data.draw(st.integers(0, columns_to - width))
    src = np.arange(rows * columns).astype(dtype).reshape(rows, columns)
    dst = np.full((rows_to, columns_to), 7, dtype)
    expected = dst.copy()
    expected[r_to:r_to + height, c_to:c_to + width] = src[r:r + height, c:c + width]
    item = src.itemsize
    sizes = dict(width=width * item, height=height, src_pitch=columns * item, dst_pitch=columns_to * item)
    device = hcclpy.Device(0)
    with device.create_stream() as stream:
        queue = stream if on_stream else None
        if direction == "h2d":
            into = hcclpy.from_numpy(dst, device=device)
            _window(into, r_to, c_to, columns_to).copy_2d(src=src[r:, c:], stream=queue, **sizes)
            stream.synchronize()
            result = into.to_numpy()
        elif direction == "d2h":
            out_of = hcclpy.from_numpy(src, device=device)
            _window(out_of, r, c, columns).copy_2d(dst=dst[r_to:, c_to:], stream=queue, **sizes)
            stream.synchronize()
            result = dst
        else:
            out_of, into = hcclpy.from_numpy(src, device=device), hcclpy.from_numpy(dst, device=device)
            a, b = _window(out_of, r, c, columns), _window(into, r_to, c_to, columns_to)
            if direction == "d2d":
                b.copy_2d(src=a, stream=queue, **sizes)
            else:
                a.copy_2d(dst=b, stream=queue, **sizes)
            result = into.to_numpy()  # waits for the copy queued on the stream
        np.testing.assert_array_equal(result, expected)


def test_packed_rows_are_the_default_pitch_and_a_stream_holds_both_sides() -> None:
    host = np.arange(12, dtype=np.int32)
    device = hcclpy.Device(0)
    with device.create_stream() as stream:
        array = hcclpy.zeros(12, "int32", device=device)
        array.copy_2d(src=host, width=16, height=3, stream=stream)  # 3 rows of 4 elements, packed
        assert array.to_numpy().tolist() == list(range(12))
        out = np.zeros((3, 4), np.int32)
        array.copy_2d(dst=out, width=16, height=3, stream=stream)
        assert any(held is out for held in stream._held)  # kept alive until the copy is done
        stream.synchronize()
        assert out.ravel().tolist() == list(range(12))
        array.close()


def test_a_2d_copy_waits_for_the_work_queued_on_its_device_array() -> None:
    device = hcclpy.Device(0)
    with device.create_stream() as stream:
        array = hcclpy.zeros((2, 4), "float32", device=device)
        gate = []
        stream.launch_host_func(lambda: gate.append(1))
        array.copy_from(np.ones((2, 4), np.float32), stream=stream)  # queued: not yet in the array
        out = np.zeros((2, 2), np.float32)
        array.copy_2d(dst=out, width=8, height=2, src_pitch=16)  # now: after the queued copy
        assert gate == [1] and out.tolist() == [[1, 1], [1, 1]]
        array.close()


def _forbid_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, fail the test if a copy reaches its C calls or waits for a stream."""

    def reached(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a refused 2-D copy reached a C call")

    monkeypatch.setattr(_memory, "copy_rows", reached)
    monkeypatch.setattr(_memory, "settle", reached)


@pytest.mark.parametrize("arguments, error, message", [
    (dict(), TypeError, "takes src= .* or dst= .*: got neither"),
    (dict(src="HOST", dst="HOST"), TypeError, "got both"),
    (dict(src="HOST", width=-1), ValueError, "width=-1 must be from 0"),
    (dict(src="HOST", height=-3), ValueError, "height=-3 must be from 0"),
    (dict(src="HOST", width=2.0), TypeError, "width=2.0 must be an int, got float"),
    (dict(src="HOST", height=True), TypeError, "height=True must be an int, not a bool"),
    (dict(src="HOST", src_pitch="16"), TypeError, "src_pitch='16' must be an int, got str"),
    (dict(src="HOST", src_pitch=8), ValueError, "src_pitch=8 is less than width=16: a row must fit in its pitch"),
    (dict(src="HOST", dst_pitch=4), ValueError, "dst_pitch=4 is less than width=16"),
    (dict(src="HOST", height=5), ValueError, "src: 5 rows of 16 bytes, 16 bytes apart, span 80 bytes, but src has "
                                             "64 bytes from its first byte"),
    (dict(src="HOST", dst_pitch=64), ValueError, "dst: 4 rows of 16 bytes, 64 bytes apart, span 208 bytes, but this "
                                                 "array has 64 bytes"),
    (dict(dst="READ_ONLY"), ValueError, "dst is read-only"),
    (dict(dst="OBJECTS", width=1, height=1), TypeError, "dst holds Python objects"),
    (dict(src=[1, 2]), TypeError, "src must be a numpy.ndarray or an hcclpy.DeviceArray, got list"),
    (dict(src="SELF", width=32, height=2), ValueError, "src and dst overlap"),
    (dict(src="CLOSED"), ValueError, "closed DeviceArray"),
    (dict(src="HOST", stream="OTHER_DEVICE"), ValueError, "stream is on device 1 but this array is on device 0"),
    (dict(src="HOST", stream=3), TypeError, "stream=3 must be an hcclpy.Stream or None"),
])
def test_bad_arguments_are_refused_before_any_c_call(arguments: dict, error: type, message: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    array = hcclpy.zeros((4, 4), "float32", device=0)
    read_only = np.zeros((4, 4), np.float32)
    read_only.flags.writeable = False
    closed = hcclpy.zeros(4, "float32", device=0)
    closed.close()
    other = hcclpy.Device(1).create_stream()
    named = {"HOST": np.zeros((4, 4), np.float32), "READ_ONLY": read_only, "OBJECTS": np.zeros(4, object),
             "SELF": array, "CLOSED": closed, "OTHER_DEVICE": other}
    given_ = {key: named.get(value, value) if isinstance(value, str) else value for key, value in arguments.items()}
    given_ = {"width": 16, "height": 4, **given_}
    with monkeypatch.context() as patched:
        _forbid_copies(patched)
        with pytest.raises(error, match=message):
            array.copy_2d(**given_)
    other.close()
    array.close()


def test_nothing_to_copy_makes_no_c_call(monkeypatch: pytest.MonkeyPatch) -> None:
    array = hcclpy.zeros(4, "float32", device=0)
    _forbid_copies(monkeypatch)
    array.copy_2d(src=np.zeros(4, np.float32), width=0, height=4, src_pitch=1000)  # rows past the end: empty
    array.copy_2d(dst=np.zeros(4, np.float32), width=16, height=0)
    monkeypatch.undo()
    array.close()


# aclDataType, the ACL runtime's element types (acl/acl_base.h), by HCCL's type: a table of the
# test, to compare DataType.size with CANN's own answer.
ACL_TYPES = {"INT8": 2, "INT16": 6, "INT32": 3, "FP16": 1, "FP32": 0, "INT64": 9, "UINT64": 10, "UINT8": 4,
             "UINT16": 7, "UINT32": 8, "FP64": 11, "BFP16": 27}


def test_datatype_size_is_what_acl_datatype_size_says() -> None:
    api = _ffi.api()
    if not api.present.get("aclDataTypeSize"):
        pytest.skip("this CANN has no aclDataTypeSize")
    for datatype in hcclpy.DataType:
        assert datatype.size == datatype.itemsize == api.aclDataTypeSize(ACL_TYPES[datatype.name]), datatype
    assert hcclpy.DataType.BF16.size == 2 and hcclpy.DataType.FP64.size == 8
