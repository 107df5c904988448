"""``hcclpy sim build|path|env``: the simulator's install tree, built on demand.

``path`` (the default) prints the tree, building it first if needed; ``build`` does the same and
``--force`` rebuilds it; ``env`` prints ``export NAME='value'`` lines that point a POSIX shell (a C
compiler, a linker, a program) at the tree::

    eval "$(hcclpy sim env)"
    cc prog.c -I$ASCEND_HOME_PATH/include -L$ASCEND_HOME_PATH/lib64 -lhccl -lascendcl

The work is done by :mod:`hcclpy.sim`; this module only parses the arguments.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``hcclpy sim`` with ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    parser = subparsers.add_parser(
        "sim", help="build the CPU simulator, print its install tree or its shell environment",
        description="Build the hcclpy simulator (a CPU implementation of HCCL and AscendCL) and show where it "
        "is. Exit status 1 if it cannot be built.")
    parser.add_argument(
        "action", nargs="?", default="path", choices=("build", "path", "env"),
        help="build: build (if needed) and print the tree; path (default): print the tree, building it if "
        "needed; env: print 'export NAME=value' lines for a POSIX shell (use: eval \"$(hcclpy sim env)\")")
    parser.add_argument("--force", action="store_true", help="with build: rebuild even if the tree exists")
    parser.set_defaults(handler=run, parser=parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Carry out ``hcclpy sim``; return 0, or 1 when the simulator cannot be built (no compiler, a
    failed compile, a cache directory that cannot be written), with the reason on stderr."""
    from ..sim import SimulatorBuildError, build, env
    from ..sim._build import sh_quote

    if args.force and args.action != "build":
        args.parser.error("--force only goes with 'build'")
    try:
        if args.action == "env":
            print("".join(f"export {name}={sh_quote(value)}\n" for name, value in env().items()), end="")
        else:
            print(build(force=args.force))
    except BrokenPipeError:  # the reader of stdout left (| head): hcclpy.cli.main ends quietly
        raise
    except (SimulatorBuildError, OSError) as exc:
        # SimulatorBuildError says what failed, cache directory problems included; OSError is the
        # rest (a lock another build held too long, an unreadable source): a message, not a traceback.
        print(f"hcclpy sim: {exc}", file=sys.stderr)
        return 1
    return 0
