"""``hcclpy info``: the text report, ``--json``, and a report when the libraries cannot be loaded."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

import hcclpy
from hcclpy.cli.info import CAPABILITIES, capabilities, format_text, visible_devices_note

TIMEOUT = 120  # seconds; the first call may build the simulator


def hcclpy_info(*args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hcclpy", "info", *args], capture_output=True, text=True,
                          env=env, timeout=TIMEOUT)


def sim_only_env(**extra: str) -> Dict[str, str]:
    """The environment with hcclpy pointed at the simulator, whatever is installed."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "HCCLPY_LIBASCENDCL", "HCCLPY_LIBHCCL",
                        "HCCL_SO_PATH", "ASCEND_RT_VISIBLE_DEVICES")}
    return {**env, "HCCLPY_BACKEND": "sim", **extra}


@pytest.fixture(scope="module")
def report(sim_home) -> dict:
    result = hcclpy_info("--json", env=sim_only_env(HCCLPY_SIM_DEVICES="3", HCCLPY_SIM_DEVICE_MEMORY="64M"))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_json_report_on_the_simulator(report, sim_home):
    assert report["hcclpy_version"] == hcclpy.__version__
    assert report["python"]["executable"] == sys.executable
    assert report["backend"] == "sim"
    assert report["error"] is None
    names = [lib["name"] for lib in report["libraries"]]
    assert names == ["libascendcl.so", "libhccl.so"]
    for lib in report["libraries"]:
        assert Path(lib["path"]).is_file()
        assert Path(lib["path"]).resolve().parent == (sim_home / "lib64").resolve()
        assert lib["found_via"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", report["acl_version"])
    assert report["soc_name"]
    assert report["device_count"] == 3
    assert report["devices"] == [{"id": i, "free": 64 << 20, "total": 64 << 20} for i in range(3)]
    assert report["environment"]["HCCLPY_SIM_DEVICES"] == "3"


def test_json_capability_table(report):
    functions = report["functions"]
    assert functions["HcclAllReduce"] is True and functions["aclrtSetDevice"] is True
    assert all(isinstance(value, bool) for value in functions.values())
    optional = report["optional_functions"]
    assert "HcclAllGatherV" in optional and "HcclAllReduce" not in optional
    assert set(optional) <= set(functions)


def test_json_capabilities(report):
    found = {entry["name"]: entry for entry in report["capabilities"]}
    assert len(found) == len(CAPABILITIES)
    for name in ("host functions", "2-D copies in one call", "IPC memory", "IPC events", "virtual memory",
                 "graphs (capture, replay)", "graph task groups", "a thread's capture mode", "scalable bootstrap",
                 "HCCL buffer"):
        assert found[name]["available"] is True and found[name]["missing"] == [], found[name]
    assert found["graphs (capture, replay)"]["api"] == "Stream.capture, Graph.replay"
    assert found["2-D copies in one call"]["without"].startswith("a copy per row")


def test_every_capability_names_optional_functions_and_real_hcclpy_names():
    from hcclpy._ffi import cdef_acl, cdef_hccl

    optional = set(cdef_acl.OPTIONAL + cdef_hccl.OPTIONAL)
    for capability in CAPABILITIES:
        assert set(capability.functions) <= optional, capability
        owner = None
        # "RootInfo.generate(scalable=True)" -> "RootInfo.generate"
        for item in re.split(r"[,;] ", re.sub(r"\([^)]*\)", "", capability.api)):
            name = item.split()[0]  # "copy_from / copy_to of rows apart": the method named first
            if "." in name:
                owner_name, member = name.split(".")
                owner = getattr(hcclpy, owner_name, None) or getattr(hcclpy.runtime, owner_name)  # TaskGroup
            else:
                member = name
                owner = owner if owner is not None and hasattr(owner, member) else (
                    hcclpy if hasattr(hcclpy, member) else hcclpy.Communicator)
            assert hasattr(owner, member), f"{capability.name}: {item!r} names no hcclpy attribute"


def test_capabilities_say_what_is_missing():
    functions = {name: True for capability in CAPABILITIES for name in capability.functions}
    functions.update(aclmdlRIExecuteAsync=False, aclrtMemcpy2d=False)
    found = {entry["name"]: entry for entry in capabilities(functions)}
    assert found["graphs (capture, replay)"]["available"] is False
    assert found["graphs (capture, replay)"]["missing"] == ["aclmdlRIExecuteAsync"]
    assert found["host functions"]["available"] is True
    report = {
        "hcclpy_version": "9.9", "python": {"version": "3.x", "executable": "python"}, "environment": {},
        "backend": "cann", "libraries": [], "acl_version": None, "soc_name": None, "device_count": 0, "devices": [],
        "functions": functions, "optional_functions": sorted(functions), "capabilities": list(found.values()),
        "simulator": None, "error": None,
    }
    text = format_text(report, width=100)
    assert re.search(rf"^capabilities: +{len(CAPABILITIES) - 2} of {len(CAPABILITIES)} available$", text, re.M)
    assert re.search(r"^  no   graphs \(capture, replay\) +Stream.capture, Graph.replay \(missing aclmdlRIExecuteAsync\)$",
                     text, re.M)
    assert "(missing aclrtMemcpy2d; without: a copy per row" in text
    assert re.search(r"^  yes  host functions +Stream.launch_host_func$", text, re.M)


def test_json_simulator_build(report, sim_home):
    build = json.loads((sim_home / "BUILD_INFO.json").read_text())
    assert report["simulator"] == build


def test_text_report(sim_home):
    result = hcclpy_info(env=sim_only_env(HCCLPY_SIM_DEVICES="2", HCCLPY_SIM_DEVICE_MEMORY="1G"))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith(f"hcclpy {hcclpy.__version__} (Python ")
    assert re.search(r"^backend: +sim \(the hcclpy CPU simulator\)$", text, re.M)
    assert re.search(rf"^libhccl\.so: +{re.escape(str(sim_home.resolve()))}/lib64/libhccl\.so \(found via ", text,
                     re.M)
    assert re.search(r"^AscendCL: +version \d+\.\d+\.\d+, SoC \S+", text, re.M)
    assert re.search(r"^devices: +2$", text, re.M)
    assert "  device 1: 1.0 GiB free of 1.0 GiB" in text
    assert re.search(r"^functions: +\d+ required and \d+ of \d+ optional C functions present$", text, re.M)
    assert "HcclAllGatherV" in text
    assert re.search(rf"^simulator: +{re.escape(str(sim_home.resolve()))} \(build ", text, re.M)
    assert re.search(rf"^capabilities: +{len(CAPABILITIES)} of {len(CAPABILITIES)} available$", text, re.M)
    assert re.search(r"^  yes  IPC memory +DeviceArray.ipc_export, DeviceArray.ipc_import$", text, re.M)
    assert "SimulatorFallbackWarning" not in result.stderr


def test_console_script(sim_home):
    program = shutil.which("hcclpy")
    if program is None:
        pytest.skip("the hcclpy console script is not installed (pip install -e .)")
    result = subprocess.run([program, "info", "--json"], capture_output=True, text=True, env=sim_only_env(),
                            timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["backend"] == "sim"


@pytest.mark.parametrize("as_json", [False, True])
def test_libraries_that_cannot_load_are_reported(as_json):
    env = {**sim_only_env(), "HCCLPY_BACKEND": "no-such-backend"}
    result = hcclpy_info(*(["--json"] if as_json else []), env=env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    if as_json:
        data = json.loads(result.stdout)
        assert data["backend"] is None and "no-such-backend" in data["error"]
        assert data["hcclpy_version"] == hcclpy.__version__
    else:
        assert "backend:        none: the libraries could not be loaded" in result.stdout
        assert "no-such-backend" in result.stdout


def test_format_text_lists_missing_functions():
    report = {
        "hcclpy_version": "9.9", "python": {"version": "3.x", "executable": "python"}, "environment": {},
        "backend": "cann", "libraries": [{"name": "libhccl.so", "path": "/opt/lib64/libhccl.so", "found_via": "x"}],
        "acl_version": None, "soc_name": None, "device_count": 1, "devices": [{"id": 0, "error": "busy"}],
        "functions": {"HcclAllReduce": True, "HcclAllGatherV": False, "HcclBarrier": True},
        "optional_functions": ["HcclAllGatherV", "HcclBarrier"], "simulator": None, "error": None,
    }
    text = format_text(report, width=80)
    assert "backend:        cann (Ascend CANN)" in text
    assert "AscendCL:       version unknown (no aclrtGetVersion), SoC unknown" in text
    assert "  device 0: error: busy" in text
    assert "1 required and 1 of 2 optional C functions present" in text
    present, missing = text.split("  missing:")
    assert "HcclBarrier" in present and "HcclAllGatherV" in missing
    assert "simulator:" not in text


@pytest.mark.parametrize("as_json", [False, True])
def test_an_override_naming_no_file_is_an_error(as_json):
    env = {**sim_only_env(), "HCCLPY_BACKEND": "auto", "HCCLPY_LIBHCCL": "/nonexistent.so"}
    result = hcclpy_info(*(["--json"] if as_json else []), env=env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    expected = "LibraryNotFoundError: HCCLPY_LIBHCCL='/nonexistent.so' cannot be used as libhccl.so: no such file."
    if as_json:
        data = json.loads(result.stdout)
        assert data["backend"] is None and data["error"].startswith(expected), data["error"]
    else:
        assert "backend:        none: the libraries could not be loaded" in result.stdout
        assert expected in result.stdout


@pytest.mark.parametrize(("variable", "value"), [("HCCLPY_SIM_DEVICES", "0"), ("HCCLPY_SIM_DEVICES", "abc"),
                                                 ("HCCLPY_SIM_DEVICE_MEMORY", "12 parsecs")])
def test_a_bad_simulator_setting_is_an_error(sim_home, variable, value):
    result = hcclpy_info("--json", env=sim_only_env(**{variable: value}))
    assert result.returncode == 1, result.stdout
    error = json.loads(result.stdout)["error"]
    assert error.startswith("AclError: aclInit failed: ACL_ERROR_INVALID_PARAM (100000): "
                            f"aclInit: {variable}='{value}' is not a "), error


@pytest.mark.parametrize(("value", "count", "stopped"), [
    ("abc", 0, "'abc'"), ("9", 0, "'9'"), ("-1", 0, "'-1'"), ("2,9,1", 1, "'9'"), ("1 , x", 1, "'x'"),
])
def test_visible_devices_that_are_not_devices_are_named(sim_home, value, count, stopped):
    result = hcclpy_info(env=sim_only_env(ASCEND_RT_VISIBLE_DEVICES=value, HCCLPY_SIM_DEVICES="4"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(rf"^devices: +{count}$", result.stdout, re.M)
    visible = f"{count} device{'' if count == 1 else 's'} visible"
    assert (f"warning:        ASCEND_RT_VISIBLE_DEVICES={value!r} stops at {stopped}, which is not a device id "
            f"(0..3, HCCLPY_SIM_DEVICES): it and the entries after it are ignored; {visible}") in result.stdout


def test_visible_devices_that_all_are_devices_give_no_warning(report, sim_home):
    assert report["warnings"] == []
    result = hcclpy_info("--json", env=sim_only_env(ASCEND_RT_VISIBLE_DEVICES="3, 1,,0"))
    data = json.loads(result.stdout)
    assert data["device_count"] == 3 and data["warnings"] == []


@pytest.mark.parametrize(("value", "count", "backend", "expected"), [
    ("", 8, "sim", None),
    ("0,1", 2, "cann", None),
    ("0,1,7", 2, "cann", "stops at '7', which is not a device id (no such device here)"),
    ("0,x", 1, "cann", "stops at 'x', which is not a device id (no such device here)"),
    (" ", 0, "sim", "ASCEND_RT_VISIBLE_DEVICES=' ' lists no device: 0 devices visible"),
    ("1,,", 1, "sim", None),
    (",1", 0, "sim", "stops at an empty entry"),
])
def test_visible_devices_note(value, count, backend, expected, monkeypatch):
    monkeypatch.delenv("HCCLPY_SIM_DEVICES", raising=False)
    note = visible_devices_note(value, count, backend)
    if expected is None:
        assert note is None
    else:
        assert note is not None and expected in note, note
