"""``hcclpy trace merge DIR``: put the flight-recorder dumps of a job's ranks side by side.

Every process of a job started with ``HCCLPY_TRACE_DIR=DIR`` dumps its records there when an
operation fails (or when the program calls ``hcclpy.trace.dump``). This command reads them all,
writes one Chrome trace of every rank (``DIR/merged.chrome.json``) and prints, for each
communicator, each rank's last completed and first pending operation, which ranks issued fewer
collectives, and the first collective the ranks disagree on (another collective, data type,
reduce op, root or, for the even collectives, count)::

    hcclpy trace merge /tmp/traces

Ranks are lined up by their collectives' numbers only: sends and receives (numbered apart, as
``p2p #k``) legitimately differ from rank to rank, so they are shown but never compared.
Communicators that share a name are kept apart by their instance (the k-th of that name).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

__all__ = ["add_parser", "report", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``hcclpy trace`` with ``subparsers``."""
    parser = subparsers.add_parser(
        "trace", help="merge the flight-recorder dumps of a job's ranks and say which rank is behind",
        description="Merge flight-recorder dumps (hcclpy.trace.dump, or HCCLPY_TRACE_DIR) into one Chrome trace and "
        "print each rank's last completed and first pending operation per communicator, the ranks that issued "
        "fewer collectives and the first collective the ranks disagree on. Exit status 1 when the directory "
        "holds no dump or a malformed one, or the merged trace cannot be written.")
    parser.add_argument("action", choices=("merge",), help="merge: the only action")
    parser.add_argument("directory", help="the directory holding the dumps (*.json)")
    parser.add_argument("--out", help="the merged Chrome trace (default: DIRECTORY/merged.chrome.json)")
    parser.set_defaults(handler=run, parser=parser)
    return parser


class DumpError(ValueError):
    """A file that looks like a flight-recorder dump (a JSON object with ``records``) but lacks
    what :func:`hcclpy.trace.dump` writes: edited by hand, cut short, or from another tool."""


# What hcclpy.trace.dump writes and the merge reads: the process, and each record.
_DUMP_KEYS = ("host", "pid", "rank", "dumped_ns")
_RECORD_KEYS = ("comm", "rank", "size", "seq", "op", "count", "dtype", "stream", "queued_ns", "state",
                "completed_by_ns")


def _checked(path: Path, data: Dict[str, Any]) -> Dict[str, Any]:
    """``data`` (read from ``path``), once it has every field the merge reads."""
    missing = [key for key in _DUMP_KEYS if key not in data]
    if missing:
        raise DumpError(f"{path} is not a hcclpy trace dump: missing {missing[0]!r}")
    for index, item in enumerate(data["records"]):
        if not isinstance(item, dict):
            raise DumpError(f"{path} is not a hcclpy trace dump: records[{index}] is not an object")
        missing = [key for key in _RECORD_KEYS if key not in item]
        if missing:
            raise DumpError(f"{path} is not a hcclpy trace dump: records[{index}] is missing {missing[0]!r}")
    return data


def _load(directory: Path) -> List[Dict[str, Any]]:
    """The dumps in ``directory``; other JSON files (no ``records`` list) are skipped.

    Raises
    ------
    DumpError
        For a file with a ``records`` list that lacks a field of a dump.
    """
    dumps = []
    for path in sorted(directory.glob("*.json")):
        if path.name.endswith(".chrome.json"):
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("records"), list):
            dumps.append(_checked(path, data))
    # A process that dumped more than once: its newest dump holds the latest state of its records.
    newest: Dict[Tuple[Any, Any], Dict[str, Any]] = {}
    for data in dumps:
        known = newest.get((data["host"], data["pid"]))
        if known is None or data["dumped_ns"] > known["dumped_ns"]:
            newest[(data["host"], data["pid"])] = data
    return list(newest.values())


_POINT_TO_POINT = {"send", "recv", "batch_send_recv"}  # one rank's send is its peer's recv
_EVEN = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "scatter"}


def _collective(item: Dict[str, Any]) -> bool:
    """Whether ``item`` is a collective (numbered in the order every rank issues them)."""
    return item["op"] not in _POINT_TO_POINT and item.get("seq") is not None


def _agreed(item: Dict[str, Any]) -> tuple:
    """What every rank's record of one collective must share (the uneven operations' counts differ
    by rank)."""
    return (item["op"], item["dtype"], item.get("op_kind"), item.get("root"),
            item["count"] if item["op"] in _EVEN else None)


def _first_mismatch(ranks: Dict[int, List[Dict[str, Any]]]) -> Optional[str]:
    """The first collective number, among those every dump holds, whose records disagree."""
    from ..trace import signature

    by_seq = {rank: {item["seq"]: item for item in items if _collective(item)} for rank, items in ranks.items()}
    common = set.intersection(*(set(records) for records in by_seq.values()))
    for seq in sorted(common):
        items = {rank: records[seq] for rank, records in sorted(by_seq.items())}
        if len({_agreed(item) for item in items.values()}) > 1:
            calls = ", ".join(f"rank {rank} {signature(item)}" for rank, item in items.items())
            return f"  mismatch at #{seq}: {calls}"
    return None


Records = Dict[Tuple[str, int], Dict[int, List[Dict[str, Any]]]]
Processes = Dict[Tuple[str, int], Dict[int, Set[Tuple[Any, Any]]]]


def _by_communicator(dumps: List[Dict[str, Any]]) -> Tuple[Records, Processes]:
    """The records of every dump, by communicator (name, instance) and rank, each rank's in the
    order it queued them; and the processes (host, pid) whose dumps hold each rank's records."""
    by_comm: Records = {}
    processes: Processes = {}
    for data in dumps:
        process = (data.get("host"), data.get("pid"))
        for item in data["records"]:
            key = (item["comm"], item.get("instance") or 1)
            by_comm.setdefault(key, {}).setdefault(item["rank"], []).append(item)
            processes.setdefault(key, {}).setdefault(item["rank"], set()).add(process)
    for ranks in by_comm.values():
        for items in ranks.values():
            items.sort(key=lambda item: item.get("queued_ns", 0))
    return by_comm, processes


def _standing(rank: int, items: List[Dict[str, Any]]) -> str:
    """Where ``rank`` stands: its last completed and its first pending operation."""
    from ..trace import label

    done = [item for item in items if item["state"] == "completed"]
    waiting = [item for item in items if item["state"] != "completed"]
    last = label(done[-1]) if done else "none recorded"
    failed = sum(item["state"] == "failed" for item in waiting)
    if failed > 1:  # a failed wait tells that one of them failed, not which: those before may be done
        state = (f"failed, or done before the failure: {failed} operations were queued since the last one known "
                 "complete, and one of them failed")
    else:
        state = waiting[0]["state"] if waiting else ""
    first = f"{label(waiting[0])} ({state})" if waiting else "none"
    return f"  rank {rank}: last completed {last}; first pending {first}"


def report(dumps: List[Dict[str, Any]]) -> List[str]:
    """The lines that say, per communicator, where each rank stands and who is behind."""
    lines = []
    by_comm, processes = _by_communicator(dumps)
    for (comm, instance), ranks in sorted(by_comm.items()):
        size = max(item["size"] for items in ranks.values() for item in items)
        which = f" (instance {instance})" if instance != 1 else ""
        lines.append(f"communicator '{comm}'{which}: dumps from {len(ranks)} of {size} ranks")
        mixed = sorted(rank for rank, found in processes[(comm, instance)].items() if len(found) > 1)
        if mixed:
            lines.append(f"  warning: the records of rank(s) {', '.join(map(str, mixed))} come from more than one "
                         "process: the directory holds dumps of several jobs, which this merge mixes up; give each "
                         "job a directory of its own (HCCLPY_TRACE_DIR)")
        issued: Dict[int, int] = {}
        for rank, items in sorted(ranks.items()):
            issued[rank] = max((item["seq"] for item in items if _collective(item)), default=0)
            lines.append(_standing(rank, items))
        mismatch = _first_mismatch(ranks) if len(ranks) > 1 else None
        if mismatch:
            lines.append(mismatch)
        ahead = max(issued.values())
        behind = sorted(rank for rank, count in issued.items() if count < ahead)
        missing = sorted(set(range(size)) - set(ranks))
        if behind:
            lines.append(f"  behind: rank(s) {', '.join(map(str, behind))} issued fewer collectives "
                         f"({', '.join(f'{issued[r]}' for r in behind)}) than the others ({ahead})")
        if missing:
            lines.append(f"  no dump from rank(s) {', '.join(map(str, missing))}: they may be the ones stuck")
        if not behind and not missing:
            lines.append(f"  every rank issued {ahead} collective{'' if ahead == 1 else 's'}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Carry out ``hcclpy trace merge``."""
    from ..trace import chrome_trace

    directory = Path(args.directory)
    try:
        dumps = _load(directory) if directory.is_dir() else []
    except DumpError as exc:
        print(f"hcclpy trace: {exc}", file=sys.stderr)
        return 1
    if not dumps:
        print(f"hcclpy trace: no flight-recorder dumps in {directory}", file=sys.stderr)
        return 1
    events: List[Dict[str, Any]] = []
    for data in dumps:
        events += chrome_trace(data["records"], data)["traceEvents"]
    out = Path(args.out) if args.out else directory / "merged.chrome.json"
    try:
        out.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}) + "\n")
    except OSError as exc:
        print(f"hcclpy trace: cannot write the merged trace to {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print("\n".join(report(dumps)))
    print(f"merged Chrome trace: {out}")
    return 0


