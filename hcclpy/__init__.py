"""hcclpy: a Python binding for Huawei's HCCL and AscendCL, with a CPU simulator of the same C ABI.

The binding is pure Python on cffi in ABI mode. Importing :mod:`hcclpy` never loads a C library;
the libraries are found and opened on first use. :mod:`hcclpy.sim` builds the simulator, an
install tree laid out like CANN (``lib64/libhccl.so``, ``lib64/libascendcl.so``, ``include/``)
that runs HCCL programs on a CPU.
"""

__version__ = "0.1.0"
