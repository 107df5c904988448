"""Conformance of the "hcclpy" torch.distributed backend: PyTorch's own distributed test suite.

For world sizes 2 and 3, ``torch_conformance_suite.py`` (our driver of the suite the torch wheel
ships, ``torch/testing/_internal/distributed/distributed_test.py``) runs every test of the suite
twice, in subprocesses: once for gloo, once for hcclpy. Every test gloo passes must pass on
hcclpy, except:

* what the hcclpy backend does not support, by design and as docs/torch.md says: a receive from
  any source, sparse tensors (the driver skips those tests with the reason);
* what torch itself keeps for gloo: ``monitored_barrier`` (torch refuses it on other backends).

No test may fail or error on hcclpy. What gloo passes is recorded in ``gloo_outcomes.json`` for the
torch version the tests pin (gloo's own run takes as long as hcclpy's, and gives the same answer
every time); with another torch, or with ``HCCLPY_CONFORMANCE_GLOO=run``, gloo runs beside hcclpy.
``python tests/torch_backend/test_torch_conformance.py`` records gloo's outcomes again.

The run takes a few minutes per world size on 2 cores, so the module is marked ``slow`` (and
``torch``); docs/torch.md gives the command:

    python -m pytest tests/torch_backend/test_torch_conformance.py -m slow -v

The suite's helpers import ``expecttest`` (a test-only package of PyTorch's); without it the
module is skipped with that reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Set

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")
pytest.importorskip("expecttest", reason="PyTorch's distributed test suite imports expecttest "
                                         "(python -m pip install expecttest)")

pytestmark = [pytest.mark.slow, pytest.mark.torch]

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "torch_conformance_suite.py"

# gloo passes these, and torch refuses them on any other backend.
TORCH_GLOO_ONLY = {"test_monitored_barrier_gloo", "test_monitored_barrier_gloo_rank_0_timeout",
                   "test_monitored_barrier_gloo_subgroup"}
# Documented as unsupported (docs/torch.md); the driver skips them on hcclpy with the reason.
UNSUPPORTED = {"test_send_recv_any_source", "test_send_recv_any_source_autograd_profiler",
               "test_send_recv_any_source_torch_profiler", "test_sparse_all_reduce_sum"}

RUN_LIMIT = 900.0     # seconds for one backend's whole run (about 1-2 minutes on 2 cores)
TEST_LIMIT = "120"    # seconds for one test of the suite (its own default: 300)
WORLD_SIZES = (2, 3)
SHARDS = 2  # drivers at once for one world size
GLOO_RECORD = HERE / "gloo_outcomes.json"  # {"torch": version, "passed": {world size: [test names]}}


class _Run:
    """One backend's run of the suite for one world size, as ``SHARDS`` drivers at once (the suite
    spends most of its time waiting for its ranks, not computing: shards overlap those waits)."""

    def __init__(self, backend: str, world_size: int, directory: Path) -> None:
        self.backend, self.world_size, self.directory = backend, world_size, directory
        self.started = time.monotonic()
        self.procs = []
        for shard in range(SHARDS):
            name = f"{backend}-{world_size}-{shard}"
            env = {**os.environ, "BACKEND": backend, "WORLD_SIZE": str(world_size), "TMPDIR": str(directory),
                   "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": TEST_LIMIT, "PYTORCH_PRINT_REPRO_ON_FAILURE": "0"}
            for variable in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "INIT_METHOD"):
                env.pop(variable, None)  # the suite sets its own; a launcher's would mislead it
            log = open(directory / f"{name}.log", "w")
            command = [sys.executable, str(DRIVER), "--json", str(directory / f"{name}.json"),
                       "--shard", f"{shard}/{SHARDS}"]
            self.procs.append((name, subprocess.Popen(command, env=env, cwd=str(directory), stdout=log,
                                                      stderr=subprocess.STDOUT), log))

    def outcomes(self) -> Dict[str, Dict[str, Any]]:
        """Every test's outcome (``{"outcome", "seconds", "detail"}``), once every shard ended."""
        merged: Dict[str, Dict[str, Any]] = {}
        for name, proc, log in self.procs:
            try:
                proc.wait(timeout=max(1.0, self.started + RUN_LIMIT - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()  # the outcomes written so far say where it stopped
                proc.wait()
            log.close()
            path = self.directory / f"{name}.json"
            if not path.exists():
                tail = (self.directory / f"{name}.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"{name} of the suite recorded no outcome; its output ends with:\n{tail}")
            merged.update(json.loads(path.read_text()))
        return merged


def _run_suite(backend: str, world_size: int, directory: Path) -> Dict[str, Dict[str, Any]]:
    return _Run(backend, world_size, directory).outcomes()


@pytest.fixture(scope="module")
def hcclpy_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[int, _Run]]:
    """hcclpy's runs for every world size, all started at once."""
    runs = {size: _Run("hcclpy", size, tmp_path_factory.mktemp(f"hcclpy-{size}")) for size in WORLD_SIZES}
    yield runs
    for run in runs.values():
        for _, proc, log in run.procs:
            proc.kill()
            proc.wait()
            log.close()


def _passed(outcomes: Dict[str, Dict[str, Any]]) -> Set[str]:
    return {name for name, o in outcomes.items() if o["outcome"] == "passed"}


def _gloo_passed(world_size: int, directory: Path) -> Set[str]:
    """The tests gloo passes: recorded for this torch, else run now."""
    if GLOO_RECORD.exists() and os.environ.get("HCCLPY_CONFORMANCE_GLOO") != "run":
        record = json.loads(GLOO_RECORD.read_text())
        if record["torch"] == torch.__version__:
            return set(record["passed"][str(world_size)])
    return _passed(_run_suite("gloo", world_size, directory))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.timeout(2 * RUN_LIMIT + 120)
def test_hcclpy_passes_what_gloo_passes(world_size: int, hcclpy_runs: Dict[int, _Run], tmp_path: Path) -> None:
    gloo_passed = _gloo_passed(world_size, tmp_path)
    hcclpy = hcclpy_runs[world_size].outcomes()
    assert len(gloo_passed) > 50, f"gloo passed only {sorted(gloo_passed)}: is the suite running at all?"

    failed = {name: o["detail"] for name, o in hcclpy.items() if o["outcome"] not in ("passed", "skipped")}
    missing = sorted(gloo_passed - TORCH_GLOO_ONLY - UNSUPPORTED - {n for n, o in hcclpy.items()
                                                                     if o["outcome"] == "passed"})
    report = [f"{name}: {hcclpy.get(name, {'outcome': 'not run (the run stopped first)'})['outcome']} "
              f"{hcclpy.get(name, {}).get('detail', '')[-1500:]}" for name in missing]
    assert not failed and not missing, (f"hcclpy failed {sorted(failed)}; gloo passes but hcclpy does not: "
                                        f"{missing}\n\n" + "\n\n".join(report))
    for name in UNSUPPORTED:  # skipped, and saying why
        assert hcclpy[name]["outcome"] == "skipped" and "unsupported by the hcclpy backend" in hcclpy[name]["detail"]


def record_gloo() -> None:
    """Run the suite on gloo for every world size and record what passes (``gloo_outcomes.json``)."""
    import tempfile

    passed = {}
    for world_size in WORLD_SIZES:
        with tempfile.TemporaryDirectory() as directory:
            passed[str(world_size)] = sorted(_passed(_run_suite("gloo", world_size, Path(directory))))
        print(f"world size {world_size}: gloo passes {len(passed[str(world_size)])} tests")
    GLOO_RECORD.write_text(json.dumps({"torch": torch.__version__, "passed": passed}, indent=1) + "\n")
    print(f"recorded in {GLOO_RECORD}")


if __name__ == "__main__":
    record_gloo()
