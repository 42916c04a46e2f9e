"""Gymnasium's dict-of-arrays infos, for a batch of any size.

Gymnasium's ``VectorEnv._add_info`` sizes its arrays by the vector env's ``num_envs``;
asynchronous collection returns batches of ``batch_size`` envs, so shmvec builds infos with
this function for both. It reproduces Gymnasium's rules exactly (tested against
``SyncVectorEnv``): every key gets an array of the batch's length plus a ``_key`` bool mask;
the first value seen for a key picks the array's type (numbers: that dtype, arrays: that
dtype and shape, anything else: an object array); nested dicts recurse; ``final_obs`` is
always an object array. :class:`InfoMerger` builds a step's infos from the envs' reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from shmvec.info_columns import ColumnReader
from shmvec.stepper import Targets
from shmvec.tree import Leaf, assemble


def add_info(
    infos: dict[str, Any],
    info: dict[str, Any],
    index: int,
    size: int,
    columns: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Merge one env's ``info`` into the batch ``infos`` at position ``index`` (of ``size``).

    ``columns``: when merging many envs into the same ``infos``, pass one dict for all of them;
    it keeps each flat key's ``(array, mask)``, so that later envs write their values straight
    in instead of looking the key up twice.
    """
    for key, value in info.items():
        if columns is not None:
            column = columns.get(key)
            if column is not None:
                column[0][index] = value
                column[1][index] = True
                continue
        if key == "final_obs":
            array = infos.get(key)
            if array is None:
                array = np.full(size, None, dtype=object)
            array[index] = value
        elif isinstance(value, dict):
            array = add_info(infos.get(key, {}), value, index, size)
        else:
            array = infos.get(key)
            if array is None:
                if type(value) in (int, float, bool) or isinstance(value, np.number):
                    array = np.zeros(size, dtype=type(value))
                elif isinstance(value, np.ndarray):
                    array = np.zeros((size, *value.shape), dtype=value.dtype)
                else:
                    array = np.full(size, None, dtype=object)
            array[index] = value
        mask = infos.get(f"_{key}")
        if mask is None:
            mask = np.zeros(size, dtype=np.bool_)
        mask[index] = True
        infos[key], infos[f"_{key}"] = array, mask
        if columns is not None and key != "final_obs" and type(array) is np.ndarray:
            columns[key] = (array, mask)
    return infos


def concat_infos(parts: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    """Join the infos of consecutive batches (of ``sizes`` envs each) into one batch's infos.

    The result is what :func:`add_info` would have built over all the envs in order: the first
    batch that has a key picks its array's type; batches without it contribute zeros (``None``
    in object arrays) and False in its ``_key`` mask.
    """
    total = sum(sizes)
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for part in parts for k in part):
        values = [part.get(key) for part in parts]
        first = next(v for v in values if v is not None)
        if isinstance(first, dict):
            out[key] = concat_infos([{} if v is None else v for v in values], sizes)
            continue
        first = np.asarray(first)
        if first.dtype == object:
            array = np.full(total, None, dtype=object)
        else:
            array = np.zeros((total, *first.shape[1:]), dtype=first.dtype)
        start = 0
        for value, size in zip(values, sizes):
            if value is not None:
                array[start : start + size] = value
            start += size
        out[key] = array
    return out


class InfoMerger:
    """Gymnasium's dict-of-arrays infos of a step, built from the envs' reports in env order,
    exactly as ``SyncVectorEnv`` builds them.

    Parameters
    ----------
    space : gymnasium.Space
        The single (per-env) observation space, for ``final_obs``.
    leaves : list of Leaf
        Its leaves (``layout.obs_leaves``), in the order of the final observation views.
    num_envs : int
    """

    def __init__(self, space: spaces.Space, leaves: list[Leaf], num_envs: int) -> None:
        self.space = space
        self.num_envs = num_envs
        # infos["final_obs"] holds one env's observation as the env returned it, as SyncVectorEnv
        # keeps it: envs give a Discrete observation as a Python int, any other fixed leaf as an
        # array (0-d for a scalar Box), a pickled leaf as its object. Read back, each is made so again.
        self._items = [
            _object_item if leaf.pickled else _int_item if isinstance(leaf.space, spaces.Discrete) else _array_item
            for leaf in leaves
        ]
        # The scalar infos in shared memory (shmvec.info_columns), once the vector env set them up.
        self.columns: ColumnReader | None = None

    def merge(
        self,
        replies: list,
        same_step: bool,
        out: Targets,
        restarted: Sequence[int],
        ids: range | np.ndarray | None = None,
        with_columns: bool = True,
    ) -> dict[str, Any]:
        """The infos of one step.

        Parameters
        ----------
        replies : list
            Each block's reply: ``None``, or ``[(env, final_info, info), ...]`` of the envs that
            had something to report.
        same_step : bool
            The step ran under SAME_STEP autoreset: ended envs give ``final_obs``/``final_info``.
        out : Targets
            Where the step wrote its flags and final observations.
        restarted : list of int
            Envs that a restart replaced in this step (``infos["restarted"]``; no final obs).
        ids : range or ndarray, optional
            The envs of the batch (all envs when ``None``); info arrays are indexed by
            position in the batch.
        with_columns : bool
            Whether the round wrote the scalar info columns (a step did, a reset did not).
        """
        reports = _reports(replies) if any(replies) else {}
        reader = self.columns if with_columns else None
        if not reports and not len(restarted):
            # A step in which no env reported ended no episode under SAME_STEP either (an env
            # that ends one always reports its final info): only the columns can have news.
            if reader is None:
                return {}  # the usual step of an env without infos
            if ids is None:
                every = reader.every_env()  # the usual MuJoCo or ALE step: each env wrote each key
                if every is not None:
                    return every
        written: list[int] = []  # the column keys some env of the batch wrote
        if reader is not None:
            seen = reader.seen(ids, restarted)
            written = np.flatnonzero(seen.any(axis=1)).tolist()
            if written and reports:
                self._fold_replied(reader, written, seen, ids, reports)
        if not (reports or restarted or written):
            return {}
        terms, truncs = out.terminations, out.truncations
        if ids is None:
            size, pos = self.num_envs, None
            ended = np.flatnonzero(terms | truncs).tolist() if same_step else []
        else:
            size = len(ids)
            pos = {int(i): k for k, i in enumerate(ids)}
            ended = [int(ids[k]) for k in np.flatnonzero(terms[ids] | truncs[ids])] if same_step else []
        ended = [i for i in ended if i not in restarted]  # a restarted env has no final obs to give
        infos: dict[str, Any] = {}
        columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # the envs' flat keys, once seen
        for i in sorted(reports.keys() | set(ended) | set(restarted)):
            k = i if pos is None else pos[i]
            final_info, info = reports.get(i, (None, None))
            if i in ended:
                final_obs = assemble(self.space, [item(v, i) for v, item in zip(out.final_obs, self._items)])
                add_info(infos, {"final_obs": final_obs, "final_info": final_info or {}}, k, size)
            if info:
                add_info(infos, info, k, size, columns)
            if i in restarted:
                add_info(infos, {"restarted": True}, k, size)
        if reader is not None:
            for k in written:
                reader.read(infos, k, seen, ids)
        return infos

    @staticmethod
    def _fold_replied(
        reader: ColumnReader,
        written: list[int],
        seen: np.ndarray,
        ids: range | np.ndarray | None,
        reports: dict[int, tuple[Any, Any]],
    ) -> None:
        """Move the column keys that some env of the batch also sent by reply from ``written``
        into ``reports``, so that :meth:`merge` builds each such key from the replies alone.

        A key's array takes its type from the first value seen in env order, which a column
        cannot know when the replies hold values of it too.

        Parameters
        ----------
        reader : ColumnReader
        written : list of int
            The column keys that some env of the batch wrote; those folded are removed.
        seen : ndarray
            ``reader.seen(ids, restarted)``.
        ids : range or ndarray, optional
            As for :meth:`merge`.
        reports : dict
            ``{env: (final_info, info)}``; the folded keys' values join the envs' ``info``.
        """
        replied = {key for _, info in reports.values() if info for key in info}
        for k in [k for k in written if reader.keys[k] in replied]:
            reader.fold(k, seen, ids, reports)
            written.remove(k)


def _int_item(view: np.ndarray, i: int) -> int:
    return view[i].item()


def _array_item(view: np.ndarray, i: int) -> np.ndarray:
    return view[i, ...].copy()


def _object_item(view: np.ndarray, i: int) -> Any:
    return view[i]


def _reports(replies: list) -> dict[int, tuple[Any, Any]]:
    """``{env: (final_info, info)}`` of the envs that reported in the blocks' ``replies``."""
    return {env: (final_info, info) for block in replies if block for env, final_info, info in block}
