"""Measuring HCCL operations the way nccl-tests and hccl_test do (``hcclpy bench``).

:mod:`.cases` holds what each operation moves and how it is checked, :mod:`.measure` the timing
loop, :mod:`.report` the table, JSON, CSV and plot. The command line is :mod:`hcclpy.cli.bench`.
"""
