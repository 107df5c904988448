"""Point-to-point in a ring: each rank passes what it holds to the next rank, N-1 times.

After step k, rank r holds the data that started on rank r-k-1, so summing everything it
received gives every rank the same total as one all-reduce: the check at the end. The ring is
run twice, with the two ways of posting a send and a receive together (so that neither waits for
the other and the ring cannot deadlock):

1. ``comm.batch_send_recv([("send", buf, next), ("recv", other, prev)])``
2. ``with hcclpy.group(): comm.send(buf, next); comm.recv(other, prev)``

Run it with any number of ranks::

    hcclpy run -n 4 examples/ring.py
    torchrun --nproc-per-node 4 examples/ring.py
    python examples/ring.py          # one rank: nothing to pass around

Exit status 1 if any rank receives the wrong data or ends with the wrong total.
"""

import sys

import numpy as np

import hcclpy

COUNT = 1000


def origin_data(rank: int) -> np.ndarray:
    """What rank ``rank`` starts with."""
    return np.arange(COUNT, dtype=np.float64) + 1000 * rank


def ring_sum(comm: hcclpy.Communicator, stream: hcclpy.Stream, use_group: bool) -> bool:
    """Pass the data around the ring, checking each step; return whether all steps were right."""
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    outgoing = hcclpy.from_numpy(origin_data(r), device=comm.device)
    incoming = hcclpy.empty(COUNT, "float64", device=comm.device)
    total = origin_data(r)
    ok = True
    for step in range(n - 1):
        if use_group:
            with hcclpy.group():
                comm.send(outgoing, nxt, stream=stream)
                comm.recv(incoming, prv, stream=stream)
        else:
            comm.batch_send_recv([("send", outgoing, nxt), ("recv", incoming, prv)], stream=stream)
        stream.synchronize()
        data = incoming.to_numpy()
        source = (r - step - 1) % n
        if not np.array_equal(data, origin_data(source)):
            print(f"rank {r}: step {step}: expected the data of rank {source}, got {data[:4]}...")
            ok = False
        total += data
        outgoing, incoming = incoming, outgoing  # forward what just arrived
    outgoing.close()
    incoming.close()

    # The same total from one collective.
    reference = hcclpy.from_numpy(origin_data(r), device=comm.device)
    comm.all_reduce(reference, stream=stream)
    stream.synchronize()
    expected = reference.to_numpy()
    reference.close()
    if not np.array_equal(total, expected):
        print(f"rank {r}: the ring total differs from all_reduce: {total[:4]}... vs {expected[:4]}...")
        ok = False
    return ok


def main() -> int:
    comm = hcclpy.init()
    stream = comm.device.create_stream()
    ok = True
    for use_group, how in ((False, "batch_send_recv"), (True, "group + send/recv")):
        passed = ring_sum(comm, stream, use_group)
        print(f"rank {comm.rank} of {comm.size}: ring with {how}: {'OK' if passed else 'WRONG'}")
        ok = ok and passed
    stream.close()
    hcclpy.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
