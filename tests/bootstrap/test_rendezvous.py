"""The TCP rendezvous of ``hcclpy.init()``: refusals, timeouts, hostile input, binding, no pickle.

Everything runs in this process against a :class:`RendezvousServer` on a loopback port (the server
answers from its own threads), so these tests need no communicator and take a few seconds in all.
Each test bounds every wait: a client gets a short ``timeout``, and raw sockets get a socket timeout.
"""

from __future__ import annotations

import ast
import hashlib
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List, Sequence

import pytest

import hcclpy.bootstrap
import hcclpy.rendezvous as rv
from hcclpy.errors import CommTimeoutError, HcclpyError
from hcclpy.rendezvous import RendezvousError, RendezvousServer, fetch_root_info, free_port, job_token

pytestmark = pytest.mark.timeout(60)

HOST = "127.0.0.1"
TOKEN = hashlib.sha256(b"test token").digest()
PAYLOAD = bytes(range(256)) * 16 + b"rootinfo"  # 4104 bytes, any bytes go
SLACK = 1.5  # seconds a timeout may be overrun by scheduling on a loaded 2-core VM


@pytest.fixture
def servers() -> Iterator[List[RendezvousServer]]:
    """Servers a test starts; all closed at teardown."""
    started: List[RendezvousServer] = []
    yield started
    for server in started:
        server.close()


def serve(servers: List[RendezvousServer], world_size: int, *, host: str = HOST, token: bytes = TOKEN,
          payload: bytes = PAYLOAD, timeout: float = 30.0) -> RendezvousServer:
    server = RendezvousServer(host, 0, world_size, token, payload, timeout)
    servers.append(server)
    return server


def fetch(server: RendezvousServer, rank: int, world_size: int, *, token: bytes = TOKEN,
          timeout: float = 5.0) -> bytes:
    """One rank's root info, without waiting for the other ranks to fetch theirs."""
    host, port = server.address
    return fetch_root_info(host, port, rank, world_size, token, timeout, until_ready=False)


def raw(server: RendezvousServer, timeout: float = 5.0) -> socket.socket:
    """A plain TCP connection to the server, to send it anything."""
    return socket.create_connection(tuple(server.address), timeout=timeout)


def reply_of(sock: socket.socket) -> tuple:
    """The (kind, body) the server answers with (bounded by the socket's timeout)."""
    return rv._read_message(sock)


def hello(token: bytes = TOKEN, rank: int = 1, world_size: int = 2) -> bytes:
    body = rv.HELLO_BODY.pack(token, rank, world_size)
    return rv.HEADER.pack(rv.MAGIC, rv.VERSION, rv.HELLO, len(body)) + body


def wait_until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


# ------------------------------------------------------------------------------ happy paths

def test_every_rank_gets_the_payload_then_the_server_stops(servers: List[RendezvousServer]) -> None:
    server = serve(servers, 4)
    assert not server.finished
    got = [None] * 4

    def client(rank: int) -> None:
        got[rank] = fetch(server, rank, 4)

    threads = [threading.Thread(target=client, args=(r,), daemon=True) for r in (3, 1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert got[1:] == [PAYLOAD] * 3
    assert wait_until(lambda: server.finished), "the server kept running after every rank was served"


def test_client_retries_until_rank_0_starts() -> None:
    port = free_port(HOST)
    result: List[object] = []

    def client() -> None:
        try:
            result.append(fetch_root_info(HOST, port, 1, 2, TOKEN, 10.0))
        except Exception as exc:  # noqa: BLE001 - checked below
            result.append(exc)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    time.sleep(0.5)  # the client is knocking on a closed port meanwhile
    server = RendezvousServer(HOST, port, 2, TOKEN, PAYLOAD, 10.0)
    try:
        thread.join(10)
        assert result == [PAYLOAD]
    finally:
        server.close()


def test_payload_of_the_real_root_info_size(servers: List[RendezvousServer]) -> None:
    payload = os.urandom(hcclpy.bootstrap.ROOT_INFO_BYTES)
    server = serve(servers, 2, payload=payload)
    assert fetch(server, 1, 2) == payload


# ------------------------------------------------------------------------------- timeouts

def test_unreachable_master_times_out_within_the_timeout() -> None:
    port = free_port(HOST)  # nothing listens there
    start = time.monotonic()
    with pytest.raises(CommTimeoutError, match=rf"{HOST}:{port}") as info:
        fetch_root_info(HOST, port, 1, 2, TOKEN, 1.0)
    elapsed = time.monotonic() - start
    assert 0.3 <= elapsed <= 1.0 + SLACK, f"gave up after {elapsed:.2f} s for a 1 s timeout"
    assert isinstance(info.value, TimeoutError) and "MASTER_ADDR" in str(info.value)


def test_unroutable_master_times_out_within_the_timeout() -> None:
    # TEST-NET-3 (RFC 5737): never routed; connect() hangs or fails at once depending on the network.
    start = time.monotonic()
    with pytest.raises(CommTimeoutError):
        fetch_root_info("203.0.113.1", 9, 1, 2, TOKEN, 1.0)
    elapsed = time.monotonic() - start
    assert elapsed <= 1.0 + SLACK, f"gave up after {elapsed:.2f} s for a 1 s timeout"


def test_silent_master_times_out_within_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rv, "IO_TIMEOUT", 3.0)  # keeps the failing case short; the bug is the same at 10 s
    with socket.socket() as listener:  # the kernel completes the handshake; nobody ever answers
        listener.bind((HOST, 0))
        listener.listen(8)
        start = time.monotonic()
        with pytest.raises(CommTimeoutError):
            fetch_root_info(HOST, listener.getsockname()[1], 1, 2, TOKEN, 0.5)
        elapsed = time.monotonic() - start
    assert elapsed <= 0.5 + SLACK, f"gave up after {elapsed:.2f} s for a 0.5 s timeout"


def test_server_stops_at_its_timeout() -> None:
    server = RendezvousServer(HOST, 0, 2, TOKEN, PAYLOAD, 0.5)
    try:
        assert wait_until(lambda: server.finished, 5.0), "the server outlived its timeout"
        with pytest.raises(ConnectionRefusedError):
            raw(server).close()
    finally:
        server.close()


def test_close_stops_the_server() -> None:
    server = RendezvousServer(HOST, 0, 3, TOKEN, PAYLOAD, 30.0)
    start = time.monotonic()
    server.close()
    assert time.monotonic() - start < 2.5 and server.finished
    with pytest.raises(CommTimeoutError):
        fetch(server, 1, 3, timeout=0.5)


# ------------------------------------------------------------------------------ refusals

def test_wrong_token_is_refused(servers: List[RendezvousServer]) -> None:
    server = serve(servers, 2)
    with pytest.raises(RendezvousError, match="token") as info:
        fetch(server, 1, 2, token=hashlib.sha256(b"another job").digest())
    assert "refused rank 1" in str(info.value)
    assert isinstance(info.value, HcclpyError)
    assert fetch(server, 1, 2) == PAYLOAD  # a refusal does not use up the rank


def test_duplicate_rank_is_refused_on_the_second(servers: List[RendezvousServer]) -> None:
    server = serve(servers, 3)
    assert fetch(server, 1, 3) == PAYLOAD
    with pytest.raises(RendezvousError, match=r"rank 1 already joined.*duplicate"):
        fetch(server, 1, 3)
    assert fetch(server, 2, 3) == PAYLOAD


def test_wrong_world_size_names_both_sizes(servers: List[RendezvousServer]) -> None:
    server = serve(servers, 4)
    with pytest.raises(RendezvousError, match=r"world size mismatch: rank 0 has 4, this rank says 3"):
        fetch(server, 1, 3)
    with pytest.raises(RendezvousError, match=r"rank 0 has 4, this rank says 5"):
        fetch(server, 1, 5)


def test_wrong_world_size_names_both_sizes_with_derived_tokens(servers: List[RendezvousServer],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # What hcclpy.bootstrap._init_tcp does on each side when the launcher sets no secret.
    monkeypatch.delenv("HCCLPY_RENDEZVOUS_TOKEN", raising=False)
    port = free_port(HOST)
    server = RendezvousServer(HOST, port, 4, job_token(port), PAYLOAD, 30.0)
    servers.append(server)
    with pytest.raises(RendezvousError, match=r"rank 0 has 4, this rank says 3"):
        fetch_root_info(HOST, port, 1, 3, job_token(port), 5.0)


def test_refusals_are_recorded_for_rank_0(servers: List[RendezvousServer], monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank 0 reports a rank it refused as refused (and why), not as one that never came.
    server = serve(servers, 3)
    said = []
    for rank, world_size, token in ((1, 3, hashlib.sha256(b"another job").digest()), (2, 4, TOKEN), (5, 3, TOKEN)):
        with pytest.raises(RendezvousError) as info:
            fetch(server, rank, world_size, token=token)
        said.append(str(info.value))
    assert fetch(server, 1, 3) == PAYLOAD
    with pytest.raises(RendezvousError):
        fetch(server, 1, 3)  # a duplicate
    assert server.refused == 4
    assert [(r.rank, r.peer) for r in server.refusals] == [(1, HOST), (2, HOST), (5, HOST), (1, HOST)]
    # Each reason is what the refused client was told.
    assert all(text.endswith(": " + r.reason) for text, r in zip(said, server.refusals))
    assert "wrong job token" in server.refusals[0].reason and "not of rank 0's job" in server.refusals[0].reason
    assert server.refusals[3].reason.startswith(f"rank 1 already joined (from {HOST})")
    # A flood of refused HELLOs is counted, but only the first few are kept.
    monkeypatch.setattr(rv, "MAX_REFUSALS", 6)
    for _ in range(5):
        with raw(server) as sock:
            sock.sendall(hello(rank=2, world_size=9))
            assert reply_of(sock)[0] == rv.ERROR
    assert server.refused == 9 and len(server.refusals) == 6
    assert fetch(server, 2, 3) == PAYLOAD


def _incomplete(world_size: int, ranks_per_node: int, joining: Sequence[int], refused: Sequence[int] = ()) -> str:
    """Rank 0's report of a rendezvous that ``joining`` ranks joined and ``refused`` were refused
    (wrong token), once its timeout passed."""
    server = RendezvousServer(HOST, 0, world_size, TOKEN, PAYLOAD, 1.0 if joining or refused else 0.3,
                              ranks_per_node=ranks_per_node)
    try:
        for rank in joining:
            assert fetch(server, rank, world_size) == PAYLOAD
        for rank in refused:
            with pytest.raises(RendezvousError):
                fetch(server, rank, world_size, token=hashlib.sha256(b"another job").digest())
        missing = server.wait(5.0)
        assert server.finished
        return server.incomplete(missing)
    finally:
        server.close()


def test_a_node_that_never_came_is_named() -> None:
    # Ranks numbered node by node (torchrun, hcclpy run): the report names the nodes.
    text = _incomplete(6, 2, [1, 3])
    assert text.startswith("rank(s) [2, 4, 5] did not reach the rendezvous on 127.0.0.1:"), text
    assert text.endswith("; node 1 of 3 (ranks 2-3) lacks rank(s) [2]; node 2 of 3 (ranks 4-5) never joined: is its "
                         "launcher running, with --node-rank 2, --nnodes 3 and the same --master-addr and "
                         "--master-port?"), text
    assert _incomplete(2, 1, []).endswith("; node 1 of 2 (rank 1) never joined: is its launcher running, with "
                                          "--node-rank 1, --nnodes 2 and the same --master-addr and --master-port?")
    # Without a layout, or one that does not divide the ranks: ranks only.
    assert "node" not in _incomplete(4, 0, [1]) and "node" not in _incomplete(4, 3, [1])


def test_ranks_refused_for_one_reason_are_said_once() -> None:
    text = _incomplete(4, 2, [1], refused=[3, 2])
    assert text.startswith("rank(s) [2, 3] did not join the rendezvous"), text
    assert "never joined" not in text and text.count("wrong job token") == 1, text
    assert "; it refused ranks 2, 3 (from 127.0.0.1): wrong job token" in text, text


@pytest.mark.parametrize("rank", [0, 4, 7, 2**32 - 1])
def test_rank_out_of_range_is_refused(servers: List[RendezvousServer], rank: int) -> None:
    server = serve(servers, 4)
    with pytest.raises(RendezvousError, match=rf"rank {rank} is not in \[1, 4\)"):
        fetch(server, rank, 4)


# ------------------------------------------------------------------------ hostile input

HOSTILE = {
    "random bytes": os.urandom(200),
    "bad magic": rv.HEADER.pack(b"NOTHCCL!", rv.VERSION, rv.HELLO, rv.HELLO_BODY.size)
                 + rv.HELLO_BODY.pack(TOKEN, 1, 2),
    "bad version": rv.HEADER.pack(rv.MAGIC, 99, rv.HELLO, rv.HELLO_BODY.size) + rv.HELLO_BODY.pack(TOKEN, 1, 2),
    "oversized length": rv.HEADER.pack(rv.MAGIC, rv.VERSION, rv.HELLO, 2**32 - 1),
    "length just over the limit": rv.HEADER.pack(rv.MAGIC, rv.VERSION, rv.HELLO, rv.MAX_PAYLOAD + 1),
    "wrong kind": rv.HEADER.pack(rv.MAGIC, rv.VERSION, rv.OK, rv.HELLO_BODY.size) + rv.HELLO_BODY.pack(TOKEN, 1, 2),
    "short hello": rv.HEADER.pack(rv.MAGIC, rv.VERSION, rv.HELLO, 8) + b"\0" * 8,
    "long hello": rv.HEADER.pack(rv.MAGIC, rv.VERSION, rv.HELLO, 1000) + b"\0" * 1000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_malformed_request_gets_an_error_reply(servers: List[RendezvousServer], name: str) -> None:
    server = serve(servers, 2)
    with raw(server) as sock:
        sock.sendall(HOSTILE[name])
        kind, body = reply_of(sock)
    assert kind == rv.ERROR and body, f"{name}: reply kind {kind}"
    assert len(body) < 1024
    assert fetch(server, 1, 2) == PAYLOAD


def test_server_survives_hostile_clients_and_serves_the_next(servers: List[RendezvousServer]) -> None:
    server = serve(servers, 3)
    open_sockets: List[socket.socket] = []
    try:
        # Connections that stay open: one silent, one with half a header, one with a header promising
        # a body it never sends.
        for data in (b"", rv.MAGIC[:5], rv.HEADER.pack(rv.MAGIC, rv.VERSION, rv.HELLO, rv.HELLO_BODY.size)):
            sock = raw(server)
            if data:
                sock.sendall(data)
            open_sockets.append(sock)
        # Connections that send garbage, or half a message, and go away; one resets.
        for data in HOSTILE.values():
            with raw(server) as sock:
                sock.sendall(data)
        with raw(server) as sock:
            sock.sendall(rv.MAGIC)
        sock = raw(server)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall(hello()[:10])
        sock.close()  # RST
        # Refused HELLOs do not count as ranks.
        for token, rank, size in ((b"\0" * 32, 1, 3), (TOKEN, 0, 3), (TOKEN, 9, 3), (TOKEN, 1, 4)):
            with raw(server) as sock:
                sock.sendall(hello(token, rank, size))
                assert reply_of(sock)[0] == rv.ERROR
        assert not server.finished
        # While the stalled connections are still open, legitimate ranks are served at once.
        start = time.monotonic()
        assert fetch(server, 2, 3) == PAYLOAD
        assert fetch(server, 1, 3) == PAYLOAD
        assert time.monotonic() - start < 3.0
        assert wait_until(lambda: server.finished)
    finally:
        for sock in open_sockets:
            sock.close()


def test_stalled_client_is_dropped_after_the_io_timeout(servers: List[RendezvousServer],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rv, "IO_TIMEOUT", 0.3)
    server = serve(servers, 2)
    with raw(server) as sock:
        sock.sendall(rv.MAGIC)  # and then nothing
        sock.settimeout(5.0)
        assert sock.recv(1) == b"", "the server kept a stalled connection open"
    assert wait_until(lambda: bool(server.errors))
    assert fetch(server, 1, 2) == PAYLOAD


def test_server_survives_running_out_of_file_descriptors() -> None:
    # The server runs in a child with a low descriptor limit; this process floods it with connections.
    port = free_port(HOST)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import resource, sys, time
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
        from hcclpy.rendezvous import RendezvousServer
        server = RendezvousServer({HOST!r}, {port}, 2, {TOKEN!r}, {PAYLOAD!r}, 30.0)
        print("ready", flush=True)
        sys.stdin.read()  # until the test is done
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    hogs: List[socket.socket] = []
    try:
        assert child.stdout.readline().strip() == "ready"
        for _ in range(80):
            try:
                hogs.append(socket.create_connection((HOST, port), timeout=2.0))
            except OSError:
                break
        time.sleep(0.5)  # the server's accept() hits EMFILE meanwhile
        for sock in hogs:
            sock.close()
        hogs.clear()
        time.sleep(0.5)
        assert fetch_root_info(HOST, port, 1, 2, TOKEN, 3.0) == PAYLOAD
    finally:
        for sock in hogs:
            sock.close()
        child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def test_a_rank_0_that_gives_up_and_exits_tells_the_ranks_it_served_why() -> None:
    # Rank 0 (a child process) gives up when its timeout passes, closes the server and exits at
    # once, as hcclpy.init's rank 0 does by raising. The rank it served hears why, not that the
    # connection went away: close() lets the server's threads tell it first (before, it mostly
    # heard "went away", as it still does with rv.FAREWELL = 0).
    port = free_port(HOST)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os
        from hcclpy.rendezvous import RendezvousServer
        server = RendezvousServer({HOST!r}, {port}, 3, {TOKEN!r}, {PAYLOAD!r}, 3.0, ranks_per_node=1)
        print("ready", flush=True)
        server.wait(10.0)
        server.close()
        os._exit(1)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(CommTimeoutError) as info:
            fetch_root_info(HOST, port, 1, 3, TOKEN, 10.0)
    finally:
        child.kill()
        child.wait()
    assert str(info.value).startswith(f"rank(s) [2] did not reach the rendezvous on {HOST}:{port} within 3 s; "
                                      "node 2 of 3 (rank 2) never joined"), info.value


# ------------------------------------------------------------------------------- binding

def _other_local_addresses() -> List[str]:
    """IPv4 addresses of this host other than 127.0.0.1 (127.0.0.2 always reaches the loopback)."""
    found = {"127.0.0.2"}
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(info[4][0])
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # the address of the default route
        try:
            probe.connect(("192.0.2.123", 9))
            found.add(probe.getsockname()[0])
        except OSError:
            pass
    found.discard("127.0.0.1")
    found.discard("0.0.0.0")
    return sorted(found)


def test_server_binds_only_to_the_address_given(servers: List[RendezvousServer]) -> None:
    server = serve(servers, 2)
    host, port = server.address
    assert host == HOST and port > 0
    refused = []
    for address in _other_local_addresses():
        try:
            socket.create_connection((address, port), timeout=2.0).close()
        except ConnectionRefusedError:
            refused.append(address)
        except OSError:  # not an address here after all
            continue
        else:
            pytest.fail(f"the server bound to {HOST} accepted a connection on {address}:{port}")
    assert "127.0.0.2" in refused
    assert fetch(server, 1, 2) == PAYLOAD


def test_listen_address_for_names_that_resolve_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def resolve(host: str, *args: Any, **kwargs: Any) -> Any:
        # As on a Debian host whose /etc/hosts says "127.0.1.1 node0"; node1 resolves to a network address.
        fake = {"node0": "127.0.1.1", "node1": "192.0.2.10"}.get(host)
        if fake is None:
            return real(host, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (fake, 0))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    assert rv.listen_address("node0") == (socket.AF_INET, "0.0.0.0")  # the other nodes reach it elsewhere
    assert rv.listen_address("node1") == (socket.AF_INET, "node1")
    for literal in ("127.0.0.1", "127.0.1.1", "192.0.2.10", "::1", "fe80::1%eth0", "localhost", "LOCALHOST"):
        assert rv.listen_address(literal)[1] == literal
    assert rv.listen_address("no-such-host.invalid") == (socket.AF_INET, "no-such-host.invalid")
    # A server for node0 listens on every interface and serves clients at any local address.
    server = RendezvousServer("node0", free_port(HOST), 2, TOKEN, PAYLOAD, 10.0)
    try:
        assert server.address[0] == "0.0.0.0"
        assert fetch_root_info(HOST, server.address[1], 1, 2, TOKEN, 5.0) == PAYLOAD
    finally:
        server.close()


def test_server_on_ipv6_loopback(servers: List[RendezvousServer]) -> None:
    try:
        server = serve(servers, 2, host="::1")
    except RendezvousError:
        pytest.skip("no IPv6 loopback here")
    host, port = server.address
    assert host == "::1" and port > 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, port), timeout=2.0).close()
    assert fetch_root_info("::1", port, 1, 2, TOKEN, 5.0) == PAYLOAD


def test_server_cannot_bind_to_a_foreign_address_or_a_busy_port(servers: List[RendezvousServer]) -> None:
    with pytest.raises(RendezvousError, match=r"cannot listen on 203\.0\.113\.7:.*MASTER_ADDR"):
        RendezvousServer("203.0.113.7", free_port(HOST), 2, TOKEN, PAYLOAD, 1.0)
    server = serve(servers, 2)
    with pytest.raises(RendezvousError, match="cannot listen"):
        RendezvousServer(HOST, server.address[1], 2, TOKEN, PAYLOAD, 1.0)


# -------------------------------------------------------------------------------- tokens

def test_job_token_with_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCCLPY_RENDEZVOUS_TOKEN", "s3cret")
    token = job_token(29500)
    assert len(token) == 32
    assert token == job_token(1234, "job-9")  # the secret alone decides
    monkeypatch.setenv("HCCLPY_RENDEZVOUS_TOKEN", "other")
    assert job_token(29500) != token


def test_derived_job_token_separates_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HCCLPY_RENDEZVOUS_TOKEN", raising=False)
    base = job_token(29500)
    assert len(base) == 32 and base == job_token(29500)
    assert base != job_token(29501)
    # The launcher's job id (LaunchInfo.job_id) separates jobs on one port.
    assert len({base, job_token(29500, "1234.0"), job_token(29500, "1234.1")}) == 3
    # So does a secret: a rank with one and a rank without are in different jobs.
    monkeypatch.setenv("HCCLPY_RENDEZVOUS_TOKEN", "s3cret")
    assert job_token(29500) != base


def test_client_rejects_an_untrusted_reply_size() -> None:
    # A "server" that answers every request with OK and a length over the limit: the client must not
    # try to read (or allocate) it, and gives up at its timeout.
    stop = threading.Event()
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen(8)
        listener.settimeout(0.05)
        port = listener.getsockname()[1]

        def evil() -> None:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                with conn:
                    conn.settimeout(2.0)
                    try:
                        conn.recv(1024)
                        conn.sendall(rv.HEADER.pack(rv.MAGIC, rv.VERSION, rv.OK, 2**31))
                    except OSError:
                        pass

        thread = threading.Thread(target=evil, daemon=True)
        thread.start()
        try:
            with pytest.raises(CommTimeoutError, match="exceeds"):
                fetch_root_info(HOST, port, 1, 2, TOKEN, 1.0)
        finally:
            stop.set()
            thread.join(5)


# ---------------------------------------------------------------------------- no pickle

SERIALIZERS = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle"}


@pytest.mark.parametrize("module", [rv, hcclpy.bootstrap], ids=["rendezvous", "bootstrap"])
def test_no_pickle_or_code_on_the_wire(module: object) -> None:
    """Nothing that can execute code is imported or called (the docstring may say so in words)."""
    tree = ast.parse(Path(module.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & SERIALIZERS, f"{module.__name__} imports {sorted(imported & SERIALIZERS)}"
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not names & (SERIALIZERS | {"eval", "exec", "loads", "__import__"}), sorted(names)
    # In words: the only mention of pickle is the docstring's promise.
    code_lines = [line for line in Path(module.__file__).read_text().splitlines()
                  if "pickle" in line and not line.lstrip().startswith(("#", '"')) and "no pickle" not in line]
    assert not code_lines, code_lines


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "192.0.2.1"])  # 192.0.2.1: TEST-NET-1, no machine's address
def test_free_port_is_free_where_asked_or_on_every_interface(host: str) -> None:
    if host == "::1" and not socket.has_ipv6:
        pytest.skip("this Python has no IPv6")
    try:
        port = free_port(host)
    except OSError as exc:  # a kernel without IPv6 on loopback
        pytest.skip(f"cannot bind {host}: {exc}")
    assert 1024 <= port < 65536
    # Nothing listens there: the port can be bound again, where asked (or anywhere, for an
    # address this machine does not have), as the launcher's rendezvous then does.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host if host != "192.0.2.1" else "", port))
