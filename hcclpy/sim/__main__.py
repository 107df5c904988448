"""``python -m hcclpy.sim [build|path|env]``: build the simulator, print its tree or its environment."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ._build import SimulatorBuildError, build, env, sh_quote


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return the exit status.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after the program name; ``sys.argv[1:]`` when omitted.

    Returns
    -------
    int
        0 on success, 1 when the simulator could not be built.

    Examples
    --------
    >>> main(["path"])  # doctest: +SKIP
    /home/me/.cache/hcclpy/sim-0123456789abcdef
    0
    """
    parser = argparse.ArgumentParser(
        prog="python -m hcclpy.sim",
        description="Build the hcclpy simulator (a CPU implementation of HCCL and AscendCL) "
        "and show where it is.",
    )
    parser.add_argument(
        "command",
        nargs="?",
        default="path",
        choices=("build", "path", "env"),
        help="build: build (if needed) and print the install tree; path (default): print the "
        "tree, building it if needed; env: print 'export NAME=value' lines for a POSIX shell",
    )
    parser.add_argument("--force", action="store_true", help="with build: rebuild even if the tree exists")
    args = parser.parse_args(argv)
    if args.force and args.command != "build":
        parser.error("--force only goes with 'build'")
    try:
        if args.command == "env":
            for name, value in env().items():
                print(f"export {name}={sh_quote(value)}")
        else:
            print(build(force=args.force))
    except SimulatorBuildError as exc:
        print(f"hcclpy.sim: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
