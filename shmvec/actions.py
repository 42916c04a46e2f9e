"""Checking a batch of actions against the action space before any worker sees it.

What is checked, and what it costs per step, is listed in ``docs/reliability.md``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from shmvec.layout import Leaf


def check_actions(leaf: Leaf, a: np.ndarray) -> None:
    """Raise ``ValueError`` if the batch ``a`` is not made of valid samples of ``leaf.space``.

    The common cases cost one or two reductions; the offending env is located only on failure.
    """
    space = leaf.space
    where = f"actions{leaf.field}"
    if isinstance(space, gym.spaces.Box):
        if a.dtype.kind not in "fiub":
            raise ValueError(f"{where} have dtype {a.dtype}, expected a number type for {space}")
        ok = bool(((a >= space.low) & (a <= space.high)).all())  # NaN fails both comparisons
    else:
        if a.dtype.kind not in "iub":
            raise ValueError(f"{where} have dtype {a.dtype}, expected integers for {space}")
        if isinstance(space, gym.spaces.MultiBinary):
            low, high = 0, 2
        elif isinstance(space, gym.spaces.Discrete):
            low, high = space.start, space.start + space.n
        else:
            low, high = space.start, space.start + space.nvec
        if np.ndim(high) == 0 and low == 0 and a.dtype.kind == "i":
            # One reduction: negative values wrap to huge unsigned ones.
            ok = a.size == 0 or a.view(f"u{a.itemsize}").max() < high
        elif np.ndim(high) == 0:
            ok = a.size == 0 or (a.min() >= low and a.max() < high)
        else:
            ok = bool(((a >= low) & (a < high)).all())
    if not ok:
        if isinstance(space, gym.spaces.Box):
            bad = ~((a >= space.low) & (a <= space.high))
        else:
            bad = (a < low) | (a >= high)
        env = int(np.argwhere(bad)[0][0])
        raise ValueError(f"{where}[{env}] = {a[env]!r} is outside the action space {space} (env {env})")
