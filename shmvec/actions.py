"""Checking a batch of actions against the action space before any worker sees it.

What is checked, and what it costs per step, is listed in ``docs/reliability.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.layout import Leaf, flatten, space_leaves

__all__ = ["ActionBatch", "action_checker"]

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# The ufunc reductions themselves: ndarray.max() adds a Python-level wrapper (~1 us a call).
_max, _min = np.maximum.reduce, np.minimum.reduce


def action_checker(leaf: Leaf) -> Callable[[np.ndarray], None]:
    """A check that raises ``ValueError`` unless a batch ``a`` holds valid samples of ``leaf.space``.

    Everything about the space is worked out here, once, so that the check itself costs one or
    two reductions per step. Scalar bounds are Python ints: comparing a numpy unsigned scalar
    with a numpy signed one takes numpy's slow promotion path (~5 us). The offending env is
    located only on failure.
    """
    space = leaf.space
    where = f"actions{leaf.field}"

    def refuse(a: np.ndarray, bad: np.ndarray) -> None:
        env = int(np.argwhere(bad)[0][0])
        raise ValueError(f"{where}[{env}] = {a[env].tolist()!r} is outside the action space {space} (env {env})")

    if isinstance(space, gym.spaces.Box):
        box_low, box_high = space.low, space.high

        def check_box(a: np.ndarray) -> None:
            if a.dtype.kind not in "fiub":
                raise ValueError(f"{where} have dtype {a.dtype}, expected a number type for {space}")
            inside = (a >= box_low) & (a <= box_high)  # NaN fails both comparisons
            if not inside.all():
                refuse(a, ~inside)

        return check_box

    if isinstance(space, gym.spaces.MultiBinary):
        low, high = 0, 2
    elif isinstance(space, gym.spaces.Discrete):
        low, high = int(space.start), int(space.start + space.n)
    else:
        low, high = space.start, space.start + space.nvec
    scalar = np.ndim(high) == 0
    if scalar:
        low, high = int(low), int(high)

    def check_integers(a: np.ndarray) -> None:
        kind = a.dtype.kind
        if kind not in "iub":
            raise ValueError(f"{where} have dtype {a.dtype}, expected integers for {space}")
        if a.size == 0:
            return
        if scalar and low == 0 and kind == "i":
            # One reduction: negative values wrap to huge unsigned ones.
            ok = int(_max(a.view(_UNSIGNED[a.itemsize]), axis=None)) < high
        elif scalar:
            ok = int(_min(a, axis=None)) >= low and int(_max(a, axis=None)) < high
        else:
            ok = bool(((a >= low) & (a < high)).all())
        if not ok:
            refuse(a, (a < low) | (a >= high))

    return check_integers


class ActionBatch:
    """Turns a batch of actions for ``n`` envs into checked per-leaf arrays.

    Parameters
    ----------
    single_action_space : gymnasium.Space
        One env's action space (nested Dict/Tuple allowed).
    validate : bool
        Check values against the space (shapes are always checked).
    """

    def __init__(self, single_action_space: gym.Space, validate: bool = True) -> None:
        self.space = single_action_space
        self.leaves = space_leaves(single_action_space, "action_space")
        self.flat = len(self.leaves) == 1 and not self.leaves[0].path
        self.checks = [action_checker(leaf) if validate else None for leaf in self.leaves]
        self._shapes: dict[int, list[tuple[int, ...]]] = {}  # n -> the expected shape of each leaf

    def leaf_arrays(self, actions: Any, n: int) -> list[np.ndarray]:
        """The ``[n, ...]`` array of each leaf, in leaf order; ``ValueError`` naming the leaf, what was
        expected and the first offending env if ``actions`` does not fit the space."""
        if self.flat:
            parts = [actions]
        else:
            try:
                parts = flatten(self.space, actions)
            except (KeyError, IndexError, TypeError) as exc:
                raise ValueError(
                    f"actions do not match action_space {self.space} (per env): {type(exc).__name__}: {exc}"
                ) from None
        shapes = self._shapes.get(n)
        if shapes is None:
            shapes = self._shapes[n] = [(n, *leaf.shape) for leaf in self.leaves]
        out = []
        for leaf, check, part, shape in zip(self.leaves, self.checks, parts, shapes):
            a = part if type(part) is np.ndarray else np.asarray(part)
            if a.shape != shape:
                raise ValueError(
                    f"actions{leaf.field} have shape {a.shape}, expected {shape} "
                    f"({n} envs, single_action_space{leaf.field}={leaf.space})"
                )
            if check is not None:
                check(a)
            out.append(a)
        return out
