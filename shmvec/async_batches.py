"""Asynchronous collection's batches: which envs a ``recv`` hands back, and which blocks a ``send`` steps.

A batch is made of whole blocks (a worker steps all of its envs at once). Its env ids are made
once per combination of blocks and handed out read-only, so that the usual loop, which passes
``recv``'s ids straight back to ``send``, is recognised by identity at no cost.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from shmvec.pool import BlockState
from shmvec.results import Index

__all__ = ["Batch", "Batches"]


class Batch(NamedTuple):
    """The envs of whole blocks, as ``recv`` returns them and ``send`` takes them back."""

    ids: np.ndarray  # read-only, in env order
    rows: Index  # into the ``[num_envs, ...]`` regions: a slice when the blocks are adjacent
    contiguous: bool
    blocks: list[int]
    views: list  # its rows' read-only result views, made by the first recv of it (Results.batch)


class Batches:
    """The batches of a vector env whose blocks are ``blocks`` (each a range of env ids)."""

    def __init__(self, blocks: list[range]) -> None:
        self.blocks = blocks
        self._made: dict[tuple[int, ...], Batch] = {}

    def of(self, ready: list[int]) -> Batch:
        """The batch made of the blocks ``ready`` (in block order)."""
        key = tuple(ready)
        batch = self._made.get(key)
        if batch is None:
            envs = [self.blocks[b] for b in ready]
            contiguous = all(a.stop == b.start for a, b in zip(envs, envs[1:]))
            ids = np.concatenate([np.arange(r.start, r.stop) for r in envs])
            ids.flags.writeable = False  # so that send() can tell them by identity
            rows: Index = slice(envs[0].start, envs[-1].stop) if contiguous else ids
            batch = self._made[key] = Batch(ids, rows, contiguous, list(ready), [])
        return batch

    def release(self) -> None:
        """Drop every batch's views of the results (the vector env closed)."""
        for batch in self._made.values():
            batch.views.clear()

    def covering(self, env_ids: np.ndarray, states: list[BlockState], after_recv: bool) -> Batch:
        """The batch of the idle blocks that ``env_ids`` covers exactly, or a ValueError saying
        what is expected (``after_recv``: a ``recv`` returned a batch since the last ``send``).
        """
        ids = np.asarray(env_ids)
        hint = "the env_ids returned by the last recv()" if after_recv else "env ids of whole idle workers' blocks"
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise ValueError(f"env_ids must be a 1-d integer array of {hint}; got {ids!r:.120}")
        starts = {envs.start: b for b, envs in enumerate(self.blocks)}
        out: list[int] = []
        pos = 0
        while pos < ids.size:
            block = starts.get(int(ids[pos]), -1)
            envs = self.blocks[block] if block >= 0 else None
            if envs is None or not np.array_equal(ids[pos : pos + len(envs)], np.arange(envs.start, envs.stop)):
                raise ValueError(f"env_ids must be {hint} (whole blocks of workers' envs); got {ids!r:.120}")
            if block in out:
                raise ValueError(f"env_ids repeats a block: {ids!r:.120}")
            if states[block] is not BlockState.IDLE:
                raise ValueError(f"envs {envs.start}..{envs.stop - 1} are already stepping: send() takes {hint}")
            out.append(block)
            pos += len(envs)
        return self.of(out)
