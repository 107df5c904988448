"""The hcclpy simulator: a CPU implementation of the AscendCL runtime and HCCL C ABI.

Its C sources ship with the package and are compiled on first use, with the system C compiler,
into a cached directory laid out like a CANN install::

    <tree>/lib64/libascendcl.so   AscendCL runtime (aclrt*)
    <tree>/lib64/libacl_rt.so     the CANN 9.x name of the same library (a symlink)
    <tree>/lib64/libhccl.so       HCCL
    <tree>/include/               acl/*.h, hccl/*.h
    <tree>/set_env.sh             source it to point a shell at the tree

The cache is ``$HCCLPY_SIM_CACHE``, else ``$XDG_CACHE_HOME/hcclpy``, else ``~/.cache/hcclpy``.
Importing this module neither builds nor loads anything. From a shell: ``python -m hcclpy.sim
[build|path|env]``.
"""

from ._build import SimulatorBuildError, build, env, home

__all__ = ["SimulatorBuildError", "build", "env", "home"]
