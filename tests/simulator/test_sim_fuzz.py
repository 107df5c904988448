"""Fuzz the simulator's C ABI through :mod:`hcclpy._ffi`: random arguments get error codes, never a crash.

Every exported HCCL function and every AscendCL runtime function the binding declares is called
with random arguments: garbage, NULL, stale, destroyed and wrong-kind handles (communicators,
streams, events, contexts, also forged ones that look like table handles); device pointers that are
live, freed, offset into or past an allocation, on the wrong device, host memory or arbitrary
integers; counts near allocation sizes and up to 2**64-1; dtypes, reduce ops, copy kinds and
memory policies outside their enums; roots, peers and ranks out of range; root infos, rank tables
and ``HcclCommConfig`` structs with random bytes and targeted corruptions. Calls come as *programs*,
sequences of up to 30 calls on a fresh set of fixtures (a 1-rank communicator, a 2-rank
``HcclCommInitAll`` communicator, streams and buffers on two devices, pinned and pageable host
buffers, events, a context), so that state-dependent bugs show up too: use after destroy, an
operation held in a group while its stream goes away, frees of freed memory.

The requirement is that the simulator never crashes or hangs: every call returns a valid
``HcclResult`` / ``aclError`` code (any code is acceptable), the strings it returns are readable,
and after a step that gave a stream work the program may synchronise it (with a timeout), so an
error that surfaces only there is collected too. Two more oracles are cheap and exact: an
``aclrtMalloc`` larger than the device must fail, and once every stream is synchronised and
destroyed at the end of a program no communicator may still have operations in flight.

How it runs: the programs execute in a child process (this file run as a script with
``--driver``) under a hard timeout per program. The child appends every call to a log before it
makes it, so a segfault, an abort or a hang fails the test with the exact call that did it, the
program's calls so far and the child's Python stack (faulthandler), never by taking pytest down.
Hypothesis draws one seed per program with a fixed, derandomised budget and no shrinking (a
failing program already names the offending call; shrinking would re-run crashing programs for
minutes); :func:`make_program` turns the seed into the program. Hand-picked programs, among them
the bugs this fuzzer found, as regressions with the codes they must return, run in
:func:`test_hand_picked`.

Deeper runs: ``HCCLPY_FUZZ_EXAMPLES`` sets the number of programs, and ``HCCLPY_FUZZ_CHILD_ENV``
(a JSON object) is added to the child's environment, e.g. to run the simulator compiled with
``-fsanitize=address,undefined`` (``HCCLPY_BACKEND=auto``, ``HCCLPY_LIBASCENDCL`` /
``HCCLPY_LIBHCCL`` naming the sanitized libraries, ``LD_PRELOAD`` the sanitizer runtimes,
``ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1``): memory errors that do not crash
an ordinary build then abort the child and fail the test the same way.

Deliberately **not** fuzzed: preconditions that no implementation can check, where real CANN
would crash just the same, so a crash would be correct behaviour.

* Host memory the library must read or write: every output pointer (``uint32_t *``, ``HcclComm *``,
  ``void **``, ``float *`` ...), ``HcclRootInfo *``, ``HcclCommConfig *``, path strings, the
  count/displacement vectors, the AlltoAllVC matrix, the ``rankIds`` / ``devices`` /
  ``HcclSendRecvItem`` arrays. They are NULL or real host memory at least as large as the API
  reads (vectors have 64 entries, more than the 16 a 4-rank matrix needs; ``itemNum``,
  ``rankNum`` and ``ndev`` never exceed their arrays; configs are allocated at full size with a
  random declared size); their contents are random.
* ``HcclGetCommName`` gets a buffer of at least 128 bytes, as the API requires; ``HcclConfigGetInfo``
  an ``info`` buffer of at least ``infoLen`` bytes, and ``HcclCommInitRootInfoScalable`` a
  ``rootInfoList`` of at least ``nRoot`` root infos.
* The host-side operands of ``aclrtMemcpy[Async]`` (both for HOST_TO_HOST and DEFAULT, the source
  for HOST_TO_DEVICE, the destination for DEVICE_TO_HOST) are real host buffers and ``count``
  stays inside them; device pointers there (live or freed) are fine since they can be checked.
  Device-side operands are fully random. Host memory given to an async copy stays allocated until
  the stream ran it (fixture buffers only; fuzzed ``aclrtMallocHost`` buffers only go to
  ``aclrtFreeHost``).
* ``aclrtLaunchCallback`` gets a real function or NULL; ``ACL_CALLBACK_BLOCK`` is left to one
  hand-picked case: a blocking callback holds its stream until the subscribed thread runs
  ``aclrtProcessReport``, so with a random thread id the stream waits forever, as on a device.
  ``aclrtProcessReport(-1)`` waits forever when nothing is pending, so its timeouts are short.
* Output cells of an initialisation inside ``HcclGroupStart`` stay alive until ``HcclGroupEnd``
  writes them.
* Root infos name the child's own pid or pids that cannot be alive: a forged live pid would make
  the simulator open another process's descriptors (as root, any process on the machine).
* Rank-table paths are never FIFOs (``open`` blocks until a writer comes, by POSIX semantics);
  directories, ``/dev/null`` and ``/dev/zero`` are fuzzed.
* ``hcclExecTimeOut = 0`` (no limit) is not drawn: an unmatched collective on a multi-rank
  communicator with no limit waits forever by design. Everything else waits for at most
  ``HCCL_EXEC_TIMEOUT`` / ``HCCL_CONNECT_TIMEOUT``, set short for the child.
* One host thread: concurrent calls are not fuzzed.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]

HOST_BYTES = 1 << 16  # each fixture host buffer (pageable and pinned)
DEV_BYTES = 1 << 16  # each fixture device allocation
VEC_ENTRIES = 64  # host arrays: more than any communicator here reads (4 ranks: a 16-entry matrix)
SYNC_MS = 2000  # the synchronisation after a step; ops wait HCCL_EXEC_TIMEOUT at most
PROGRAM_TIMEOUT = 60.0  # seconds for one program, fixtures and teardown included
RESTART_EVERY = 60  # programs per child: bounds what leaks across programs (root-info memfds)
MASK64 = (1 << 64) - 1
DEVICE_MEMORY = 64 << 20  # HCCLPY_SIM_DEVICE_MEMORY of the child

# The child's world: 4 small devices (a successful call touches at most 64 MiB), and short
# timeouts so that a collective nobody matches fails quickly instead of waiting for its peer.
CHILD_ENV = {
    "HCCLPY_BACKEND": "sim",
    "HCCLPY_SIM_DEVICES": "4",
    "HCCLPY_SIM_DEVICE_MEMORY": str(DEVICE_MEMORY),
    "HCCL_CONNECT_TIMEOUT": "0.5",
    "HCCL_EXEC_TIMEOUT": "0.3",
}
# Variables that could point the child at another library or renumber its devices.
CHILD_ENV_DROP = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_RT_VISIBLE_DEVICES", "HCCLPY_LIBASCENDCL",
                  "HCCLPY_LIBHCCL", "HCCL_SO_PATH", "LD_LIBRARY_PATH", "HCCL_BUFFSIZE")

# enum sim_kind of hcclpy/sim/src/common/sim.h: the low 4 bits of every handle.
KIND_CODES = {"stream": 1, "event": 2, "context": 3, "comm": 4}
HANDLE_KINDS = tuple(KIND_CODES)

# rootinfo_wire_t of hcclpy/sim/src/hccl/internal.h: what HcclGetRootInfo writes.
RI_FIELDS = {"magic": (0, "8s"), "token": (8, "16s"), "pid": (24, "<i"), "fd": (28, "<i"),
             "start_time": (32, "<Q"), "node": (40, "64s")}
# HcclCommConfig (v11): offsets of the fields a program may set.
CFG_FIELDS = {"hcclBufferSize": (24, "<I"), "hcclDeterministic": (28, "<I"), "hcclCommName": (32, "128s"),
              "hcclOpExpansionMode": (288, "<I"), "hcclRdmaTrafficClass": (292, "<I"),
              "hcclRdmaServiceLevel": (296, "<I"), "hcclWorldRankID": (300, "<I"), "hcclJobID": (304, "<Q"),
              "hcclExecTimeOut": (316, "<i"), "hcclQos": (2228, "<I")}
DEAD_PIDS = (0, -1, (1 << 31) - 1, (1 << 22) + 1)  # no process has these (pid_max is at most 2**22)
CFG_MAGIC = 0xF0F0F0F0
CFG_VERSION = 11


def host_sides(kind: int) -> Tuple[bool, bool]:
    """Which operands of an ``aclrtMemcpy`` of ``kind`` the runtime takes as host memory (dst, src).

    HOST_TO_HOST and DEFAULT: both; HOST_TO_DEVICE (and via a buffer): the source; DEVICE_TO_HOST:
    the destination. Unknown kinds count as both, so that no program relies on them being refused.
    """
    return kind in (0, 2, 4) or kind > 7, kind in (0, 1, 4, 5) or kind > 7


def rank_table(devices: Sequence[int], *, server: str = "host-0") -> str:
    """A rank table in the documented format: rank i on ``devices[i]``, all on one server."""
    entries = [{"device_id": str(d), "device_ip": f"192.168.100.{10 + r}", "rank_id": str(r)}
               for r, d in enumerate(devices)]
    return json.dumps({"status": "completed", "version": "1.0", "server_count": "1",
                       "server_list": [{"server_id": server, "device": entries}]})


# ================================================================================ the child

def acl_codes() -> frozenset:
    """Every ``aclError`` value the simulator's headers define (what an ACL call may return)."""
    codes = set()
    for header in (REPO / "hcclpy" / "sim" / "include" / "acl").rglob("*.h"):
        text = header.read_text()
        codes.update(int(v) for v in re.findall(r"static const int ACL_\w+ = (\d+);", text))
        codes.update(int(v) for v in re.findall(r"#define (?:ACL_ERROR_\w+|ACL_RT_SUCCESS)\s+(\d+)", text))
    return frozenset(codes)


class Driver:
    """Runs fuzz programs on the simulator, in the child process.

    A program is ``{"id": n, "steps": [[function, [argument specs], stream_index], ...]}``.
    Argument specs are JSON values resolved here, against this program's objects: an int is a
    number (wrapped to the parameter's C type), a list is ``[tag, ...]`` (see :meth:`resolve`).
    ``stream_index`` >= 0 asks for ``aclrtSynchronizeStreamWithTimeout`` on that argument after
    the call; a fourth element, in hand-picked programs, is the code the call must return. The
    reply lists the problems found: invalid or unexpected return codes, unreadable strings, an
    allocation larger than the device that succeeded, operations still in flight at teardown.
    """

    def __init__(self, log_fd: int, workdir: Path) -> None:
        from hcclpy import _ffi

        self.ffi = _ffi.ffi
        self.lib = _ffi.api()
        self.log_fd = log_fd
        self.workdir = workdir
        self.hccl_codes_by_name = self.ffi.typeof("HcclResult").relements
        self.hccl_codes = frozenset(self.hccl_codes_by_name.values())
        self.acl_codes = acl_codes()
        self.tid = threading.get_ident()  # pthread_self() of this thread, for aclrtSubscribeReport
        self.files = 0
        self.reset()
        self.callback = self.ffi.callback("void(void *)", self._on_callback)
        self.label = "init"
        ffi = self.ffi
        self.host = [ffi.new("char[]", HOST_BYTES) for _ in range(2)]
        self.pinned: List[int] = []
        self.must(self.call("aclrtSetDevice", [0]) == 0, "aclrtSetDevice(0)")
        for _ in range(2):
            cell = ffi.new("void **")
            self.must(self.call("aclrtMallocHost", [cell, HOST_BYTES]) == 0, "aclrtMallocHost")
            self.pinned.append(self.address(cell[0]))
        (workdir / "empty").write_bytes(b"")
        (workdir / "dir").mkdir(exist_ok=True)
        self.fds = {"empty": os.open(workdir / "empty", os.O_RDWR), "devnull": os.open(os.devnull, os.O_RDWR),
                    "log": log_fd}

    # ------------------------------------------------------------------------ helpers

    def _on_callback(self, user_data: Any) -> None:
        self.log(f"{self.label}: host callback ran")

    def address(self, pointer: Any) -> int:
        return int(self.ffi.cast("uintptr_t", pointer))

    def must(self, condition: bool, what: str) -> None:
        if not condition:
            raise RuntimeError(f"fixture call failed: {what}: {self.recent()}")

    def recent(self) -> str:
        text = self.lib.aclGetRecentErrMsg()
        return "" if text == self.ffi.NULL else self.ffi.string(text).decode("utf-8", "replace")

    def log(self, line: str) -> None:
        # os.write, not a buffered file: the line is in the log before the call, even if it crashes.
        os.write(self.log_fd, (line + "\n").encode("utf-8", "replace"))

    def call(self, name: str, args: Sequence[Any], shown: Optional[Sequence[str]] = None) -> Any:
        """Call ``name`` (logged before and after) and check what it returned."""
        text = ", ".join(shown) if shown is not None else ", ".join(self.show(a) for a in args)
        self.log(f"{self.label}: {name}({text})")
        result = getattr(self.lib, name)(*args)
        self.log(f"    -> {self.show(result)}")
        self.check_result(name, result)
        return result

    def show(self, value: Any) -> str:
        """A C value for the log: pointers in hex, numbers in decimal."""
        if isinstance(value, int):
            return str(value)
        if isinstance(value, self.ffi.CData):
            kind = self.ffi.typeof(value).kind
            if kind in ("pointer", "array", "function"):
                return hex(self.address(value))
            if kind == "struct":  # by value: its bytes
                return repr(bytes(self.ffi.buffer(self.ffi.new(self.ffi.getctype(self.ffi.typeof(value), "*"), value))))
            return str(int(value))
        return repr(value)

    def check_result(self, name: str, result: Any) -> None:
        """Record a problem unless ``result`` is a valid code (or a readable string) for ``name``."""
        ffi = self.ffi
        if name in ("HcclGetErrorString", "aclrtGetSocName"):
            if result == ffi.NULL:
                self.problems.append(f"{self.label}: {name} returned NULL")
            else:
                ffi.string(result)  # must be a readable C string
            return
        if name == "aclGetRecentErrMsg":
            if result != ffi.NULL:
                ffi.string(result)
            return
        if name == "HcclGetCommConfigCapability":
            return
        if name == "aclDataTypeSize":  # a size, not a code: one of the element sizes, or 0
            if int(result) not in (0, 1, 2, 4, 8, 16):
                self.problems.append(f"{self.label}: aclDataTypeSize returned {int(result)}")
            return
        code = int(result)
        if name in ("aclrtPeekAtLastError", "aclrtGetLastError"):
            # The simulator keeps one "last error" per thread for both libraries, so a failed
            # HCCL call leaves an HcclResult there: accept both kinds of code.
            valid = code in self.acl_codes or code in self.hccl_codes
        else:
            valid = code in (self.hccl_codes if name.startswith("Hccl") else self.acl_codes)
        # Read the error text after every failure: it is formatted from the fuzzed values.
        self.last_error = self.recent() if code != 0 else ""
        if not valid:
            self.problems.append(f"{self.label}: {name} returned {code}, not a valid code ({self.last_error})")

    # --------------------------------------------------------------------- resolving

    def registry(self, kind: str, index: int) -> int:
        """The ``index``-th handle of ``kind`` this program made (modulo their number; 0 if none)."""
        items = self.reg[kind]
        return items[index % len(items)] if items else 0

    def pointer_of(self, spec: List[Any]) -> int:
        """The address a pointer spec names (``dev``, ``host``, ``pinned``, ``pinfuzz``)."""
        tag, index = spec[0], spec[1]
        offset = spec[2] if len(spec) > 2 else 0
        if tag == "dev":
            base = self.dev[index % len(self.dev)][0] if self.dev else 0
        elif tag == "host":
            base = self.address(self.host[index % len(self.host)])
        elif tag == "pinned":
            base = self.pinned[index % len(self.pinned)]
        else:  # pinfuzz: a buffer the program got from aclrtMallocHost
            base = self.pinfuzz[index % len(self.pinfuzz)][0] if self.pinfuzz else 0
        return (base + offset) & MASK64

    def number(self, value: int, ctype: Any) -> Any:
        """``value`` wrapped to an integer or enum C type, as the C call would see it."""
        if ctype.kind == "enum":
            return self.ffi.cast(ctype, value & 0xFFFFFFFF)
        bits = 8 * self.ffi.sizeof(ctype)
        value &= (1 << bits) - 1
        signed = not (ctype.cname.startswith("u") or ctype.cname == "size_t")
        if signed and value >= 1 << (bits - 1):
            value -= 1 << bits
        return value

    def resolve(self, spec: Any, ctype: Any) -> Any:
        """The C argument for ``spec`` given the parameter's C type.

        Tags: ``null``; ``raw`` (an integer address); ``reg`` (an object of this program by kind
        and index: live, destroyed or of another kind than the parameter wants); ``forged`` (a
        handle-shaped integer); ``dev`` / ``host`` / ``pinned`` / ``pinfuzz`` (buffers, with an
        offset); ``out`` (a fresh output cell of the parameter's type); ``buf`` (n bytes);
        ``cell`` (a ``void *`` cell holding a handle); ``outarr`` (n output handles); ``vec`` /
        ``u32arr`` / ``i32arr`` (host arrays, values repeated to the length); ``items``
        (``HcclSendRecvItem`` array); ``ri`` (a root info); ``rilist`` (an array of them);
        ``cfg`` (an ``HcclCommConfig``);
        ``path`` (a file); ``str`` (a C string); ``bytes`` (a struct by value, from a string);
        ``cb`` (the callback); ``tid`` (this thread).
        """
        ffi = self.ffi
        if isinstance(spec, int):
            if ctype.kind == "pointer":
                return ffi.cast(ctype, spec & MASK64)
            return self.number(spec, ctype)
        tag = spec[0]
        if tag == "null":
            return ffi.NULL
        if tag == "tid":
            return self.number(self.tid, ctype)
        if tag == "cb":
            return self.callback
        if tag == "raw":
            address = spec[1] & MASK64
        elif tag == "reg":  # an optional fourth element: an offset from it
            address = (self.registry(spec[1], spec[2]) + (spec[3] if len(spec) > 3 else 0)) & MASK64
        elif tag == "shareable":  # a shareable handle of this process: its pid, a descriptor, slot, generation
            address = os.getpid() << 42 | (spec[1] & 0xFFFF) << 26 | (spec[2] & 0x3FF) << 16 | (spec[3] & 0xFFFF)
        elif tag == "forged":
            address = ((spec[3] & 0xFFFFFFFF) << 32 | (spec[2] & 0x0FFFFFFF) << 4 | (spec[1] & 0xF)) & MASK64
        elif tag in ("dev", "host", "pinned", "pinfuzz"):
            address = self.pointer_of(spec)
        else:
            obj = self.build(spec, ctype)
            self.keep.append(obj)
            return ffi.cast(ctype, obj) if ctype.kind == "pointer" else obj
        return ffi.cast(ctype, address) if ctype.kind == "pointer" else self.number(address, ctype)

    def build(self, spec: List[Any], ctype: Any) -> Any:
        """The host object behind a structured spec (kept alive by the caller)."""
        ffi = self.ffi
        tag = spec[0]
        if tag == "out":
            return ffi.new(ctype)
        if tag == "buf":
            return ffi.new("char[]", spec[1])
        if tag == "bytes":  # a struct passed by value, from its bytes
            value = ffi.new(ffi.getctype(ctype, "*"))
            ffi.memmove(value, spec[1].encode()[:ffi.sizeof(ctype)], min(len(spec[1]), ffi.sizeof(ctype)))
            return value[0]
        if tag == "cell":
            return ffi.new("void **", self.resolve(spec[1], ffi.typeof("void *")))
        if tag == "outarr":
            return ffi.new("void *[]", max(1, spec[1]))
        if tag in ("vec", "u32arr", "i32arr"):
            values = spec[1] or [0]
            length = max(VEC_ENTRIES, len(values))
            ctype_name = {"vec": "uint64_t[]", "u32arr": "uint32_t[]", "i32arr": "int32_t[]"}[tag]
            element = ffi.typeof(ctype_name).item
            return ffi.new(ctype_name, [self.number(values[i % len(values)], element) for i in range(length)])
        if tag == "items":
            items = ffi.new("HcclSendRecvItem[]", max(1, len(spec[1])))
            for item, (kind, buf, count, dtype, peer) in zip(items, spec[1]):
                item.sendRecvType = kind & 0xFFFFFFFF  # the enums are unsigned int in C
                item.buf = self.resolve(buf, ffi.typeof("void *"))
                item.count = count & MASK64
                item.dataType = dtype & 0xFFFFFFFF
                item.remoteRank = peer & 0xFFFFFFFF
            return items
        if tag == "ri":
            return self.root_info(spec[1], spec[2])
        if tag == "rilist":
            infos = ffi.new("HcclRootInfo[]", max(1, len(spec[1])))
            for index, (_, base, patches) in enumerate(spec[1]):
                ffi.memmove(infos + index, self.root_info(base, patches), ffi.sizeof("HcclRootInfo"))
            return infos
        if tag == "cfg":
            return self.config(*spec[1:])
        if tag == "path":
            return ffi.new("char[]", self.path(spec[1], spec[2] if len(spec) > 2 else None).encode())
        if tag == "str":
            return ffi.new("char[]", spec[1].encode())
        if tag == "prop":  # an aclrtPhysicalMemProp
            prop = ffi.new("aclrtPhysicalMemProp *")
            signed = ffi.typeof("int")
            prop.handleType, prop.allocationType, prop.memAttr = (self.number(v, signed) for v in spec[1:4])
            prop.location.id, prop.location.type = spec[4] & 0xFFFFFFFF, self.number(spec[5], signed)
            prop.reserve = spec[6] & MASK64
            return prop
        raise ValueError(f"unknown argument spec {spec!r}")

    def root_info(self, base: List[Any], patches: List[List[Any]]) -> Any:
        """An ``HcclRootInfo``: a real one of this program, zeros or random bytes, then patched."""
        data = bytearray(4108)
        if base[0] == "fresh" and self.reg["rootinfo"]:
            data[:] = self.reg["rootinfo"][base[1] % len(self.reg["rootinfo"])]
        elif base[0] == "rand":
            data[:] = random.Random(base[1]).randbytes(4108)
        for field, value in patches:
            if field == "byte":
                data[value[0] % 4108] = value[1] & 0xFF
                continue
            offset, fmt = RI_FIELDS[field]
            if field == "pid" and value == "self":
                value = os.getpid()
            elif field == "fd" and isinstance(value, str):
                value = self.fds[value]
            elif isinstance(value, str):  # magic, token, node: bytes as text, padded with NULs by struct
                value = value.encode("latin-1")
            struct.pack_into(fmt, data, offset, value)
        # Random bytes under a valid magic word would name random live processes, whose descriptors
        # the simulator would then open: only this process and pids that cannot be alive are used.
        if struct.unpack_from("<i", data, RI_FIELDS["pid"][0])[0] not in (os.getpid(), *DEAD_PIDS):
            struct.pack_into("<i", data, RI_FIELDS["pid"][0], DEAD_PIDS[-1])
        return self.ffi.new("HcclRootInfo *", {"internal": bytes(data)})

    def config(self, base: str, size: Optional[int], magic: Optional[int], version: Optional[int],
               fields: Dict[str, Any], patches: List[List[int]]) -> Any:
        """An ``HcclCommConfig`` at full size: initialised, zeros or random, then changed."""
        ffi = self.ffi
        full = ffi.sizeof("HcclCommConfig")
        data = bytearray(full)
        if base == "init":  # what the header's HcclCommConfigInit writes
            struct.pack_into("<QIIQII", data, 0, full, CFG_MAGIC, CFG_VERSION, 0, 0xFFFFFFFF, 0xFFFFFFFF)
            for name in ("hcclRdmaTrafficClass", "hcclRdmaServiceLevel", "hcclQos"):
                struct.pack_into("<I", data, CFG_FIELDS[name][0], 0xFFFFFFFF)
            struct.pack_into("<i", data, CFG_FIELDS["hcclExecTimeOut"][0], -1)
        elif isinstance(base, int):  # a seed for random bytes
            data[:] = random.Random(base).randbytes(full)
        for value, (offset, fmt) in ((size, (0, "<Q")), (magic, (8, "<I")), (version, (12, "<I"))):
            if value is not None:
                struct.pack_into(fmt, data, offset, value & ((1 << (8 * struct.calcsize(fmt))) - 1))
        for name, value in fields.items():
            offset, fmt = CFG_FIELDS[name]
            if isinstance(value, str):
                value = value.encode("latin-1")
            elif fmt in ("<I", "<Q"):
                value &= (1 << (8 * struct.calcsize(fmt))) - 1
            struct.pack_into(fmt, data, offset, value)
        for offset, byte in patches:
            data[offset % full] = byte & 0xFF
        config = ffi.new("HcclCommConfig *")
        ffi.memmove(config, bytes(data), full)
        return config

    def path(self, what: str, text: Optional[str]) -> str:
        """A path for ``HcclCommInitClusterInfo``: special files, or a file holding ``text``."""
        special = {"missing": str(self.workdir / "no-such-file"), "dir": str(self.workdir / "dir"),
                   "devnull": os.devnull, "devzero": "/dev/zero", "empty": str(self.workdir / "empty"), "": ""}
        if what in special:
            return special[what]
        self.files += 1
        path = self.workdir / f"table-{self.files}.json"
        path.write_text(text or "", encoding="utf-8", errors="surrogateescape")
        return str(path)

    # ---------------------------------------------------------------------- programs

    def reset(self) -> None:
        """Forget the previous program's objects (its teardown destroyed them)."""
        # Handles of every kind, live or destroyed, in creation order; root infos as bytes.
        self.reg: Dict[str, List[Any]] = {kind: [] for kind in (*HANDLE_KINDS, "rootinfo")}
        # Virtual memory: reserved addresses, physical memory handles, shareable handles, mappings.
        self.reg.update(virt=[], phys=[], share=[])
        self.mapped: List[int] = []
        self.dev: List[List[Any]] = []  # device allocations: [address, size, live]
        self.pinfuzz: List[List[Any]] = []  # aclrtMallocHost buffers of the program: [address, live]
        self.pending_cells: List[Any] = []  # HcclComm cells the outermost HcclGroupEnd writes
        self.depth = 0  # HcclGroupStart nesting
        self.problems: List[str] = []
        self.keep: List[Any] = []  # C objects the library may still use after the call that got them
        self.last_error = ""

    def run(self, program: Dict[str, Any]) -> Dict[str, Any]:
        """Set up fixtures, run the steps, tear everything down; return the problems found."""
        self.reset()
        self.log(f"=== program {program['id']}")
        self.label = f"program {program['id']} fixtures"
        self.fixtures()
        for number, (name, specs, sync_index, *expected) in enumerate(program["steps"]):
            self.label = f"program {program['id']} step {number}"
            code = self.step(name, specs, sync_index)
            if expected and code != expected[0]:
                self.problems.append(f"{self.label}: {name} returned {code}, expected {expected[0]} "
                                     f"({self.last_error})")
        self.label = f"program {program['id']} teardown"
        self.teardown()
        return {"problems": self.problems}

    def fixtures(self) -> None:
        """What every program starts with; the indexes are those the generators call plausible."""
        ffi, call = self.ffi, self.call
        self.must(call("aclrtSetDevice", [0]) == 0, "aclrtSetDevice(0)")
        for _ in range(3):
            info = ffi.new("HcclRootInfo *")
            self.must(call("HcclGetRootInfo", [info]) == 0, "HcclGetRootInfo")
            self.reg["rootinfo"].append(bytes(ffi.buffer(info)))
        cell = ffi.new("void **")
        info = ffi.new("HcclRootInfo *", {"internal": self.reg["rootinfo"].pop()})
        self.must(call("HcclCommInitRootInfo", [1, info, 0, cell]) == 0, "HcclCommInitRootInfo")
        self.reg["comm"].append(self.address(cell[0]))
        cells = ffi.new("void *[]", 2)
        self.must(call("HcclCommInitAll", [2, ffi.new("int32_t[]", [0, 1]), cells]) == 0, "HcclCommInitAll")
        self.reg["comm"] += [self.address(cells[0]), self.address(cells[1])]
        # streams 0, 1 and buffers dev 0..3 on device 0; stream 2 and dev 4 on device 1
        for device, streams, buffers in ((0, 2, 4), (1, 1, 1)):
            self.must(call("aclrtSetDevice", [device]) == 0, f"aclrtSetDevice({device})")
            for _ in range(streams):
                cell = ffi.new("void **")
                self.must(call("aclrtCreateStream", [cell]) == 0, "aclrtCreateStream")
                self.reg["stream"].append(self.address(cell[0]))
            for _ in range(buffers):
                cell = ffi.new("void **")
                self.must(call("aclrtMalloc", [cell, DEV_BYTES, 0]) == 0, "aclrtMalloc")
                self.dev.append([self.address(cell[0]), DEV_BYTES, True])
        for _ in range(2):
            cell = ffi.new("void **")
            self.must(call("aclrtCreateEvent", [cell]) == 0, "aclrtCreateEvent")
            self.reg["event"].append(self.address(cell[0]))
        cell = ffi.new("void **")
        self.must(call("aclrtCreateContext", [cell, 0]) == 0, "aclrtCreateContext")  # becomes current
        self.reg["context"].append(self.address(cell[0]))
        self.must(call("aclrtSetDevice", [0]) == 0, "aclrtSetDevice(0)")  # back to the default context

    def step(self, name: str, specs: List[Any], sync_index: int) -> int:
        """Run one call (and the synchronisation after it); return its code (-1 for no code)."""
        ffi = self.ffi
        function = getattr(self.lib, name)
        params = ffi.typeof(function).args
        if len(params) != len(specs):
            raise ValueError(f"{name} takes {len(params)} arguments, the program gives {len(specs)}")
        if name in ("aclrtMemcpy", "aclrtMemcpyAsync"):
            specs = self.host_side_contract(specs)
        args = [self.resolve(spec, ctype) for spec, ctype in zip(specs, params)]
        shown = [f"{json.dumps(spec)}={self.show(arg)}" if isinstance(spec, list) else self.show(arg)
                 for spec, arg in zip(specs, args)]
        result = self.call(name, args, shown)
        code = result if isinstance(result, int) else -1
        self.record(name, args, code)
        if sync_index >= 0:
            self.call("aclrtSynchronizeStreamWithTimeout", [args[sync_index], SYNC_MS])
        return code

    def host_side_contract(self, specs: List[Any]) -> List[Any]:
        """Keep the host-side operands of a copy inside real host memory (see the module doc)."""
        count = specs[3]
        host_dst, host_src = host_sides(specs[4] & 0xFFFFFFFF)
        specs = list(specs)
        for index, host in ((0, host_dst), (2, host_src)):
            spec = specs[index]
            if not host or spec[0] == "null":
                continue
            if spec[0] in ("host", "pinned"):
                offset = min(max(spec[2], 0), HOST_BYTES)
                specs[index] = [spec[0], spec[1], offset]
                count = min(count & MASK64, HOST_BYTES - offset)
            elif spec[0] == "dev" and self.dev:
                size = self.dev[spec[1] % len(self.dev)][1]
                specs[index] = ["dev", spec[1], min(max(spec[2], 0), size)]
            else:
                raise ValueError(f"host-side copy operand {spec!r} breaks the API's precondition")
        specs[3] = count
        return specs

    def record(self, name: str, args: List[Any], code: int) -> None:
        """Remember what a call created, freed or started."""
        ffi = self.ffi
        if name == "HcclGroupStart" and code == 0:
            self.depth += 1
        elif name == "HcclGroupEnd" and self.depth > 0:
            self.depth -= 1
            if self.depth == 0:
                self.harvest()
        if code != 0:
            return
        if name == "aclrtMalloc" and int(args[1]) > DEVICE_MEMORY:
            self.problems.append(f"{self.label}: aclrtMalloc of {int(args[1])} bytes succeeded on a device of "
                                 f"{DEVICE_MEMORY} bytes")
            return
        created = {"aclrtCreateStream": "stream", "aclrtCreateStreamWithConfig": "stream",
                   "aclrtCreateEvent": "event", "aclrtCreateEventWithFlag": "event",
                   "aclrtCreateEventExWithFlag": "event", "aclrtCreateContext": "context"}
        if name in created:
            self.reg[created[name]].append(self.address(args[0][0]))
        elif name in ("HcclGetRootInfo", "HcclGetRootInfoScalable"):
            self.reg["rootinfo"].append(bytes(ffi.buffer(args[0])))
        elif name.startswith("HcclCommInit") and name != "HcclCommInitAll":
            if self.depth > 0:
                self.pending_cells.append(args[-1])  # written by the outermost HcclGroupEnd
            else:
                self.add_comm(args[-1][0])
        elif name == "HcclCommInitAll":
            for i in range(min(int(args[0]), VEC_ENTRIES)):
                self.add_comm(args[2][i])
        elif name == "HcclCreateSubCommConfig":
            self.add_comm(args[6][0])
        elif name == "aclrtMalloc":
            self.dev.append([self.address(args[0][0]), int(args[1]), True])
        elif name == "aclrtMallocHost":
            self.pinfuzz.append([self.address(args[0][0]), True])
        elif name == "aclrtFree":
            for entry in self.dev:
                if entry[0] == self.address(args[0]):
                    entry[2] = False
        elif name == "aclrtFreeHost":
            for entry in self.pinfuzz:
                if entry[0] == self.address(args[0]):
                    entry[1] = False
        elif name == "aclrtReserveMemAddress":
            self.reg["virt"].append(self.address(args[0][0]))
        elif name == "aclrtMallocPhysical":
            self.reg["phys"].append(self.address(args[0][0]))
            if int(args[1]) > DEVICE_MEMORY:
                self.problems.append(f"{self.label}: aclrtMallocPhysical of {int(args[1])} bytes succeeded on a "
                                     f"device of {DEVICE_MEMORY} bytes")
        elif name == "aclrtMemImportFromShareableHandle":
            self.reg["phys"].append(self.address(args[2][0]))
        elif name == "aclrtMemExportToShareableHandle":
            self.reg["share"].append(int(args[3][0]))
        elif name == "aclrtMapMem":
            self.mapped.append(self.address(args[0]))

    def add_comm(self, handle: Any) -> None:
        """Register a communicator an initialisation returned (NULL: none, e.g. not a member)."""
        if handle != self.ffi.NULL:
            self.reg["comm"].append(self.address(handle))

    def harvest(self) -> None:
        """Register the communicators the outermost HcclGroupEnd wrote."""
        for cell in self.pending_cells:
            self.add_comm(cell[0])
        self.pending_cells = []

    def teardown(self) -> None:
        """Destroy what the program made, in an order that leaves nothing waiting."""
        call, ffi = self.call, self.ffi
        for _ in range(self.depth):
            call("HcclGroupEnd", [])
        self.depth = 0
        self.harvest()
        for stream in dict.fromkeys(self.reg["stream"]):
            call("aclrtSynchronizeStreamWithTimeout", [ffi.cast("void *", stream), 5000])
            call("aclrtDestroyStreamForce", [ffi.cast("void *", stream)])
        for comm in dict.fromkeys(self.reg["comm"]):
            if call("HcclCommDestroy", [ffi.cast("void *", comm)]) == self.hccl_codes_by_name["HCCL_E_AGAIN"]:
                # every stream was synchronised and destroyed: nothing can be in flight any more
                self.problems.append(f"{self.label}: communicator {comm:#x} still has operations in flight")
        for event in dict.fromkeys(self.reg["event"]):
            call("aclrtDestroyEvent", [ffi.cast("void *", event)])
        # Virtual memory, in CANN's order: unmap, free, release (what is gone already is refused).
        for address in dict.fromkeys(self.mapped):
            call("aclrtUnmapMem", [ffi.cast("void *", address)])
        for handle in dict.fromkeys(self.reg["phys"]):
            call("aclrtFreePhysical", [ffi.cast("void *", handle)])
        for address in dict.fromkeys(self.reg["virt"]):
            call("aclrtReleaseMemAddress", [ffi.cast("void *", address)])
        for address, _, live in self.dev:
            if live:
                call("aclrtFree", [ffi.cast("void *", address)])
        for context in dict.fromkeys(self.reg["context"]):
            call("aclrtDestroyContext", [ffi.cast("void *", context)])
        for address, live in self.pinfuzz:
            if live:
                call("aclrtFreeHost", [ffi.cast("void *", address)])
        self.keep = []


def driver_main(argv: Sequence[str]) -> int:
    """The child: read programs (JSON lines) on stdin, answer on the reply descriptor."""
    log_path, workdir, reply_fd = argv[0], Path(argv[1]), int(argv[2])
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        driver = Driver(log_fd, workdir)
        os.write(reply_fd, b'{"ready": true}\n')
    except Exception:  # noqa: BLE001 - reported to the parent
        os.write(reply_fd, (json.dumps({"error": traceback.format_exc()}) + "\n").encode())
        return 1
    for line in sys.stdin:
        try:
            reply = driver.run(json.loads(line))
        except Exception:  # noqa: BLE001 - a bug of this driver, reported to the parent
            reply = {"error": traceback.format_exc()}
        os.write(reply_fd, (json.dumps(reply) + "\n").encode())
    return 0


# =============================================================================== the parent

class ChildFailure(AssertionError):
    """The child crashed, hung, or could not run a program."""


class FuzzChild:
    """A driver process, restarted after a failure and every ``RESTART_EVERY`` programs."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: Optional[subprocess.Popen] = None
        self.runs = 0
        self.starts = 0

    def start(self) -> None:
        """Start a driver with the fuzzing environment and wait until it is ready."""
        self.starts += 1
        base = self.workdir / f"child-{self.starts}"
        base.mkdir()
        self.log_path = base / "calls.log"
        self.err_path = base / "stderr.txt"
        env = {k: v for k, v in os.environ.items() if k not in CHILD_ENV_DROP}
        env.update(CHILD_ENV)
        env.update(json.loads(os.environ.get("HCCLPY_FUZZ_CHILD_ENV", "{}")))
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        read_end, write_end = os.pipe()
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--driver", str(self.log_path), str(base), str(write_end)],
                cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=err, stderr=err, pass_fds=(write_end,),
                start_new_session=True,  # its own process group: nothing of it outlives a kill
            )
        os.close(write_end)
        self.replies = os.fdopen(read_end, "rb", buffering=0)
        self.pending = b""
        self.runs = 0
        ready = self.reply(PROGRAM_TIMEOUT, None)
        if not ready.get("ready"):
            self.fail("could not start", None, ready.get("error", ""))

    def reply(self, timeout: float, program: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """The child's next answer; a failure if it dies or says nothing for ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self.fail(f"hung: no answer within {timeout:.0f} s", program)
            ready, _, _ = select.select([self.replies], [], [], left)
            if ready:
                chunk = self.replies.read(65536)
                if not chunk:
                    self.fail("died", program)
                self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, program: Dict[str, Any]) -> List[str]:
        """Run one program; its problems, or :class:`ChildFailure` on a crash or hang."""
        if self.proc is None or self.runs >= RESTART_EVERY:
            self.stop()
            self.start()
        self.runs += 1
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(program) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.fail("died", program)
        answer = self.reply(PROGRAM_TIMEOUT, program)
        if "error" in answer:
            self.fail("raised in the driver", program, answer["error"])
        return answer["problems"]

    def fail(self, what: str, program: Optional[Dict[str, Any]], detail: str = "") -> None:
        """Stop the child and raise a report naming the call it was in."""
        proc = self.proc
        if proc is not None and proc.poll() is None and what.startswith("hung"):
            os.kill(proc.pid, signal.SIGUSR1)  # faulthandler: the Python stacks of all threads
            time.sleep(0.5)
        self.stop(kill=True)
        code = proc.returncode if proc is not None else None
        if code is not None and code < 0:
            what += f" (killed by {signal.Signals(-code).name})" if -code in signal.valid_signals() else ""
        log = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        start = max((i for i, ln in enumerate(log) if ln.startswith("===")), default=0)
        calls = [ln for ln in log[start:] if not ln.startswith(("    ->", "==="))]
        last = log[-1] if log else ""
        culprit = last if log and not last.startswith(("    ->", "===")) else "(between calls)"
        stderr = self.err_path.read_text(errors="replace") if self.err_path.exists() else ""
        report = [f"the simulator child {what}", f"in the call: {culprit}", f"(full log: {self.log_path})",
                  "--- the program's calls so far ---", *calls[-25:]]
        if detail:
            report += ["--- driver error ---", detail]
        if stderr.strip():
            report += ["--- child stderr (last 60 lines) ---", *stderr.splitlines()[-60:]]
        if program is not None:
            report += ["--- program ---", json.dumps(program)]
        raise ChildFailure("\n".join(report))

    def stop(self, kill: bool = False) -> None:
        """End the child: it exits when its input closes; ``kill`` (or 10 s) ends it at once."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            if not kill:
                proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        self.replies.close()


@pytest.fixture(scope="module")
def child(sim_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzChild]:
    """The driver process (the simulator is built first, so the child never compiles it)."""
    runner = FuzzChild(tmp_path_factory.mktemp("fuzz"))
    yield runner
    runner.stop()


def run_program(child: FuzzChild, steps: List[Any], ident: Any) -> None:
    """Run ``steps`` in the child and fail on a crash, a hang or an invalid return code."""
    problems = child.run({"id": ident, "steps": steps})
    assert not problems, "\n".join(problems + ["--- program ---", json.dumps(steps)])


# ============================================================================== generators

# Programs come from seeds: hypothesis draws the seeds (a fixed, derandomised budget) and the small
# kit below turns each seed into a program. Drawing programs with hypothesis strategies directly
# spent most of the budget on hypothesis's mutations, near-copies of earlier examples (up to five
# per fresh one, each a round trip to the child: 600 distinct calls in 3,700); from seeds every
# program is new. Reusing an object is still common: plausible handles come from a few indexes.

Rand = random.Random


class Gen:
    """Draws a value from a ``random.Random``: the fuzzer's small counterpart of a strategy."""

    __slots__ = ("draw",)

    def __init__(self, draw: Callable[[Rand], Any]) -> None:
        self.draw = draw

    def __call__(self, r: Rand) -> Any:
        return self.draw(r)


def just(value: Any) -> Gen:
    return Gen(lambda r: value)


def ints(low: int, high: int) -> Gen:
    return Gen(lambda r: r.randint(low, high))


def sampled(values: Sequence[Any]) -> Gen:
    values = tuple(values)
    return Gen(lambda r: r.choice(values))


def one_of(*gens: Gen) -> Gen:
    return Gen(lambda r: r.choice(gens)(r))


def builds(make: Callable[..., Any], *gens: Gen) -> Gen:
    return Gen(lambda r: make(*(g(r) for g in gens)))


def lists(gen: Gen, low: int, high: int) -> Gen:
    return Gen(lambda r: [gen(r) for _ in range(r.randint(low, high))])


# Characters for random rank-table text: JSON syntax, digits, letters, blanks, escapes, non-ASCII.
TEXT_CHARS = '{}[]",:.-+eE0123456789 \t\n\\/utrnfalsrvecompld_' + "\x00\x7f\u00e9\u4e2d\U0001f600"
text = Gen(lambda r: "".join(r.choice(TEXT_CHARS) for _ in range(r.randint(0, 200))))

U64_EDGES = [0, 1, 2, 3, 4, 7, 8, 63, 64, 65, 255, 256, 1023, 1024, 4095, 4096, 4097, 8191, 8192, 16383, 16384,
             32768, 65535, 65536, 65537, 1 << 20, (1 << 26) + 1, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32,
             0x7FFFFFFFF, 0x800000000, (1 << 61) + 1, (1 << 63) - 1, 1 << 63, MASK64 - 64, MASK64 - 63, MASK64 - 1,
             MASK64]
U32_EDGES = [0, 1, 2, 3, 4, 5, 7, 8, 12, 13, 14, 17, 18, 24, 25, 255, 256, 1041, 4095, 4096, 4097, (1 << 31) - 1,
             1 << 31, (1 << 32) - 2, (1 << 32) - 1]
I32_EDGES = [-(1 << 31), -65536, -2, -1, 0, 1, 2, 3, 4, 7, 8, 255, 256, 65536, (1 << 31) - 1]

u64 = one_of(sampled(U64_EDGES), ints(0, MASK64))
u32 = one_of(sampled(U32_EDGES), ints(0, (1 << 32) - 1))
i32 = one_of(sampled(I32_EDGES), ints(-(1 << 31), (1 << 31) - 1))
small = ints(0, 64)
null = just(["null"])
raw = builds(lambda v: ["raw", v], u64)


class P:
    """A parameter: how to draw a plausible value (``good``) and an arbitrary one (``bad``).

    ``tie`` makes a plausible value copy the one drawn for parameter ``tie`` (AlltoAll's send and
    receive counts, say), so that valid calls are common enough to reach the deeper checks.
    """

    def __init__(self, good: Gen, bad: Optional[Gen] = None, *, tie: Optional[int] = None,
                 stream: bool = False) -> None:
        self.good = good
        self.bad = one_of(good, bad) if bad is not None else good
        self.tie = tie
        self.stream = stream


def handle(kind: str, good_indexes: Sequence[int]) -> P:
    """A handle parameter: mostly a live object of the kind, else anything handle-shaped."""
    good = builds(lambda i: ["reg", kind, i], sampled(good_indexes))
    bad = one_of(
        builds(lambda k, i: ["reg", k, i], sampled(HANDLE_KINDS), ints(0, 9)),  # destroyed, made later, wrong kind
        null, raw,
        builds(lambda c, i, g: ["forged", c, i, g], ints(0, 15), one_of(ints(0, 40), u32), one_of(ints(0, 6), u32)),
        builds(lambda i: ["dev", i, 0], ints(0, 9)),
    )
    return P(good, bad, stream=kind == "stream")


def comm() -> P:
    return handle("comm", [0, 0, 0, 1, 2])  # 0: the 1-rank comm; 1, 2: the ranks of a 2-rank one


def stream() -> P:
    return handle("stream", [0, 0, 1, 2])  # 0, 1 on device 0; 2 on device 1


def event() -> P:
    return handle("event", [0, 1])


def context() -> P:
    return handle("context", [0, 1])


good_dptr = builds(lambda i, o: ["dev", i, o], ints(0, 3), sampled([0, 0, 0, 0, 64, 4096]))
offsets = one_of(sampled([-(1 << 20), -4096, -64, -1, 1, 2, 3, 4, DEV_BYTES - 8, DEV_BYTES - 1, DEV_BYTES,
                          DEV_BYTES + 64, 1 << 20, 1 << 26]),
                 ints(-(1 << 63), (1 << 63) - 1))
any_dptr = one_of(
    builds(lambda i, o: ["dev", i, o], ints(0, 12), offsets),  # live, freed, other device, outside
    builds(lambda t, i, o: [t, i, o], sampled(["host", "pinned"]), ints(0, 1), small),
    builds(lambda i: ["pinfuzz", i, 0], ints(0, 3)),
    null, raw,
    builds(lambda k, i: ["reg", k, i], sampled(HANDLE_KINDS), ints(0, 5)),
)


def dptr() -> P:
    return P(good_dptr, any_dptr)


def count(tie: Optional[int] = None) -> P:
    return P(small, u64, tie=tie)


# 0..11 move data, 12 (int128) and the fp8 numbers are refused, anything else is no dtype
bad_dtype = one_of(sampled([12, 13, 14, 15, 16, 17, 255]), u32)


def dtype(tie: Optional[int] = None) -> P:
    return P(ints(0, 11), bad_dtype, tie=tie)


def redop() -> P:
    return P(ints(0, 3), one_of(sampled([4, 5, 255]), u32))


def root() -> P:
    return P(sampled([0, 0, 1]), u32)


def peer() -> P:
    return P(sampled([1, 1, 0]), u32)  # 1 is the other rank of the 2-rank comm


def vector() -> P:
    good = builds(lambda v: ["vec", v], lists(ints(0, 16), 1, 4))
    return P(good, one_of(null, builds(lambda v: ["vec", v], lists(u64, 0, 8))))


def out() -> P:
    return P(just(["out"]), null)


def number(good: Gen, bad: Gen) -> P:
    return P(good, bad)


def timeout_ms() -> P:
    return P(sampled([0, 1, 10, 50, -1]), sampled([-(1 << 31), -1000, -2, 100]))


def device_id() -> P:
    return P(sampled([0, 0, 0, 1]), i32)


# A root info: a real one of this program (used or not), zeros or random bytes, and corruptions
# that get past the magic check: other pids, descriptors naming files that are not control
# segments (an empty file, the log, /dev/null, small numbers), a node name with no NUL.
fd_patch = builds(lambda v: ["fd", v], one_of(sampled(["empty", "log", "devnull", -1, (1 << 31) - 1]), ints(0, 40)))
ri_patch = one_of(
    fd_patch, fd_patch, fd_patch,  # the descriptor leads furthest into the simulator: weighted up
    builds(lambda v: ["magic", v], sampled(["HPSROOT1", "HPSROOT0", ""])),
    builds(lambda v: ["pid", v], sampled(["self", *DEAD_PIDS])),
    builds(lambda v: ["start_time", v], one_of(just(0), u64)),
    builds(lambda v: ["node", v], sampled(["", "elsewhere", "x" * 64])),
    builds(lambda v: ["token", v], Gen(lambda r: r.randbytes(16).decode("latin-1"))),
    builds(lambda o, b: ["byte", [o, b]], ints(0, 4107), ints(0, 255)),
)
root_info_good = builds(lambda i: ["ri", ["fresh", i], []], ints(0, 3))
root_info_any = builds(
    lambda base, patches: ["ri", base, patches],
    one_of(*[builds(lambda i: ["fresh", i], ints(0, 3))] * 4, just(["zero"]),
           builds(lambda s: ["rand", s], ints(0, 1 << 30))),
    lists(ri_patch, 0, 3),
)


def root_info() -> P:
    return P(root_info_good, one_of(null, root_info_any))


# An HcclCommConfig: initialised as HcclCommConfigInit does, zeros or random bytes; then a random
# declared size, magic word, version, field values and raw bytes. hcclExecTimeOut is never 0
# (no limit; see the module docstring).
def _cfg_fields(r: Rand) -> Dict[str, Any]:
    fields: Dict[str, Any] = {}
    for name in r.sample(sorted(CFG_FIELDS), r.randint(0, 4)):
        if name == "hcclCommName":
            fields[name] = r.choice(["", "fuzz", "n" * 127, "n" * 128])
        elif name == "hcclExecTimeOut":
            fields[name] = r.choice([-1, -2, 1, -(1 << 31)])
        else:
            fields[name] = u32(r)
    return fields


cfg_good = builds(lambda name: ["cfg", "init", None, None, None, {"hcclCommName": name} if name else {}, []],
                  sampled(["", "", "fuzz-comm"]))
cfg_any = builds(
    lambda base, size, magic, version, fields, patches: ["cfg", base, size, magic, version, fields, patches],
    one_of(just("init"), just("zero"), ints(0, 1 << 30)),
    one_of(just(None), sampled([0, 8, 23, 24, 32, 160, 300, 312, 2232, 2248, 1 << 20]), u64),
    one_of(just(None), just(CFG_MAGIC), u32),
    one_of(just(None), ints(0, 12), u32),
    Gen(_cfg_fields),
    lists(builds(lambda o, b: [o, b], ints(0, 2247), ints(0, 255)), 0, 4),
)


def config() -> P:
    return P(cfg_good, one_of(null, cfg_any))


TABLES = [rank_table([0]), rank_table([1]), rank_table([0, 1]), rank_table([0], server="elsewhere"),
          rank_table([7]), rank_table([0, 0])]


def mangle(text: str, cuts: List[Tuple[int, str]]) -> str:
    """``text`` with characters replaced (a position past the end truncates it there)."""
    chars = list(text)
    for position, char in cuts:
        if position >= len(chars):
            del chars[position % max(1, len(chars)):]
        elif chars:
            chars[position] = char
    return "".join(chars)


table_text = one_of(
    sampled(TABLES),
    builds(mangle, sampled(TABLES), lists(builds(lambda p, c: (p, c), ints(0, 400), sampled(TEXT_CHARS)), 1, 6)),
    text,
    sampled(["[" * 40 + "]" * 40, '{"status": "completed", "server_list": [' * 20, "1" * 4096, '"' + "\\u" * 20]),
)
path_good = just(["path", "table", rank_table([0])])
path_any = one_of(
    null,
    builds(lambda w: ["path", w], sampled(["missing", "dir", "devnull", "devzero", "empty", ""])),
    builds(lambda t: ["path", "table", t], table_text),
)


def path() -> P:
    return P(path_good, path_any)


def call(*params: P) -> Gen:
    """Arguments for a function: all plausible, one arbitrary, or a mix; plus its stream index."""
    stream_index = next((i for i, p in enumerate(params) if p.stream), -1)

    def draw(r: Rand) -> Tuple[List[Any], int]:
        mode = r.choice(("good", "good", "one_bad", "one_bad", "mixed"))
        bad_index = r.randrange(len(params)) if params else -1
        values: List[Any] = []
        for i, p in enumerate(params):
            bad = (mode == "one_bad" and i == bad_index) or (mode == "mixed" and r.random() < 0.5)
            if p.tie is not None and not bad:
                values.append(values[p.tie])
            else:
                values.append((p.bad if bad else p.good)(r))
        return values, stream_index

    return Gen(draw)


def items_call(r: Rand) -> Tuple[List[Any], int]:
    """HcclBatchSendRecv: an item array (itemNum never past its end), comm, stream."""
    fine = r.random() < 0.5

    def item(r: Rand) -> List[Any]:
        if fine:
            return [r.choice([0, 1]), good_dptr(r), small(r), ints(0, 11)(r), r.choice([1, 1, 0])]
        return [one_of(sampled([0, 1]), u32)(r), any_dptr(r), one_of(small, u64)(r), dtype().bad(r),
                peer().bad(r)]

    items = None if r.random() < 0.1 else [item(r) for _ in range(r.randint(0, 5))]
    spec, item_num = (["null"], u32(r)) if items is None else (["items", items], r.randint(0, len(items)))
    kind = "good" if fine else "bad"
    return [spec, item_num, getattr(comm(), kind)(r), getattr(stream(), kind)(r)], 3


def scalable_init_call(r: Rand) -> Tuple[List[Any], int]:
    """HcclCommInitRootInfoScalable: rootInfoList holds at least nRoot root infos when it is not NULL."""
    if r.random() < 0.5:  # one rank, from one or several real root infos of this program
        roots = [root_info_good(r) for _ in range(r.randint(1, 3))]
        return [1, 1, ["rilist", roots], 0, 0, config().good(r), out().good(r)], -1
    roots = lists(root_info_any, 1, 4)(r)
    listed = ["null"] if r.random() < 0.1 else ["rilist", roots]
    n_root = one_of(ints(0, len(roots)), u32)(r) if listed[0] == "null" else ints(0, len(roots))(r)
    return [one_of(ints(0, 4), u32)(r), n_root, listed, one_of(ints(0, 3), u32)(r), one_of(just(0), u32)(r),
            config().bad(r), out().bad(r)], -1


def config_info_call(r: Rand) -> Tuple[List[Any], int]:
    """HcclConfigGetInfo: the info buffer holds at least infoLen bytes when it is not NULL."""
    info_len = one_of(sampled([0, 1, 3, 4, 5, 127, 128, 1599, 1600, 4096]), ints(0, 8192))(r)
    info = ["null"] if r.random() < 0.1 else ["buf", max(1, info_len)]
    kind = "good" if r.random() < 0.5 else "bad"
    return [getattr(comm(), kind)(r), P(ints(0, 4), one_of(sampled([-1, 5, 255]), i32)).bad(r), info_len, info], -1


def sub_comm_call(r: Rand) -> Tuple[List[Any], int]:
    """HcclCreateSubCommConfig: rankIds holds at least rankNum entries when it is not NULL."""
    kind = "good" if r.random() < 0.5 else "bad"
    parent = ["null"] if r.random() < 0.1 else ["cell", getattr(comm(), kind)(r)]
    if kind == "good":
        ids = r.choice([[0], [0], [0, 1], [1], [1, 0]])
        rank_ids, rank_num = ["u32arr", ids], len(ids)
    elif r.random() < 0.8:
        rank_ids = ["u32arr", lists(one_of(ints(0, 4), u32), 0, 6)(r)]
        rank_num = r.randint(0, VEC_ENTRIES)
    else:
        rank_ids, rank_num = ["null"], u32(r)
    sub_id = one_of(ints(0, 3), u64)(r)
    sub_rank = sampled([0, 0, 1])(r) if kind == "good" else u32(r)
    return [parent, rank_num, rank_ids, sub_id, sub_rank, getattr(config(), kind)(r), getattr(out(), kind)(r)], -1


def init_all_call(r: Rand) -> Tuple[List[Any], int]:
    """HcclCommInitAll: devices and comms hold at least ndev entries when they are not NULL."""
    if r.random() < 0.5:  # distinct devices that exist
        devices = r.sample(range(4), r.randint(1, 4))
        return [len(devices), ["i32arr", devices], ["outarr", VEC_ENTRIES]], -1
    devices = None if r.random() < 0.2 else lists(one_of(ints(0, 3), i32), 1, 5)(r)
    comms = r.random() < 0.8
    ndev = one_of(ints(0, 5), ints(0, VEC_ENTRIES))(r) if devices is not None and comms else u32(r)
    return [ndev, ["i32arr", devices] if devices is not None else ["null"],
            ["outarr", VEC_ENTRIES] if comms else ["null"]], -1


def host_operand(host: bool, fine: bool) -> Gen:
    """A copy operand: anything where the kind says device memory, host memory where it says host."""
    if not host:
        return good_dptr if fine else any_dptr
    buffers = builds(lambda t, i, o: [t, i, o], sampled(["host", "pinned"]), ints(0, 1),
                     small if fine else one_of(small, ints(0, HOST_BYTES)))
    if fine:
        return buffers
    return one_of(buffers, builds(lambda i, o: ["dev", i, o], ints(0, 12), one_of(just(0), small)), null)


def memcpy_call(is_async: bool) -> Gen:
    """aclrtMemcpy[Async]: the kind decides which operands must be real host memory."""

    def draw(r: Rand) -> Tuple[List[Any], int]:
        fine = r.random() < 0.5
        kind = r.randint(0, 7) if fine or r.random() < 0.5 else u32(r)
        host_dst, host_src = host_sides(kind)
        n = small(r) if fine else one_of(small, sampled([4096, DEV_BYTES, DEV_BYTES + 1, HOST_BYTES]), u64)(r)
        dest_max = n if fine else one_of(just(n), just(max(0, n - 1)), u64)(r)
        args = [host_operand(host_dst, fine)(r), dest_max, host_operand(host_src, fine)(r), n, kind]
        if not is_async:
            return args, -1
        args.append((stream().good if fine else stream().bad)(r))
        return args, 5

    return Gen(draw)


def memcpy_2d_call(is_async: bool) -> Gen:
    """aclrtMemcpy2d[Async]: rows small enough that a host side always fits its buffer (host memory
    cannot be checked); the kind, the pitches and the device side vary freely."""

    def draw(r: Rand) -> Tuple[List[Any], int]:
        fine = r.random() < 0.5
        kind = r.choice([1, 2]) if fine else one_of(ints(0, 7), u32)(r)
        host_dst, host_src = host_sides(kind)
        width, height = ints(0, 64)(r), ints(0, 8)(r)
        pitches = [width + ints(0, 64)(r) if fine or r.random() < 0.7 else ints(0, 64)(r) for _ in range(2)]
        dst = host_operand(True, True)(r) if host_dst else (good_dptr if fine else any_dptr)(r)
        src = host_operand(True, True)(r) if host_src else (good_dptr if fine else any_dptr)(r)
        args = [dst, pitches[0], src, pitches[1], width, height, kind]
        if not is_async:
            return args, -1
        args.append((stream().good if fine else stream().bad)(r))
        return args, 7

    return Gen(draw)


sizes = P(sampled([1, 64, 4096, DEV_BYTES]), u64)
flags = P(sampled([0, 1, 2, 8, 9]), u32)
tid = P(just(["tid"]), one_of(just(0), u64))
fill = P(ints(0, 255), i32)

# Virtual memory: reserved addresses (at offsets on and off the 2 MiB granularity), physical memory
# handles (live, freed, of another kind, forged), aclrtPhysicalMemProp structs, shareable handles.
# A shareable handle names its exporter's pid: forged ones name this process or pid 0 only (a live
# pid would make the simulator open another process's descriptors).
GRANULE = 2 << 20
vsizes = P(sampled([1, GRANULE, 2 * GRANULE, 4 * GRANULE]), one_of(sampled([0, 3 << 20, 1 << 30]), u64))
psizes = P(sampled([GRANULE, 2 * GRANULE]), one_of(sampled([0, 1, 3 << 20, DEVICE_MEMORY + GRANULE]), u64))
virt = P(builds(lambda i, o: ["reg", "virt", i, o], ints(0, 3), sampled([0, 0, GRANULE, 2 * GRANULE])),
         one_of(builds(lambda i, o: ["reg", "virt", i, o], ints(0, 3), sampled([1, 4096, -GRANULE, 1 << 40])),
                any_dptr))
phys = P(builds(lambda i: ["reg", "phys", i], ints(0, 3)),
         one_of(builds(lambda k, i: ["reg", k, i], sampled(HANDLE_KINDS), ints(0, 5)), null, raw,
                builds(lambda c, i, g: ["forged", c, i, g], sampled([0xA, 0xA, 1]), ints(0, 8), ints(0, 4)),
                builds(lambda i: ["dev", i, 0], ints(0, 4))))
prop = P(builds(lambda attr, device: ["prop", 0, 0, attr, device, 1, 0], sampled([4, 4, 5, 13, 12]),
                sampled([0, 0, 1])),
         builds(lambda *fields: ["prop", *fields], one_of(ints(0, 2), u32), one_of(ints(0, 2), u32),
                one_of(ints(0, 18), u32), one_of(ints(0, 4), u32), one_of(ints(0, 5), u32), u64))
shareable = P(builds(lambda i: ["reg", "share", i], ints(0, 3)),
              one_of(builds(lambda f, s, g: ["shareable", f, s, g], ints(0, 64), ints(0, 300), ints(0, 3)),
                     ints(0, (1 << 42) - 1)))

# Every HCCL function the binding declares, then every ACL function: how to draw its arguments.
FUNCTIONS: Dict[str, Gen] = {
    "HcclGetRootInfo": call(out()),
    "HcclCommInitRootInfo": call(number(just(1), one_of(sampled([0, 2, 4096, 4097]), u32)),
                                 root_info(), root(), out()),
    "HcclCommInitRootInfoConfig": call(number(just(1), one_of(sampled([0, 2, 4097]), u32)),
                                       root_info(), root(), config(), out()),
    "HcclCommInitClusterInfo": call(path(), root(), out()),
    "HcclCommInitClusterInfoConfig": call(path(), root(), config(), out()),
    "HcclCommInitAll": Gen(init_all_call),
    "HcclCreateSubCommConfig": Gen(sub_comm_call),
    "HcclCommDestroy": call(comm()),
    "HcclGetRankSize": call(comm(), out()),
    "HcclGetRankId": call(comm(), out()),
    "HcclGetCommName": call(comm(), P(just(["buf", 128]), one_of(null, just(["buf", 4096])))),
    "HcclGetErrorString": call(number(ints(0, 25), i32)),
    "HcclGetCommAsyncError": call(comm(), out()),
    "HcclGetCommConfigCapability": call(),
    "HcclSetConfig": call(number(just(0), u32), number(ints(0, 2), i32)),
    "HcclGetConfig": call(number(just(0), u32), out()),
    "HcclCommSuspend": call(comm()),
    "HcclCommResume": call(comm()),
    "HcclGroupStart": call(),
    "HcclGroupEnd": call(),
    "HcclAllReduce": call(dptr(), dptr(), count(), dtype(), redop(), comm(), stream()),
    "HcclBroadcast": call(dptr(), count(), dtype(), root(), comm(), stream()),
    "HcclReduce": call(dptr(), dptr(), count(), dtype(), redop(), root(), comm(), stream()),
    "HcclAllGather": call(dptr(), dptr(), count(), dtype(), comm(), stream()),
    "HcclAllGatherV": call(dptr(), count(), dptr(), vector(), vector(), dtype(), comm(), stream()),
    "HcclReduceScatter": call(dptr(), dptr(), count(), dtype(), redop(), comm(), stream()),
    "HcclReduceScatterV": call(dptr(), vector(), vector(), dptr(), count(), dtype(), redop(), comm(), stream()),
    "HcclScatter": call(dptr(), dptr(), count(), dtype(), root(), comm(), stream()),
    "HcclAlltoAll": call(dptr(), count(), dtype(), dptr(), count(tie=1), dtype(tie=2), comm(), stream()),
    "HcclAlltoAllV": call(dptr(), vector(), vector(), dtype(), dptr(), vector(), vector(), dtype(tie=3), comm(),
                          stream()),
    "HcclAlltoAllVC": call(dptr(), vector(), dtype(), dptr(), dtype(tie=2), comm(), stream()),
    "HcclSend": call(dptr(), count(), dtype(), peer(), comm(), stream()),
    "HcclRecv": call(dptr(), count(), dtype(), peer(), comm(), stream()),
    "HcclBatchSendRecv": Gen(items_call),
    "HcclBarrier": call(comm(), stream()),
    "HcclGetRootInfoScalable": call(out()),
    "HcclCommInitRootInfoScalable": Gen(scalable_init_call),
    "HcclConfigGetInfo": Gen(config_info_call),
    # The fixture communicators' HCCL buffer (400 MB) does not fit the child's devices: HCCL_E_OOM,
    # unless a fuzzed config made a communicator with a small hcclBufferSize.
    "HcclGetHcclBuffer": call(comm(), out(), out()),
    "HcclGetHeterogMode": call(comm(), out()),

    "aclInit": call(P(null, builds(lambda s: ["str", s], sampled(["", "/no/such/file", "/dev/null",
                                                                  str(REPO / "pyproject.toml")])))),
    "aclFinalize": call(),
    "aclGetRecentErrMsg": call(),
    "aclrtGetVersion": call(out(), out(), out()),
    "aclrtGetSocName": call(),
    "aclrtGetRunMode": call(out()),
    "aclrtSetDevice": call(device_id()),
    "aclrtResetDevice": call(device_id()),
    "aclrtGetDevice": call(out()),
    "aclrtGetDeviceCount": call(out()),
    "aclrtSynchronizeDevice": call(),
    "aclrtSynchronizeDeviceWithTimeout": call(timeout_ms()),
    "aclrtCreateContext": call(out(), device_id()),
    "aclrtDestroyContext": call(context()),
    "aclrtSetCurrentContext": call(context()),
    "aclrtGetCurrentContext": call(out()),
    "aclrtCreateStream": call(out()),
    "aclrtCreateStreamWithConfig": call(out(), P(ints(0, 7), u32), flags),
    "aclrtDestroyStream": call(stream()),
    "aclrtDestroyStreamForce": call(stream()),
    "aclrtSynchronizeStream": call(stream()),
    "aclrtSynchronizeStreamWithTimeout": call(stream(), timeout_ms()),
    "aclrtStreamWaitEvent": call(stream(), event()),
    "aclrtStreamQuery": call(stream(), out()),
    "aclrtStreamGetId": call(stream(), out()),
    "aclrtLaunchHostFunc": call(stream(), P(just(["cb"]), null), P(raw, null)),
    "aclrtDeviceCanAccessPeer": call(out(), device_id(), device_id()),
    "aclrtDeviceEnablePeerAccess": call(device_id(), P(just(0), u32)),
    "aclrtDeviceDisablePeerAccess": call(device_id()),
    "aclrtCreateEvent": call(out()),
    "aclrtCreateEventWithFlag": call(out(), flags),
    "aclrtCreateEventExWithFlag": call(out(), flags),
    "aclrtRecordEvent": call(event(), stream()),
    "aclrtResetEvent": call(event(), stream()),
    "aclrtQueryEvent": call(event(), out()),
    "aclrtQueryEventStatus": call(event(), out()),
    "aclrtSynchronizeEvent": call(event()),
    "aclrtSynchronizeEventWithTimeout": call(event(), timeout_ms()),
    "aclrtEventElapsedTime": call(out(), event(), event()),
    "aclrtDestroyEvent": call(event()),
    "aclrtMalloc": call(out(), sizes, P(sampled([0, 1, 2, 3, 0x100, 0x1000]), u32)),
    "aclrtMallocHost": call(out(), sizes),
    "aclrtFree": call(P(builds(lambda i: ["dev", i, 0], ints(0, 12)), any_dptr)),
    # never the fixture pinned buffers: async copies may still use them (see the module docstring)
    "aclrtFreeHost": call(P(builds(lambda i: ["pinfuzz", i, 0], ints(0, 3)),
                            one_of(builds(lambda i, o: ["dev", i, o], ints(0, 12), offsets),
                                   builds(lambda i, o: ["host", i, o], ints(0, 1), small), null, raw))),
    "aclrtMemcpy": memcpy_call(False),
    "aclrtMemcpyAsync": memcpy_call(True),
    "aclrtMemset": call(dptr(), P(just(DEV_BYTES), u64), fill, count()),
    "aclrtMemsetAsync": call(dptr(), P(just(DEV_BYTES), u64), fill, count(), stream()),
    "aclrtGetMemInfo": call(P(ints(0, 9), u32), out(), out()),
    "aclrtMemcpy2d": memcpy_2d_call(False),
    "aclrtMemcpy2dAsync": memcpy_2d_call(True),
    "aclDataTypeSize": call(P(ints(-1, 41), i32)),
    "aclrtMallocAlign32": call(out(), sizes, P(sampled([0, 1, 2, 3, 0x100, 0x1000]), u32)),
    "aclrtPointerGetAttributes": call(dptr(), out()),
    "aclrtHostRegister": call(P(builds(lambda i, o: ["pinned", i, o], ints(0, 1), sampled([0, 4096])), any_dptr),
                              P(sampled([4096, 8192]), u64), P(just(0), i32), out()),
    "aclrtHostUnregister": call(P(builds(lambda i, o: ["pinned", i, o], ints(0, 1), sampled([0, 4096])), any_dptr)),
    "aclrtDeviceGetBareTgid": call(out()),
    # (the key buffer always holds len bytes: a smaller one is the caller's overflow, as with any C API)
    "aclrtIpcMemGetExportKey": call(dptr(), count(), P(just(["buf", 65]), null),
                                    P(just(65), one_of(sampled([0, 64]), u64)), P(sampled([0, 1]), u64)),
    "aclrtIpcMemSetImportPid": call(P(builds(lambda s: ["str", s], sampled(["", "hcclpy-ipc-1-2-3"])), null),
                                    P(just(["i32arr", [1]]), null), P(just(1), u64)),
    "aclrtIpcMemImportByKey": call(out(), P(builds(lambda s: ["str", s], sampled(["", "hcclpy-ipc-1-2-3",
                                                                                  "hcclpy-ipc-x"])), null),
                                   P(sampled([0, 1]), u64)),
    "aclrtIpcGetEventHandle": call(event(), out()),
    "aclrtIpcOpenEventHandle": call(P(builds(lambda s: ["bytes", s], sampled(["", "hcclpy-ipce-1-2-3"])),
                                      builds(lambda s: ["bytes", s], sampled(["x" * 64, "hcclpy-ipce-x"]))), out()),
    "aclrtIpcMemClose": call(P(builds(lambda s: ["str", s], sampled(["", "hcclpy-ipc-1-2-3"])), null)),
    "aclmdlRICaptureBegin": call(stream(), P(sampled([0, 1, 2]), i32)),
    "aclmdlRICaptureGetInfo": call(stream(), out(), out()),
    "aclmdlRICaptureEnd": call(stream(), out()),
    "aclmdlRICaptureThreadExchangeMode": call(out()),
    "aclmdlRIExecuteAsync": call(P(null, raw), stream()),
    "aclmdlRIDestroy": call(P(null, raw)),
    "aclmdlRICaptureTaskGrpBegin": call(stream()),
    "aclmdlRICaptureTaskGrpEnd": call(stream(), out()),
    "aclmdlRICaptureTaskUpdateBegin": call(stream(), P(null, raw)),
    "aclmdlRICaptureTaskUpdateEnd": call(stream()),
    "aclrtSetStreamFailureMode": call(stream(), P(sampled([0, 1]), u64)),
    # Waits bounded to an hour at the shortest: a fuzzed program's event waits must not fail on time.
    "aclrtSetOpWaitTimeout": call(P(sampled([0, 3600]), one_of(just(0), ints(3600, (1 << 32) - 1)))),
    "aclrtSetOpExecuteTimeOut": call(P(sampled([0, 30]), u32)),
    "aclrtLaunchCallback": call(P(just(["cb"]), null), P(raw, null),
                                P(just(0), sampled([2, 3, 255, (1 << 32) - 1])), stream()),
    "aclrtSubscribeReport": call(tid, stream()),
    "aclrtProcessReport": call(P(sampled([0, 1, 5]), sampled([-(1 << 31), -2]))),
    "aclrtUnSubscribeReport": call(tid, stream()),
    "aclrtPeekAtLastError": call(number(just(0), u32)),
    "aclrtGetLastError": call(number(just(0), u32)),
    "aclrtReserveMemAddress": call(out(), vsizes, P(just(0), one_of(sampled([1, 4096]), u64)),
                                   P(null, one_of(raw, just(["raw", 17 << 40]))), P(sampled([0, 1]), u64)),
    "aclrtReleaseMemAddress": call(virt),
    "aclrtMallocPhysical": call(out(), psizes, prop, P(just(0), u64)),
    "aclrtFreePhysical": call(phys),
    "aclrtMapMem": call(virt, psizes, P(just(0), one_of(just(4096), u64)), phys, P(just(0), u64)),
    "aclrtUnmapMem": call(virt),
    "aclrtMemGetAllocationGranularity": call(prop, P(sampled([0, 1]), one_of(just(0xFFFF), u32)), out()),
    "aclrtMemExportToShareableHandle": call(phys, P(just(0), u32), P(sampled([0, 1]), u64), out()),
    "aclrtMemSetPidToShareableHandle": call(shareable, P(just(["i32arr", [1]]), one_of(null, just(["i32arr", [0]]))),
                                            P(just(1), one_of(ints(0, VEC_ENTRIES), u64))),
    "aclrtMemImportFromShareableHandle": call(shareable, device_id(), out()),
}
FUNCTION_NAMES = sorted(FUNCTIONS)
MAX_STEPS = 30


def make_program(seed: int) -> List[Any]:
    """The program for ``seed``: calls drawn from every function, some followed by a stream sync."""
    r = Rand(seed)
    program = []
    for _ in range(r.randint(1, MAX_STEPS)):
        name = r.choice(FUNCTION_NAMES)
        args, stream_index = FUNCTIONS[name](r)
        sync = stream_index if stream_index >= 0 and r.random() < 0.5 else -1
        program.append([name, args, sync])
    return program



# =================================================================================== tests

def test_every_function_is_fuzzed() -> None:
    """The fuzzer draws every HCCL and ACL function the binding declares, no more, no fewer."""
    from hcclpy._ffi import cdef_acl, cdef_hccl

    declared = set(cdef_acl.REQUIRED + cdef_acl.OPTIONAL + cdef_hccl.REQUIRED + cdef_hccl.OPTIONAL)
    assert set(FUNCTIONS) == declared


@settings(max_examples=int(os.environ.get("HCCLPY_FUZZ_EXAMPLES", "150")), deadline=None, derandomize=True,
          database=None, phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, MASK64))
@pytest.mark.slow
def test_fuzz(child: FuzzChild, seed: int) -> None:
    """Random programs: every call returns a valid code; nothing crashes or hangs."""
    run_program(child, make_program(seed), f"seed {seed}")


# Hand-picked programs: corner cases worth running every time, and what the fuzzer found.
# Step format: [function, [argument specs], stream index to synchronise after or -1, expected code].
HCCL_E_PARA, HCCL_E_UNAVAIL, ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_MEMORY_ALLOCATION = 1, 7, 100000, 207001
HCCL_E_OOM = 24
ACL_ERROR_RT_PARAM_INVALID, ACL_ERROR_RT_INVALID_HANDLE = 107000, 107017
DEV0, DEV1, COMM1, COMM2, S0, S1 = ["dev", 0, 0], ["dev", 1, 0], ["reg", "comm", 0], ["reg", "comm", 1], \
    ["reg", "stream", 0], ["reg", "stream", 1]
EV0, EV1 = ["reg", "event", 0], ["reg", "event", 1]
HAND_PICKED: Dict[str, List[Any]] = {
    "collectives on the 1-rank comm, every dtype, synchronised": [
        ["HcclAllReduce", [DEV0, DEV1, 8, dt, 0, COMM1, S0], 6] for dt in range(12)] + [
        ["HcclAlltoAllV", [DEV0, ["vec", [4]], ["vec", [0]], 4, DEV1, ["vec", [4]], ["vec", [0]], 4, COMM1, S0], 9],
        ["HcclAlltoAllVC", [DEV0, ["vec", [4]], 4, DEV1, 4, COMM1, S0], 6],
        ["HcclAllGatherV", [DEV0, 4, DEV1, ["vec", [4]], ["vec", [0]], 4, COMM1, S0], 7],
        ["HcclReduceScatterV", [DEV0, ["vec", [4]], ["vec", [0]], DEV1, 4, 4, 0, COMM1, S0], 8],
    ],
    "counts one element past the allocation": [
        ["HcclAllReduce", [DEV0, DEV1, DEV_BYTES // 4 + 1, 4, 0, COMM1, S0], 6],
        ["HcclAllGather", [DEV0, DEV1, DEV_BYTES + 1, 0, COMM1, S0], 5],
        ["HcclBroadcast", [["dev", 0, DEV_BYTES - 4], 2, 4, 0, COMM1, S0], 5],
        ["aclrtMemset", [["dev", 0, 8], DEV_BYTES, 0, DEV_BYTES - 7], -1],
    ],
    "freed device memory and double free": [
        ["aclrtFree", [DEV0], -1], ["aclrtFree", [DEV0], -1],
        ["HcclAllReduce", [DEV0, DEV1, 8, 4, 0, COMM1, S0], 6],
        ["aclrtMemcpy", [DEV1, 64, DEV0, 64, 3], -1],
        ["aclrtMemcpy", [["host", 0, 0], 64, DEV0, 64, 2], -1],
        ["aclrtMemcpy", [DEV0, 64, ["host", 0, 0], 64, 1], -1],
    ],
    "destroyed comm and stream, then used": [
        ["aclrtDestroyStream", [S1], -1], ["HcclCommDestroy", [COMM1], -1],
        ["HcclAllReduce", [DEV0, DEV1, 8, 4, 0, COMM1, S1], 6], ["HcclCommDestroy", [COMM1], -1],
        ["aclrtDestroyStream", [S1], -1], ["aclrtSynchronizeStream", [S1], -1],
    ],
    "an unmatched collective on the 2-rank comm times out": [
        ["HcclAllReduce", [DEV0, DEV1, 8, 4, 0, COMM2, S0], 6],
        ["HcclGetCommAsyncError", [COMM2, ["out"]], -1],
        ["HcclAllReduce", [DEV0, DEV1, 8, 4, 0, COMM2, S0], 6],
        ["HcclCommDestroy", [COMM2], -1],
    ],
    "matched send and receive on the 2-rank comm": [
        ["HcclSend", [DEV0, 16, 4, 1, COMM2, S0], -1],
        ["HcclRecv", [["dev", 4, 0], 16, 4, 0, ["reg", "comm", 2], ["reg", "stream", 2]], 5],
        ["aclrtSynchronizeStreamWithTimeout", [S0, 2000], -1],
    ],
    "blocking host callback, processed by its thread": [
        ["aclrtSubscribeReport", [["tid"], S0], -1],
        ["aclrtLaunchCallback", [["cb"], ["null"], 1, S0], -1],
        ["aclrtProcessReport", [2000], -1],
        ["aclrtSynchronizeStreamWithTimeout", [S0, 2000], -1],
        ["aclrtUnSubscribeReport", [["tid"], S0], -1],
    ],
    "host callbacks run by their thread while the stream worker posts them (regression: use after free, ASan)": [
        ["aclrtSubscribeReport", [["tid"], S0], -1, 0]] + [
        ["aclrtLaunchCallback", [["cb"], ["raw", i], 0, S0], -1, 0] for i in range(8)] + [
        ["aclrtProcessReport", [1000], -1, 0] for _ in range(8)] + [
        ["aclrtSynchronizeStreamWithTimeout", [S0, 2000], -1, 0],
        ["aclrtUnSubscribeReport", [["tid"], S0], -1, 0],
        ["aclrtProcessReport", [0], -1],
    ],
    "an initialisation held in a group, the group never ended": [
        ["HcclGroupStart", [], -1],
        ["HcclCommInitRootInfo", [1, ["ri", ["fresh", 0], []], 0, ["out"]], -1],
        ["HcclAllReduce", [DEV0, DEV1, 8, 4, 0, COMM1, S0], -1],
    ],
    "root info: unterminated node name (regression: read past the root info)": [
        ["HcclCommInitRootInfo", [1, ["ri", ["fresh", 0], [["node", "x" * 64]]], 0, ["out"]], -1, HCCL_E_PARA],
    ],
    "root info naming an empty file (regression: SIGBUS)": [
        ["HcclCommInitRootInfo", [1, ["ri", ["fresh", 0], [["fd", "empty"]]], 0, ["out"]], -1, HCCL_E_UNAVAIL],
        ["HcclCommInitRootInfo", [1, ["ri", ["fresh", 1], [["fd", "log"]]], 0, ["out"]], -1, HCCL_E_UNAVAIL],
        ["HcclCommInitRootInfo", [1, ["ri", ["fresh", 1], [["fd", "devnull"]]], 0, ["out"]], -1, HCCL_E_UNAVAIL],
        ["HcclCommInitRootInfo", [1, ["ri", ["fresh", 1], []], 0, ["out"]], -1, 0],
    ],
    "aclrtMalloc of sizes that wrap when rounded up (regression: success, overlapping blocks)": [
        ["aclrtMalloc", [["out"], size, 0], -1, ACL_ERROR_RT_MEMORY_ALLOCATION]
        for size in (MASK64, MASK64 - 63, MASK64 - 64, 1 << 63, DEVICE_MEMORY + 1)] + [
        ["aclrtMalloc", [["out"], 1 << 20, 0], -1, 0],
        ["aclrtMemset", [["dev", 5, 0], 1 << 20, 1, 1 << 20], -1, 0],
    ],
    "streams and comms destroyed while a group holds operations on them (regression: use after free)": [
        ["HcclGroupStart", [], -1],
        ["HcclAllReduce", [DEV0, DEV1, 8, 4, 0, COMM1, S1], -1, 0],
        ["aclrtDestroyStream", [S1], -1, 0],
        ["HcclGroupEnd", [], -1, HCCL_E_PARA],
        ["HcclAllReduce", [DEV0, DEV1, 8, 4, 0, COMM1, S0], -1, 0],  # the dropped op left nothing behind
        ["aclrtSynchronizeStreamWithTimeout", [S0, 2000], -1, 0],
        ["HcclGroupStart", [], -1],
        ["HcclAllReduce", [DEV0, DEV1, 8, 4, 0, COMM1, S0], -1, 0],
        ["HcclCommDestroy", [COMM1], -1, 0],
        ["HcclGroupEnd", [], -1, HCCL_E_PARA],
    ],
    "events: recorded, waited for, timed, reset, destroyed while recorded": [
        ["aclrtRecordEvent", [EV0, S0], -1, 0],
        ["HcclAllReduce", [DEV0, DEV1, 8, 4, 0, COMM1, S0], -1, 0],
        ["aclrtRecordEvent", [EV1, S0], -1, 0],
        ["aclrtStreamWaitEvent", [S1, EV1], -1, 0],
        ["aclrtSynchronizeEventWithTimeout", [EV1, 2000], -1, 0],
        ["aclrtEventElapsedTime", [["out"], EV0, EV1], -1, 0],
        ["aclrtEventElapsedTime", [["out"], EV1, EV0], -1, 0],
        ["aclrtResetEvent", [EV0, S1], 1, ACL_ERROR_INVALID_PARAM],  # made by aclrtCreateEvent: no reset
        ["aclrtRecordEvent", [EV0, S1], -1, 0],
        ["aclrtDestroyEvent", [EV0], -1, 0],
        ["aclrtSynchronizeStreamWithTimeout", [S1, 2000], -1, 0],
        ["aclrtQueryEvent", [EV0, ["out"]], -1],
        ["aclrtSynchronizeEvent", [EV0], -1],
    ],
    "freed device memory as the host side of a copy (regression: SIGSEGV past the device's memory)": [
        ["aclrtMalloc", [["out"], 48 << 20, 0], -1, 0],
        ["aclrtMalloc", [["out"], 8 << 20, 0], -1, 0],
        ["aclrtFree", [["dev", 6, 0]], -1, 0],
        ["aclrtMemcpy", [["dev", 5, 0], 48 << 20, ["dev", 6, 0], 48 << 20, 1], -1, ACL_ERROR_INVALID_PARAM],
        ["aclrtMemcpy", [["dev", 5, 0], 48 << 20, ["dev", 6, 0], 48 << 20, 4], -1, ACL_ERROR_INVALID_PARAM],
        ["aclrtMemcpy", [["dev", 6, 0], 48 << 20, ["dev", 5, 0], 48 << 20, 2], -1, ACL_ERROR_INVALID_PARAM],
        ["aclrtMemcpyAsync", [["dev", 5, 0], 48 << 20, ["dev", 6, 0], 48 << 20, 1, S0], 5, ACL_ERROR_INVALID_PARAM],
        ["aclrtMemcpy", [["dev", 5, 0], 48 << 20, ["dev", 5, 48 << 20], 1, 4], -1, ACL_ERROR_INVALID_PARAM],
        ["aclrtMemcpy", [["dev", 5, 0], 48 << 20, ["host", 0, 0], 4096, 1], -1, 0],
    ],
    "a reduce-scatter whose sendBuf is at the top of the address space (regression: pointer overflow, UBSan)": [
        ["HcclReduceScatter", [["raw", MASK64], ["null"], 59, 11, 0, COMM1, S0], 6],
    ],
    "rank tables: big, deep, truncated": [
        ["HcclCommInitClusterInfo", [["path", "table", "1" * 4096], 0, ["out"]], -1],
        ["HcclCommInitClusterInfo", [["path", "table", "[" * 100], 0, ["out"]], -1],
        ["HcclCommInitClusterInfo", [["path", "table", rank_table([0])[:-5]], 0, ["out"]], -1],
        ["HcclCommInitClusterInfo", [["path", "devzero"], 0, ["out"]], -1],
        ["HcclCommInitClusterInfo", [["path", "table", rank_table([0])], 0, ["out"]], -1],
    ],
    "config: declared size larger than the struct, name without NUL": [
        ["HcclCommInitRootInfoConfig", [1, ["ri", ["fresh", 0], []], 0,
                                        ["cfg", "init", MASK64, None, None, {}, []], ["out"]], -1],
        ["HcclCommInitRootInfoConfig", [1, ["ri", ["fresh", 1], []], 0,
                                        ["cfg", "init", None, None, 2, {"hcclCommName": "n" * 128}, []], ["out"]], -1],
    ],
    "the CANN 9.x communicator functions: configuration items, the HCCL buffer, the scalable bootstrap": [
        ["HcclGetHeterogMode", [COMM1, ["out"]], -1, 0],
        ["HcclConfigGetInfo", [COMM1, 3, 4, ["buf", 4]], -1, 0],
        ["HcclConfigGetInfo", [COMM1, 1, 1600, ["buf", 1600]], -1, 0],
        ["HcclConfigGetInfo", [COMM1, 4, 127, ["buf", 127]], -1, HCCL_E_PARA],  # a string takes UDI_MAX_LENGTH
        ["HcclConfigGetInfo", [COMM1, 2, 8, ["buf", 8]], -1, HCCL_E_PARA],  # a uint32_t takes exactly 4
        ["HcclConfigGetInfo", [COMM1, 5, 4, ["buf", 4]], -1, HCCL_E_PARA],
        ["HcclGetHcclBuffer", [COMM1, ["out"], ["out"]], -1, HCCL_E_OOM],  # 400 MB: more than a device here
        ["HcclGetRootInfoScalable", [["out"]], -1, 0],
        ["HcclCommInitRootInfoScalable", [2, 3, ["rilist", [["ri", ["fresh", i], []] for i in range(3)]], 0, 0,
                                          ["cfg", "init", None, None, None, {}, []], ["out"]], -1, HCCL_E_PARA],
        ["HcclCommInitRootInfoScalable", [1, 1, ["rilist", [["ri", ["fresh", 0], []]]], 0, 0,
                                          ["cfg", "init", None, None, None, {"hcclBufferSize": 1}, []], ["out"]], -1,
         0],
        ["HcclGetHcclBuffer", [["reg", "comm", 3], ["out"], ["out"]], -1, 0],  # 2 MB
        ["HcclGetHcclBuffer", [["reg", "comm", 3], ["out"], ["out"]], -1, 0],
        ["HcclAllReduce", [DEV0, DEV1, 8, 4, 0, ["reg", "comm", 3], S0], 6, 0],
    ],
    "virtual memory in CANN's order, and out of it": [
        ["aclrtReserveMemAddress", [["out"], 4 * GRANULE, 0, ["null"], 0], -1, 0],
        ["aclrtMallocPhysical", [["out"], 2 * GRANULE, ["prop", 0, 0, 4, 0, 1, 0], 0], -1, 0],
        ["aclrtMallocPhysical", [["out"], GRANULE, ["prop", 0, 0, 4, 0, 1, 0], 0], -1, 0],
        ["aclrtMapMem", [["reg", "virt", 0, 0], 2 * GRANULE, 0, ["reg", "phys", 0], 0], -1, 0],
        ["aclrtMapMem", [["reg", "virt", 0, GRANULE], GRANULE, 0, ["reg", "phys", 1], 0], -1,
         ACL_ERROR_RT_PARAM_INVALID],  # over a mapping
        ["aclrtMapMem", [["reg", "virt", 0, 2 * GRANULE], GRANULE, 0, ["reg", "phys", 1], 0], -1, 0],
        ["aclrtMemset", [["reg", "virt", 0, 0], 3 * GRANULE, 7, 3 * GRANULE], -1, 0],
        ["HcclAllReduce", [["reg", "virt", 0, 0], ["reg", "virt", 0, 4096], 8, 4, 0, COMM1, S0], 6, 0],
        ["aclrtMemcpy", [["host", 0, 0], 64, ["reg", "virt", 0, 2 * GRANULE - 32], 64, 2], -1, 0],
        ["aclrtMemExportToShareableHandle", [["reg", "phys", 0], 0, 0, ["out"]], -1, 0],
        ["aclrtMemSetPidToShareableHandle", [["reg", "share", 0], ["i32arr", [1]], 1], -1, 0],
        ["aclrtMemImportFromShareableHandle", [["reg", "share", 0], 0, ["out"]], -1,
         ACL_ERROR_RT_PARAM_INVALID],  # its own export
        ["aclrtFreePhysical", [["reg", "phys", 0]], -1, ACL_ERROR_RT_PARAM_INVALID],  # mapped
        ["aclrtReleaseMemAddress", [["reg", "virt", 0, 0]], -1, ACL_ERROR_RT_PARAM_INVALID],  # with mappings
        ["aclrtUnmapMem", [["reg", "virt", 0, GRANULE]], -1, ACL_ERROR_RT_PARAM_INVALID],  # inside a mapping
        ["aclrtUnmapMem", [["reg", "virt", 0, 0]], -1, 0],
        ["aclrtMemset", [["reg", "virt", 0, 0], 64, 0, 64], -1, ACL_ERROR_INVALID_PARAM],  # nothing mapped
        ["aclrtFreePhysical", [["reg", "phys", 0]], -1, 0],
        ["aclrtFreePhysical", [["reg", "phys", 0]], -1, ACL_ERROR_RT_INVALID_HANDLE],
        ["aclrtMemSetPidToShareableHandle", [["reg", "share", 0], ["i32arr", [1]], 1], -1,
         ACL_ERROR_RT_INVALID_HANDLE],  # its memory was freed
        ["aclrtReleaseMemAddress", [["reg", "virt", 0, 0]], -1, ACL_ERROR_RT_PARAM_INVALID],  # phys 1 still there
        ["aclrtUnmapMem", [["reg", "virt", 0, 2 * GRANULE]], -1, 0],
        ["aclrtFreePhysical", [["reg", "phys", 1]], -1, 0],
        ["aclrtReleaseMemAddress", [["reg", "virt", 0, 0]], -1, 0],
        ["aclrtReleaseMemAddress", [["reg", "virt", 0, 0]], -1, ACL_ERROR_RT_PARAM_INVALID],
    ],
}


@pytest.mark.parametrize("name", list(HAND_PICKED))
def test_hand_picked(child: FuzzChild, name: str) -> None:
    """Corner cases and regressions, each a fixed program."""
    run_program(child, HAND_PICKED[name], name)


if __name__ == "__main__" and sys.argv[1:2] == ["--driver"]:
    sys.exit(driver_main(sys.argv[2:]))
