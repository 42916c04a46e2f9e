"""Gymnasium's dict-of-arrays infos, for a batch of any size.

Gymnasium's ``VectorEnv._add_info`` sizes its arrays by the vector env's ``num_envs``;
asynchronous collection returns batches of ``batch_size`` envs, so shmvec builds infos with
this function for both. It reproduces Gymnasium's rules exactly (tested against
``SyncVectorEnv``): every key gets an array of the batch's length plus a ``_key`` bool mask;
the first value seen for a key picks the array's type (numbers: that dtype, arrays: that
dtype and shape, anything else: an object array); nested dicts recurse; ``final_obs`` is
always an object array.
"""

from __future__ import annotations

from typing import Any

import numpy as np


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
    in (a step of 16 MuJoCo envs with nine keys each: 40 % less time).
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
