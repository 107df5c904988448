"""DistributedDataParallel on the "hcclpy" torch.distributed backend.

The only hcclpy-specific lines are ``import hcclpy.torch`` and the backend name. Each rank trains
the same small model on its own data for a few steps; DDP averages the gradients over the ranks,
so every rank ends with the same parameters, which the example checks (with all_gather_object).
An uneven all-gather, which torch.distributed itself does not offer, closes the run.

Run it with torchrun-style launchers; with none, it is a job of one rank::

    hcclpy run -n 4 examples/torch_ddp.py
    torchrun --nproc-per-node 4 examples/torch_ddp.py

CPU tensors are staged through device memory: on a machine without CANN they run on the hcclpy
CPU simulator. Exit status 1 on a wrong result.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hcclpy.torch


def main() -> int:
    if "RANK" not in os.environ:  # no launcher: a job of one rank
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    dist.init_process_group("hcclpy")
    try:
        rank, size = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)  # the same initial weights everywhere (DDP would broadcast them anyway)
        model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                            torch.nn.Linear(32, 1)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(rank)  # each rank its own batches
        for _ in range(10):
            x = torch.randn(32, 16, generator=data)
            loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()  # gradients are all-reduced through hcclpy here
            optimizer.step()
        mine = torch.cat([p.detach().flatten() for p in model.parameters()])
        everyone = [None] * size
        dist.all_gather_object(everyone, mine)
        same = all(torch.equal(mine, other) for other in everyone)

        # Rank r contributes r + 1 rows: an uneven all-gather (HcclAllGatherV).
        rows = [r + 1 for r in range(size)]
        gathered = torch.empty(sum(rows), 2)
        hcclpy.torch.all_gather_into_tensor_uneven(gathered, torch.full((rank + 1, 2), float(rank)), rows)
        expected = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(size)])
        uneven_ok = torch.equal(gathered, expected)

        print(f"rank {rank} of {size}: loss {loss.item():.4f}, parameters "
              f"{'identical on every rank' if same else 'DIFFER between ranks'}, uneven all-gather "
              f"{'OK' if uneven_ok else 'WRONG'}")
        return 0 if same and uneven_ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
