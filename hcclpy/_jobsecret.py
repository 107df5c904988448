"""The secret of a job's TCP rendezvous: a token its own ranks share and no other user can learn.

Whoever presents rank 0's token receives the root info, and with it a seat in the communicator (and
the data of every collective). So the token is never derived from what others can see (the port,
a job id); it travels, in order of preference:

- in ``HCCLPY_RENDEZVOUS_TOKEN``, set by the user for the whole job (``hcclpy run`` sets a fresh
  one for a job on one host);
- through torchrun's own store, which its agent serves to the job's workers (rank 0 publishes the
  port it listens on and a random token there);
- for a job on one host, through a file only this user can read: rank 0 writes a random token to
  this user's runtime directory (``$XDG_RUNTIME_DIR/hcclpy``, else ``<tmp>/hcclpy-<uid>``, mode
  0700) before it listens, and the other ranks read it once they reach rank 0.

A job across hosts with none of these is refused at once (see :func:`hcclpy.init`).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import tempfile
from typing import Optional

from . import _environment

__all__ = ["TOKEN_BYTES", "from_secret", "new_token", "private_dir", "publish", "read", "withdraw"]

TOKEN_BYTES = 32


def new_token() -> bytes:
    """A fresh random token."""
    return secrets.token_bytes(TOKEN_BYTES)


def from_secret(secret: str) -> bytes:
    """The token of a secret the user chose (``HCCLPY_RENDEZVOUS_TOKEN``): any length, same bytes."""
    return hashlib.sha256(("secret:" + secret).encode()).digest()


def private_dir() -> str:
    """This user's directory for job secrets, created if needed (mode 0700).

    Raises
    ------
    PermissionError
        If the directory belongs to another user or others may read or write it (someone could
        have made it in advance, to read the secrets put there).
    """
    runtime = _environment.runtime_dir()
    if runtime and os.path.isdir(runtime) and _private(runtime):
        path = os.path.join(runtime, "hcclpy")
    else:
        path = os.path.join(tempfile.gettempdir(), f"hcclpy-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    if not _private(path):
        raise PermissionError(f"{path} must be a directory that only this user (uid {os.getuid()}) owns and "
                              "can enter, to hold the job's rendezvous secret; remove it, or set "
                              "HCCLPY_RENDEZVOUS_TOKEN on every rank")
    return path


def _private(path: str) -> bool:
    info = os.lstat(path)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and info.st_mode & 0o077 == 0


def _path(key: str) -> str:
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    return os.path.join(private_dir(), f"rendezvous-{name}")


def publish(key: str, token: bytes) -> str:
    """Write ``token`` as the secret of the job ``key`` names (replacing an earlier job's); return
    the file's path, for :func:`withdraw`."""
    path = _path(key)
    fd, scratch = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".rendezvous-")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(token)
        os.replace(scratch, path)  # a reader sees the old token or the new one, never half of one
    except BaseException:
        os.unlink(scratch)
        raise
    return path


def read(key: str) -> Optional[bytes]:
    """The secret rank 0 published for the job ``key`` names, or None if there is none yet."""
    try:
        with open(_path(key), "rb") as handle:
            token = handle.read(TOKEN_BYTES + 1)
    except FileNotFoundError:
        return None
    return token if len(token) == TOKEN_BYTES else None


def withdraw(path: str) -> None:
    """Remove a published secret (every rank has it, or the rendezvous failed)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
