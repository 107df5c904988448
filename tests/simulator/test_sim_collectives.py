"""Every HCCL operation x element type x reduction on the simulator, from a C program.

``tests/simulator/c/collectives.c`` checks every output element bit for bit (fp16/bf16 reduced in fp32 and
rounded once, in rank order), that inputs are left alone and that nothing is written outside an
output or into the gaps of a V-operation. ``tests/simulator/c/kernel_paths.c`` checks that the two builds of
the fp16/bf16 reductions store the same bits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import hcclpy.sim
import sim_runner as runner

# Eight ranks as processes only: as threads they add time, not paths.
MATRIX = [(n, mode) for n in (1, 2, 3, 4, 8) for mode in ("threads", "procs") if (n, mode) != (8, "threads")] + [
    (4, "mixed")]


@pytest.fixture(scope="module")
def collectives(compile_c):
    return runner.build(compile_c, "collectives")


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("nranks", "mode"), MATRIX, ids=[f"{m}-{n}" for n, m in MATRIX])
@pytest.mark.slow
def test_collectives(collectives, sim_env, nranks, mode):
    # the big cases move ~4 MiB per rank; with 8 ranks on 2 cores keep them smaller
    large = 1 << 20 if nranks <= 4 else 1 << 18
    args = [*runner.rank_args(nranks, mode), "--large", str(large)]
    runner.check(runner.run(collectives, args, sim_env, timeout=360))


# Three ranks, whose shares do not divide the large cases evenly; the processes' path at these sizes is
# the threads' (a rank reaches its peers' memory the same way).
STREAMING = [(3, "threads")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("nranks", "mode"), STREAMING, ids=[f"{m}-{n}" for n, m in STREAMING])
@pytest.mark.slow
def test_collectives_at_streaming_sizes(collectives, sim_env, nranks, mode):
    # From 16 MiB an operation stores around the caches, and its reductions run in blocks of
    # their own (kernels.c): 8 Mi + 3 elements takes the large cases of every 2- and 4-byte
    # type past that size, in shares that do not divide evenly among 3 ranks.
    args = [*runner.rank_args(nranks, mode), "--large", str((8 << 20) + 3)]
    runner.check(runner.run(collectives, args, sim_env, timeout=240))


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_fp16_and_bf16_kernels_store_the_same_bits_on_every_path(compile_c, sim_env):
    # The reductions of the 16-bit floats have portable code and, on x86 with AVX2 and F16C, a
    # second build chosen at run time (kernels.c); kernel_paths.c includes that source and checks
    # every float's narrowing and whole reductions on both against each other.
    sources = Path(hcclpy.sim.__file__).resolve().parent / "src"
    program = compile_c([runner.C_DIR / "kernel_paths.c"], "kernel_paths", extra_flags=(f"-I{sources}",))
    result = runner.run(program, [], sim_env, timeout=200)
    runner.check(result)
    assert "kernels: " in result.output
