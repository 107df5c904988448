"""The ACL runtime and argument checking of the simulator, from C and C++ programs: devices,
contexts, streams, events, callbacks, memory info; error codes and messages for bad arguments;
the headers compiled as C++14."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sim_runner as runner
from hcclpy.sim._build import find_compiler, run_compiler


@pytest.fixture(scope="module")
def programs(compile_c):
    return {name: runner.build(compile_c, name) for name in ("streams", "errors")}


STREAMS = [(1, "threads"), (2, "threads"), (4, "threads"), (1, "procs"), (2, "procs"), (4, "mixed")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("nranks", "mode"), STREAMS, ids=[f"{m}-{n}" for n, m in STREAMS])
@pytest.mark.slow
def test_streams(programs, sim_env, nranks, mode):
    env = {k: v for k, v in sim_env.items() if k != "HCCLPY_SIM_DEVICES"}
    runner.check(runner.run(programs["streams"], runner.rank_args(nranks, mode), env, timeout=180))


DEVICE_ENVS = [
    {"HCCLPY_SIM_DEVICES": "3"},
    {"HCCLPY_SIM_DEVICES": "12"},
    {"ASCEND_RT_VISIBLE_DEVICES": "6,7,2"},  # 3 visible devices, renumbered 0..2
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("extra_env", DEVICE_ENVS, ids=["sim-devices-3", "sim-devices-12", "visible-6-7-2"])
@pytest.mark.slow
def test_streams_device_count_from_env(programs, sim_env, extra_env):
    result = runner.run(
        programs["streams"], runner.rank_args(2, "threads"), sim_env, timeout=180, extra_env=extra_env
    )
    runner.check(result)


ERRORS = [(n, mode) for n in (1, 2, 3) for mode in ("threads", "procs")] + [(8, "threads"), (4, "mixed")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("nranks", "mode"), ERRORS, ids=[f"{m}-{n}" for n, m in ERRORS])
def test_errors(programs, sim_env, nranks, mode):
    runner.check(runner.run(programs["errors"], runner.rank_args(nranks, mode), sim_env, timeout=180))


@pytest.mark.timeout(240)
def test_runtime_rules(compile_c, sim_env):
    # Destroy races, event flag rules, event status, copy kinds, threads left by the last reset.
    binary = runner.build(compile_c, "runtime_rules")
    runner.check(runner.run(binary, runner.rank_args(1, "threads"), sim_env, timeout=180))


# Builds the simulator with AddressSanitizer into the cache directory given as argv[1] and prints
# the tree: the module-level flags are the build's own, set before it hashes them.
_ASAN_BUILD = """
import sys
from hcclpy.sim import _build
_build.CFLAGS = tuple(f for f in _build.CFLAGS if f != "-O2") + ("-O1", "-fsanitize=address", "-fno-omit-frame-pointer")
_build.LDFLAGS = _build.LDFLAGS + ("-fsanitize=address",)
print(_build.build())
"""


def _compiler_has_asan() -> bool:
    compiler = find_compiler()
    found = subprocess.run([*compiler, "-print-file-name=libasan.so"], capture_output=True, text=True)
    return found.returncode == 0 and os.path.isabs(found.stdout.strip())


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_runtime_rules_under_address_sanitizer(tmp_path, sim_env):
    # A stream or event freed by aclrtDestroy* on one thread while others still synchronise it is a
    # use after free that an ordinary build only sometimes shows (a crash, a garbage code): with
    # the simulator and the program built with -fsanitize=address, every such access aborts.
    if not _compiler_has_asan():
        pytest.skip("the C compiler has no AddressSanitizer runtime")
    build = subprocess.run(
        [sys.executable, "-c", _ASAN_BUILD], capture_output=True, text=True, timeout=600,
        env={**os.environ, "HCCLPY_SIM_CACHE": str(tmp_path / "cache")},
    )
    assert build.returncode == 0, build.stderr[-4000:]
    home = Path(build.stdout.strip().splitlines()[-1])
    binary = tmp_path / "runtime_rules_asan"
    lib64 = home / "lib64"
    run_compiler([
        *find_compiler(), "-Wall", "-Wextra", "-Werror", "-fsanitize=address", "-fno-omit-frame-pointer",
        f"-I{home / 'include'}", str(runner.C_DIR / "harness.c"), str(runner.C_DIR / "runtime_rules.c"),
        "-o", str(binary), f"-L{lib64}", "-lhccl", "-lascendcl", f"-Wl,-rpath,{lib64}", "-pthread",
    ], what="compiling runtime_rules with AddressSanitizer failed")
    env = {k: v for k, v in sim_env.items() if k not in ("LD_PRELOAD", "ASCEND_HOME_PATH")}
    env["LD_LIBRARY_PATH"] = str(lib64)
    result = runner.run(binary, [*runner.rank_args(1, "threads"), "--iterations", "20"], env, timeout=300,
                        extra_env={"ASAN_OPTIONS": "detect_leaks=0:allocator_may_return_null=1"})
    assert "AddressSanitizer" not in result.output, result.report()
    runner.check(result)


@pytest.mark.timeout(240)
def test_headers_work_from_cxx(compile_c, sim_env):
    binary = runner.build(compile_c, "cxx_smoke", cplusplus=True)
    runner.check(runner.run(binary, [], sim_env, timeout=120))


# What a program sees of the simulator's settings: it calls the entry points that read them and
# prints each return code with the aclGetRecentErrMsg text, one "name rc message" line each.
SETTINGS_PROGRAM = r"""
#include <stdio.h>
#include <hccl/hccl.h>

static void report(const char *name, int rc)
{
    const char *text = aclGetRecentErrMsg();
    printf("%s %d %s\n", name, rc, rc != 0 && text != NULL ? text : "");
}

int main(void)
{
    report("aclInit", aclInit(NULL));
    uint32_t count = 99;
    report("aclrtGetDeviceCount", aclrtGetDeviceCount(&count));
    printf("count %u\n", count);
    report("aclrtSetDevice", aclrtSetDevice(0));
    int32_t devices[1] = {0};
    HcclComm comms[1];
    report("HcclCommInitAll", HcclCommInitAll(1, devices, comms));
    return 0;
}
"""

ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_RT_INVALID_DEVICEID = 107001
HCCL_E_PARA = 1


@pytest.fixture(scope="module")
def settings_program(compile_c, tmp_path_factory):
    source = tmp_path_factory.mktemp("settings") / "settings.c"
    source.write_text(SETTINGS_PROGRAM)
    return compile_c([source], "settings")


def run_settings(binary, sim_env, **settings: str) -> dict:
    """{call: (rc, message)} and the device count, from one run of the settings program."""
    env = {k: v for k, v in sim_env.items()
           if k not in ("HCCLPY_SIM_DEVICES", "HCCLPY_SIM_DEVICE_MEMORY", "ASCEND_RT_VISIBLE_DEVICES")}
    result = runner.run(binary, [], env, timeout=60, extra_env=settings)
    assert result.returncode == 0, result.report()
    calls = {}
    for line in result.output.splitlines():
        name, value, *message = line.split(" ", 2)
        calls[name] = (int(value), message[0] if message else "")
    return calls


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", ["0", "abc", "257", "-3", "4x", "2.5"])
def test_bad_device_count_fails_every_device_call(settings_program, sim_env, value):
    calls = run_settings(settings_program, sim_env, HCCLPY_SIM_DEVICES=value)
    why = f"HCCLPY_SIM_DEVICES='{value}' is not a number of devices: it takes a whole number from 1 to 256"
    assert calls["aclInit"][0] == ACL_ERROR_INVALID_PARAM
    assert calls["aclInit"][1].startswith(f"aclInit: {why}"), calls
    assert calls["aclrtGetDeviceCount"] == (ACL_ERROR_INVALID_PARAM, f"aclrtGetDeviceCount: {calls['aclInit'][1][9:]}")
    assert calls["count"][0] == 0
    assert calls["aclrtSetDevice"][0] == ACL_ERROR_INVALID_PARAM and calls["aclrtSetDevice"][1].startswith(why)
    assert calls["HcclCommInitAll"][0] == HCCL_E_PARA
    assert calls["HcclCommInitAll"][1].startswith(f"HcclCommInitAll: {why}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", ["abc", "512K", "1e30G", "nan", "8Q"])
def test_bad_device_memory_fails_every_device_call(settings_program, sim_env, value):
    calls = run_settings(settings_program, sim_env, HCCLPY_SIM_DEVICE_MEMORY=value)
    why = f"HCCLPY_SIM_DEVICE_MEMORY='{value}' is not a device memory size: it takes a number of bytes, at least 1M"
    assert calls["aclInit"][0] == ACL_ERROR_INVALID_PARAM and calls["aclInit"][1].startswith(f"aclInit: {why}")
    assert calls["aclrtSetDevice"][0] == ACL_ERROR_INVALID_PARAM and calls["aclrtSetDevice"][1].startswith(why)


@pytest.mark.timeout(120)
def test_two_bad_settings_are_both_named(settings_program, sim_env):
    calls = run_settings(settings_program, sim_env, HCCLPY_SIM_DEVICES="0", HCCLPY_SIM_DEVICE_MEMORY="1K")
    message = calls["aclInit"][1]
    assert "HCCLPY_SIM_DEVICES='0'" in message and "; HCCLPY_SIM_DEVICE_MEMORY='1K'" in message


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("settings", "count"), [
    ({"HCCLPY_SIM_DEVICES": "1"}, 1), ({"HCCLPY_SIM_DEVICES": " 256 "}, 256), ({"HCCLPY_SIM_DEVICES": ""}, 8),
    ({"HCCLPY_SIM_DEVICE_MEMORY": "1M"}, 8), ({"HCCLPY_SIM_DEVICE_MEMORY": "1.5Gi"}, 8),
])
def test_good_settings_still_work(settings_program, sim_env, settings, count):
    calls = run_settings(settings_program, sim_env, **settings)
    assert calls["aclInit"] == (0, "") and calls["aclrtGetDeviceCount"] == (0, "")
    assert calls["count"][0] == count and calls["aclrtSetDevice"] == (0, "")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("value", "count", "stopped"), [
    ("abc", 0, "'abc'"), ("9", 0, "'9'"), ("-1", 0, "'-1'"), ("3,9,2", 1, "'9'"), (",1", 0, "an empty entry"),
])
def test_visible_devices_stop_at_the_first_that_is_not_a_device(settings_program, sim_env, value, count, stopped):
    # As CANN: no error, the list ends there. A device id the list left out says where it ended.
    calls = run_settings(settings_program, sim_env, ASCEND_RT_VISIBLE_DEVICES=value)
    assert calls["aclInit"] == (0, "") and calls["aclrtGetDeviceCount"] == (0, "")
    assert calls["count"][0] == count
    note = (f"ASCEND_RT_VISIBLE_DEVICES='{value}' stops at {stopped}, which is not a device id (0..7, "
            "HCCLPY_SIM_DEVICES): it and the entries after it are ignored")
    if count == 0:
        assert calls["aclrtSetDevice"] == (ACL_ERROR_RT_INVALID_DEVICEID,
                                           f"device id 0 is out of range: no device is visible ({note})")
    else:
        assert calls["aclrtSetDevice"] == (0, "")


# --------------------------------------------------- CANN 9.x management functions (management.c)

@pytest.fixture(scope="module")
def management_program(compile_c):
    return runner.build(compile_c, "management")


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("nranks", "mode"), [(1, "threads"), (2, "threads"), (3, "procs"), (4, "mixed")],
                         ids=["threads-1", "threads-2", "procs-3", "mixed-4"])
def test_management_functions(management_program, sim_env, nranks, mode):
    runner.check(runner.run(management_program, runner.rank_args(nranks, mode), sim_env, timeout=180))


# aclFinalizeReference finalises ACL, so it runs in a program of its own: prints "rc refCount" per call.
FINALIZE_REFERENCE_PROGRAM = r"""
#include <stdio.h>
#include <acl/acl.h>

int main(void)
{
    if (aclInit(NULL) != ACL_SUCCESS)
        return 2;
    uint64_t refs = 77;
    int rc = aclFinalizeReference(&refs);
    printf("%d %llu\n", rc, (unsigned long long)refs);
    refs = 77;
    rc = aclFinalizeReference(&refs);
    printf("%d %llu\n", rc, (unsigned long long)refs);
    return 0;
}
"""


def test_acl_finalize_reference(compile_c, sim_env, tmp_path):
    source = tmp_path / "finalize_reference.c"
    source.write_text(FINALIZE_REFERENCE_PROGRAM)
    binary = compile_c([source], "finalize_reference")
    result = runner.run(binary, [], sim_env, timeout=60)
    assert result.returncode == 0, result.report()
    lines = result.output.split()
    # The simulator counts one aclInit: dropping it finalises (0 left); a second call is a repeat.
    assert lines[:2] == ["0", "0"], result.report()
    assert lines[2:] == ["100037", "77"], result.report()


@pytest.mark.timeout(120)
def test_newer_runtime_functions(compile_c, sim_env):
    # The newer runtime functions of c/runtime_newer.c (stream queries and ids, host functions,
    # 2-D copies, data type sizes, peer access, failure modes, op timeouts, pointer attributes,
    # host registration): results, stream order, and the codes of bad arguments.
    binary = compile_c([runner.C_DIR / "runtime_newer.c"], "runtime_newer")
    result = runner.run(binary, [], sim_env, timeout=90)
    runner.check(result)
    assert re.search(r"runtime_newer: \d+ checks OK", result.output), result.output


@pytest.mark.timeout(120)
def test_device_memory_shared_between_processes(compile_c, sim_env):
    # c/ipc_memory.c: an exporter and two importer processes share device memory through IPC keys:
    # process-id checks, reads and writes seen on both sides, freeing refused while a live process
    # imports, keys closed and memory freed in either order, a dead importer holding nothing.
    binary = compile_c([runner.C_DIR / "ipc_memory.c"], "ipc_memory")
    result = runner.run(binary, [], sim_env, timeout=90)
    runner.check(result)
    assert re.search(r"ipc_memory: \d+ checks OK", result.output), result.output


@pytest.mark.timeout(120)
def test_events_shared_between_processes(compile_c, sim_env):
    # c/ipc_events.c: an importer opens an exporter's ACL_EVENT_IPC event and a stream of its own
    # waits for the exporter's record; an opened event is waited for, never recorded; bad handles.
    binary = compile_c([runner.C_DIR / "ipc_events.c"], "ipc_events")
    result = runner.run(binary, [], sim_env, timeout=90)
    runner.check(result)
    assert re.search(r"ipc_events: \d+ checks OK", result.output), result.output
