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
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .. import __version__
from . import bench, info, run, sim, trace

__all__ = ["main"]

_COMMANDS = (info, run, sim, bench, trace)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``hcclpy`` command, with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="hcclpy",
        description="hcclpy: a Python binding for Huawei HCCL and AscendCL, with a CPU simulator of the same C ABI.",
    )
    parser.add_argument("--version", action="version", version=f"hcclpy {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
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
        error, as argparse does).

    Examples
    --------
    >>> from hcclpy.cli import main
    >>> main(["info", "--json"])  # doctest: +SKIP
    0
    """
    parser = build_parser()
    arguments = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(arguments)
    args.argv = arguments  # for subcommands that relaunch themselves
    return int(args.handler(args))
