"""The ``hcclpy`` command line (also ``python -m hcclpy``).

Subcommands, one module each:

``hcclpy info``
    What hcclpy found: libraries and how, versions, devices, optional functions (:mod:`.info`).
``hcclpy run -n N script.py ...``
    Start N local ranks with a torchrun-compatible environment (:mod:`.run`).
``hcclpy sim build|path|env``
    Build the CPU simulator, print its tree or the shell variables that point at it (:mod:`.sim`).
``hcclpy bench OPERATION``
    Measure one operation over a range of sizes, nccl-tests style (:mod:`.bench`).
``hcclpy trace merge DIR``
    Merge the ranks' flight-recorder dumps and say which rank is behind (:mod:`.trace`).

A subcommand module provides ``add_parser(subparsers)``, which registers its parser and sets the
``handler`` default to a function that takes the parsed arguments and returns the exit status.
Importing this package loads no C library.

What every subcommand shares is done once, in :func:`main`: an option no parser knows is refused
with the nearest known spelling ("did you mean --nproc-per-node?"), and output piped into a reader
that leaves early (``hcclpy info | head -1``) ends quietly, with exit status 141 (``128 +
SIGPIPE``, what a program killed by SIGPIPE reports) and no traceback.
"""

from __future__ import annotations

import argparse
import difflib
import signal
import sys
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Tuple

from .. import __version__
from . import _output, bench, info, run, sim, trace

__all__ = ["EXIT_BROKEN_PIPE", "main"]

_COMMANDS = (info, run, sim, bench, trace)

EXIT_BROKEN_PIPE = 128 + getattr(signal, "SIGPIPE", 13)  # 141, as a shell reports a program SIGPIPE killed


class _Parser(argparse.ArgumentParser):
    """argparse's parser, where an abbreviation matching several spellings of one option (``--nproc``
    for ``--nproc-per-node`` and ``--nproc_per_node``) means that option, not an ambiguity."""

    def _get_option_tuples(self, option_string: str) -> List[Tuple[Any, ...]]:
        found: Dict[int, Tuple[Any, ...]] = {}
        for option in super()._get_option_tuples(option_string):
            found.setdefault(id(option[0]), option)  # option[0] is the action, whatever the Python version
        return list(found.values())


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``hcclpy`` command, with every subcommand registered."""
    parser = _Parser(
        prog="hcclpy",
        description="hcclpy: a Python binding for Huawei HCCL and AscendCL, with a CPU simulator of the same C ABI.",
    )
    parser.add_argument("--version", action="version", version=f"hcclpy {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for command in _COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``hcclpy`` command line and return its exit status.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after the program name; ``sys.argv[1:]`` when omitted.

    Returns
    -------
    int
        The exit status: 0 on success; what each subcommand documents otherwise (2 for a usage
        error, as argparse does); 141 when the reader of the output went away before it was all
        written (``hcclpy info | head -1``), which is not reported otherwise.

    Examples
    --------
    >>> from hcclpy.cli import main
    >>> main(["info", "--json"])  # doctest: +SKIP
    0
    """
    try:
        try:
            status = _run(sys.argv[1:] if argv is None else list(argv))
        except SystemExit:  # --help, --version and usage errors: their output goes out now too
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here rather than at exit, where a reader gone would print a traceback
        return status
    except BrokenPipeError:
        # The reader left (| head): Python's recipe is to send what is still buffered to /dev/null,
        # which the flush at exit then writes without a complaint.
        _output.to_devnull(sys.stdout)
        return EXIT_BROKEN_PIPE


def _run(arguments: List[str]) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(arguments)
    if unknown:
        _unrecognized(_subparser(parser, getattr(args, "command", None)), unknown)
    args.argv = arguments  # for subcommands that relaunch themselves
    return int(args.handler(args))


def _subparser(parser: argparse.ArgumentParser, command: Optional[str]) -> argparse.ArgumentParser:
    """The parser of subcommand ``command``, or ``parser`` itself when there is none."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            found: argparse.ArgumentParser = action.choices[command]
            return found
    return parser


def suggest(parser: argparse.ArgumentParser, option: str) -> Optional[str]:
    """The option of ``parser`` nearest to ``option`` (difflib), by its documented spelling (the
    first long one: ``--nproc-per-node`` for ``--nproc_per_node``); None when none is near.
    Options hidden from the help are never suggested.

    Examples
    --------
    >>> suggest(_subparser(build_parser(), "run"), "--nproc_per_nodes")
    '--nproc-per-node'
    >>> suggest(_subparser(build_parser(), "run"), "--master-adress=h")
    '--master-addr'
    """
    spellings: Dict[str, str] = {}
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        longs = [name for name in action.option_strings if name.startswith("--")]
        documented = next((name for name in longs if "_" not in name), longs[0] if longs else action.option_strings[0])
        for name in action.option_strings:
            spellings[name] = documented
    name = option.split("=", 1)[0]
    near = difflib.get_close_matches(name, list(spellings), n=1, cutoff=0.6)
    if not near:  # a different separator or case: --Master_Port
        key = name.lower().replace("_", "-")
        near = [spelling for spelling in spellings if spelling.lower().replace("_", "-") == key][:1]
    return spellings[near[0]] if near else None


def _unrecognized(parser: argparse.ArgumentParser, unknown: List[str]) -> NoReturn:
    """A usage error for the arguments ``parser`` does not know, suggesting the option meant."""
    message = f"unrecognized arguments: {' '.join(unknown)}"
    for option in unknown:
        if option.startswith("-") and option != "-":
            near = suggest(parser, option)
            if near is not None:
                message = f"unrecognized option {option.split('=', 1)[0]}; did you mean {near}?"
                break
    parser.error(message)
