"""PyTorch's own distributed test suite, driven against one torch.distributed backend.

The torch wheel ships ``torch/testing/_internal/distributed/distributed_test.py``: a few hundred
tests of every collective, point-to-point call, group and DDP feature, written against
``torch.distributed`` only, which PyTorch runs for gloo, NCCL and UCC. This module is our own
driver of it (PyTorch drives it from ``test/distributed/test_distributed_spawn.py``, which the
wheel does not ship): it makes the suite's one test class for the backend named by the
``BACKEND`` environment variable, and runs it with a result object that records every test's
outcome in a JSON file as it goes, so that a run cut short still tells what it reached.

The suite decides which tests apply to a backend from sets in
``common_distributed.DistTestCases`` (``backend_feature["plugin"]`` makes a third-party backend
available to it, ``"ddp"`` and ``"subgroup"`` enable DDP and ``new_group`` tests;
``skip_collective[...]`` names what a backend lacks). Its decorators read those sets when the
suite is imported, so :func:`_declare_hcclpy` fills them first. What the hcclpy backend does not
support (a receive from any source, sparse tensors) is skipped with the reason, see
:data:`UNSUPPORTED`.

Run it directly (``TEMP_DIR`` and ``INIT_METHOD`` are set per test by the suite itself)::

    BACKEND=hcclpy WORLD_SIZE=2 python tests/torch_backend/torch_conformance_suite.py --json out.json -k all_reduce

``tests/torch_backend/test_torch_conformance.py`` runs it for world sizes 2 and 3 and compares with gloo.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import traceback
import unittest
from typing import Any, Dict, List, Optional, Sequence

BACKEND = os.environ.get("BACKEND", "")
if not BACKEND or "WORLD_SIZE" not in os.environ:
    raise RuntimeError("torch_conformance_suite needs the BACKEND (gloo, hcclpy) and WORLD_SIZE (2 or more) "
                       "environment variables, which the suite itself reads when it is imported")
# The suite reads TEMP_DIR when imported (its setUp then makes a fresh one per test).
os.environ.setdefault("TEMP_DIR", os.environ.get("TMPDIR", "/tmp"))

import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# Tests the hcclpy backend refuses by design, with the reason that docs/torch.md gives. The
# suite skips the any-source receives itself once the backend is named in its
# "sendrecv anysource" set; the sparse all-reduce tests are gated on gloo by name.
UNSUPPORTED = {
    "test_send_recv_any_source": "receive from any source: HCCL receives from a named peer",
    "test_send_recv_any_source_autograd_profiler": "receive from any source: HCCL receives from a named peer",
    "test_send_recv_any_source_torch_profiler": "receive from any source: HCCL receives from a named peer",
    "test_sparse_all_reduce_sum": "sparse tensors: HCCL moves dense buffers",
    "test_sparse_all_reduce_sum_cuda": "sparse tensors: HCCL moves dense buffers",
}


def _declare_hcclpy() -> None:
    """Register the backend and name it in the suite's feature sets, as a third-party backend does."""
    import hcclpy.torch  # noqa: F401  (registers "hcclpy" with torch.distributed)

    DistTestCases.backend_feature["plugin"].add("hcclpy")   # the suite may create it
    DistTestCases.backend_feature["ddp"].add("hcclpy")      # DistributedDataParallel on CPU tensors
    DistTestCases.backend_feature["subgroup"].add("hcclpy")  # new_group / new_subgroups
    DistTestCases.skip_collective["sendrecv anysource"].add("hcclpy")


if BACKEND == "hcclpy":
    _declare_hcclpy()

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


# How each test starts its ranks: "spawn" as PyTorch's driver does (a fresh interpreter per rank,
# which imports torch and the suite again: about 5 s a test on 2 cores), or "fork" (the default
# here: a copy of this process, which has imported everything but started nothing, ~20x faster).
START_METHOD = os.environ.get("HCCLPY_CONFORMANCE_START", "fork")
if START_METHOD not in ("fork", "spawn"):
    raise ValueError(f"HCCLPY_CONFORMANCE_START must be 'fork' or 'spawn', got {START_METHOD!r}")


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """The suite's tests for ``BACKEND``; every test starts ``WORLD_SIZE`` fresh processes."""

    def setUp(self) -> None:
        super().setUp()
        if START_METHOD == "spawn":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)


# Spawned ranks unpickle the class by its qualified name, which must therefore be this one.
TestDistBackendWithSpawn.__qualname__ = TestDistBackendWithSpawn.__name__

# Tests the suite keeps for gloo by naming it (``BACKEND != "gloo"``, ``require_backend_is_available(
# {"gloo"})``, "get_future is only supported on mpi, nccl and gloo", ...) although they run on CPU
# tensors through torch.distributed's public API alone: a CPU backend is held to them too. Each
# one passes on gloo at world sizes 2 and 3. Left out: the monitored_barrier tests, because torch
# itself refuses monitored_barrier on any backend but gloo, and tests gated on NCCL or CUDA.
RESERVED_FOR_GLOO = (
    [f"test_accumulate_gradients_no_sync{suffix}"
     for suffix in ("", "_grad_is_view", "_allreduce_hook", "_allreduce_with_then_hook")]
    + [f"test_all_reduce_coalesced{group}_{op}" for group in ("", "_group", "_full_group")
       for op in ("sum", "product", "min", "max")]
    + ["test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_barrier_timeout_full_group",
       "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags", "test_get_future",
       "test_grads_same_across_ranks_with_no_sync", "test_scatter_object_list"]
)


def _set_skip(name: str, skip: bool, reason: str = "") -> None:
    """Mark or unmark test ``name`` as skipped. The suite's skip decorators set the mark on the
    function they decorate, and decorators above them copy it to their wrappers, so every layer
    down the ``__wrapped__`` chain gets the same mark."""
    layer = getattr(TestDistBackendWithSpawn, name, None)
    if layer is None:
        raise LookupError(f"the suite has no test {name!r} (another torch version?)")
    while layer is not None:
        layer.__unittest_skip__ = skip
        layer.__unittest_skip_why__ = reason
        layer = getattr(layer, "__wrapped__", None)


# Of those, tests whose body picks its CPU code by ``BACKEND == "gloo"`` (and has none for other
# names: it would fail on a variable never set). They run with the suite's BACKEND reading
# "gloo" while the test body runs; the group, created before, is the hcclpy one.
CPU_BODY_NAMED_GLOO = [f"test_accumulate_gradients_no_sync{suffix}"
                       for suffix in ("", "_grad_is_view", "_allreduce_hook", "_allreduce_with_then_hook")]


def _with_gloo_body(name: str) -> None:
    import torch.testing._internal.distributed.distributed_test as suite

    test = getattr(TestDistBackendWithSpawn, name)

    @functools.wraps(test)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved, suite.BACKEND = suite.BACKEND, "gloo"
        try:
            return test(self, *args, **kwargs)
        finally:
            suite.BACKEND = saved

    setattr(TestDistBackendWithSpawn, name, run)


if BACKEND == "hcclpy":
    for _name in RESERVED_FOR_GLOO:
        _set_skip(_name, False)
    for _name in CPU_BODY_NAMED_GLOO:
        _with_gloo_body(_name)
    for _name, _reason in UNSUPPORTED.items():
        _set_skip(_name, True, f"unsupported by the hcclpy backend: {_reason}")


def test_names() -> List[str]:
    """Every test of the suite, by method name."""
    return sorted(unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn))


class _Recorder(unittest.TextTestResult):
    """A result that also writes ``{test: {"outcome", "seconds", "detail"}}`` to a JSON file after
    every test (pass, fail, error, skip)."""

    path: Optional[str] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: Dict[str, Dict[str, Any]] = {}
        self._started = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        self._started = time.monotonic()
        super().startTest(test)

    def _record(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes[name] = {"outcome": outcome, "seconds": round(time.monotonic() - self._started, 2),
                               "detail": detail[-4000:]}
        if self.path:
            with open(self.path + ".tmp", "w") as f:
                json.dump(self.outcomes, f, indent=1, sort_keys=True)
            os.replace(self.path + ".tmp", self.path)

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._record(test, "failed", "".join(traceback.format_exception(*err)))

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._record(test, "error", "".join(traceback.format_exception(*err)))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._record(test, "xfail")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self._record(test, "xpass")


def run(names: Sequence[str], json_path: Optional[str], verbosity: int = 2) -> Dict[str, Dict[str, Any]]:
    """Run the named tests one after the other; return (and write) their outcomes."""
    suite = unittest.TestSuite(TestDistBackendWithSpawn(name) for name in names)
    _Recorder.path = json_path
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=verbosity, resultclass=_Recorder)
    result = runner.run(suite)
    return result.outcomes  # type: ignore[attr-defined]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", action="append", default=[],
                        help="run the tests whose name contains this (repeatable; default: all)")
    parser.add_argument("--exclude", action="append", default=[], help="leave out tests whose name contains this")
    parser.add_argument("--names", help="a file of test names, one a line, to run (instead of -k)")
    parser.add_argument("--json", help="write the outcomes here, updated after every test")
    parser.add_argument("--list", action="store_true", help="print the selected names and stop")
    parser.add_argument("--shard", metavar="K/N", help="run every N-th selected test from the K-th (0-based): N "
                                                       "drivers at once share the suite")
    args = parser.parse_args(argv)
    names = test_names()
    if args.names:
        with open(args.names) as f:
            wanted = {line.strip() for line in f if line.strip()}
        names = [n for n in names if n in wanted]
    if args.k:
        names = [n for n in names if any(k in n for k in args.k)]
    names = [n for n in names if not any(x in n for x in args.exclude)]
    if args.shard:
        index, count = (int(part) for part in args.shard.split("/"))
        if not 0 <= index < count:
            parser.error(f"--shard {args.shard}: K must be in [0, N)")
        names = names[index::count]
    if args.list:
        print("\n".join(names))
        return 0
    outcomes = run(names, args.json)
    bad = [n for n, o in outcomes.items() if o["outcome"] in ("failed", "error", "xpass")]
    return 1 if bad else 0


if __name__ == "__main__":
    # Run under the module's own name, so that spawned ranks find the test class by importing it.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_conformance_suite

    sys.exit(torch_conformance_suite.main())
