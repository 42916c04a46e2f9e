"""The route of a step's infos, decided here only: which keys get a column in shared memory,
how a block sends its envs' infos (:class:`InfoRoute`), and how main reads the columns.

MuJoCo's envs report several numbers per env and step (Ant nine), ALE's a few; pickling them
in every reply costs more than the rest of a round. After the first step that reports infos,
the vector env takes the keys whose merged values are 1-D numeric arrays as a fixed schema
(like EnvPool's info spec), lays out one column and one mask row per key in a second segment
(:class:`InfoLayout`) and hands it to every block. A block's :class:`InfoRoute` then writes
those values there (:class:`ColumnWriter`) and sends only the rest, by reply; the merge
(:class:`~shmvec.infos.InfoMerger`) reads the columns (:class:`ColumnReader`) and the replies.

The infos stay Gymnasium's, value for value and dtype for dtype: a value of another type than
its column's, and every info of an env that ends an episode under SAME_STEP, take the reply
path, and where a key arrives both ways in one step the merge folds the column values back
into the replies, so that Gymnasium's rule (the first env's value picks the array's type)
decides as it would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shmvec.layout import Regions

__all__ = ["ColumnReader", "ColumnWriter", "InfoLayout", "InfoRoute", "InfoSchema", "plain_scalars"]

# Keys the merge writes itself (never an env's own scalar).
_RESERVED = frozenset({"final_obs", "final_info", "restarted"})

# The Python types whose values Gymnasium batches into these dtypes (``np.zeros(n, dtype=type(v))``).
_PYTHON = {np.dtype(np.float64): float, np.dtype(np.int64): int, np.dtype(np.bool_): bool}


# numpy scalar types that travel by reply as Python scalars with nothing lost (see plain_scalars).
# Not np.bool_: Gymnasium batches it in an object array, a bool in a bool one.
_PLAIN: dict[type, type] = {np.float64: float}
if np.dtype(int) == np.int64:
    _PLAIN[np.int64] = int


def plain_scalars(info: dict | None) -> dict | None:
    """``info`` with its numpy float64 scalars (int64 too, where that is the default int) as
    Python floats (ints), nested dicts included; the env's dict is not changed.

    What a worker sends back with a step: a numpy scalar pickles through its dtype, several
    times the bytes and time of a Python one. The infos a user gets are unchanged: Gymnasium's
    merge gives a float64 (int64) array either way, with the same values.
    """
    if not info:
        return info
    out = {}
    for key, value in info.items():
        kind = type(value)
        if kind in _PLAIN:
            value = _PLAIN[kind](value)
        elif kind is dict:
            value = plain_scalars(value)
        out[key] = value
    return out


class InfoRoute:
    """How one block's envs send their infos: the block's side of the one decision.

    A value of a key that has a column, and fits it, is written there; everything else goes in
    the block's reply as a report ``(env, final_info, info)``: every info of a reset (the
    columns hold a step's), and both infos of an env that ends an episode under SAME_STEP (its
    final info must reach the merge whole). Replies that are pickled (a worker's) carry their
    numpy scalars as Python ones (:func:`plain_scalars`).

    Parameters
    ----------
    start : int
        The block's first env (reports name envs by their index in the vector env).
    pickled : bool
        Whether the replies are pickled (a worker's block; the calling process's block hands
        its reports over as they are).
    """

    __slots__ = ("start", "pickled", "columns")

    def __init__(self, start: int, pickled: bool) -> None:
        self.start = start
        self.pickled = pickled
        self.columns: ColumnWriter | None = None  # once main attached the info segment

    def before_step(self) -> None:
        """No env of the block has written a column yet."""
        if self.columns is not None:
            self.columns.clear()

    def step_report(self, j: int, info: dict | None, final_info: dict | None) -> tuple | None:
        """Block env ``j``'s report of a step, or ``None`` when its columns took everything.

        ``final_info``: the ended episode's info under SAME_STEP (``None`` otherwise).
        """
        if final_info is None and self.columns is not None and info:
            info = self.columns.write(j, info)  # what is left to send
            if not info:
                return None
        if self.pickled:
            return self.start + j, plain_scalars(final_info), plain_scalars(info) or {}
        return self.start + j, final_info, info or {}

    def reset_report(self, j: int, info: dict) -> tuple:
        """Block env ``j``'s report of a reset (a reset writes no column)."""
        return self.start + j, None, plain_scalars(info) if self.pickled else info


def _accepted(dtype: np.dtype) -> set[type]:
    """The value types that Gymnasium batches into an array of ``dtype`` (a numpy bool is not
    one: it is no ``np.number``, so Gymnasium batches it as an object).
    """
    return {t for t in (_PYTHON.get(dtype), dtype.type) if t is not None and t is not np.bool_}


@dataclass(frozen=True)
class InfoSchema:
    """The info keys that live in columns, with their dtypes."""

    keys: tuple[str, ...]
    dtypes: tuple[np.dtype, ...]

    @classmethod
    def discover(cls, infos: dict[str, Any]) -> InfoSchema | None:
        """The schema of a step's merged ``infos``: its flat keys batched as 1-D numeric arrays
        (``None`` if there is none).
        """
        keys, dtypes = [], []
        for key, value in infos.items():
            if key.startswith("_") or key in _RESERVED or f"_{key}" not in infos:
                continue
            if type(value) is np.ndarray and value.ndim == 1 and value.dtype.kind in "biuf":
                keys.append(key)
                dtypes.append(value.dtype)
        return cls(tuple(keys), tuple(dtypes)) if keys else None


@dataclass(kw_only=True)
class InfoLayout(Regions):
    """The info segment: ``info/<k>`` ``[N]`` of key ``k``'s dtype, then ``info_masks`` ``[K, N]``
    bool (row ``k``: which envs reported key ``k`` in their last step).
    """

    schema: InfoSchema

    @classmethod
    def build(cls, schema: InfoSchema, num_envs: int) -> InfoLayout:
        out = cls(num_envs=num_envs, obs_leaves=[], act_leaves=[], with_final_obs=False, schema=schema)
        for k, dtype in enumerate(schema.dtypes):
            out._add(f"info/{k}", (num_envs,), dtype)
        out._add("info_masks", (len(schema.keys), num_envs), np.bool_)
        return out


class ColumnWriter:
    """A block's side: write its envs' column keys, hand back the rest.

    Parameters
    ----------
    layout : InfoLayout
    buffer : buffer
        This process's mapping of the info segment.
    block : slice
        The block's envs.
    """

    __slots__ = ("columns", "masks")

    def __init__(self, layout: InfoLayout, buffer: Any, block: slice) -> None:
        views = layout.views(buffer)
        self.masks = views["info_masks"][:, block]
        schema = layout.schema
        self.columns = {
            key: (views[f"info/{k}"][block], self.masks[k], _accepted(dtype))
            for k, (key, dtype) in enumerate(zip(schema.keys, schema.dtypes))
        }

    def clear(self) -> None:
        """Before a step: no env of the block has reported anything yet."""
        self.masks[...] = False

    def write(self, j: int, info: dict[str, Any]) -> dict[str, Any] | None:
        """Write block env ``j``'s values of the column keys; return the other items (``None``: none)."""
        columns = self.columns
        rest = None
        for key, value in info.items():
            column = columns.get(key)
            if column is not None and type(value) in column[2]:
                try:
                    column[0][j] = value
                except (OverflowError, ValueError, TypeError):  # an int beyond the column's range
                    pass
                else:
                    column[1][j] = True
                    continue
            if rest is None:
                rest = {}
            rest[key] = value
        return rest


class ColumnReader:
    """Main's side: the column keys of a step's infos, as Gymnasium batches them.

    Parameters
    ----------
    layout : InfoLayout
    views : dict of ndarray
        ``layout.views`` over main's mapping.
    """

    def __init__(self, layout: InfoLayout, views: dict[str, np.ndarray]) -> None:
        self.keys = layout.schema.keys
        # A column value back as a value of the type it was written from, for the reply path.
        self.types = [_PYTHON.get(dtype, dtype.type) for dtype in layout.schema.dtypes]
        self.values = [views[f"info/{k}"] for k in range(len(self.keys))]
        self.masks = views["info_masks"]

    def every_env(self) -> dict[str, Any] | None:
        """The infos of a step in which every env wrote every key (all of them by column), or
        ``None`` when some did not: the common case, in a few array copies.
        """
        masks = self.masks
        if not masks.all():
            return None
        infos: dict[str, Any] = {}
        ones = np.ones(masks.shape[1], dtype=bool)
        for key, values in zip(self.keys, self.values):
            infos[key] = values.copy()
            infos[f"_{key}"] = ones.copy()
        return infos

    def seen(self, ids: range | np.ndarray | None, restarted: Any) -> np.ndarray:
        """``[K, batch]``: which envs of the batch wrote each key in their step (a copy; the
        restarted envs, whose step was lost, wrote nothing).
        """
        seen = self.masks.copy() if ids is None else self.masks[:, ids]
        if len(restarted):
            where = list(restarted) if ids is None else [k for k, i in enumerate(ids) if i in set(restarted)]
            seen[:, where] = False
        return seen

    def fold(self, k: int, seen: np.ndarray, ids: range | np.ndarray | None, reports: dict) -> None:
        """Put key ``k``'s column values back into ``reports`` (``{env: (final_info, info)}``),
        for a key that some env also sent by reply: the reply path then merges it whole.
        """
        key, values, kind = self.keys[k], self.values[k], self.types[k]
        for pos in np.flatnonzero(seen[k]).tolist():
            env = pos if ids is None else int(ids[pos])
            final_info, info = reports.get(env, (None, None))
            reports[env] = (final_info, {**(info or {}), key: kind(values[env])})

    def read(self, infos: dict[str, Any], k: int, seen: np.ndarray, ids: range | np.ndarray | None) -> None:
        """Add key ``k`` and its mask to ``infos``: the batch's values, 0 where an env did not report it."""
        mask = seen[k]
        values = self.values[k].copy() if ids is None else self.values[k][ids]
        if not mask.all():
            values[~mask] = 0
        infos[self.keys[k]] = values
        infos[f"_{self.keys[k]}"] = mask
