"""DDP training across simulated servers through the "hcclpy" backend ends where gloo's does.

Four ranks on two servers of two (HCCLPY_SIM_SERVER per rank): each server's ranks share memory,
the servers talk over TCP, and the gradients' all-reduce runs in HCCL's hierarchical form (sum
inside each server, then across the servers in server order). The same ranks train the same model
once with the hcclpy default group and once with a gloo group (test_torch_training's ranks), and
the parameters must agree with gloo's within that test's tolerance and be identical on every rank.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import ranks  # noqa: E402
from test_torch_training import _both, _check  # noqa: E402


@pytest.mark.timeout(120)
def test_ddp_across_two_servers_trains_like_gloo(tmp_path: Any) -> None:
    servers = ["a", "a", "b", "b"]
    _check(ranks.run_processes(_both, len(servers), str(tmp_path), "ddp", timeout=90, servers=servers))
