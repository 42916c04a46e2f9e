"""The life of a vector env in one state, and the one check every public method makes of it.

Shared by :class:`~shmvec.ShmVecEnv` and :class:`~shmvec.ray.RayVecEnv`, so that the same
mistake raises the same error, worded the same way, whichever class the user holds.
"""

from __future__ import annotations

from enum import Enum

from gymnasium.error import ResetNeeded

from shmvec.errors import ClosedError

__all__ = ["Lifecycle", "refuse"]


class Lifecycle(Enum):
    """Where a vector env stands."""

    NEEDS_RESET = "needs reset"  # built: reset() (or async_reset()) before step, send or rollout
    READY = "ready"
    CLOSED = "closed"  # by close(), or by a fault that left its workers in an unknown state


def refuse(state: Lifecycle, owner: str, method: str, needs_reset: bool) -> None:
    """Raise what calling ``owner.method()`` in ``state`` deserves, if anything.

    :class:`~shmvec.ClosedError` when closed; Gymnasium's ``ResetNeeded`` when ``method``
    ``needs_reset`` and there was none yet. Callers test ``state is Lifecycle.READY`` first, so
    that the step path pays for one comparison only.
    """
    if state is Lifecycle.CLOSED:
        raise ClosedError(f"{method}() on a closed {owner}; create a new one")
    if needs_reset and state is Lifecycle.NEEDS_RESET:
        raise ResetNeeded(f"{owner}.{method}() was called before reset(); call reset() first")
