"""``hcclpy.init()``: the world communicator from the launcher's environment.

Rank, world size and local rank come from the arguments, else from the first launcher whose
variables are set: torchrun / ``hcclpy run`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), Slurm
(``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``), Open MPI (``OMPI_COMM_WORLD_*``) and
MPICH/PMI (``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``). Without any, the process is rank 0 of 1,
and the local rank (the device) is the rank, whether given or not.

The root info travels, in order of preference: through a rank table (``rank_table=`` or
``RANK_TABLE_FILE``, no exchange at all), through ``mpi_comm`` (mpi4py), through a shared file
(``store_path=``), or through the TCP rendezvous rank 0 hosts on ``MASTER_ADDR:MASTER_PORT``.

The rendezvous port: ``HCCLPY_RENDEZVOUS_PORT`` when set; else ``MASTER_PORT``, except under
torchrun, whose agent already serves its own store there (``TORCHELASTIC_USE_AGENT_STORE=True``):
then rank 0 listens on any free port and publishes it in that store (``master_port`` is 0); else,
for launchers that set no port (Slurm, MPI), one derived from the job id; else 29500.

The rendezvous admits only ranks that present the job's secret, which no other user can learn
(``HCCLPY_RENDEZVOUS_TOKEN``, torchrun's store, or a private file for a job on one host: see
``hcclpy._jobsecret``); a job across hosts with none of these is refused before anything starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import ipaddress
import itertools
import json
import math
import numbers
import os
import tempfile
import threading
import time
import zlib
from typing import Any, Callable, List, Mapping, Optional, Tuple, Union

from . import _environment, _jobsecret
from ._launchers import LAUNCHERS
from ._progress import Progress
from .communicator import Communicator, _named, _rank_table_path
from .config import CommConfig
from .errors import CommTimeoutError
from .rendezvous import RendezvousServer, fetch_root_info, job_token
from .rootinfo import ROOT_INFO_BYTES, RootInfo
from .runtime import Device, device_count
from .runtime._device import DeviceLike

__all__ = ["LaunchInfo", "detect_launch", "first_host", "init", "shutdown", "world"]

DEFAULT_PORT = 29500


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the job, as read from the launcher's environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str
    job_id: str = ""  # what tells this job's ranks from another job's on the same hosts
    single_host: bool = True  # False when the launcher says (or may mean) that ranks run on several hosts


def _int_env(env: Mapping[str, str], name: str) -> Optional[int]:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _port_env(env: Mapping[str, str], name: str) -> Optional[int]:
    port = _int_env(env, name)
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"environment variable {name}={port} is not a TCP port (1..65535)")
    return port


def _port(env: Mapping[str, str], job_id: str) -> int:
    explicit = _port_env(env, "HCCLPY_RENDEZVOUS_PORT")
    if explicit is not None:
        return explicit
    master = _port_env(env, "MASTER_PORT")
    if master is not None:
        if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # torchrun's agent serves its own store on MASTER_PORT: rank 0 listens on any free
            # port and tells the others through that store.
            return 0
        return master
    # Launchers without a rendezvous port: every rank derives the same one from the job id.
    return DEFAULT_PORT + 1 + zlib.crc32(job_id.encode()) % 20000 if job_id else DEFAULT_PORT


def _single_host(env: Mapping[str, str], launcher: str, size: int, local_size: Optional[int]) -> bool:
    """Whether every rank of the job runs on this host, as far as the launcher tells."""
    if launcher == "slurm":
        nodes = _int_env(env, "SLURM_STEP_NUM_NODES") or _int_env(env, "SLURM_JOB_NUM_NODES") or _int_env(env, "SLURM_NNODES")
        if nodes is not None:
            return nodes == 1
    if local_size is not None:
        return local_size >= size
    # No local size: a rendezvous on a loopback address can only be reached from this host.
    return _loopback(env.get("MASTER_ADDR") or "127.0.0.1")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def _hydra_proxy_pid() -> Optional[int]:
    """The pid of MPICH's ``hydra_pmi_proxy`` this process descends from (through wrapper scripts
    too), or None. All ranks of a job on one node share it, and other jobs have their own."""
    pid = os.getppid()
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            return None
        name, after = stat[stat.index(b"(") + 1: stat.rindex(b")")], stat[stat.rindex(b")") + 2:].split()
        if name == b"hydra_pmi_proxy":
            return pid
        pid = int(after[1])  # the parent: the field after the state
        if pid <= 1:
            return None
    return None


def _job_id(env: Mapping[str, str], launcher: str, job_var: str, size: int, local_size: Optional[int]) -> str:
    """What separates this job from others the launcher runs on the same hosts at the same time."""
    job_id = env.get(job_var, "") if job_var else ""
    if launcher == "slurm" and job_id and env.get("SLURM_STEP_ID"):
        job_id += "." + env["SLURM_STEP_ID"]  # the steps of one allocation share the job id
    if launcher == "pmi" and not job_id and local_size in (None, size):
        # MPICH's mpiexec (Hydra) names no job: on one node, its proxy process stands for the job.
        proxy = _hydra_proxy_pid()
        job_id = f"hydra-proxy-{proxy}" if proxy is not None else ""
    return job_id


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``"gpu[003-008,011],cpu1"`` gives ``"gpu003"``."""
    first, depth = "", 0
    for char in nodelist:
        if char == "," and depth == 0:
            break
        depth += char == "["
        depth -= char == "]"
        first += char
    if "[" not in first:
        return first
    prefix, rest = first.split("[", 1)
    ranges, suffix = rest.split("]", 1)
    return prefix + ranges.split(",")[0].split("-")[0] + suffix


def detect_launch(env: Optional[Mapping[str, str]] = None) -> LaunchInfo:
    """Read rank, sizes and rendezvous address from the environment (see the module docstring)."""
    env = _environment.variables() if env is None else env
    partial = None  # a launcher's rank without its size, or the reverse
    for launcher, rank_var, size_var, local_var, local_size_var, job_var in LAUNCHERS:
        rank, size = _int_env(env, rank_var), _int_env(env, size_var)
        if rank is None or size is None:
            # A Slurm batch script outside any step may have SLURM_PROCID alone.
            if (rank, size) != (None, None) and launcher != "slurm" and partial is None:
                partial = (rank_var, size_var) if size is None else (size_var, rank_var)
            continue
        local = _int_env(env, local_var)
        if local is not None and local < 0:
            raise ValueError(f"environment variable {local_var}={local} must be >= 0: it is the process's place "
                             "among the job's processes on its node")
        local_size = _int_env(env, local_size_var) if local_size_var else None
        job_id = _job_id(env, launcher, job_var, size, local_size)
        if launcher == "slurm":
            # Rank 0 runs on the first node of the allocation (the launch node may be a login node).
            nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            master = (env.get("MASTER_ADDR") or (first_host(nodelist) if nodelist else None)
                      or env.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1")
        else:
            master = env.get("MASTER_ADDR") or "127.0.0.1"
        return LaunchInfo(rank, size, rank if local is None else local, size if local_size is None else local_size,
                          master, _port(env, job_id), launcher, job_id, _single_host(env, launcher, size, local_size))
    if partial is not None:  # each process would run alone: wrong results, and no error
        present, missing = partial
        raise ValueError(f"environment variable {present}={env[present]!r} is set but {missing} is not; a launcher "
                         f"sets both (unset {present} to run as rank 0 of 1)")
    return LaunchInfo(0, 1, 0, 1, env.get("MASTER_ADDR") or "127.0.0.1", _port(env, ""), "none")


_lock = threading.Lock()
_world: Optional[Communicator] = None


def world() -> Optional[Communicator]:
    """The communicator :func:`init` created, or None."""
    return _world


_FILE_MAGIC = b"HCCLPYRF"
_STARTED = time.time()  # files older than this process (with some slack) come from an earlier job
_STALE_SLACK = 60.0


def _exchange_by_file(path: str, rank: int, device: Device, timeout: float, token: bytes) -> RootInfo:
    if rank == 0:
        info = RootInfo.generate(device)
        directory = os.path.dirname(os.path.abspath(path)) or "."
        with tempfile.NamedTemporaryFile(dir=directory, delete=False) as handle:
            handle.write(_FILE_MAGIC + token + info.to_bytes())
        os.replace(handle.name, path)  # readers never see a partial file
        return info
    deadline = time.monotonic() + timeout
    header = _FILE_MAGIC + token
    while True:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
                fresh = os.fstat(handle.fileno()).st_mtime >= _STARTED - _STALE_SLACK
            # A file another job left behind (other token, or older than this process) is ignored.
            if fresh and len(data) == len(header) + ROOT_INFO_BYTES and data.startswith(header):
                return RootInfo(data[len(header):])
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise CommTimeoutError(f"rank 0 did not write the root info to {path} within {timeout:g} s")
        time.sleep(0.01)


def init(rank: Optional[int] = None, world_size: Optional[int] = None, device: Optional[DeviceLike] = None,
         config: Union[CommConfig, Mapping[str, Any], None] = None, timeout: float = 300.0, *,
         rank_table: Optional[Union[str, "os.PathLike[str]"]] = None, mpi_comm: Any = None,
         store_path: Optional[Union[str, "os.PathLike[str]"]] = None) -> Communicator:
    """Create the world communicator for this process and return it.

    Parameters
    ----------
    rank, world_size
        Default: from the launcher's environment (torchrun, Slurm, Open MPI, MPICH), else 0 and 1.
    device
        Default: the local rank (a logical id, so ``ASCEND_RT_VISIBLE_DEVICES`` applies); with no
        launcher, the rank (``init(rank=r, world_size=n)`` in n processes of one host uses devices
        0 to n - 1).
    config
        :class:`CommConfig` or dict for the communicator.
    timeout
        Seconds to wait for the root info to reach every rank (rank 0 starting, the other ranks
        joining its rendezvous or reading ``store_path``); rank 0 waits at most
        ``HCCL_CONNECT_TIMEOUT`` too, after which HCCL gives up on a root info nobody joined.
        Forming the communicator afterwards is bounded by ``HCCL_CONNECT_TIMEOUT``.
    rank_table
        Path of a rank-table file; default ``RANK_TABLE_FILE`` when it names an existing file and
        the job has more than one rank (its rank count must be the world size).
    mpi_comm
        An mpi4py communicator to broadcast the root info over; ``rank`` and ``world_size``
        default to its own.
    store_path
        A file all ranks can see, to pass the root info through instead of TCP.

    Raises
    ------
    ValueError
        For an inconsistent rank, world size or device.
    FileNotFoundError, TypeError
        For a ``rank_table`` that does not exist, a ``store_path`` in a directory that does not, or an
        ``mpi_comm`` that is not an mpi4py communicator (before anything is created).
    CommTimeoutError
        If the rendezvous did not complete in time.

    Examples
    --------
    >>> comm = hcclpy.init()            # under torchrun, srun, mpirun or hcclpy run
    >>> comm.all_reduce(x)
    """
    global _world
    # Every argument is checked before anything is exchanged or created.
    config = _named(CommConfig.coerce(config), "world")
    launch = detect_launch()
    if mpi_comm is not None:
        rank, world_size = _ranks_of(mpi_comm, rank, world_size)
    sized_by_caller = world_size is not None or launch.launcher != "none"
    rank = launch.rank if rank is None else rank
    world_size = launch.world_size if world_size is None else world_size
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an int >= 1")
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} must be an int in [0, {world_size})")
    rank, world_size = int(rank), int(world_size)  # NumPy integers too
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 < timeout < math.inf:
        raise ValueError(f"timeout={timeout!r} must be a positive, finite number of seconds")
    timeout = float(timeout)
    if rank_table is not None:
        rank_table = _rank_table_path(rank_table, "rank_table")
    if store_path is not None:
        store_path = _store_path(store_path)
    # RANK_TABLE_FILE describes the cluster's jobs, and is often exported on CANN hosts: a process
    # that runs alone does not wait for a table's other ranks. rank_table= is always used.
    table = rank_table or _environment.rank_table_file()
    use_table = bool(rank_table) or bool(table and world_size > 1 and os.path.isfile(table))
    if use_table and sized_by_caller:
        listed = _rank_table_size(table)
        if listed is not None and listed != world_size:
            raise ValueError(f"the rank table {table} lists {listed} ranks but world_size is {world_size}")
    if device is None:
        # No launcher says where the ranks run: as LOCAL_RANK defaults to the rank, so does the device
        # (else every rank numbered by the caller would share device 0).
        no_launcher = launch.launcher == "none"
        local_rank = rank if no_launcher else launch.local_rank
        count = device_count()
        if not 0 <= local_rank < count:
            raise ValueError(f"local rank {local_rank}{' (the rank: no launcher sets one)' if no_launcher else ''} "
                             f"has no device: {count} visible (set device=, or ASCEND_RT_VISIBLE_DEVICES / "
                             "HCCLPY_SIM_DEVICES)")
        device = local_rank
    dev = Device(device)
    with _lock:
        if _world is not None and not _world.destroyed:
            raise RuntimeError("hcclpy.init() was already called in this process; call hcclpy.shutdown() first")
        if use_table:
            comm = Communicator.from_rank_table(table, rank, config=config, device=dev)
        elif world_size == 1:
            comm = Communicator(1, RootInfo.generate(dev), 0, config=config, device=dev)
        elif mpi_comm is not None:
            payload = RootInfo.generate(dev).to_bytes() if rank == 0 else None
            comm = Communicator(world_size, RootInfo(mpi_comm.bcast(payload, root=0)), rank, config=config, device=dev)
        elif store_path is not None:
            info = _exchange_by_file(store_path, rank, dev, timeout, job_token(launch.master_port, launch.job_id))
            try:
                comm = Communicator(world_size, info, rank, config=config, device=dev)
            finally:
                if rank == 0:  # every rank has joined, or the job failed: no later run may read it
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(store_path)
        else:
            comm = _init_tcp(launch, rank, world_size, dev, config, timeout)
        _world = comm
        return comm


def _store_path(path: Any) -> str:
    """``store_path`` checked: a path (str, bytes or os.PathLike) to a file in a directory that exists."""
    if not isinstance(path, (str, bytes)) and not hasattr(path, "__fspath__"):
        raise TypeError(f"store_path must be a path to a file (str or os.PathLike), got {type(path).__name__}")
    text = os.fsdecode(os.fspath(path))
    if not text or "\0" in text:
        raise ValueError(f"store_path={text!r} must be a non-empty path with no NUL byte")
    if not os.path.isdir(os.path.dirname(os.path.abspath(text))):
        raise FileNotFoundError(f"store_path={text!r}: its directory does not exist")
    if os.path.isdir(text):
        raise IsADirectoryError(f"store_path={text!r} is a directory; name a file in it")
    return text


def _ranks_of(mpi_comm: Any, rank: Optional[int], world_size: Optional[int]) -> Any:
    """``rank`` and ``world_size`` for an mpi4py communicator: its own when not given; given ones
    must agree with it (a sub-communicator's ranks are not the launcher's)."""
    if not all(callable(getattr(mpi_comm, name, None)) for name in ("bcast", "Get_rank", "Get_size")):
        raise TypeError(f"mpi_comm must be an mpi4py communicator (such as MPI.COMM_WORLD), got "
                        f"{type(mpi_comm).__name__}")
    own_rank, own_size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    if (rank is not None and rank != own_rank) or (world_size is not None and world_size != own_size):
        raise ValueError(f"rank={rank} and world_size={world_size} differ from mpi_comm's rank {own_rank} of "
                         f"{own_size}: leave them out to use mpi_comm's")
    return own_rank, own_size


def _rank_table_size(path: str) -> Optional[int]:
    """How many ranks a rank table lists (the devices of its ``server_list``); None when it cannot
    tell (HCCL then reads the table itself and says what is wrong with it)."""
    try:
        with open(path, encoding="utf-8") as handle:
            table = json.load(handle)
        return sum(len(server["device"]) for server in table["server_list"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _init_tcp(launch: LaunchInfo, rank: int, world_size: int, dev: Device, config: Any, timeout: float) -> Communicator:
    """The root info through rank 0's TCP rendezvous, with a secret only the job's ranks learn
    (``hcclpy._jobsecret``): the user's, else one passed through torchrun's store, else one in a
    file of this user's for a job on one host."""
    env = _environment.variables()
    if launch.launcher == "torchrun" and not (env.get("MASTER_PORT") or env.get("HCCLPY_RENDEZVOUS_PORT")):
        raise ValueError(f"RANK={rank} and WORLD_SIZE={world_size} are set but MASTER_PORT is not, so the ranks "
                         f"cannot meet: start the script with a launcher (hcclpy run -n {world_size} script.py, "
                         "torchrun), or set MASTER_ADDR and MASTER_PORT (rank 0's host and a free port) for every rank")
    secret = _environment.rendezvous_secret()
    store = _torchrun_store(env, timeout)
    if not secret and store is None and not launch.single_host:
        raise ValueError("this job's ranks run on several hosts and no secret reaches them all: set "
                         "HCCLPY_RENDEZVOUS_TOKEN to the same random value on every rank (for example export "
                         "HCCLPY_RENDEZVOUS_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))') in "
                         "the job script, before srun or mpirun), or pass mpi_comm=, or use torchrun")
    host, port = launch.master_addr, launch.master_port
    if store is not None:
        key = f"hcclpy/rendezvous/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_rendezvous_number)}"
    else:
        key = f"{port}:{launch.job_id}:{world_size}"
    if rank == 0:
        info = RootInfo.generate(dev)
        token = _jobsecret.from_secret(secret) if secret else _jobsecret.new_token()
        # Published before rank 0 listens: a rank that reaches it reads this job's secret, not an earlier one's.
        published = _jobsecret.publish(key, token) if not secret and store is None else None
        # HCCL gives up on a root info nobody joins within HCCL_CONNECT_TIMEOUT: waiting longer for
        # the ranks to fetch it would only end in that error.
        limit = min(timeout, _environment.connect_timeout())
        try:
            server = RendezvousServer(host, port, world_size, token, info.to_bytes(), limit,
                                      ranks_per_node=_ranks_per_node(env, launch, world_size))
            try:
                if store is not None:
                    store.set(key, f"{server.address[1]} {token.hex()}")
                missing = _wait_for_ranks(server, f"{host}:{server.address[1]}", limit)
                if missing:
                    raise CommTimeoutError(server.incomplete(missing))
                return Communicator(world_size, info, 0, config=config, device=dev)
            finally:
                server.close()
                if store is not None:
                    store.delete_key(key)
        finally:
            if published is not None:
                _jobsecret.withdraw(published)
    token_or_reader: Union[bytes, Callable[[], Optional[bytes]]]
    if store is not None:
        port, published_token = _read_store(store, key, rank, timeout)
        token_or_reader = _jobsecret.from_secret(secret) if secret else published_token
    elif secret:
        token_or_reader = _jobsecret.from_secret(secret)
    else:
        token_or_reader = lambda: _jobsecret.read(key)  # noqa: E731 - read once rank 0 is reached
    payload = fetch_root_info(host, port, rank, world_size, token_or_reader, timeout)
    return Communicator(world_size, RootInfo(payload), rank, config=config, device=dev)


def _ranks_per_node(env: Mapping[str, str], launch: LaunchInfo, world_size: int) -> int:
    """The ranks of a node when the launcher numbers them node by node, each node's ``LOCAL_WORLD_SIZE``
    ranks after the previous node's (torchrun, ``hcclpy run`` with ``GROUP_WORLD_SIZE`` nodes), so that
    a rendezvous a node never joins names it; else 0."""
    nodes = _int_env(env, "GROUP_WORLD_SIZE")
    if launch.launcher != "torchrun" or nodes is None or nodes < 2:
        return 0
    return launch.local_world_size if launch.local_world_size * nodes == world_size else 0


_rendezvous_number = itertools.count()  # this process's rendezvous through torchrun's store, for their keys


def _torchrun_store(env: Mapping[str, str], timeout: float) -> Any:
    """The store torchrun's agent serves to its workers on ``MASTER_ADDR:MASTER_PORT``
    (``TORCHELASTIC_USE_AGENT_STORE=True``), or None outside torchrun."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    try:
        from torch.distributed import TCPStore
    except ImportError as exc:
        raise RuntimeError("torchrun started this process (TORCHELASTIC_USE_AGENT_STORE=True) but torch cannot be "
                           f"imported ({exc}), and hcclpy.init() meets the other ranks through torchrun's store") from exc
    return TCPStore(env.get("MASTER_ADDR") or "127.0.0.1", int(env["MASTER_PORT"]), is_master=False,
                    timeout=datetime.timedelta(seconds=timeout))


def _read_store(store: Any, key: str, rank: int, timeout: float) -> Tuple[int, bytes]:
    """The port and token rank 0 published in torchrun's store under ``key``."""
    deadline = time.monotonic() + timeout
    progress = Progress(timeout)
    while True:
        try:
            store.wait([key], datetime.timedelta(seconds=max(0.01, min(1.0, deadline - time.monotonic()))))
            break
        except RuntimeError as exc:  # torch's DistStoreError: not there yet (or the store went away)
            if time.monotonic() >= deadline:
                raise CommTimeoutError(f"rank 0 did not publish its rendezvous in torchrun's store within "
                                       f"{timeout:g} s ({exc})") from None
            progress.tick(lambda: f"rank {rank} is waiting for rank 0 to publish its rendezvous in torchrun's store")
    port, token = store.get(key).decode().split()
    return int(port), bytes.fromhex(token)


def _wait_for_ranks(server: RendezvousServer, where: str, limit: float) -> List[int]:
    """Rank 0 waits for every rank to fetch the root info, saying every few seconds which have not;
    returns the ranks that never did."""
    progress = Progress(limit)
    missing = server.wait(1.0)
    while missing and not server.finished:
        progress.tick(lambda: f"rank 0 is waiting for rank(s) {', '.join(map(str, missing))} to join the "
                              f"rendezvous on {where}")
        missing = server.wait(1.0)
    return missing


def shutdown(timeout: Optional[float] = None) -> None:
    """Destroy the communicator :func:`init` created (if any). Idempotent.

    ``timeout`` is :meth:`Communicator.destroy`'s: seconds to wait at most for work still queued
    (a collective whose peer never came, say) before aborting it; None waits for it."""
    global _world
    with _lock:
        comm = _world
    if comm is not None and not comm.destroyed:
        comm.destroy(timeout=timeout)  # kept as the world while it raises (a bad timeout, Ctrl-C)
        comm._closed_by = "destroyed by hcclpy.shutdown()"  # what later calls on it then say
    with _lock:
        if _world is comm:
            _world = None
