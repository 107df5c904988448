"""Every torch.distributed operation through the "hcclpy" backend, against gloo on the same inputs.

Each world size runs once: every rank runs all the cases, on the hcclpy default group and on a
gloo group of the same ranks, and reports its mismatches. Where gloo lacks an operation (AVG,
PREMUL_SUM, uneven gathers) the expected value is computed from the inputs as gloo gathered them.
"""

from __future__ import annotations

from typing import Any, List, Optional

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import ranks  # noqa: E402
import torch_ranks as tr  # noqa: E402

REDUCE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64,
                 torch.uint8, torch.bool)
COMPLEX_DTYPES = (torch.complex64, torch.complex128)
COMPLEX_REDUCTIONS = ("SUM", "AVG")  # gloo and the hcclpy backend refuse PRODUCT, MIN and MAX on complex
MOVE_DTYPES = (torch.float32, torch.int64, torch.bool, torch.complex64, torch.int8, torch.float16, torch.bfloat16)


def _cases(rank: int, size: int, gloo: Any) -> List[Any]:
    def gloo_or_reference(op_name: str, tensor: torch.Tensor, run: Any) -> torch.Tensor:
        expected = tensor.clone()
        try:
            run(expected)
            return expected
        except (RuntimeError, ValueError):  # gloo does not reduce this dtype or op
            return tr.reduced(tr.everyone(tensor, gloo), op_name)

    def all_reduce() -> List[Optional[str]]:
        out = []
        for dtype in REDUCE_DTYPES:
            for name, op in tr.REDUCTIONS.items():
                x = tr.data(rank, (5, 3), dtype, seed=len(out), small=name == "PRODUCT")
                want = gloo_or_reference(name, x, lambda t: dist.all_reduce(t, op=op, group=gloo))
                got = x.clone()
                dist.all_reduce(got, op=op)
                out.append(tr.mismatch(f"all_reduce {dtype} {name}", got, want))
        for dtype in (torch.float32, torch.bfloat16):
            x = tr.data(rank, (7,), dtype, seed=3)
            got = x.clone()
            dist.all_reduce(got, op=dist.ReduceOp.AVG)
            out.append(tr.mismatch(f"all_reduce {dtype} AVG", got, tr.reduced(tr.everyone(x, gloo), "AVG")))
            got = x.clone()
            dist.all_reduce(got, op=dist._make_nccl_premul_sum(0.5))
            want = tr.reduced([t * 0.5 for t in tr.everyone(x, gloo)], "SUM")
            out.append(tr.mismatch(f"all_reduce {dtype} PREMUL_SUM", got, want))
        near_the_limit = torch.full((3,), 40000.0, dtype=torch.float16)  # the mean fits float16, the sum not
        dist.all_reduce(near_the_limit, op=dist.ReduceOp.AVG)
        out.append(tr.mismatch("all_reduce float16 AVG of values whose sum overflows", near_the_limit,
                               torch.full((3,), 40000.0, dtype=torch.float16)))
        empty = torch.empty(0)
        dist.all_reduce(empty)
        return out

    def broadcast_and_reduce() -> List[Optional[str]]:
        out = []
        for root in range(size):
            for dtype in MOVE_DTYPES:
                x = tr.data(rank, (4, 2), dtype, seed=root)
                want, got = x.clone(), x.clone()
                dist.broadcast(want, root, group=gloo)
                dist.broadcast(got, root)
                out.append(tr.mismatch(f"broadcast {dtype} root {root}", got, want))
            for name, op in tr.REDUCTIONS.items():
                x = tr.data(rank, (6,), torch.float32, seed=root, small=name == "PRODUCT")
                want, got = x.clone(), x.clone()
                dist.reduce(want, root, op=op, group=gloo)
                dist.reduce(got, root, op=op)
                if rank == root:
                    out.append(tr.mismatch(f"reduce {name} root {root}", got, want))
            for dtype in COMPLEX_DTYPES:  # summed as pairs of reals, as gloo does
                for name in COMPLEX_REDUCTIONS:
                    x = tr.data(rank, (5,), dtype, seed=root)
                    want, got = x.clone(), x.clone()
                    dist.reduce(want, root, op=getattr(dist.ReduceOp, name), group=gloo)
                    dist.reduce(got, root, op=getattr(dist.ReduceOp, name))
                    if rank == root:
                        out.append(tr.mismatch(f"reduce {dtype} {name} root {root}", got, want))
        return out

    def gathers() -> List[Optional[str]]:
        out = []
        for dtype in MOVE_DTYPES:
            x = tr.data(rank, (3, 2), dtype, seed=5)
            want = tr.everyone(x, gloo)
            got = [torch.empty_like(x) for _ in range(size)]
            dist.all_gather(got, x)
            out += [tr.mismatch(f"all_gather {dtype} [{r}]", g, w) for r, (g, w) in enumerate(zip(got, want))]
            flat = torch.empty((size * 3, 2), dtype=dtype)
            dist.all_gather_into_tensor(flat, x)
            out.append(tr.mismatch(f"all_gather_into_tensor {dtype}", flat, torch.cat(want)))
        # outputs of different sizes: all-gather-v
        x = torch.full((rank + 1,), float(rank))
        got = [torch.empty(r + 1) for r in range(size)]
        dist.all_gather(got, x)
        out += [tr.mismatch(f"uneven all_gather [{r}]", g, torch.full((r + 1,), float(r))) for r, g in enumerate(got)]
        # all_gather_coalesced: output_tensor_lists[r][i] is rank r's inputs[i] ([rank][tensor],
        # the transpose of all_gather's lists). With as many inputs of one shape as ranks, reading
        # the lists the other way round fits every shape and swaps the results silently.
        for count, shapes in ((size, [(2,)] * size), (size + 1, [(i + 1,) for i in range(size + 1)])):
            inputs = [tr.data(rank, shape, torch.float32, seed=20 + i) for i, shape in enumerate(shapes)]
            want = [[tr.data(r, shape, torch.float32, seed=20 + i) for i, shape in enumerate(shapes)]
                    for r in range(size)]
            for name, group in (("hcclpy", None), ("gloo", gloo)):
                got_lists = [[torch.empty(shape) for shape in shapes] for _ in range(size)]
                dist.all_gather_coalesced(got_lists, inputs, group=group)
                out += [tr.mismatch(f"{name} all_gather_coalesced of {count} inputs [{r}][{i}]", g, w)
                        for r in range(size) for i, (g, w) in enumerate(zip(got_lists[r], want[r]))]
        for root in range(size):
            x = tr.data(rank, (5,), torch.int32, seed=root)
            want = tr.everyone(x, gloo)
            got = [torch.empty_like(x) for _ in range(size)] if rank == root else None
            dist.gather(x, got, dst=root)
            if rank == root:
                out += [tr.mismatch(f"gather root {root} [{r}]", g, w) for r, (g, w) in enumerate(zip(got, want))]
            pieces = [tr.data(r, (2, 2), torch.float64, seed=root) for r in range(size)] if rank == root else None
            got_one, want_one = torch.empty(2, 2, dtype=torch.float64), torch.empty(2, 2, dtype=torch.float64)
            dist.scatter(got_one, pieces, src=root)
            dist.scatter(want_one, pieces, src=root, group=gloo)
            out.append(tr.mismatch(f"scatter root {root}", got_one, want_one))
        return out

    def reduce_scatters() -> List[Optional[str]]:
        out = []
        plain = [(dtype, tuple(tr.REDUCTIONS)) for dtype in (torch.float32, torch.int32, torch.bfloat16, torch.bool)]
        for dtype, names in plain + [(dtype, COMPLEX_REDUCTIONS) for dtype in COMPLEX_DTYPES]:
            for name in names:
                op = getattr(dist.ReduceOp, name)
                blocks = [tr.data(rank, (4,), dtype, seed=10 + b, small=name == "PRODUCT") for b in range(size)]
                every = [tr.everyone(b, gloo) for b in blocks]
                want = tr.reduced(every[rank], name)
                got = torch.empty(4, dtype=dtype)
                dist.reduce_scatter(got, blocks, op=op)
                out.append(tr.mismatch(f"reduce_scatter {dtype} {name}", got, want))
                got = torch.empty(4, dtype=dtype)
                dist.reduce_scatter_tensor(got, torch.cat(blocks), op=op)
                out.append(tr.mismatch(f"reduce_scatter_tensor {dtype} {name}", got, want))
        blocks = [tr.data(rank, (3,), torch.float32, seed=20 + b) for b in range(size)]
        want = tr.reduced([tr.everyone(b, gloo) for b in blocks][rank], "AVG")
        got = torch.empty(3)
        dist.reduce_scatter(got, blocks, op=dist.ReduceOp.AVG)
        out.append(tr.mismatch("reduce_scatter AVG", got, want))
        # blocks of different sizes: reduce-scatter-v
        blocks = [torch.full((b + 1,), float(rank + b)) for b in range(size)]
        got = torch.empty(rank + 1)
        dist.reduce_scatter(got, blocks)
        want = torch.full((rank + 1,), float(sum(r + rank for r in range(size))))
        out.append(tr.mismatch("uneven reduce_scatter", got, want))
        blocks = [torch.full((b + 1,), complex(rank, b)) for b in range(size)]
        got = torch.empty(rank + 1, dtype=torch.complex64)
        dist.reduce_scatter(got, blocks)
        want = torch.full((rank + 1,), complex(sum(range(size)), size * rank), dtype=torch.complex64)
        out.append(tr.mismatch("uneven reduce_scatter complex64", got, want))
        return out

    def all_to_alls() -> List[Optional[str]]:
        out = []
        for dtype in MOVE_DTYPES:
            x = tr.data(rank, (size * 2, 3), dtype, seed=30)
            want, got = torch.empty_like(x), torch.empty_like(x)
            dist.all_to_all_single(want, x, group=gloo)
            dist.all_to_all_single(got, x)
            out.append(tr.mismatch(f"all_to_all_single {dtype}", got, want))
            ins = list(x.chunk(size))
            want = [torch.empty_like(t) for t in ins]
            got = [torch.empty_like(t) for t in ins]
            dist.all_to_all(want, ins, group=gloo)
            dist.all_to_all(got, ins)
            out += [tr.mismatch(f"all_to_all {dtype} [{r}]", g, w) for r, (g, w) in enumerate(zip(got, want))]
        # uneven: rank r sends j + r + 1 rows to rank j
        send_rows = [j + rank + 1 for j in range(size)]
        recv_rows = [rank + i + 1 for i in range(size)]
        x = tr.data(rank, (sum(send_rows), 2), torch.float32, seed=31)
        want = torch.empty(sum(recv_rows), 2)
        got = torch.empty(sum(recv_rows), 2)
        dist.all_to_all_single(want, x, recv_rows, send_rows, group=gloo)
        dist.all_to_all_single(got, x, recv_rows, send_rows)
        out.append(tr.mismatch("all_to_all_single with splits", got, want))
        ins = list(x.split(send_rows))
        got = [torch.empty(n, 2) for n in recv_rows]
        dist.all_to_all(got, ins)
        out += [tr.mismatch(f"uneven all_to_all [{r}]", g, w) for r, (g, w) in enumerate(zip(got, want.split(recv_rows)))]
        return out

    def memory_formats() -> List[Optional[str]]:
        # channels_last tensors travel in memory order, as NCCL takes them; with every tensor of a
        # call in the same format that is their logical order too, so gloo's results hold.
        out = []
        for form, shape in ((torch.channels_last, (2, 3, 2, 2)), (torch.channels_last_3d, (2, 3, 1, 2, 2))):
            def dense(values: torch.Tensor) -> torch.Tensor:
                return values.contiguous(memory_format=form)

            def empty(rows: int) -> torch.Tensor:
                return torch.empty((rows, *shape[1:])).contiguous(memory_format=form)

            x = dense(tr.data(rank, shape, torch.float32, seed=45))
            got = x.clone()  # clone keeps the format
            dist.all_reduce(got)
            out.append(tr.mismatch(f"all_reduce {form}", got, tr.reduced(tr.everyone(x, gloo), "SUM")))
            out.append(None if got.is_contiguous(memory_format=form) else f"all_reduce {form} changed the format")
            got = x.clone()
            dist.broadcast(got, size - 1)
            out.append(tr.mismatch(f"broadcast {form}", got, tr.everyone(x, gloo)[size - 1]))
            everyone = tr.everyone(x, gloo)
            gathered = [empty(shape[0]) for _ in range(size)]
            dist.all_gather(gathered, x)
            out += [tr.mismatch(f"all_gather {form} [{r}]", g, w) for r, (g, w) in enumerate(zip(gathered, everyone))]
            flat = empty(size * shape[0])
            dist.all_gather_into_tensor(flat, x)
            out.append(tr.mismatch(f"all_gather_into_tensor {form}", flat, torch.cat(everyone)))
            big = dense(tr.data(rank, (size * shape[0], *shape[1:]), torch.float32, seed=46))
            mine = empty(shape[0])
            dist.reduce_scatter_tensor(mine, big)
            want = tr.reduced(tr.everyone(big, gloo), "SUM").chunk(size)[rank]
            out.append(tr.mismatch(f"reduce_scatter_tensor {form}", mine, want))
            want, got = empty(size * shape[0]), empty(size * shape[0])
            dist.all_to_all_single(want, big, group=gloo)
            dist.all_to_all_single(got, big)
            out.append(tr.mismatch(f"all_to_all_single {form}", got, want))
            pieces = [dense(tr.data(rank, shape, torch.float32, seed=47 + r)) for r in range(size)]
            got = [empty(shape[0]) for _ in range(size)]
            dist.all_to_all(got, pieces)
            want = [tr.data(r, shape, torch.float32, seed=47 + rank) for r in range(size)]  # what rank r sent here
            out += [tr.mismatch(f"all_to_all {form} [{r}]", g, w) for r, (g, w) in enumerate(zip(got, want))]
            # Complex tensors reach the backend as their real views, whose strides fit no format.
            z = dense(tr.data(rank, shape, torch.complex64, seed=48))
            got = z.clone()
            dist.all_reduce(got)
            out.append(tr.mismatch(f"all_reduce complex64 {form}", got, tr.reduced(tr.everyone(z, gloo), "SUM")))
            gathered = [torch.empty_like(z) for _ in range(size)]
            dist.all_gather(gathered, z)
            out += [tr.mismatch(f"all_gather complex64 {form} [{r}]", g, w)
                    for r, (g, w) in enumerate(zip(gathered, tr.everyone(z, gloo)))]
            # scatter and gather lists in another format than the root's own tensor: the root
            # converts them (it alone sees them; refusing would leave the others waiting).
            pieces = [tr.data(r, shape, torch.float32, seed=49) for r in range(size)] if rank == 0 else None
            got = empty(shape[0])
            dist.scatter(got, pieces, src=0)
            out.append(tr.mismatch(f"scatter contiguous list into {form}", got, tr.data(rank, shape, torch.float32, seed=49)))
            targets = [torch.empty(shape) for _ in range(size)] if rank == 0 else None
            dist.gather(x, targets, dst=0)
            if rank == 0:
                out += [tr.mismatch(f"gather {form} into contiguous [{r}]", g, w)
                        for r, (g, w) in enumerate(zip(targets, everyone))]
            got = empty(shape[0])
            if rank % 2 == 0 and rank + 1 < size:
                dist.send(x, rank + 1)
            elif rank % 2 == 1:
                dist.recv(got, rank - 1)
                out.append(tr.mismatch(f"send/recv {form}", got, everyone[rank - 1]))
        return out

    def point_to_point() -> List[Optional[str]]:
        out = []
        right, left = (rank + 1) % size, (rank - 1) % size
        # blocking, ordered so that it cannot deadlock
        x = tr.data(rank, (5,), torch.float32, seed=40)
        got = torch.empty(5)
        if rank % 2 == 0:
            dist.send(x, right)
            dist.recv(got, left)
        else:
            dist.recv(got, left)
            dist.send(x, right)
        out.append(tr.mismatch("send/recv ring", got, tr.data(left, (5,), torch.float32, seed=40)))
        # every rank sends first, then receives: channels per direction keep it from deadlocking
        for dtype in MOVE_DTYPES:
            x = tr.data(rank, (3,), dtype, seed=41)
            got = torch.empty_like(x)
            sent = dist.isend(x, right)
            received = dist.irecv(got, left)
            sent.wait()
            received.wait()
            out.append(tr.mismatch(f"isend/irecv {dtype}", got, tr.data(left, (3,), dtype, seed=41)))
        # batch_isend_irecv, with the receive listed first, and two messages to the same peer in order
        a, b = torch.full((2,), 10.0 * rank), torch.full((4,), 10.0 * rank + 1)
        got_a, got_b = torch.empty(2), torch.empty(4)
        ops = [dist.P2POp(dist.irecv, got_a, left), dist.P2POp(dist.isend, a, right),
               dist.P2POp(dist.isend, b, right), dist.P2POp(dist.irecv, got_b, left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        out.append(tr.mismatch("batch_isend_irecv first", got_a, torch.full((2,), 10.0 * left)))
        out.append(tr.mismatch("batch_isend_irecv second", got_b, torch.full((4,), 10.0 * left + 1)))
        return out

    def objects() -> List[Optional[str]]:
        out = []
        items = [{"rank": rank, "text": "x" * rank}]
        dist.broadcast_object_list(items, src=size - 1)
        out.append(None if items == [{"rank": size - 1, "text": "x" * (size - 1)}] else f"broadcast_object_list {items}")
        gathered: List[Any] = [None] * size
        dist.all_gather_object(gathered, (rank, [rank] * rank))
        out.append(None if gathered == [(r, [r] * r) for r in range(size)] else f"all_gather_object {gathered}")
        received: List[Any] = [None] * size if rank == 0 else None
        dist.gather_object({"from": rank}, received, dst=0)
        if rank == 0:
            out.append(None if received == [{"from": r} for r in range(size)] else f"gather_object {received}")
        mine: List[Any] = [None]
        dist.scatter_object_list(mine, [f"for {r}" for r in range(size)] if rank == 0 else None, src=0)
        out.append(None if mine == [f"for {rank}"] else f"scatter_object_list {mine}")
        dist.barrier()
        return out

    def uneven_functions() -> List[Optional[str]]:
        splits = [r + 1 for r in range(size)]
        x = torch.full((rank + 1, 2), float(rank))
        got = torch.empty(sum(splits), 2)
        hcclpy.torch.all_gather_into_tensor_uneven(got, x, splits)
        want = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(size)])
        out = [tr.mismatch("all_gather_into_tensor_uneven", got, want)]
        full = tr.data(rank, (sum(splits), 2), torch.float32, seed=50)
        mine = torch.empty(rank + 1, 2)
        hcclpy.torch.reduce_scatter_tensor_uneven(mine, full, splits, op=dist.ReduceOp.MAX)
        want = tr.reduced(tr.everyone(full, gloo), "MAX").split(splits)[rank]
        out.append(tr.mismatch("reduce_scatter_tensor_uneven MAX", mine, want))
        work = hcclpy.torch.all_gather_into_tensor_uneven(got, x, splits, async_op=True)
        work.wait()
        out.append(tr.mismatch("all_gather_into_tensor_uneven async", got,
                               torch.cat([torch.full((r + 1, 2), float(r)) for r in range(size)])))
        return out

    def async_works() -> List[Optional[str]]:
        out = []
        xs = [tr.data(rank, (1000,), torch.float32, seed=60 + i) for i in range(4)]
        wants = [tr.reduced(tr.everyone(x, gloo), "SUM") for x in xs]
        gots = [x.clone() for x in xs]
        works = [dist.all_reduce(g, async_op=True) for g in gots]
        futures = [w.get_future() for w in works]
        for i, (work, future) in enumerate(zip(works, futures)):
            value = future.wait()
            out.append(None if value[0] is gots[i] else f"future {i} value is not the output tensor")
            out.append(None if work.wait() and work.is_completed() else f"work {i} not completed after wait")
            out.append(tr.mismatch(f"async all_reduce {i}", gots[i], wants[i]))
        chained = dist.all_reduce(torch.ones(2), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
        out.append(tr.mismatch("future.then", chained.wait(), torch.full((2,), 2.0 * size)))
        return out

    import hcclpy.torch  # noqa: F401
    return [all_reduce, broadcast_and_reduce, gathers, reduce_scatters, all_to_alls, memory_formats, point_to_point,
            objects, uneven_functions, async_works]


def _against_gloo(rank: int, size: int, info: bytes, directory: str) -> List[str]:
    gloo = tr.init(rank, size, directory)
    try:
        return tr.run_cases(_cases(rank, size, gloo))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_every_operation_matches_gloo(size: int, tmp_path: Any) -> None:
    problems = ranks.run_processes(_against_gloo, size, str(tmp_path), timeout=240)
    report = [f"rank {r}: {p}" for r, found in enumerate(problems) for p in found]
    assert not report, "\n".join(report)
