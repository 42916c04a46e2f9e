"""Env states and checkpoints on the calling process's side: what ``get_state`` hands out, the
checks of what ``set_state`` gets back, and the file helpers.

The snapshot of each env is taken in the process that steps it (:mod:`shmvec.snapshot`); this
module wraps it with what the calling process holds of that env (its latest observation) and
what the block counts for it (autoreset pending, the running episode).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shmvec.errors import SnapshotError, WorkerError
from shmvec.lifecycle import Lifecycle
from shmvec.protocol import Command
from shmvec.session import Session

__all__ = ["EnvState", "Snapshots", "load_state", "save_state"]

FORMAT = "shmvec.state_dict/1"
# The episode statistics a state_dict carries: (shared region, key).
_EPISODE_STATS = (
    ("last_return", "episode_returns"),
    ("last_length", "episode_lengths"),
    ("episode_count", "episode_counts"),
)


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


def env_ids_of(ids: Any, num_envs: int, method: str) -> list[int]:
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


class Snapshots:
    """The snapshot and checkpoint part of :class:`~shmvec.ShmVecEnv`'s API (a base class of it)."""

    _session: Session
    num_envs: int
    autoreset_mode: Any
    copy: bool

    def get_state(self, env_ids: Sequence[int] | np.ndarray | None = None) -> list[EnvState]:
        """Snapshot the envs ``env_ids`` (default: all): one opaque, picklable :class:`EnvState` each.

        A state holds everything the env's next steps depend on: the env and each wrapper
        (their RNGs, a ``TimeLimit``'s step count, frame stacks, episode statistics), the
        emulator of an ALE env, the simulator of a MuJoCo env, and what shmvec keeps per env
        (its latest observation, a pending autoreset, the running episode's return and length).
        After :meth:`set_state` the same actions give bit-identical results (``docs/snapshots.md``).

        >>> import shmvec
        >>> envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2)
        >>> obs, _ = envs.reset(seed=0)
        >>> saved = envs.get_state()
        >>> first = envs.step([1, 0, 1, 0])[0]
        >>> _ = envs.set_state(saved)
        >>> bool((envs.step([1, 0, 1, 0])[0] == first).all())
        True
        >>> envs.close()

        Raises
        ------
        SnapshotError
            An env whose state cannot be captured (it names the env and the attribute in the
            way); the vector env stays usable.
        """
        session = self._session
        session.guard("get_state", sync=False)
        ids = env_ids_of(env_ids, self.num_envs, "get_state")
        groups = by_block(ids, session.pool.blocks)
        replies = self._state_round(Command.GET_STATE, groups, lambda i, offset: offset, "get_state")
        obs = session.latest
        found = {}
        for block, members in groups.items():
            for i, (snapshot, pending, ret, length) in zip(members, replies[block]):
                found[i] = EnvState(i, snapshot, tuple(leaf[i : i + 1].copy() for leaf in obs), pending, ret, length)
        return [found[i] for i in ids]

    def set_state(self, states: Sequence[EnvState], env_ids: Sequence[int] | np.ndarray | None = None) -> Any:
        """Put the envs ``env_ids`` (default: all) in the states :meth:`get_state` gave; return
        their observations (one row per env of ``env_ids``, as :meth:`reset` would).

        A state may come from any slot, of this vector env or of another built from the same
        factories (a new process, a restarted worker). With every env restored, a vector env
        that was never reset is ready to step.

        Raises
        ------
        SnapshotError
            A state taken from envs of another kind (other wrappers, another space).
        """
        everything = env_ids is None or (np.size(env_ids) == self.num_envs)
        session = self._session
        session.guard("set_state", needs_reset=not everything, sync=False)
        ids = env_ids_of(env_ids, self.num_envs, "set_state")
        home = session.home.obs
        states = check_states(states, ids, home)
        groups = by_block(ids, session.pool.blocks)
        by_id = dict(zip(ids, states))

        def record(i: int, offset: int) -> tuple:
            s = by_id[i]
            return offset, (s.snapshot, s.autoreset, s.episode_return, s.episode_length)

        session.to_home()
        self._state_round(Command.SET_STATE, groups, record, "set_state")
        for i, state in by_id.items():
            for dst, saved in zip(home, state.obs):
                dst[i : i + 1] = saved
        if everything:
            session.state = Lifecycle.READY
        rows = np.asarray(ids)
        contiguous = bool(len(ids)) and ids == list(range(ids[0], ids[0] + len(ids)))
        return session.results.batch(slice(ids[0], ids[-1] + 1) if contiguous else rows, contiguous, self.copy)[0]

    def _state_round(
        self, cmd: int, groups: dict[int, list[int]], item: Callable[[int, int], Any], method: str
    ) -> list:
        """A GET_STATE or SET_STATE round on the blocks of ``groups`` (``{block: env ids}``, none
        in flight): each block's payload holds ``item(env id, offset in the block)`` per env. A
        :class:`SnapshotError` in a block is raised as itself.
        """
        session = self._session
        blocks, env_blocks = list(groups), session.pool.blocks
        payloads: list[Any] = [None] * len(env_blocks)
        for block, members in groups.items():
            start = env_blocks[block].start
            payloads[block] = [item(i, i - start) for i in members]
        busy = [b for b in blocks if session.in_flight([b])]
        if busy:
            envs = [i for b in busy for i in env_blocks[b]]
            raise ValueError(f"{method}: envs {envs} are in flight (sent, not received): recv() them first")
        try:
            return session.round(cmd, payloads, blocks)
        except WorkerError as exc:
            if isinstance(exc.error, SnapshotError):
                raise exc.error from exc
            raise

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this vector env elsewhere, bit for bit: every env's
        :meth:`get_state`, the episode statistics, and the random generators of the spaces
        (``action_space.sample()``). A picklable dict; see :meth:`load_state_dict` and
        :func:`shmvec.save_state`. Nothing may be in flight (receive every batch first).
        """
        self._session.guard("state_dict", sync=False)
        if self._session.in_flight():
            raise ValueError("state_dict: envs are in flight (sent, not received): recv() every batch first")
        return {
            "format": FORMAT,
            "num_envs": self.num_envs,
            "autoreset_mode": self.autoreset_mode.value,
            "envs": self.get_state(),
            **{key: self._session.pool.views[name].copy() for name, key in _EPISODE_STATS},
            "space_rngs": space_rngs(self),
        }

    def load_state_dict(self, state: dict[str, Any]) -> Any:
        """Continue from :meth:`state_dict`'s ``state``, taken from this vector env or another with
        the same env factories and ``num_envs`` (in another process, say); return every env's
        observation. The envs are then ready to step (or, with asynchronous collection, to send).
        """
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"load_state_dict: not a ShmVecEnv state_dict (format {FORMAT!r})")
        for key, mine in (("num_envs", self.num_envs), ("autoreset_mode", self.autoreset_mode.value)):
            if state[key] != mine:
                raise ValueError(f"load_state_dict: the checkpoint has {key}={state[key]!r}, this vector env {mine!r}")
        self._session.guard("load_state_dict", needs_reset=False)
        obs = self.set_state(state["envs"])
        for name, key in _EPISODE_STATS:
            self._session.pool.views[name][...] = state[key]
        set_space_rngs(self, state["space_rngs"])
        return obs
