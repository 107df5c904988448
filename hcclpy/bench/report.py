"""Printing and saving ``hcclpy bench`` results: the nccl-tests table, JSON, CSV and a plot."""

from __future__ import annotations

import csv
import json
import os
from typing import Any, Dict, List, Optional, TextIO, Tuple

from .._units import format_bytes
from .cases import IN_PLACE_BY_NATURE
from .measure import Result, Row

__all__ = ["average_busbw", "check_output", "check_plot", "footer", "hccl_test_table", "header", "plot_figure", "print_row",
           "size_ticks", "write_csv", "write_json", "write_plot", "wrong_elements"]

# hccl_test's names for the data types
TYPE_NAMES = {"INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "UINT8": "uint8",
              "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64", "FP16": "fp16", "FP32": "fp32",
              "FP64": "fp64", "BFP16": "bfp16"}


def average_busbw(rows: List[Row], operation: str) -> float:
    """The mean bus bandwidth over sizes and columns, as nccl-tests' last line (broadcast's
    out-of-place column times its in-place call, so it counts once)."""
    columns = ("in_place",) if operation in IN_PLACE_BY_NATURE else ("out_of_place", "in_place")
    values = [getattr(row, column).busbw for row in rows for column in columns if getattr(row, column) is not None]
    return sum(values) / len(values) if values else 0.0


def wrong_elements(rows: List[Row]) -> int:
    """The wrong elements over every cell of ``rows`` (unchecked cells count none)."""
    return sum(r.wrong or 0 for row in rows for r in (row.out_of_place, row.in_place) if r is not None)


def _time(time_us: float) -> str:
    # As nccl-tests: no decimals from 10 ms on, so a time of seconds still fits the column.
    return f"{time_us:>9.0f}" if time_us >= 10000 else f"{time_us:>9.2f}"


def _cells(result: Optional[Result]) -> str:
    if result is None:
        return f"{'N/A':>9} {'N/A':>7} {'N/A':>7} {'N/A':>6}"
    wrong = "N/A" if result.wrong is None else result.wrong  # N/A: not checked (-c 0), as nccl-tests
    return f"{_time(result.time_us)} {result.algbw:>7.2f} {result.busbw:>7.2f} {wrong:>6}"


def header(meta: Dict[str, Any], out: TextIO) -> None:
    """The nccl-tests table's header, printed before the first row is measured."""
    print(f"# hcclpy bench {meta['operation']}: {meta['nranks']} ranks, backend {meta['backend']}, "
          f"warmup {meta['warmup']}, iters {meta['iters']}, check {'on' if meta['check'] else 'off'}", file=out)
    print(f"# time: device events around back-to-back calls on one stream; {meta['average']}; "
          "GB/s = 1e9 bytes/s; busbw = algbw x the nccl-tests factor", file=out)
    if meta["operation"] in IN_PLACE_BY_NATURE:
        print(f"# {meta['operation']}: HCCL has no out-of-place form, so both columns time the in-place call "
              "(counted once in the average)", file=out)
    print(f"# {'':>62}out-of-place{'':>22}in-place", file=out)
    print(f"# {'size':>10} {'count':>12} {'type':>6} {'redop':>6} {'root':>5} "
          f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6} {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}",
          file=out)
    print(f"# {'(B)':>10} {'(elements)':>12} {'':>6} {'':>6} {'':>5} "
          f"{'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6} {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7}", file=out,
          flush=True)


def print_row(row: Row, meta: Dict[str, Any], out: TextIO) -> None:
    """One row of the table, flushed at once (a run stopped later still shows it)."""
    print(f"  {row.size:>10} {row.count:>12} {meta['type']:>6} {meta['redop']:>6} {meta['root']:>5} "
          f"{_cells(row.out_of_place)} {_cells(row.in_place)}", file=out, flush=True)


def footer(rows: List[Row], meta: Dict[str, Any], out: TextIO) -> None:
    """The table's last lines: wrong elements (N/A when unchecked), the average bus bandwidth, and
    for a run that stopped early, why (``meta["stopped"]``)."""
    wrong = wrong_elements(rows)
    verdict = f"{wrong} {'OK' if wrong == 0 else 'FAILED'}" if meta["check"] else "N/A (not checked: -c 0)"
    print(f"# Out of bounds values : {verdict}", file=out)
    print(f"# Avg bus bandwidth    : {average_busbw(rows, meta['operation']):.4f}", file=out)
    if not meta["complete"]:
        print(f"# Incomplete: {meta['stopped']}; {len(rows)} size(s) measured", file=out)
    out.flush()


def hccl_test_table(rows: List[Row], meta: Dict[str, Any], out: TextIO) -> None:
    """hccl_test's table: size, average time and algorithm bandwidth of the out-of-place call, and
    the check (``success``, ``failed``, or ``NULL`` when checks are off), under its header line,
    which gives the timed calls (with ``-n 0`` the count chosen for each size, first to last)."""
    sizes = [row.size for row in rows]
    counts = list(dict.fromkeys(row.iters for row in rows))
    iters = meta["iters"]  # no row measured
    if len(counts) == 1:
        iters = counts[0]
    elif counts:
        iters = f"auto ({counts[0]} to {counts[-1]} by size)"
    print(f"the minbytes is {min(sizes, default=0)}, maxbytes is {max(sizes, default=0)}, iters is {iters}, "
          f"warmup_iters is {meta['warmup']}", file=out)
    print("data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:", file=out)
    for row in rows:
        result = row.out_of_place
        if result is None:
            continue
        check = "NULL" if result.wrong is None else "success" if result.wrong == 0 else "failed"
        print(f"{row.size:<18}| {result.time_us:>12.2f}   | {result.algbw:>18.5f}   | {check}", file=out)
    out.flush()


def check_output(path: str) -> None:
    """ValueError saying why ``path`` cannot be written: its directory is missing, it is a directory,
    or it may not be written. Nothing is created: the check runs before the benchmark, so that a
    wrong path fails at once rather than after the whole run."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"the directory {directory} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory, not a file")
    if not os.access(path if os.path.exists(path) else directory, os.W_OK):
        raise ValueError("no permission to write it" if os.path.exists(path) else
                         f"no permission to create a file in {directory}")


def _matplotlib() -> Any:
    """``matplotlib``, set to draw without a display; RuntimeError when it is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    return matplotlib


def check_plot(path: str) -> None:
    """ValueError when :func:`write_plot` could not write ``path``: matplotlib is missing, cannot
    write the format its extension names, or :func:`check_output` refuses it. (Without an
    extension matplotlib writes PNG to ``path.png``.)"""
    try:
        _matplotlib()
    except RuntimeError:
        raise ValueError("plotting needs matplotlib (pip install matplotlib)") from None
    from matplotlib.backend_bases import FigureCanvasBase

    extension = os.path.splitext(path)[1][1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if extension and extension not in formats:
        raise ValueError(f"matplotlib cannot write .{extension} files; the extension must be one of "
                         f"{', '.join('.' + name for name in sorted(formats))}")
    check_output(path if extension else path + ".png")


def write_json(rows: List[Row], meta: Dict[str, Any], path: str) -> None:
    """``meta`` (``complete`` false and ``stopped`` saying why for a run that stopped early), the
    average bus bandwidth and the rows measured; an unchecked #wrong is null."""
    with open(path, "w") as out:
        json.dump({**meta, "avg_busbw": average_busbw(rows, meta["operation"]),
                   "rows": [row.as_dict() for row in rows]}, out, indent=1)
        out.write("\n")


def write_csv(rows: List[Row], meta: Dict[str, Any], path: str) -> None:
    """One line per size and column, with the timed calls (``iters``); an unchecked #wrong is empty."""
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["operation", "nranks", "size", "count", "type", "redop", "root", "placement", "iters",
                         "time_us", "algbw", "busbw", "wrong"])
        for row in rows:
            for placement, result in (("out-of-place", row.out_of_place), ("in-place", row.in_place)):
                if result is not None:
                    writer.writerow([meta["operation"], meta["nranks"], row.size, row.count, meta["type"],
                                     meta["redop"], meta["root"], placement, row.iters, f"{result.time_us:.3f}",
                                     f"{result.algbw:.4f}", f"{result.busbw:.4f}",
                                     "" if result.wrong is None else result.wrong])


# The most size labels a panel shows: "128 MiB" is about 0.6 inch wide at the plot's font, and a
# panel about 4.5 inches.
_MAX_SIZE_LABELS = 6


def size_ticks(sizes: List[int], most: int = _MAX_SIZE_LABELS) -> Tuple[List[float], List[float]]:
    """The labelled (major) and unlabelled (minor) x ticks of a plot of ``sizes`` (bytes, above 0).

    Ticks sit at the powers of two from the smallest size to the largest. The first and the last
    of them are labelled, and between them every 1st, 2nd, 5th, 10th, 20th or 50th exponent (the
    smallest step that gives at most ``most`` labels; a multiple of it, so that with a step that
    divides 10, 1 KiB, 1 MiB and 1 GiB are labelled), leaving out those less than a step from either
    end; the other powers of two are minor ticks. Sizes holding fewer than two powers of two (sizes
    stepped by ``-i`` inside one octave) are labelled at the sizes themselves, every k-th one from
    the largest.

    Examples
    --------
    >>> [format_bytes(int(x)) for x in size_ticks([8, 4096])[0]]
    ['8 B', '64 B', '256 B', '1 KiB', '4 KiB']
    >>> [format_bytes(int(x)) for x in size_ticks([8, 1 << 30])[0]]
    ['8 B', '1 KiB', '32 KiB', '1 MiB', '32 MiB', '1 GiB']
    """
    low, high = min(sizes), max(sizes)
    exponents = [k for k in range(low.bit_length() - 1, high.bit_length()) if low <= 1 << k <= high]
    if len(exponents) < 2:
        ordered = sorted(set(sizes))
        every = -(-len(ordered) // most)  # rounded up
        major = ordered[::-1][::every][::-1]  # counted from the largest, which is always labelled
        return [float(s) for s in major], [float(s) for s in ordered if s not in major]
    first, last = exponents[0], exponents[-1]
    for step in (1, 2, 5, 10, 20, 50):
        labelled = [first] + [k for k in exponents if k % step == 0 and k - first >= step and last - k >= step]
        labelled.append(last)
        if len(labelled) <= most:
            break
    return [float(1 << k) for k in labelled], [float(1 << k) for k in exponents if k not in labelled]


def plot_figure(rows: List[Row], meta: Dict[str, Any]) -> Any:
    """The figure :func:`write_plot` saves (a ``matplotlib.figure.Figure``; close it with
    ``matplotlib.pyplot.close``): bus bandwidth and time against size, on log axes.

    The size axis is log 2, runs from the smallest size measured to the largest, and is labelled in
    bytes (``8 B``, ``1 KiB``, ``64 MiB``) at the ticks :func:`size_ticks` picks, so that the labels
    never overlap. Points at or below 0 (a 0-byte size, a bandwidth too small to print) have no
    place on a log axis and are left out; a panel left with none says so, on linear axes."""
    _matplotlib()
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatter, NullFormatter

    class PlainLogFormatter(LogFormatter):
        """matplotlib's LogFormatter, writing 0.6 where it writes 6e-01."""

        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            return f"{x:g}"

    figure, panels = plt.subplots(1, 2, figsize=(11, 4))
    for axes, title, value in zip(panels, ("bus bandwidth (GB/s)", "time per call (us)"), ("busbw", "time_us")):
        for placement in ("out_of_place", "in_place"):
            cells = [(row.size, getattr(row, placement)) for row in rows]
            points = [(size, getattr(cell, value)) for size, cell in cells
                      if cell is not None and size > 0 and getattr(cell, value) > 0]
            if points:
                # Not clipped: the axis ends at the largest size, and its marker sits on the frame.
                axes.plot(*zip(*points), marker="o", label=placement.replace("_", "-"), clip_on=False)
        axes.set_xlabel("size")
        axes.set_title(title)
        if not axes.lines:  # log axes of nothing warn, and a legend of nothing too
            axes.text(0.5, 0.5, "no data above 0", transform=axes.transAxes, ha="center", va="center")
            continue
        sizes = sorted({int(x) for line in axes.lines for x in line.get_xdata()})
        axes.set_xscale("log", base=2)
        major, minor = size_ticks(sizes)
        axes.xaxis.set_major_locator(FixedLocator(major))
        axes.xaxis.set_minor_locator(FixedLocator(minor))
        axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_bytes(int(round(x)))))
        axes.xaxis.set_minor_formatter(NullFormatter())
        if len(sizes) > 1:
            axes.set_xlim(sizes[0], sizes[-1])
        else:  # one size: an octave either side of it
            axes.set_xlim(sizes[0] / 2, sizes[0] * 2)
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))  # 0.01, 1, 100
        # Labels between powers of 10 only when the values span less than one: else a narrow range
        # (times of 1.6 to 2.2 us) would show no label at all.
        axes.yaxis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.5)))
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
    figure.suptitle(f"hcclpy bench {meta['operation']}, {meta['nranks']} ranks, {meta['type']}, "
                    f"backend {meta['backend']}")
    figure.tight_layout()
    return figure


def write_plot(rows: List[Row], meta: Dict[str, Any], path: str) -> None:
    """Save :func:`plot_figure` of ``rows`` to ``path`` (needs matplotlib; the format is the
    extension's, PNG without one)."""
    _matplotlib()
    import matplotlib.pyplot as plt

    figure = plot_figure(rows, meta)
    try:
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)
