"""What the caller gets of the shared results: copies or read-only views, of every env or of a batch.

Workers write each step's observations, rewards and flags into the segment; ``reset``, ``step``
and ``recv`` hand them out from here, as owned copies (``copy=True``) or as read-only views
valid until the next command (``copy=False``). Variable-size leaves (Text, Sequence, Graph,
OneOf) are ``[num_envs]`` object arrays of this process, batched as Gymnasium does: a tuple
of one object per env.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces

from shmvec.errors import NonFiniteError
from shmvec.layout import Layout
from shmvec.stepper import Targets
from shmvec.tree import assemble

__all__ = ["CopyOut", "Results", "SharedBuffers"]

Index = slice | np.ndarray  # the envs of a batch: a slice when they are adjacent

# A block's observations are copied out as soon as the block finishes a step, while the others
# still step, when they are at least this many bytes: about what a wake-up of the calling
# process costs in copying (smaller ones are copied after the round, with one wake-up).
COPY_AS_DONE_BYTES = 64 * 1024


class SharedBuffers(NamedTuple):
    """Read-only views of the shared memory that ``reset``, ``step`` and ``recv`` write every
    env's results into (``[num_envs, ...]`` each; ``obs`` nested as the observation space).

    They stay valid until ``close`` and always hold each env's latest results. A variable-size
    leaf (Text, Sequence, Graph, OneOf) is a ``[num_envs]`` object array of the main process.
    """

    obs: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class Results:
    """The result regions of one segment, and the batches handed out of them.

    Parameters
    ----------
    space : gymnasium.Space
        The single (per-env) observation space.
    layout : Layout
    views : dict of ndarray
        ``layout.views(buffer)`` in this process.

    Attributes
    ----------
    home : Targets
        Where a synchronous step reads its actions and writes its results (a rollout's rows
        are other :class:`~shmvec.stepper.Targets`).
    buffers : SharedBuffers
        Read-only views of every env's latest results.
    """

    def __init__(self, space: spaces.Space, layout: Layout, views: dict[str, np.ndarray], blocks: list[range]) -> None:
        self.space = space
        self.leaves = layout.obs_leaves
        obs = layout.leaf_views(views, "obs")
        final = layout.leaf_views(views, "final_obs") if layout.with_final_obs else []
        act = layout.leaf_views(views, "act")
        self.home = Targets(obs, final, act, views["rewards"], views["terminations"], views["truncations"])
        self._obs_ro = [_read_only(v) for v in obs]
        self._rewards_ro, self._terms_ro, self._truncs_ro = (
            _read_only(views[name]) for name in ("rewards", "terminations", "truncations")
        )
        self.buffers = SharedBuffers(assemble(space, self._obs_ro), self._rewards_ro, self._terms_ro, self._truncs_ro)
        self._flat = len(self.leaves) == 1 and not self.leaves[0].path
        # Variable-size leaves: batched as a tuple of one object per env, as Gymnasium does.
        self._pickled = [leaf.pickled for leaf in self.leaves] if layout.pickled("obs/") else None
        self._blocks: list[range] | None = None  # (pickled leaves are copied after the round)
        if self._pickled is None:
            row_bytes = sum(v.nbytes // len(v) for v in obs)
            if max(len(block) for block in blocks) * row_bytes >= COPY_AS_DONE_BYTES:
                self._blocks = blocks
        self.copies_as_done = self._blocks is not None  # (see copy_out)
        # The usual observation, one array of fixed-size values: what a step copies out of it.
        self._plain = obs[0] if self._flat and self._pickled is None else None

    def copy_out(self) -> CopyOut | None:
        """Where the next step's observations are copied block by block as the blocks finish
        (:meth:`step` takes it); ``None`` where they are copied after the round (small ones).
        """
        return None if self._blocks is None else CopyOut(self.home.obs, self._blocks)

    def observations(self, copy: bool) -> Any:
        """Every env's latest observation."""
        if self._pickled is not None:
            return self._with_objects(slice(None), True, copy)
        if not copy:
            return self.buffers.obs
        return self._tree([v.copy() for v in self.home.obs])

    def _tree(self, leaves: list[np.ndarray]) -> Any:
        return leaves[0] if self._flat else assemble(self.space, leaves)

    def step(self, copy: bool, taken: CopyOut | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """``(obs, rewards, terminations, truncations)`` of every env; with ``copy``, the
        observations are ``taken``'s where the step copied them as its blocks finished.
        """
        home = self.home
        if copy:
            if taken is not None:
                obs = self._tree(taken.finish())
            elif self._plain is not None:
                obs = self._plain.copy()
            else:
                obs = self.observations(True)
            return obs, home.rewards.copy(), home.terminations.copy(), home.truncations.copy()
        obs = self.buffers.obs if self._pickled is None else self.observations(False)
        return obs, self._rewards_ro, self._terms_ro, self._truncs_ro

    def batch(
        self, index: Index, contiguous: bool, copy: bool, kept: list | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """``(obs, rewards, terminations, truncations)`` of the envs ``index`` (a batch of
        :meth:`~shmvec.ShmVecEnv.recv`); views only where ``copy=False`` and they are adjacent.

        ``kept``: an empty list the caller keeps with the batch, where the read-only views of its
        rows are made once and kept (adjacent envs, fixed-size leaves): every later ``recv`` of
        that batch copies them, or hands them out, with no slicing.
        """
        if kept is not None and contiguous and self._pickled is None:
            if not kept:
                kept += [v[index] for v in self._obs_ro], self._rewards_ro[index], self._terms_ro[index]
                kept += (self._truncs_ro[index],)
            leaves, rewards, terms, truncs = kept
            if not copy:
                return self._tree(leaves), rewards, terms, truncs
            return self._tree([v.copy() for v in leaves]), rewards.copy(), terms.copy(), truncs.copy()
        home = self.home
        if self._pickled is not None:
            obs = self._with_objects(index, contiguous, copy)
        elif not copy and contiguous:
            obs = assemble(self.space, [v[index] for v in self._obs_ro])
        else:  # fancy indexing copies already
            obs = assemble(self.space, [v[index].copy() if contiguous else v[index] for v in home.obs])
        if not copy and contiguous:
            return obs, self._rewards_ro[index], self._terms_ro[index], self._truncs_ro[index]
        return obs, home.rewards[index].copy(), home.terminations[index].copy(), home.truncations[index].copy()

    def _with_objects(self, index: Index, contiguous: bool, copy: bool) -> Any:
        """The observations of the envs ``index`` when the space has pickled leaves: those are
        a tuple of one object per env (deep copies with ``copy=True``), as Gymnasium's
        ``concatenate`` batches them; the other leaves as :meth:`batch` gives them.
        """
        assert self._pickled is not None
        leaves = []
        views = self.home.obs if copy or not contiguous else self._obs_ro
        for view, pickled in zip(views, self._pickled):
            part = view[index]
            if pickled:
                part = deepcopy(tuple(part)) if copy else tuple(part)
            elif copy and contiguous:
                part = part.copy()
            leaves.append(part)
        return assemble(self.space, leaves)

    def check_finite(self, rewards: bool, index: Index = slice(None), out: Targets | None = None) -> None:
        """Raise :class:`~shmvec.NonFiniteError` naming the first env of ``index`` whose reward
        (with ``rewards``) or floating-point observation in ``out`` (default: :attr:`home`) is
        NaN or infinite.
        """
        out = self.home if out is None else out
        arrays = [("reward", out.rewards)] if rewards else []
        arrays += [
            (f"observation{leaf.field}", view) for leaf, view in zip(self.leaves, out.obs) if view.dtype.kind == "f"
        ]
        for name, arr in arrays:
            finite = np.isfinite(arr[index])
            if not finite.all():
                env = int(np.arange(len(arr))[index][np.argwhere(~finite)[0][0]])
                raise NonFiniteError(f"env {env} returned a non-finite {name}: {arr[env]!r}", env)


class CopyOut:
    """Owned copies of every env's observations, taken one block at a time: each block as it
    finishes a step (:meth:`block`, ``WorkerPool.wait``'s ``on_done``), what is left after it
    (:meth:`finish`: blocks that failed, were restarted, or finished unseen).
    """

    __slots__ = ("leaves", "_src", "_blocks", "_left")

    def __init__(self, src: list[np.ndarray], blocks: list[range]) -> None:
        self.leaves = [np.empty_like(v) for v in src]
        self._src, self._blocks = src, blocks
        self._left = [True] * len(blocks)

    def block(self, block: int) -> None:
        """Copy the observations of ``block``'s envs, which it finished writing."""
        rows = self._blocks[block]
        index = slice(rows.start, rows.stop)
        for dst, src in zip(self.leaves, self._src):
            dst[index] = src[index]
        self._left[block] = False

    def finish(self) -> list[np.ndarray]:
        """The copies, once the blocks not copied yet are."""
        for block, left in enumerate(self._left):
            if left:
                self.block(block)
        return self.leaves
