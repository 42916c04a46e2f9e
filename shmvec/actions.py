"""Checking a batch of actions against the action space before any worker sees it.

What is checked, and what it costs per step, is listed in ``docs/reliability.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.tree import Leaf, flatten, space_leaves

__all__ = ["ActionBatch", "action_checker"]


def action_checker(leaf: Leaf) -> Callable[[np.ndarray, np.ndarray | None], None]:
    """A check ``check(a, ignored)`` that raises ``ValueError`` unless a batch ``a`` holds valid
    samples of ``leaf.space`` in every row that ``ignored`` (a bool mask of rows, or ``None``)
    does not mark.

    Rows marked ``ignored`` are those of envs that will not see their action (a NEXT_STEP
    reset): Gymnasium hands any value there, so only their dtype is checked.

    Everything about the space is worked out here, once. Where one bound holds for every
    element (Discrete, MultiBinary, a Box with uniform bounds), the check compares the batch's
    smallest and largest values, found with ``argmin``/``argmax`` and read with ``item()``:
    a third of the instructions of two ufunc reductions (callgrind: ~6k against ~15k per step),
    and plain Python numbers, so no numpy type promotion between, say, uint64 and int64. The
    offending env is located only on failure.
    """
    space = leaf.space
    where = f"actions{leaf.field}"
    if leaf.pickled:
        return _contains_checker(space, where)
    empty = 0 in leaf.shape  # then every batch is empty (a.size costs as much as argmax)
    refuse = _refuser(space, where)
    if isinstance(space, gym.spaces.Box):
        return _box_checker(space, where, empty, refuse)
    return _integer_checker(space, where, empty, refuse)


def _refuser(space: gym.Space, where: str) -> Callable[[np.ndarray, np.ndarray, np.ndarray | None], None]:
    """The failure path of a check: ``refuse(a, bad, ignored)`` raises ``ValueError`` naming the
    first env that has a ``bad`` element and is not ``ignored``, and returns if there is none.
    """

    def refuse(a: np.ndarray, bad: np.ndarray, ignored: np.ndarray | None) -> None:
        rows = bad.reshape(len(bad), -1).any(axis=1)
        if ignored is not None:  # looked at on failure only: the usual step pays nothing for it
            rows &= ~ignored
            if not rows.any():
                return
        env = int(np.argmax(rows))
        raise ValueError(f"{where}[{env}] = {a[env].tolist()!r} is outside the action space {space} (env {env})")

    return refuse


def _box_checker(
    space: gym.spaces.Box, where: str, empty: bool, refuse: Callable[[np.ndarray, np.ndarray, np.ndarray | None], None]
) -> Callable[[np.ndarray, np.ndarray | None], None]:
    """The check of a Box leaf (see :func:`action_checker`).

    Parameters
    ----------
    space : gymnasium.spaces.Box
    where : str
        The leaf as error messages name it (``actions['key']``).
    empty : bool
        Whether the leaf has no elements (every batch is empty).
    refuse : callable
        The leaf's failure path (:func:`_refuser`).
    """
    box_low, box_high = space.low, space.high
    uniform = box_low.size > 0 and bool((box_low == box_low.flat[0]).all() and (box_high == box_high.flat[0]).all())
    lo, hi = (box_low.flat[0].item(), box_high.flat[0].item()) if uniform else (None, None)

    def check_box(a: np.ndarray, ignored: np.ndarray | None) -> None:
        if a.dtype.kind not in "fiub":
            raise ValueError(f"{where} have dtype {a.dtype}, expected a number type for {space}")
        if empty:
            return
        # argmin/argmax land on a NaN if there is one, and NaN fails both comparisons.
        if uniform and a.item(a.argmin()) >= lo and a.item(a.argmax()) <= hi:
            return
        inside = (a >= box_low) & (a <= box_high)  # NaN fails both comparisons
        if not inside.all():
            refuse(a, ~inside, ignored)

    return check_box


def _integer_checker(
    space: gym.Space, where: str, empty: bool, refuse: Callable[[np.ndarray, np.ndarray, np.ndarray | None], None]
) -> Callable[[np.ndarray, np.ndarray | None], None]:
    """The check of a Discrete, MultiBinary or MultiDiscrete leaf ``space``; the other
    parameters are :func:`_box_checker`'s.
    """
    low: int | np.ndarray  # one bound for every element, or an array of them
    high: int | np.ndarray
    if isinstance(space, gym.spaces.MultiBinary):
        low, high = 0, 2
    elif isinstance(space, gym.spaces.Discrete):
        low, high = int(space.start), int(space.start + space.n)
    else:
        assert isinstance(space, gym.spaces.MultiDiscrete)  # the last fixed-size leaf space (see space_leaves)
        low, high = space.start, space.start + space.nvec
    low, high = np.asarray(low), np.asarray(high)
    scalar = bool((low == low.flat[0]).all() and (high == high.flat[0]).all()) if high.size else False
    if scalar:  # one bound for every element (MultiDiscrete with equal nvec and start too)
        low, high = int(low.flat[0]), int(high.flat[0])

    def check_integers(a: np.ndarray, ignored: np.ndarray | None) -> None:
        kind = a.dtype.kind
        if kind not in "iub":
            raise ValueError(f"{where} have dtype {a.dtype}, expected integers for {space}")
        if empty:
            return
        if scalar:
            ok = a.item(a.argmin()) >= low and a.item(a.argmax()) < high
        else:
            ok = bool(((a >= low) & (a < high)).all())
        if not ok:
            refuse(a, (a < low) | (a >= high), ignored)

    return check_integers


def _contains_checker(space: gym.Space, where: str) -> Callable[[np.ndarray, np.ndarray | None], None]:
    """The check of a pickled leaf (one object per env): ``space.contains`` for each env."""

    def check_items(a: np.ndarray, ignored: np.ndarray | None) -> None:
        for env, item in enumerate(a):
            if ignored is not None and ignored[env]:
                continue
            try:
                inside = space.contains(item)
            except Exception:  # a malformed sample (a dict where a tuple belongs, ...) is not in it
                inside = False
            if not inside:
                raise ValueError(f"{where}[{env}] = {item!r:.120} is outside the action space {space} (env {env})")

    return check_items


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
        self.validate = validate
        self.leaves = space_leaves(single_action_space)
        self.flat = len(self.leaves) == 1 and not self.leaves[0].path and not self.leaves[0].pickled
        self.checks = [action_checker(leaf) if validate else None for leaf in self.leaves]
        # How each leaf's part of a batch becomes its array, chosen once per leaf (functions,
        # not bound methods: the batch holding its own methods would be a reference cycle).
        self._convert = [ActionBatch._items if leaf.pickled else ActionBatch._checked for leaf in self.leaves]
        self._shapes: dict[int, list[tuple[int, ...]]] = {}  # n -> the expected shape of each leaf

    def leaf_arrays(self, actions: Any, n: int, ignored: np.ndarray | None = None) -> list[np.ndarray]:
        """The ``[n, ...]`` array of each leaf (``n >= 1``), in leaf order.

        Raises ``TypeError`` for a scalar where a batch is expected (as Gymnasium's ``iterate``
        does), else ``ValueError`` naming the leaf, what was expected and the first offending
        env if ``actions`` does not fit the space. ``ignored``: bool mask of the envs whose
        action will not be used (their values are not checked against the space).
        """
        shapes = self._shapes.get(n)
        if shapes is None:
            shapes = self._shapes[n] = [(n, *leaf.shape) for leaf in self.leaves]
        if self.flat:  # the common case, on every step: no flattening, no loop
            return [self._checked(0, actions, shapes[0], ignored)]
        try:
            parts = flatten(self.space, actions)
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(
                f"actions do not match action_space {self.space} (per env): {type(exc).__name__}: {exc}"
            ) from None
        convert = self._convert
        return [convert[k](self, k, part, shapes[k], ignored) for k, part in enumerate(parts)]

    def write(
        self, actions: Any, views: list[np.ndarray], n: int, ignored: np.ndarray | None = None, index: Any = Ellipsis
    ) -> None:
        """Check ``actions`` for ``n`` envs as :meth:`leaf_arrays` does, then write each leaf
        into its view of ``views`` at ``index``: only once every leaf passed, so that a refused
        action leaves nothing half-written. Item assignment casts as ``np.copyto(casting="unsafe")``
        does, at a third of its cost.
        """
        if self.flat:  # the common case, on every step: one array, checked and written
            shapes = self._shapes.get(n)
            if shapes is None:
                shapes = self._shapes[n] = [(n, *self.leaves[0].shape)]
            views[0][index] = self._checked(0, actions, shapes[0], ignored)
            return
        for view, a in zip(views, self.leaf_arrays(actions, n, ignored)):
            view[index] = a

    def bounds(self) -> tuple[int, int] | None:
        """``(low, high)`` where the batch is one Discrete leaf of int64 whose values are checked:
        every value must fall in ``[low, high)``, a test the compiled round can make on a staged
        batch (:meth:`stage`); ``None`` for every other space.
        """
        leaf = self.leaves[0]
        if not (self.flat and self.validate and isinstance(leaf.space, gym.spaces.Discrete)):
            return None
        if leaf.dtype != np.int64 or leaf.shape != ():
            return None
        start = int(leaf.space.start)
        return start, start + int(leaf.space.n)

    def stage(self, actions: Any, staging: np.ndarray) -> bool:
        """Write a batch of integers (or booleans) of ``staging``'s shape into it, unchecked: the
        compiled round checks it against :meth:`bounds` and copies it where it goes. False, with
        nothing written, for anything else (:meth:`write` then checks it, and says what is wrong).
        """
        a = actions if type(actions) is np.ndarray else np.asarray(actions)
        if a.shape != staging.shape:
            return False
        kind = a.dtype.kind
        # (uint64 can wrap into range as int64; floats are refused by the check's message)
        if kind != "i" and kind != "b" and (kind != "u" or a.itemsize == 8):
            return False
        staging[...] = a
        return True

    def _checked(self, k: int, part: Any, shape: tuple[int, ...], ignored: np.ndarray | None) -> np.ndarray:
        a = part if type(part) is np.ndarray else np.asarray(part)
        if a.shape != shape:
            self._refuse_shape(k, a, shape)
        check = self.checks[k]
        if check is not None:
            check(a, ignored)
        return a

    def _refuse_shape(self, k: int, a: np.ndarray, shape: tuple[int, ...]) -> None:
        """Raise for leaf ``k``'s part ``a`` of a batch, which does not have ``shape``."""
        leaf = self.leaves[k]
        # A scalar is not a batch at all (Gymnasium: TypeError); a batch of the wrong size or
        # shape is a wrong value (ValueError).
        error = TypeError if a.ndim == 0 else ValueError
        raise error(
            f"actions{leaf.field} have shape {a.shape}, expected {shape} "
            f"({shape[0]} envs, single_action_space{leaf.field}={leaf.space})"
        )

    def _items(self, k: int, part: Any, shape: tuple[int, ...], ignored: np.ndarray | None) -> np.ndarray:
        """A pickled leaf's part of a batch (one sample per env, read as Gymnasium's ``iterate``
        reads it: any sequence) as an ``[n]`` object array.
        """
        leaf, n = self.leaves[k], shape[0]
        try:
            # A string is a sequence too, of characters: Gymnasium would hand out one per env.
            items = None if isinstance(part, (str, bytes)) else list(part)
        except TypeError:
            items = None
        if items is None:
            raise TypeError(
                f"actions{leaf.field} must hold one sample per env ({n} envs, "
                f"single_action_space{leaf.field}={leaf.space}), got a {type(part).__name__}"
            )
        if len(items) != n:
            raise ValueError(
                f"actions{leaf.field} hold {len(items)} samples, expected {n} "
                f"(one per env, single_action_space{leaf.field}={leaf.space})"
            )
        a = np.empty(n, dtype=object)
        for i, item in enumerate(items):
            a[i] = item  # item assignment keeps each object as it is (a slice would unpack sequences)
        check = self.checks[k]
        if check is not None:
            check(a, ignored)
        return a
