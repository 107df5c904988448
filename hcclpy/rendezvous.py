"""A small TCP rendezvous: rank 0 hands the root info to every other rank.

Rank 0 serves; the others connect (retrying while rank 0 starts), present the job's token, their
rank and the world size, and receive the 4108-byte root info. The protocol is a fixed binary
framing with bounded sizes (no pickle, nothing executable crosses the network):

    request:  magic "HCCLPYRV" | version u16 | kind u16 | length u32 | payload
              HELLO payload: token (32 bytes) | rank u32 | world_size u32
    reply:    the same header; kind OK with the root info, or ERROR with a UTF-8 message
    then:     every second, WAITING with the ranks (u32 each) that have not joined yet, until
              READY (every rank has the root info) or ERROR (the rendezvous failed: why)

A rank creates its communicator only after READY, so that when a rank never comes, every rank
(rank 0 included) fails at the rendezvous naming exactly that rank, rather than some ranks waiting
in HCCL for a rank 0 that gave up on the rendezvous.

The server binds to the address it is given (``MASTER_ADDR``), not to every interface, with one
exception: a host name other than ``localhost`` that this host resolves to a loopback address (as
Debian's ``127.0.1.1 hostname`` line does) while the other nodes reach the host at its network
address; then it listens on every interface. It answers malformed or hostile input with an error
while staying up, and records the ranks it refuses (:attr:`RendezvousServer.refusals`), so that rank
0 can tell a rank it refused from one it never heard from. The job's token keeps everyone else out:
:mod:`hcclpy.bootstrap` gives the server a secret only the job's ranks can learn (``hcclpy._jobsecret``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
import struct
import threading
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple, Union

from . import _environment
from ._jobsecret import from_secret
from ._progress import Progress
from .errors import CommTimeoutError, HcclpyError

__all__ = ["Refusal", "RendezvousError", "RendezvousServer", "fetch_root_info", "free_port", "job_token",
           "listen_address"]

MAGIC = b"HCCLPYRV"
VERSION = 2
HELLO, OK, ERROR, WAITING, READY = 1, 2, 3, 4, 5
STATUS_PERIOD = 1.0  # seconds between two WAITING messages to a rank that has the root info
HEADER = struct.Struct("!8sHHI")
HELLO_BODY = struct.Struct("!32sII")
MAX_PAYLOAD = 64 * 1024
IO_TIMEOUT = 10.0
FAREWELL = 2.0  # seconds close() gives the served ranks' threads to send the rendezvous's end
MAX_REFUSALS = 16  # refusals a server keeps the details of: a flood of strays must not grow it without bound


class RendezvousError(HcclpyError):
    """The rendezvous refused this rank (wrong token, duplicate rank, wrong world size...)."""


def job_token(master_port: int, job_id: str = "") -> bytes:
    """A 32-byte token: ``HCCLPY_RENDEZVOUS_TOKEN``'s if set, else one derived from the rendezvous
    port and the launcher's job id (``LaunchInfo.job_id``), which separates jobs but is no secret:
    fit only where the exchange itself is private (``hcclpy.init(store_path=...)``'s file). The TCP
    rendezvous of :func:`hcclpy.init` never uses a derived token.

    The address is left out: nodes may spell rank 0's host differently (``localhost``,
    ``127.0.0.1``, a name, an address), and a client that reaches the server has the right one. The
    world size is checked separately, so a mismatch is reported as such.

    Examples
    --------
    >>> len(job_token(29500, "job-7"))
    32
    """
    secret = _environment.rendezvous_secret()
    if secret:
        return from_secret(secret)
    return hashlib.sha256(f"derived:{master_port}:{job_id}".encode()).digest()


class Refusal(NamedTuple):
    """A HELLO the server refused: the rank it claimed, the client's address, and why."""

    rank: int
    peer: str
    reason: str


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(size - got)
        if not chunk:
            raise ConnectionError("connection closed mid-message")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_message(sock: socket.socket) -> Tuple[int, bytes]:
    magic, version, kind, length = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if magic != MAGIC or version != VERSION:
        raise ValueError("not an hcclpy rendezvous message (bad magic or version)")
    if length > MAX_PAYLOAD:
        raise ValueError(f"message of {length} bytes exceeds the {MAX_PAYLOAD}-byte limit")
    return kind, _recv_exact(sock, length)


def _send_message(sock: socket.socket, kind: int, payload: bytes) -> None:
    sock.sendall(HEADER.pack(MAGIC, VERSION, kind, len(payload)) + payload)


def listen_address(host: str) -> Tuple[int, str]:
    """The socket family and address rank 0 listens on for ``MASTER_ADDR`` = ``host``: the address
    itself, or every interface for a name (not ``localhost``) this host resolves to a loopback
    address, which the other nodes would not reach."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        ipaddress.ip_address(host.split("%")[0])
        return family, host  # an address, as given
    except ValueError:
        pass
    if host.lower() == "localhost" or host.lower().startswith("localhost."):
        return family, host
    try:
        resolved = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return family, host  # bind() reports it
    family, _, _, _, address = resolved[0]
    if ipaddress.ip_address(address[0].split("%")[0]).is_loopback:
        return family, "::" if family == socket.AF_INET6 else "0.0.0.0"
    return family, host


class RendezvousServer:
    """Serves ``payload`` (the root info) to ``world_size - 1`` ranks on ``(host, port)``.

    Runs in a background thread from construction until every rank was served, :meth:`close` is
    called, or ``timeout`` seconds pass.

    Attributes
    ----------
    address
        The ``(host, port)`` it listens on.
    refusals
        The first :data:`MAX_REFUSALS` HELLOs it refused, as :class:`Refusal` (rank, client address,
        reason); ``refused`` counts them all. A refused client gives up (:func:`fetch_root_info`
        raises :class:`RendezvousError`).
    errors
        Connections that failed (a client that vanished or stalled, ``accept`` errors).

    ``ranks_per_node`` (a launcher that numbers the ranks node by node, ``ranks_per_node`` a node,
    as torchrun and ``hcclpy run`` do) lets its reports name the nodes the missing ranks are on.
    """

    def __init__(self, host: str, port: int, world_size: int, token: bytes, payload: bytes,
                 timeout: float = 300.0, *, ranks_per_node: int = 0) -> None:
        self._host = host
        self._timeout = timeout
        self._world_size = world_size
        self._ranks_per_node = ranks_per_node
        self._token = token
        self._payload = payload
        self._deadline = time.monotonic() + timeout
        self._served: Dict[int, str] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._followers: List[threading.Thread] = []  # the threads that tell served ranks the news
        self.errors: List[str] = []
        self.refusals: List[Refusal] = []  # the first MAX_REFUSALS, in order
        self.refused = 0  # how many HELLOs were refused in all
        family, bind_host = listen_address(host)
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((bind_host, port))
        except OSError as exc:
            self._sock.close()
            raise RendezvousError(f"rank 0 cannot listen on {host}:{port} for the rendezvous: {exc} (is MASTER_ADDR "
                                  "an address of this host, and the port free? HCCLPY_RENDEZVOUS_PORT chooses "
                                  "another)") from exc
        self._sock.listen(128)
        self._sock.settimeout(0.02)  # how soon close() is noticed
        self.address = self._sock.getsockname()[:2]
        self._thread = threading.Thread(target=self._serve, name="hcclpy-rendezvous", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while not self._done.is_set() and time.monotonic() < self._deadline:
                with self._lock:
                    if len(self._served) >= self._world_size - 1:
                        break
                try:
                    conn, peer = self._sock.accept()
                except socket.timeout:
                    continue
                except OSError as exc:
                    if self._done.is_set():
                        break
                    # Out of descriptors (a connection flood, say): keep serving once they free up.
                    self.errors.append(f"accept: {exc}")
                    time.sleep(0.05)
                    continue
                threading.Thread(target=self._handle, args=(conn, peer), daemon=True).start()
        finally:
            self._sock.close()
            self._done.set()

    def _handle(self, conn: socket.socket, peer: Tuple[str, int]) -> None:
        conn.settimeout(IO_TIMEOUT)
        try:
            with conn:
                try:
                    kind, body = _read_message(conn)
                    reply_kind, reply = self._answer(kind, body, peer)
                except (ValueError, struct.error) as exc:
                    reply_kind, reply = ERROR, f"malformed request: {exc}".encode()
                _send_message(conn, reply_kind, reply)
                if reply_kind == OK:
                    with self._lock:
                        self._followers.append(threading.current_thread())
                    self._follow(conn)
        except (OSError, ConnectionError) as exc:  # a client that vanished or stalled
            self.errors.append(f"{peer}: {exc}")

    def _follow(self, conn: socket.socket) -> None:
        """Tell a served rank, every second, which ranks it waits for, then how the rendezvous ended."""
        while not self._done.wait(STATUS_PERIOD):
            _send_message(conn, WAITING, b"".join(struct.pack("!I", r) for r in self.missing()))
        missing = self.missing()
        if missing:
            _send_message(conn, ERROR, self.incomplete(missing).encode())
        else:
            _send_message(conn, READY, b"")

    def _answer(self, kind: int, body: bytes, peer: Tuple[str, int]) -> Tuple[int, bytes]:
        if kind != HELLO or len(body) != HELLO_BODY.size:
            return ERROR, b"expected a HELLO message"
        token, rank, world_size = HELLO_BODY.unpack(body)
        with self._lock:
            reason = self._refusal(token, rank, world_size)
            if reason is None:
                self._served[rank] = peer[0]
                return OK, self._payload
            # Kept for rank 0's error: the client gives up, so the rank will be missing.
            self.refused += 1
            if len(self.refusals) < MAX_REFUSALS:
                self.refusals.append(Refusal(rank, peer[0], reason))
        return ERROR, reason.encode()

    def _refusal(self, token: bytes, rank: int, world_size: int) -> Optional[str]:
        """Why a HELLO is refused, or None to serve it (called with the lock held)."""
        if not hmac.compare_digest(token, self._token):
            return ("wrong job token: HCCLPY_RENDEZVOUS_TOKEN differs from rank 0's (or is set on one side only), "
                    "or this rank is not of rank 0's job (another job, or another user, on this port)")
        if world_size != self._world_size:
            return f"world size mismatch: rank 0 has {self._world_size}, this rank says {world_size}"
        if not 0 < rank < self._world_size:
            return f"rank {rank} is not in [1, {self._world_size})"
        if rank in self._served:
            return f"rank {rank} already joined (from {self._served[rank]}): duplicate RANK?"
        return None

    def wait(self, timeout: Optional[float] = None) -> List[int]:
        """Wait until every rank was served, the server's timeout passed or :meth:`close` was
        called, or at most ``timeout`` seconds; return the ranks not served yet (empty: all were)."""
        left = max(0.0, self._deadline - time.monotonic()) + 1.0
        self._done.wait(left if timeout is None else min(left, timeout))
        return self.missing()

    def missing(self) -> List[int]:
        """The ranks not served yet."""
        with self._lock:
            return [r for r in range(1, self._world_size) if r not in self._served]

    def incomplete(self, missing: List[int]) -> str:
        """What went wrong for a rendezvous that ``missing`` ranks did not join: those it never heard
        from, and those it refused (which gave up), with the reasons. Rank 0 raises it, and the
        ranks it served receive it."""
        where = f"{self._host}:{self.address[1]}"
        if time.monotonic() < self._deadline:
            return f"rank 0 closed the rendezvous on {where} (it failed or was stopped) before rank(s) {missing} joined"
        refused = {refusal.rank for refusal in self.refusals}
        silent = [rank for rank in missing if rank not in refused]
        if silent:
            text = f"rank(s) {silent} did not reach the rendezvous on {where} within {self._timeout:g} s"
            text += "".join(f"; {node}" for node in self._nodes(silent))
        else:
            text = f"rank(s) {missing} did not join the rendezvous on {where} within {self._timeout:g} s"
        # The ranks of a node refused for one reason (a wrong token, say) are said once.
        alike: Dict[Tuple[str, str], List[int]] = {}
        for refusal in self.refusals:
            alike.setdefault((refusal.peer, refusal.reason), []).append(refusal.rank)
        for (peer, reason), ranks in alike.items():
            ranks = sorted(set(ranks))
            who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
            text += f"; it refused {who} (from {peer}): {reason}"
        if self.refused > len(self.refusals):
            text += f"; it refused {self.refused - len(self.refusals)} more"
        return text

    def _nodes(self, silent: List[int]) -> List[str]:
        """What the nodes of ``silent`` ranks (never heard from) miss, when the launcher numbers
        the ranks node by node: a node none of whose ranks came is named with the launcher's
        option that starts it."""
        per_node = self._ranks_per_node
        if per_node <= 0 or self._world_size % per_node or self._world_size == per_node:
            return []
        nodes = self._world_size // per_node
        said = []
        for node in sorted({rank // per_node for rank in silent}):
            first, last = node * per_node, (node + 1) * per_node - 1
            own = f"ranks {first}-{last}" if last > first else f"rank {first}"
            absent = [rank for rank in silent if first <= rank <= last]
            if len(absent) == per_node:
                said.append(f"node {node} of {nodes} ({own}) never joined: is its launcher running, with "
                            f"--node-rank {node}, --nnodes {nodes} and the same --master-addr and --master-port?")
            else:
                said.append(f"node {node} of {nodes} ({own}) lacks rank(s) {absent}")
        return said

    @property
    def finished(self) -> bool:
        """True once every rank was served (or the server stopped); False otherwise."""
        return self._done.is_set()

    def close(self) -> None:
        """Stop serving, once the ranks served were told how the rendezvous ended (for at most
        :data:`FAREWELL` seconds): a rank 0 that gives up and exits has told them why, rather than
        leaving them a connection that went away."""
        self._done.set()
        end = time.monotonic() + FAREWELL
        self._thread.join(timeout=FAREWELL)
        with self._lock:
            followers = list(self._followers)
        for follower in followers:
            follower.join(timeout=max(0.0, end - time.monotonic()))


def fetch_root_info(host: str, port: int, rank: int, world_size: int,
                    token: Union[bytes, Callable[[], Optional[bytes]]], timeout: float, *,
                    until_ready: bool = True) -> bytes:
    """Ask rank 0's rendezvous for the root info, retrying until ``timeout`` seconds have passed,
    then (``until_ready``) wait until every rank has it; say every few seconds what this rank
    waits for.

    ``token`` is the job's token, or a function that reads it once rank 0 is reached (None: not
    published yet, try again), for a secret rank 0 publishes before it listens.

    Raises
    ------
    CommTimeoutError
        If rank 0 could not be reached in time, or another rank did not join the rendezvous (its
        text is rank 0's, naming that rank).
    RendezvousError
        If rank 0 refused this rank.
    """
    deadline = time.monotonic() + timeout
    progress = Progress(timeout)
    delay, last_error = 0.01, None
    while True:
        try:
            left = max(0.05, deadline - time.monotonic())
            sock = socket.create_connection((host, port), timeout=min(IO_TIMEOUT, left))
        except OSError as exc:
            last_error = exc
        else:
            with sock:
                try:
                    sock.settimeout(min(IO_TIMEOUT, left))
                    secret = token if isinstance(token, bytes) else token()
                    if secret is None:
                        raise ConnectionError("rank 0 listens but has not published the job's secret")
                    _send_message(sock, HELLO, HELLO_BODY.pack(secret, rank, world_size))
                    kind, body = _read_message(sock)
                except (OSError, ConnectionError, ValueError) as exc:
                    last_error = exc
                else:
                    if kind != OK:
                        raise RendezvousError(f"rank 0's rendezvous at {host}:{port} refused rank {rank}: "
                                              + body.decode("utf-8", "replace"))
                    if until_ready:
                        _until_ready(sock, host, port, rank, deadline, progress)
                    return body
        if time.monotonic() + delay > deadline:
            raise CommTimeoutError(f"could not reach rank 0's rendezvous at {host}:{port} within {timeout:g} s "
                                   f"(last error: {last_error}); check MASTER_ADDR/MASTER_PORT (or "
                                   "HCCLPY_RENDEZVOUS_PORT) and that rank 0 started")
        progress.tick(lambda: f"rank {rank} is waiting for rank 0's rendezvous at {host}:{port} ({last_error})")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _until_ready(sock: socket.socket, host: str, port: int, rank: int, deadline: float, progress: Progress) -> None:
    """Follow rank 0's news until every rank has the root info."""
    missing: List[int] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CommTimeoutError(f"rank {rank} has the root info, but rank(s) {missing} had not joined the "
                                   f"rendezvous at {host}:{port} when its timeout ran out")
        sock.settimeout(min(IO_TIMEOUT, left))
        try:
            kind, body = _read_message(sock)
        except socket.timeout:
            continue
        except (OSError, ConnectionError, ValueError) as exc:
            raise CommTimeoutError(f"rank 0's rendezvous at {host}:{port} went away while rank {rank} waited for "
                                   f"the other ranks ({exc}): rank 0 failed or was stopped") from None
        if kind == READY:
            return
        if kind == ERROR:
            raise CommTimeoutError(body.decode("utf-8", "replace"))
        missing = [rank for (rank,) in struct.iter_unpack("!I", body)] if kind == WAITING else missing
        progress.tick(lambda: f"rank {rank} is waiting for rank(s) {', '.join(map(str, missing))} to join the "
                              f"rendezvous at {host}:{port}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listened on at ``host`` a moment ago (the kernel's pick); where ``host``
    is not an address of this machine, a port free on every interface."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, 0))
        except OSError:  # not an address of this machine: any interface will do
            sock.bind(("", 0))
        return int(sock.getsockname()[1])

