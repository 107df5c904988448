"""``python -m hcclpy``: the ``hcclpy`` command line (see :mod:`hcclpy.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
