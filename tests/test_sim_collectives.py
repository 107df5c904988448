"""Every HCCL operation x element type x reduction on the simulator, from a C program.

``tests/c/collectives.c`` checks every output element bit for bit (fp16/bf16 reduced in fp32 and
rounded once, in rank order), that inputs are left alone and that nothing is written outside an
output or into the gaps of a V-operation.
"""

from __future__ import annotations

import pytest

import sim_runner as runner

MATRIX = [(n, mode) for n in (1, 2, 3, 4, 8) for mode in ("threads", "procs")] + [(4, "mixed")]


@pytest.fixture(scope="module")
def collectives(compile_c):
    return runner.build(compile_c, "collectives")


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("nranks", "mode"), MATRIX, ids=[f"{m}-{n}" for n, m in MATRIX])
def test_collectives(collectives, sim_env, nranks, mode):
    # the big cases move ~4 MiB per rank; with 8 ranks on 2 cores keep them smaller
    large = 1 << 20 if nranks <= 4 else 1 << 18
    args = [*runner.rank_args(nranks, mode), "--large", str(large)]
    runner.check(runner.run(collectives, args, sim_env, timeout=360))
