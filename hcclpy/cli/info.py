"""``hcclpy info [--json]``: what hcclpy found and what it can do here.

It reports the hcclpy and Python versions, the backend (``cann`` or ``sim``), each shared library
with its path and how it was found, the AscendCL version (``aclrtGetVersion``) and SoC name
(``aclrtGetSocName``), every visible device with its free and total memory, how the NumPy path
stages element-wise operations, which optional C functions the loaded libraries export, which of
hcclpy's capabilities they give (:data:`CAPABILITIES`), the simulator's build description when
running on it, the environment variables that steer hcclpy,
and a warning for a setting that was partly ignored (the entries of ``ASCEND_RT_VISIBLE_DEVICES``
from the first one that is not a device, an ``HCCLPY_TRACE_SIZE`` that is not a number). ``--json``
prints the same as one JSON object.

Exit status 0, or 1 when the libraries cannot be loaded (the report then says why: among others an
``HCCLPY_LIBHCCL`` / ``HCCLPY_LIBASCENDCL`` / ``HCCL_SO_PATH`` that names no loadable library, an
unusable simulator cache, or a simulator setting out of range, which fails ``aclInit``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import warnings
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from .. import __version__, _environment
from ..errors import SimulatorFallbackWarning

__all__ = ["CAPABILITIES", "Capability", "add_parser", "collect", "format_text", "run"]

# Environment variables that change what hcclpy loads or how the libraries behave.
ENVIRONMENT = (
    "HCCLPY_BACKEND", "HCCLPY_LIBASCENDCL", "HCCLPY_LIBHCCL", "HCCL_SO_PATH", "ASCEND_HOME_PATH",
    "ASCEND_TOOLKIT_HOME", "ASCEND_RT_VISIBLE_DEVICES", "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_BUFFSIZE",
    "HCCL_DETERMINISTIC", "HCCL_ALGO", "HCCL_IF_IP", "HCCL_SOCKET_IFNAME", "HCCL_IF_BASE_PORT", "RANK_TABLE_FILE",
    "HCCLPY_SIM_DEVICES", "HCCLPY_SIM_DEVICE_MEMORY", "HCCLPY_SIM_CACHE", "HCCLPY_SIM_SERVER", "HCCLPY_SIM_NODE",
    "HCCLPY_SIM_PROFILE", "HCCLPY_SIM_DESYNC_CHECK",
    "HCCLPY_TRACE", "HCCLPY_TRACE_SIZE", "HCCLPY_TRACE_DIR",
)


class Capability(NamedTuple):
    """Something hcclpy does only where the loaded libraries export optional C functions."""

    name: str
    """What it is, in a few words."""
    api: str
    """The hcclpy names that give it."""
    functions: Tuple[str, ...]
    """The C functions it needs, all of them."""
    without: Optional[str] = None
    """What hcclpy does where one is missing; None: the names raise ``UnsupportedError``."""


# Every capability that depends on optional functions (cdef_acl.OPTIONAL, cdef_hccl.OPTIONAL),
# the newer CANN runtime and HCCL surface first.
CAPABILITIES: Tuple[Capability, ...] = (
    Capability("host functions", "Stream.launch_host_func", ("aclrtLaunchHostFunc",)),
    Capability("stream query without waiting", "Stream.query", ("aclrtStreamQuery",), "a wait of no time"),
    Capability("stream ids", "Stream.id", ("aclrtStreamGetId",)),
    Capability("stream failure mode", "Stream.set_failure_mode", ("aclrtSetStreamFailureMode",)),
    Capability("operator timeouts", "set_op_wait_timeout, set_op_execute_timeout",
               ("aclrtSetOpWaitTimeout", "aclrtSetOpExecuteTimeOut")),
    Capability("2-D copies in one call", "DeviceArray.copy_2d; copy_from / copy_to of rows apart",
               ("aclrtMemcpy2d", "aclrtMemcpy2dAsync"), "a copy per row (copy_from / copy_to: a contiguous copy)"),
    Capability("pointer attributes", "pointer_attributes", ("aclrtPointerGetAttributes",)),
    Capability("host registration", "register_host", ("aclrtHostRegister", "aclrtHostUnregister")),
    Capability("peer access", "Device.can_access_peer, enable_peer_access, disable_peer_access",
               ("aclrtDeviceCanAccessPeer", "aclrtDeviceEnablePeerAccess", "aclrtDeviceDisablePeerAccess")),
    Capability("IPC memory", "DeviceArray.ipc_export, DeviceArray.ipc_import",
               ("aclrtIpcMemGetExportKey", "aclrtIpcMemSetImportPid", "aclrtIpcMemImportByKey", "aclrtIpcMemClose")),
    Capability("IPC events", "Device.create_event(ipc=True), Event.ipc_handle, Event.ipc_open",
               ("aclrtCreateEventExWithFlag", "aclrtIpcGetEventHandle", "aclrtIpcOpenEventHandle")),
    Capability("virtual memory", "VirtualRange, PhysicalMemory, allocation_granularity",
               ("aclrtReserveMemAddress", "aclrtReleaseMemAddress", "aclrtMallocPhysical", "aclrtFreePhysical",
                "aclrtMapMem", "aclrtUnmapMem", "aclrtMemGetAllocationGranularity")),
    Capability("shared physical memory", "PhysicalMemory.export, PhysicalMemory.import_",
               ("aclrtMemExportToShareableHandle", "aclrtMemSetPidToShareableHandle",
                "aclrtMemImportFromShareableHandle")),
    Capability("graphs (capture, replay)", "Stream.capture, Graph.replay",
               ("aclmdlRICaptureBegin", "aclmdlRICaptureEnd", "aclmdlRIExecuteAsync", "aclmdlRIDestroy")),
    Capability("graph task groups", "Graph.group, TaskGroup.update",
               ("aclmdlRICaptureTaskGrpBegin", "aclmdlRICaptureTaskGrpEnd", "aclmdlRICaptureTaskUpdateBegin",
                "aclmdlRICaptureTaskUpdateEnd")),
    Capability("a thread's capture mode", "capture_thread_mode", ("aclmdlRICaptureThreadExchangeMode",)),
    Capability("scalable bootstrap", "RootInfo.generate(scalable=True), Communicator(n, [root infos], rank)",
               ("HcclGetRootInfoScalable", "HcclCommInitRootInfoScalable")),
    Capability("communicator config info", "Communicator.config_info", ("HcclConfigGetInfo",)),
    Capability("HCCL buffer", "Communicator.hccl_buffer", ("HcclGetHcclBuffer",)),
    Capability("heterogeneous mode", "Communicator.heterogeneous_mode", ("HcclGetHeterogMode",)),
    Capability("uneven gather and scatter", "all_gather_v, reduce_scatter_v", ("HcclAllGatherV", "HcclReduceScatterV")),
    Capability("scatter", "scatter", ("HcclScatter",)),
    Capability("all-to-all", "all_to_all", ("HcclAlltoAll",)),
    Capability("all-to-all by count matrix", "all_to_all_vc", ("HcclAlltoAllVC",)),
    Capability("batched sends and receives", "batch_send_recv", ("HcclBatchSendRecv",)),
    Capability("barrier", "barrier", ("HcclBarrier",)),
    Capability("groups", "group", ("HcclGroupStart", "HcclGroupEnd")),
    Capability("abort", "Communicator.abort", ("HcclCommSuspend",)),
    Capability("several devices in one process", "Communicator.init_all", ("HcclCommInitAll",)),
)


def capabilities(functions: Dict[str, bool]) -> List[Dict[str, Any]]:
    """:data:`CAPABILITIES` as JSON-ready dicts, each with ``available`` (every function present)
    and ``missing`` (the functions that are not), given ``functions`` (C name to presence)."""
    found = []
    for capability in CAPABILITIES:
        missing = [name for name in capability.functions if not functions.get(name)]
        found.append({**capability._asdict(), "functions": list(capability.functions), "available": not missing,
                      "missing": missing})
    return found


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``hcclpy info`` with ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    parser = subparsers.add_parser(
        "info", help="show the libraries found, versions, devices and optional functions",
        description="Show what hcclpy found: the backend (cann or sim), each library and how it was found, the "
        "AscendCL version and SoC name, the devices and their memory, the optional C functions the libraries "
        "export and the capabilities they give, and the simulator's build when running on it. Exit status 1 if the "
        "libraries cannot be loaded.")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Carry out ``hcclpy info``; return 0, or 1 when the libraries could not be loaded."""
    report = collect()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_text(report))
    return 0 if report["error"] is None else 1


def collect() -> Dict[str, Any]:
    """Everything ``hcclpy info`` reports, as a JSON-ready dict (loads the libraries).

    Returns
    -------
    dict
        ``hcclpy_version``, ``python`` (version, executable), ``environment`` (the variables of
        :data:`ENVIRONMENT` that are set), ``backend`` (``"cann"``, ``"sim"`` or None),
        ``libraries`` (name, path, found_via), ``acl_version`` (``"major.minor.patch"`` or None),
        ``soc_name``, ``device_count``, ``devices`` (id, free and total bytes, or error),
        ``functions`` (C function name to bool), ``optional_functions`` (the names hcclpy can
        do without), ``capabilities`` (:func:`capabilities`: what hcclpy can do with them),
        ``simulator`` (the build description or None), ``warnings`` (settings that
        were partly ignored, such as the entries of ``ASCEND_RT_VISIBLE_DEVICES`` from the first
        one that is not a device, or an ``HCCLPY_TRACE_SIZE`` that is not a number) and ``error``
        (why the libraries could not be loaded, else None).

    Examples
    --------
    >>> collect()["backend"]  # doctest: +SKIP
    'sim'
    """
    variables = _environment.variables()
    report: Dict[str, Any] = {
        "hcclpy_version": __version__,
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "environment": {name: variables[name] for name in ENVIRONMENT if name in variables},
        "backend": None, "libraries": [], "acl_version": None, "soc_name": None, "device_count": None,
        "devices": [], "functions": {}, "optional_functions": [], "capabilities": [], "simulator": None,
        "warnings": [], "error": None,
    }
    import hcclpy

    from .. import _ffi
    from .._ffi import cdef_acl, cdef_hccl

    try:
        with warnings.catch_warnings():
            # The report says which backend is in use; the fallback warning would only repeat it.
            warnings.simplefilter("ignore", SimulatorFallbackWarning)
            library = hcclpy.library_info()
    except Exception as exc:  # noqa: BLE001 - the report is how this failure gets explained
        report["error"] = f"{type(exc).__name__}: {exc}"
        return report
    report.update(backend=library["backend"], libraries=library["libraries"], functions=library["functions"],
                  simulator=library["simulator"],
                  optional_functions=sorted(cdef_acl.OPTIONAL + cdef_hccl.OPTIONAL),
                  capabilities=capabilities(library["functions"]))
    bound = _ffi.api()
    if bound.present.get("aclrtGetVersion"):
        parts = [_ffi.new("int32_t *") for _ in range(3)]
        if bound.aclrtGetVersion(*parts) == 0:
            report["acl_version"] = ".".join(str(part[0]) for part in parts)
    if bound.present.get("aclrtGetSocName"):
        report["soc_name"] = _ffi.string(bound.aclrtGetSocName()) or None
    try:
        report["device_count"] = hcclpy.device_count()
    except hcclpy.HcclpyError as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        return report
    problem = _environment.trace_size()[1]  # import hcclpy warned and went on, so that it can be reported here
    if problem is not None:
        report["warnings"].append(problem)
    note = visible_devices_note(_environment.visible_devices(), report["device_count"],
                                report["backend"])
    if note is not None:
        report["warnings"].append(note)
    for index in range(report["device_count"]):
        entry: Dict[str, Any] = {"id": index}
        try:
            entry["free"], entry["total"] = hcclpy.Device(index).memory_info()
        except hcclpy.HcclpyError as exc:
            entry["error"] = str(exc)
        report["devices"].append(entry)
    return report


# An entry of ASCEND_RT_VISIBLE_DEVICES as the runtime reads it (strtol: blanks, a sign, digits), and
# what separates two entries (any run of commas and blanks).
_VISIBLE_ENTRY = re.compile(r"\s*([+-]?\d+)")
_VISIBLE_SEPARATOR = re.compile(r"[\s,]*")


def _visible_entries(value: str) -> Tuple[List[str], str]:
    """The numeric entries at the start of ``value``, read as the simulator reads them, and the
    text from the first entry that is not a number on ('' when every entry is one)."""
    entries: List[str] = []
    position = len(value) - len(value.lstrip())
    while position < len(value):
        match = _VISIBLE_ENTRY.match(value, position)
        if match is None:
            break
        entries.append(match.group(1))
        position = _VISIBLE_SEPARATOR.match(value, match.end()).end()
    return entries, value[position:]


def visible_devices_note(value: str, device_count: int, backend: Optional[str]) -> Optional[str]:
    """Which entry of ``ASCEND_RT_VISIBLE_DEVICES`` (``value``) ended the list, or None when every
    entry became a device.

    The runtime, CANN's and the simulator's, takes the listed devices in order up to the first entry
    that is not a device (not a number, or no such device) and ignores it and every entry after
    it, without an error: a program then finds fewer devices (maybe none) and says only how many.
    ``device_count`` is how many the runtime made visible, so the entry at that index is the first
    one it did not take.
    """
    if value == "":
        return None  # unset or empty: every device
    visible = f"{device_count} device{'' if device_count == 1 else 's'} visible"
    entries, rest = _visible_entries(value)
    if device_count < len(entries):
        stopped = f"'{entries[device_count]}'"
    elif rest.strip():
        first = rest.split(",")[0].strip()
        stopped = f"'{first}'" if first else "an empty entry"
    elif not entries:
        return f"ASCEND_RT_VISIBLE_DEVICES={value!r} lists no device: {visible}"
    else:
        return None
    # The same words as the simulator's own message (aclrtSetDevice on a device the list left out).
    physical = _environment.sim_devices() or "8"
    where = (f"0..{int(physical) - 1}, HCCLPY_SIM_DEVICES" if backend == "sim" and physical.isdigit()
             else "no such device here")
    return (f"ASCEND_RT_VISIBLE_DEVICES={value!r} stops at {stopped}, which is not a device id ({where}): "
            f"it and the entries after it are ignored; {visible}")


def _size(nbytes: int) -> str:
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _columns(cells: List[str], indent: str, width: int) -> List[str]:
    """``cells`` in as many left-aligned columns as fit in ``width``, filled row by row."""
    if not cells:
        return []
    cell = max(len(text) for text in cells) + 2
    per_line = max(1, (width - len(indent)) // cell)
    return [indent + "".join(text.ljust(cell) for text in cells[start:start + per_line]).rstrip()
            for start in range(0, len(cells), per_line)]


def format_text(report: Dict[str, Any], width: Optional[int] = None) -> str:
    """The report of :func:`collect` as text for a terminal ``width`` columns wide."""
    width = width or shutil.get_terminal_size((100, 24)).columns
    python = report["python"]
    lines = [f"hcclpy {report['hcclpy_version']} (Python {python['version']}, {python['executable']})"]

    def field(name: str, value: Any) -> None:
        lines.append(f"{name + ':':<16}{value}")

    if report["environment"]:
        field("environment", " ".join(f"{k}={v}" for k, v in report["environment"].items()))
    if report["backend"] is None:
        field("backend", "none: the libraries could not be loaded")
        lines.append(report["error"] or "")
        return "\n".join(lines)
    field("backend", {"sim": "sim (the hcclpy CPU simulator)", "cann": "cann (Ascend CANN)"}.get(
        report["backend"], report["backend"]))
    for lib in report["libraries"]:
        field(lib["name"], f"{lib['path']} (found via {lib['found_via']})")
    field("AscendCL", f"version {report['acl_version'] or 'unknown (no aclrtGetVersion)'}, "
          f"SoC {report['soc_name'] or 'unknown'}")
    if report["device_count"] is not None:
        field("devices", report["device_count"])
        for device in report["devices"]:
            state = (f"error: {device['error']}" if "error" in device
                     else f"{_size(device['free'])} free of {_size(device['total'])}")
            lines.append(f"  device {device['id']}: {state}")
    for warning in report.get("warnings", ()):
        field("warning", warning)
    functions, optional = report["functions"], report["optional_functions"]
    present = [name for name in optional if functions.get(name)]
    missing = [name for name in optional if not functions.get(name)]
    required = len(functions) - len(optional)
    field("functions", f"{required} required and {len(present)} of {len(optional)} optional C functions present")
    lines.append("  present:")
    lines.extend(_columns(present, "    ", width))
    lines.append("  missing:" + ("" if missing else " none"))
    lines.extend(_columns(missing, "    ", width))
    found = report.get("capabilities", [])
    if found:
        field("capabilities", f"{sum(c['available'] for c in found)} of {len(found)} available")
        name_width = max(len(c["name"]) for c in found)
        for capability in found:
            line = f"  {'yes' if capability['available'] else 'no':<3}  {capability['name']:<{name_width}}  " \
                   f"{capability['api']}"
            if capability["missing"]:
                line += f" (missing {', '.join(capability['missing'])}"
                line += f"; without: {capability['without']})" if capability["without"] else ")"
            lines.append(line)
    sim = report["simulator"]
    if sim is not None:
        compiler = sim.get("compiler", {})
        tree = os.path.dirname(os.path.dirname(report["libraries"][0]["path"])) if report["libraries"] else "?"
        field("simulator", f"{tree} (build {sim.get('hash', '?')}, hcclpy {sim.get('hcclpy_version', '?')})")
        lines.append(f"  compiler: {' '.join(compiler.get('command', []))}: {compiler.get('version', '?')}")
        if sim.get("cflags"):
            lines.append(f"  cflags:   {' '.join(sim['cflags'])}")
    if report["error"] is not None:
        lines.append(f"error: {report['error']}")
    return "\n".join(lines)
