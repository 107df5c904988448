"""Releasing C handles exactly once: by ``close()``, or by the garbage collector as a safety net."""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable, Optional

# How many times something work can use was closed (a DeviceArray, a Stream, a communicator
# destroyed or aborted; hcclpy.group() counts too), in a list so that importers see it change. A
# persistent operation that found what it uses open stays sure of it while the count does not
# change (any change will do: no lock needed).
CLOSES = [0]


class Releaser:
    """Holds what it takes to release one handle; the finalizer sees this, never the owning object.

    ``release`` is called at most once. ``owned=False`` marks a borrowed handle: it is never released.
    """

    __slots__ = ("release_fn", "what", "warn")

    def __init__(self, release_fn: Optional[Callable[[], Any]], what: str, warn: bool) -> None:
        self.release_fn = release_fn
        self.what = what
        self.warn = warn

    def __call__(self, collected: bool) -> None:
        release, self.release_fn = self.release_fn, None
        if release is None:
            return
        if collected and self.warn:
            warnings.warn(f"an unclosed {self.what} was released by the garbage collector; close it or use "
                          "it as a context manager", ResourceWarning, stacklevel=2)
        release()


def attach(owner: object, release_fn: Optional[Callable[[], Any]], what: str, *, warn: bool = True) -> weakref.finalize:
    """Arrange for ``release_fn`` to run when ``owner`` is collected; returns the finalizer.

    ``finalizer.detach()`` followed by a call of the returned releaser is the explicit close path.
    At interpreter exit nothing runs: the runtime reclaims its handles itself.
    """
    releaser = Releaser(release_fn, what, warn)
    finalizer = weakref.finalize(owner, releaser, True)
    finalizer.atexit = False
    return finalizer


def close_now(finalizer: weakref.finalize) -> bool:
    """Release through ``finalizer`` now, without the collector warning; False if already released."""
    detached = finalizer.detach()
    if detached is None:
        return False
    releaser = detached[1]
    releaser(False)
    return True
