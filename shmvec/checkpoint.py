"""Env states and checkpoints on the calling process's side: what ``get_state`` hands out, the
checks of what ``set_state`` gets back, and the file helpers.

The snapshot of each env is taken in the process that steps it (:mod:`shmvec.snapshot`); this
module wraps it with what the calling process holds of that env (its latest observation) and
what the block counts for it (autoreset pending, the running episode).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shmvec.errors import SnapshotError

__all__ = ["EnvState", "load_state", "save_state"]

FORMAT = "shmvec.state_dict/1"


@dataclass(frozen=True, eq=False)
class EnvState:
    """The state of one env of a :class:`~shmvec.ShmVecEnv`, from :meth:`~shmvec.ShmVecEnv.get_state`.

    Opaque and picklable: pass it to :meth:`~shmvec.ShmVecEnv.set_state` of the same vector env
    or of another built from the same env factories, into the same slot or any other.

    Attributes
    ----------
    env_index : int
        The slot it was taken from.
    nbytes : int
        Its size in memory (the env's snapshot and its observation).
    """

    env_index: int
    snapshot: bytes  # the env's layers, from shmvec.snapshot.capture
    obs: tuple[np.ndarray, ...]  # its latest observation: a one-row slice of each observation leaf
    autoreset: bool  # its next step is a reset (NEXT_STEP), or it must be reset (DISABLED)
    episode_return: float  # the running episode, as shmvec counts it
    episode_length: int

    @property
    def nbytes(self) -> int:
        return len(self.snapshot) + sum(leaf.nbytes for leaf in self.obs)

    def __repr__(self) -> str:
        return f"EnvState(env_index={self.env_index}, nbytes={self.nbytes})"


def env_ids(ids: Any, num_envs: int, method: str) -> list[int]:
    """``ids`` (``None``: every env) as a list of distinct env indices, checked."""
    if ids is None:
        return list(range(num_envs))
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{method}: env_ids must be a sequence of ints, got {ids!r:.80}")
    out = [int(i) for i in arr]
    bad = [i for i in out if not 0 <= i < num_envs]
    if bad:
        raise ValueError(f"{method}: env_ids {bad} out of range for {num_envs} envs")
    if len(set(out)) != len(out):
        raise ValueError(f"{method}: env_ids must be distinct, got {out}")
    return out


def by_block(ids: list[int], blocks: Sequence[range]) -> dict[int, list[int]]:
    """The env ids grouped by the block that steps them, in block order."""
    starts = [b.start for b in blocks]
    out: dict[int, list[int]] = {}
    for i in ids:
        block = int(np.searchsorted(starts, i, side="right")) - 1
        out.setdefault(block, []).append(i)
    return dict(sorted(out.items()))


def check_states(states: Any, ids: list[int], leaves: list[np.ndarray]) -> list[EnvState]:
    """``states`` checked against the slots ``ids`` and the observation ``leaves`` they go into."""
    if isinstance(states, EnvState):
        raise TypeError("set_state: states must be a list of EnvState (one per env of env_ids), got one EnvState")
    states = list(states)
    if len(states) != len(ids):
        raise ValueError(f"set_state: got {len(states)} states for {len(ids)} envs (env_ids)")
    for k, state in enumerate(states):
        if not isinstance(state, EnvState):
            raise TypeError(f"set_state: states[{k}] is a {type(state).__name__}, expected an EnvState from get_state")
        if len(state.obs) != len(leaves) or any(
            saved.shape[1:] != leaf.shape[1:] or saved.dtype != leaf.dtype for saved, leaf in zip(state.obs, leaves)
        ):
            found = [(s.shape[1:], str(s.dtype)) for s in state.obs]
            wanted = [(v.shape[1:], str(v.dtype)) for v in leaves]
            raise SnapshotError(
                f"set_state: the state for env {ids[k]} (taken from env {state.env_index}) has observation "
                f"leaves {found}, this vector env {wanted}: it comes from envs with another observation space"
            )
    return states


def space_rngs(env: Any) -> dict[str, Any]:
    """The random-generator states of ``env``'s spaces (what ``action_space.sample()`` draws from).

    A batched space not built yet is left out: built later, it copies its single space's generator.
    """
    out = {}
    for name in ("single_action_space", "single_observation_space", "action_space", "observation_space"):
        space = env.__dict__.get(name if name.startswith("single") else f"_batched_{name}")
        if space is not None:
            out[name] = space.np_random.bit_generator.state
    return out


def set_space_rngs(env: Any, rngs: dict[str, Any]) -> None:
    for name, state in rngs.items():
        getattr(env, name).np_random.bit_generator.state = state
    for name in ("action_space", "observation_space"):  # built after the checkpoint: built later here too
        if name not in rngs:
            env.__dict__.pop(f"_batched_{name}", None)


def save_state(envs: Any, path: str | os.PathLike) -> None:
    """Write ``envs.state_dict()`` to ``path`` (pickled; written whole, then renamed into place).

    >>> import shmvec
    >>> envs = shmvec.make("CartPole-v1", num_envs=2, num_workers=1)
    >>> _ = envs.reset(seed=0)
    >>> import tempfile, os; path = os.path.join(tempfile.mkdtemp(), "envs.ckpt")
    >>> shmvec.save_state(envs, path)
    >>> envs.close()
    >>> envs = shmvec.make("CartPole-v1", num_envs=2, num_workers=1)
    >>> obs = shmvec.load_state(envs, path)
    >>> obs.shape
    (2, 4)
    >>> envs.close()
    """
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(envs.state_dict(), f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def load_state(envs: Any, path: str | os.PathLike) -> Any:
    """Read a checkpoint that :func:`save_state` wrote into ``envs``; return their observations
    (``envs.load_state_dict``). Only load files you trust: they are pickles.
    """
    with open(os.fspath(path), "rb") as f:
        return envs.load_state_dict(pickle.load(f))
