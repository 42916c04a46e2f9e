"""Where every per-step array lives inside the one shared-memory segment of a vector env.

A :class:`Layout` is computed once, in the main process, from the single observation and
action spaces. It is a small picklable description (names, dtypes, shapes, byte offsets); both
the main process and the workers turn it into numpy views over the same buffer with
:meth:`Layout.views`. See ``docs/architecture.md`` for the picture.

Leaves whose samples have no fixed size (Text, Sequence, Graph, OneOf, custom spaces) are
*pickled leaves*: their regions take no bytes of the segment. Each process gets a private
``object`` array of the region's shape instead, and what a worker writes there travels with
the reply of its command (see ``protocol``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from shmvec.protocol import REPLY_BYTES
from shmvec.tree import PICKLED, Leaf, space_leaves

ALIGN = 64  # a cache line: arrays written by different processes never share one

# Control block: one cache line (8 int64 words) per block, then one for the main process.
CTRL_WORDS = 8


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Region:
    """A named array of the segment; ``offset`` is -1 for a pickled one (no bytes there)."""

    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(kw_only=True)
class Regions:
    """Named, 64-byte aligned arrays packed one after the other into one segment, for
    ``num_envs`` envs whose observations and actions are made of ``obs_leaves`` and
    ``act_leaves`` (plus their final observations where ``with_final_obs``).
    """

    num_envs: int
    obs_leaves: list[Leaf]
    act_leaves: list[Leaf]
    with_final_obs: bool
    regions: dict[str, Region] = field(default_factory=dict)
    size: int = 0

    def _add(self, name: str, shape: tuple[int, ...], dtype: Any) -> None:
        dtype = np.dtype(dtype)
        if dtype == PICKLED:  # Python objects cannot live in shared memory
            self.regions[name] = Region(name, -1, tuple(shape), dtype)
            return
        region = Region(name, self.size, tuple(shape), dtype)
        self.regions[name] = region
        self.size = _align(self.size + max(region.nbytes, 1))

    def _add_leaves(self, obs_rows: tuple[int, ...], rows: tuple[int, ...]) -> None:
        """The ``obs/<i>`` regions (``[*obs_rows, *leaf shape]``), then ``final_obs/<i>`` if
        any and ``act/<i>`` (``[*rows, *leaf shape]``).
        """
        for i, leaf in enumerate(self.obs_leaves):
            self._add(f"obs/{i}", (*obs_rows, *leaf.shape), leaf.dtype)
        if self.with_final_obs:
            for i, leaf in enumerate(self.obs_leaves):
                self._add(f"final_obs/{i}", (*rows, *leaf.shape), leaf.dtype)
        for i, leaf in enumerate(self.act_leaves):
            self._add(f"act/{i}", (*rows, *leaf.shape), leaf.dtype)

    def views(self, buf: Any) -> dict[str, np.ndarray]:
        """Numpy views of every region over ``buf`` (a writable buffer of ``self.size`` bytes);
        for a pickled region, a new array of ``None`` private to the calling process.
        """
        return {
            r.name: np.full(r.shape, None, dtype=PICKLED)
            if r.offset < 0
            else np.ndarray(r.shape, dtype=r.dtype, buffer=buf, offset=r.offset)
            for r in self.regions.values()
        }

    def pickled(self, *prefixes: str) -> list[str]:
        """The names of the pickled regions whose names start with one of ``prefixes``
        (``'obs/'``, ``'final_obs/'``, ``'act/'``).
        """
        return [r.name for r in self.regions.values() if r.offset < 0 and r.name.startswith(prefixes)]

    def leaf_views(self, views: dict[str, np.ndarray], prefix: str) -> list[np.ndarray]:
        """The per-leaf arrays of ``prefix`` ('obs', 'final_obs' or 'act'), in leaf order."""
        count = len(self.act_leaves if prefix == "act" else self.obs_leaves)
        return [views[f"{prefix}/{i}"] for i in range(count)]


def control_lines(views: dict) -> list[memoryview]:
    """The ``ctrl`` region as one int64 memoryview per line (the blocks' lines, then main's).

    The hot paths poll and write single words; a memoryview item costs about a third of a
    numpy scalar's indexing and comes back as a plain ``int``.
    """
    return [memoryview(line) for line in views["ctrl"]]


@dataclass(kw_only=True)
class Layout(Regions):
    """Byte offsets of every array in the segment.

    Regions (each ``[num_envs, ...]`` unless noted, each 64-byte aligned):

    - ``ctrl``: ``[num_blocks + 1, 8]`` int64, one cache line per block plus the main process
    - ``obs/<i>``: one per observation leaf
    - ``final_obs/<i>``: one per observation leaf (same-step autoreset only)
    - ``act/<i>``: one per action leaf
    - ``rewards`` float64, ``terminations`` / ``truncations`` / ``autoreset`` bool
    - ``last_return`` float64, ``last_length`` int64, ``episode_count`` int64: the last finished one
    - ``replies``: ``[num_blocks, REPLY_BYTES]`` uint8, each block's last pickled reply (when it fits)
    - ``busy``: ``[num_blocks, 8]`` float64, one cache line per block: word 0 counts the seconds
      the block's worker has spent running commands (``ShmVecEnv.diagnose`` reads it)

    The ``obs``, ``final_obs`` and ``act`` regions of pickled leaves are ``[num_envs]`` object
    arrays outside the segment (see the module docstring).
    """

    num_blocks: int

    @classmethod
    def build(
        cls,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        num_envs: int,
        num_blocks: int,
        with_final_obs: bool,
    ) -> Layout:
        layout = cls(
            num_envs=num_envs,
            num_blocks=num_blocks,
            obs_leaves=space_leaves(observation_space),
            act_leaves=space_leaves(action_space),
            with_final_obs=with_final_obs,
        )
        n = num_envs
        layout._add("ctrl", (num_blocks + 1, CTRL_WORDS), np.int64)
        layout._add_leaves((n,), (n,))
        layout._add("rewards", (n,), np.float64)
        layout._add("terminations", (n,), np.bool_)
        layout._add("truncations", (n,), np.bool_)
        layout._add("autoreset", (n,), np.bool_)
        layout._add("last_return", (n,), np.float64)
        layout._add("last_length", (n,), np.int64)
        layout._add("episode_count", (n,), np.int64)
        layout._add("replies", (num_blocks, REPLY_BYTES), np.uint8)
        layout._add("busy", (num_blocks, CTRL_WORDS), np.float64)
        return layout


@dataclass(kw_only=True)
class RolloutLayout(Regions):
    """The rollout segment: ``[T, N]`` storage that workers fill step by step, in place.

    Regions (``T = num_steps``, ``N = num_envs``, each 64-byte aligned):

    - ``obs/<i>``: ``[T + 1, N, ...]``; row ``t`` is the observation action ``t`` is taken on,
      row ``T`` the observation after the last step (the next rollout's row 0)
    - ``final_obs/<i>``: ``[T, N, ...]`` (same-step autoreset only): where step ``t`` ended an episode
    - ``act/<i>``: ``[T, N, ...]``, written by main before step ``t``
    - ``rewards`` float64, ``terminations`` / ``truncations`` bool: ``[T, N]``, written by step ``t``

    A block stepping row ``t`` reads ``act[t]`` and writes ``rewards[t]``, the flags,
    ``final_obs[t]`` and ``obs[t + 1]``.
    """

    num_steps: int

    @classmethod
    def build(cls, layout: Layout, num_steps: int) -> RolloutLayout:
        """The rollout storage for ``num_steps`` steps of the vector env laid out by ``layout``."""
        out = cls(
            num_envs=layout.num_envs,
            num_steps=num_steps,
            obs_leaves=layout.obs_leaves,
            act_leaves=layout.act_leaves,
            with_final_obs=layout.with_final_obs,
        )
        t, n = num_steps, layout.num_envs
        out._add_leaves((t + 1, n), (t, n))
        out._add("rewards", (t, n), np.float64)
        out._add("terminations", (t, n), np.bool_)
        out._add("truncations", (t, n), np.bool_)
        return out
