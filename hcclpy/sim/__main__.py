"""``python -m hcclpy.sim [build|path|env]``: the same as ``hcclpy sim`` (:mod:`hcclpy.cli.sim`),
for scripts that reach the simulator through the package rather than the ``hcclpy`` command."""

from __future__ import annotations

import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hcclpy sim`` with ``argv`` and return the exit status.

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
    from ..cli import main as cli_main  # the command line sits above the simulator package

    return cli_main(["sim", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
