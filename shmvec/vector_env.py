"""``ShmVecEnv``: Gymnasium's ``VectorEnv`` API over a :class:`~shmvec.pool.WorkerPool`."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from shmvec.actions import ActionBatch
from shmvec.blocks import reset_payloads, set_attr_payloads
from shmvec.checks import env_factories, parse_autoreset_mode, positive_int, seeds_per_env, usable_cores
from shmvec.errors import ClosedError, NonFiniteError, PayloadError, WorkerError
from shmvec.infos import add_info
from shmvec.pool import LaneState, WorkerPool
from shmvec.protocol import Command
from shmvec.storage import RolloutStorage, split_policy_output
from shmvec.tree import assemble, pickled_fields
from shmvec.worker import Targets

__all__ = ["ShmVecEnv", "SharedBuffers", "make"]


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


class ShmVecEnv(VectorEnv):
    """Vectorized environment whose worker processes step lanes (contiguous blocks) of envs in
    shared memory.

    Observations, actions, rewards and episode flags live in one shared-memory segment: workers
    write results straight into it and only command bytes cross the pipes. Parts of a space
    with no fixed size (Text, Sequence, Graph, OneOf) travel pickled instead, one message per
    worker and step, and are batched as Gymnasium does (a tuple of one sample per env).
    Semantics (seeding, autoreset modes, infos) are those of
    :class:`gymnasium.vector.SyncVectorEnv`, bit for bit.

    Example
    -------
    >>> import gymnasium as gym, shmvec
    >>> envs = shmvec.ShmVecEnv([lambda: gym.make("CartPole-v1")] * 4, num_workers=2)
    >>> obs, infos = envs.reset(seed=42)
    >>> obs.shape
    (4, 4)
    >>> obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
    >>> rewards
    array([1., 1., 1., 1.])
    >>> envs.close()

    Parameters
    ----------
    env_fns : sequence of callables
        Factories returning ``gymnasium.Env``; lambdas and closures are fine (cloudpickle).
    num_workers : int, optional
        Number of lanes stepped in parallel, each by a worker process; defaults to the usable
        cores (at most ``num_envs``). With ``step_in_main`` the calling process steps one of them.
    batch_size : int, optional
        Envs that :meth:`recv` hands back at a time; defaults to ``num_envs`` (synchronous
        collection, :meth:`step` works). Smaller: asynchronous collection with
        :meth:`send`/:meth:`recv` (``docs/async.md``); it must be a multiple of the lane size
        ``num_envs / num_workers``, and ``num_envs`` must divide by ``num_workers``.
    step_in_main : bool, default False
        ``False`` (the default): every env runs in a worker process, so an env that raises,
        segfaults, calls ``os._exit``, blows up its memory or hangs cannot take the calling
        process down (it comes back as a :class:`~shmvec.WorkerError` or
        :class:`~shmvec.WorkerDied`, or a restart with ``on_error="restart"``). ``True`` is an
        opt-in speed mode: the calling process steps the last lane itself while the workers
        step theirs, which on few cores and cheap envs beats waiting (no core idles). It gives
        up isolation for that lane: an env crash there ends your process, and
        ``on_error="restart"`` can only recover from exceptions in it. With asynchronous
        collection and ``True``, :meth:`recv` steps the calling process's lane while fewer
        than a batch's worth of worker lanes sent before it are done (``docs/async.md``).
    autoreset_mode : AutoresetMode or str, default NEXT_STEP
        Gymnasium's autoreset mode: ``NEXT_STEP``, ``SAME_STEP`` or ``DISABLED``.
    copy : bool, default True
        Return arrays the caller owns. ``False`` returns read-only views of the shared buffers,
        valid until the next ``step``/``reset`` (zero copies).
    context : str, optional
        ``multiprocessing`` start method: ``"fork"``, ``"forkserver"`` or ``"spawn"``.
    timeout : float, optional
        Seconds any command may take, from when it was sent to the workers, before
        :class:`~shmvec.StepTimeout`; ``None`` waits forever (a dead worker is still noticed
        within half a second).
    validate_actions : bool, default True
        Refuse actions of the wrong shape, a non-integer dtype for discrete spaces, or values
        outside the action space (Box bounds included), with a ``ValueError``, before any
        worker sees them. Under NEXT_STEP the rows of envs that this step resets are not held
        to the space (those envs ignore their action, as in Gymnasium). Costs a few numpy
        reductions per step. ``False`` keeps only the shape check: actions are then cast to the
        space's dtype as they are written. Either way a scalar where a batch is expected is a
        ``TypeError``, as in Gymnasium.
    on_error : {"raise", "restart"}, default "raise"
        What a fault during ``step`` does. ``"raise"``: close the vector env cleanly and
        raise the error. ``"restart"``: replace the failed worker (or the main process's lane)
        with new envs, reset them, and carry on: each of its envs returns the first observation
        of a new episode with reward 0, ``terminated=False``, ``truncated=True`` and
        ``infos["restarted"]`` set (no ``final_obs``: the old episode's last observation is
        lost). The step after is a normal step, also under NEXT_STEP. Every restart is
        recorded in :attr:`restarts` as ``(worker_index, env_range, exception)``. Faults in
        ``reset``, ``call`` and ``set_attr`` always raise.
    check_finite : bool, default False
        Raise :class:`~shmvec.NonFiniteError` (naming the env and the field) when a step or
        reset returns a NaN or infinite reward or floating-point observation. Costs one
        ``isfinite`` pass over the batch per step. The vector env stays usable.
    spin_us : float, optional
        Microseconds a wait spins before it blocks. Default: workers spin 2000 when
        ``num_workers`` <= cores, else 0; the calling process spins 2000 when worker processes
        + 1 <= cores, 150 when it shares the cores with ``num_workers`` <= cores workers (the
        default layout on a small machine: a short spin catches a cheap step without a kernel
        wake-up), else 0. Given, it applies to both sides.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        num_workers: int | None = None,
        batch_size: int | None = None,
        step_in_main: bool = False,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        context: str | None = None,
        timeout: float | None = None,
        validate_actions: bool = True,
        on_error: str = "raise",
        check_finite: bool = False,
        spin_us: float | None = None,
    ) -> None:
        super().__init__()
        if on_error not in ("raise", "restart"):
            raise ValueError(f"on_error must be 'raise' or 'restart', got {on_error!r}")
        self.on_error = on_error
        self.check_finite = check_finite
        self.restarts: list[tuple[int, range, Exception]] = []
        self._restarted: list[int] | None = None
        env_fns = env_factories(env_fns, "ShmVecEnv")
        self.num_envs = len(env_fns)
        self.autoreset_mode = parse_autoreset_mode(autoreset_mode)
        num_workers = usable_cores() if num_workers is None else positive_int(num_workers, "num_workers")
        self.num_workers = min(num_workers, self.num_envs)
        self.batch_size = self._check_batch_size(batch_size)
        self.copy = copy
        self._pool = WorkerPool(
            env_fns, self.num_workers, step_in_main, context, self.autoreset_mode.value, timeout, spin_us
        )
        self._finalizer = weakref.finalize(self, self._pool.shutdown)
        # Closes this env when the code it guards raises (a weak reference: no cycle keeps
        # the env alive past its last user, whose garbage collection closes it).
        self._closing = _ClosingOnError(weakref.ref(self))
        pool = self._pool
        self.context = pool.context
        self.single_observation_space = pool.spaces.observation_space
        self.single_action_space = pool.spaces.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = dict(pool.spaces.metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = pool.spaces.render_mode

        layout, views = pool.layout, pool.views
        self._actions = ActionBatch(self.single_action_space, validate_actions)
        self._act_views = layout.leaf_views(views, "act")
        self._obs_views = layout.leaf_views(views, "obs")
        self._obs_leaves = layout.obs_leaves
        self._flat_obs = len(layout.obs_leaves) == 1 and not layout.obs_leaves[0].path
        # Variable-size leaves: batched as a tuple of one object per env, as Gymnasium does.
        self._pickled_obs = [leaf.pickled for leaf in layout.obs_leaves] if layout.pickled("obs/") else None
        self._final_views = layout.leaf_views(views, "final_obs") if layout.with_final_obs else []
        # infos["final_obs"] holds one env's observation as the env returned it, as SyncVectorEnv
        # keeps it: envs give a Discrete observation as a Python int, any other fixed leaf as an
        # array (0-d for a scalar Box), a pickled leaf as its object. Read back, each is made so again.
        self._final_item = [
            _object_item if leaf.pickled else _int_item if isinstance(leaf.space, gym.spaces.Discrete) else _array_item
            for leaf in layout.obs_leaves
        ]
        readonly = []
        for v in (*self._obs_views, views["rewards"], views["terminations"], views["truncations"]):
            ro = v.view()
            ro.flags.writeable = False
            readonly.append(ro)
        k = len(self._obs_views)
        self._obs_readonly_leaves = readonly[:k]
        self._obs_readonly = assemble(self.single_observation_space, readonly[:k])
        self._rewards_ro, self._terms_ro, self._truncs_ro = readonly[k:]
        self._rewards, self._terms, self._truncs = views["rewards"], views["terminations"], views["truncations"]
        self._autoreset = views["autoreset"]
        # Where a synchronous step's results land (a rollout's rows are other Targets).
        self._home = Targets(
            self._obs_views, self._final_views, self._act_views, self._rewards, self._terms, self._truncs
        )
        self._current_obs = self._obs_views  # the leaves holding every env's latest observation
        self._storage: RolloutStorage | None = None
        self._stats = {name: views[name] for name in ("last_return", "last_length", "episode_count")}
        self._needs_reset = True
        lanes = len(pool.lanes)
        self._lane_states = pool.states  # read on the step path (see _drain)
        # Async: the batch the last recv returned, until a send: (ids, index, contiguous, lanes).
        self._last: tuple | None = None
        self._batches: dict[tuple[int, ...], tuple] = {}  # lanes -> (ids, index, contiguous, lanes), see _batch_of
        # Whole lanes per recv: all of them in sync mode (whose lanes may differ in size by one env).
        self._batch_lanes = lanes if self.batch_size == self.num_envs else self.batch_size // len(pool.lanes[0])
        self._held: tuple | None = (
            None  # async: (batch, its _batch_of entry) refused by check_finite, for the next recv
        )

    def _check_batch_size(self, batch_size: int | None) -> int:
        n, w = self.num_envs, self.num_workers
        if batch_size is None or batch_size == n:
            return n
        if not isinstance(batch_size, int) or not 0 < batch_size < n:
            raise ValueError(f"batch_size must be an int in 1..num_envs={n}, got {batch_size!r}")
        if self.autoreset_mode is AutoresetMode.DISABLED:
            raise ValueError("asynchronous collection supports autoreset modes NEXT_STEP and SAME_STEP, not DISABLED")
        if n % w:
            raise ValueError(
                f"asynchronous collection needs num_envs ({n}) divisible by num_workers ({w}): "
                "batches are made of whole workers' blocks"
            )
        if batch_size % (n // w):
            raise ValueError(
                f"batch_size ({batch_size}) must be a multiple of the envs per worker "
                f"({n // w} = num_envs {n} / num_workers {w})"
            )
        return batch_size

    # -- the VectorEnv API ----------------------------------------------------------------
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset all envs (or those in ``options["reset_mask"]``) and return ``(obs, infos)``.

        ``seed=int`` seeds env ``i`` with ``seed + i``; a list gives one seed (or ``None``) per env.
        """
        n = self.num_envs
        seeds = seeds_per_env(seed, self.num_envs)
        mask = None
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = options.pop("reset_mask")
            # Gymnasium's checks, in its order, with its exception types and messages.
            if not isinstance(mask, np.ndarray):
                raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
            if mask.shape != (n,):
                raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
            if mask.dtype != np.bool_:
                raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
            if not mask.any():
                raise ValueError(
                    "`options['reset_mask']` must contain a boolean array with at least one True "
                    f"value, got reset_mask={mask}"
                )
        payloads = reset_payloads(seeds, options, mask, self._pool.lanes)
        self._restarted = None  # a restart reported by the last step is not this reset's
        replies = self._run(Command.RESET, payloads)  # (which drains sends not received)
        self._needs_reset = False
        self._current_obs = self._obs_views
        if self.check_finite:
            self._check_finite(rewards=False)
        return self._observations(), self._merge_infos(replies, same_step=False)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its row of ``actions``; see Gymnasium's ``VectorEnv.step``."""
        if self._needs_reset:
            if self.closed:
                raise ClosedError("step() on a closed ShmVecEnv")
            raise ResetNeeded("ShmVecEnv.step() was called before reset(); call reset() first")
        if self.batch_size != self.num_envs:
            raise ValueError(
                f"this ShmVecEnv collects asynchronously (batch_size={self.batch_size} < "
                f"num_envs={self.num_envs}): use send(actions, env_ids) and recv()"
            )
        if self.autoreset_mode is AutoresetMode.DISABLED and self._autoreset.any():
            ended = np.flatnonzero(self._autoreset).tolist()
            raise ValueError(
                f"envs {ended} ended their episode and autoreset_mode is DISABLED: reset them first "
                "with reset(options={'reset_mask': mask})"
            )
        self._drain()  # sends not received: their actions must not be overwritten
        self._write_actions(actions)
        self._restarted = None
        self._current_obs = self._obs_views
        replies = self._run(Command.STEP, drained=True)
        infos = self._merge_infos(replies, same_step=self.autoreset_mode is AutoresetMode.SAME_STEP)
        if self.check_finite:
            self._check_finite(rewards=True)
        if self.copy:
            return self._observations(), self._rewards.copy(), self._terms.copy(), self._truncs.copy(), infos
        obs = self._obs_readonly if self._pickled_obs is None else self._observations()
        return obs, self._rewards_ro, self._terms_ro, self._truncs_ro, infos

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every env (or read the attribute if not callable)."""
        replies = self._run(Command.CALL, [(name, args, kwargs)] * len(self._pool.lanes), closes_on_error=False)
        return tuple(result for lane in replies for result in lane)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute ``name`` of every env."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set attribute ``name`` of every env: one value for all, or a list/tuple of one per env."""
        self._run(Command.SET_ATTR, set_attr_payloads(name, values, self._pool.lanes), closes_on_error=False)

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """Each env's ``np_random_seed`` (its last reset's seed), as Gymnasium's vector envs give it."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Each env's random generator (a copy, for envs stepped in worker processes), as
        ``AsyncVectorEnv`` gives them.
        """
        return self.get_attr("np_random")

    def render(self) -> tuple[Any, ...]:
        """The frames rendered by every env (per its ``render_mode``)."""
        return self.call("render")

    def close_extras(self, **kwargs: Any) -> None:
        """Stop the workers, close every env and release the shared memory."""
        self._needs_reset = True
        self._finalizer()

    # -- asynchronous collection (EnvPool style) -------------------------------------------
    def async_reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Start resetting every env without waiting; :meth:`recv` returns the batches.

        ``seed`` and ``options`` are as in :meth:`reset` (``reset_mask`` excepted).
        """
        if self.closed:
            raise ClosedError("this ShmVecEnv is closed; create a new one")
        seeds = seeds_per_env(seed, self.num_envs)
        self._drain()
        payloads = reset_payloads(seeds, options, None, self._pool.lanes)
        self._submit(Command.RESET, list(range(len(self._pool.lanes))), payloads)
        self._needs_reset = False

    def send(self, actions: Any, env_ids: Any) -> None:
        """Step the envs ``env_ids`` (those :meth:`recv` just returned) with ``actions``.

        ``actions`` holds one row per env of ``env_ids``, in that order. After :meth:`reset`,
        every env is ready for a ``send``.
        """
        if self._needs_reset:
            if self.closed:
                raise ClosedError("send() on a closed ShmVecEnv")
            raise ResetNeeded("send() was called before reset() or async_reset()")
        batch = self._last
        if batch is None or env_ids is not batch[0]:  # the usual loop passes the (read-only) ids recv() returned
            batch = self._batch_of(self._lanes_of(np.asarray(env_ids)))
        ids, index, _, lanes = batch
        self._write_actions(actions, (len(ids), index))
        self._submit(Command.STEP, lanes, None)

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
        """Wait for ``batch_size`` envs to finish; return their results and ids.

        Returns ``(obs, rewards, terminations, truncations, infos, env_ids)``, each with one row
        per env of ``env_ids`` (a whole number of lanes, in env order): ``batch_size``
        envs, or all those in flight if fewer (when you hold some back). Blocks that finish
        first are returned first. Autoreset, infos and episode statistics behave as in
        :meth:`step`. With ``copy=False`` a batch of adjacent lanes comes as read-only views.
        ``env_ids`` is read-only: pass it back to :meth:`send` as it is (the cheapest check).
        """
        if self.closed:
            raise ClosedError("recv() on a closed ShmVecEnv")
        if self._held is not None:
            (batch, self._last), self._held = self._held, None
            return batch
        if _IN_FLIGHT not in self._lane_states:
            raise RuntimeError("recv() with no env in flight: call send() (or async_reset()) first")
        pool = self._pool
        with self._closing:  # fewer lanes in flight than a batch (envs held back): what there is
            ready, got, failures = pool.receive(self._batch_lanes)
        self._restarted = None
        commands = pool.commands
        if failures:
            self._settle(failures, all(commands[lane] == Command.STEP for lane in failures), self._home)
        self._last = last = self._batch_of(ready)
        ids, index, contiguous, _ = last
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP and any(
            commands[lane] == Command.STEP for lane in ready
        )
        infos = self._merge_infos([got.get(lane) for lane in ready], same_step=same_step, ids=ids)
        if self._pickled_obs is not None:
            obs = self._with_objects(index, contiguous)
        elif not self.copy and contiguous:
            obs = assemble(self.single_observation_space, [v[index] for v in self._obs_readonly_leaves])
        else:
            obs = assemble(
                self.single_observation_space, [v[index].copy() if contiguous else v[index] for v in self._obs_views]
            )
        if not self.copy and contiguous:
            batch = (obs, self._rewards_ro[index], self._terms_ro[index], self._truncs_ro[index], infos, ids)
        else:
            batch = (
                obs,
                self._rewards[index].copy(),
                self._terms[index].copy(),
                self._truncs[index].copy(),
                infos,
                ids,
            )
        if self.check_finite:
            try:
                self._check_finite(rewards=True, index=index)
            except NonFiniteError as exc:
                # Nothing is lost: the next recv() hands this batch over as it is.
                self._held, exc.env_ids = (batch, last), ids
                raise
        return batch

    def _batch_of(self, ready: list[int]) -> tuple[np.ndarray, slice | np.ndarray, bool, list[int]]:
        """``(env_ids, index, contiguous, lanes)`` of a batch made of the lanes ``ready``, made once
        per combination: the ids are read-only, so the same array can be handed out every time.
        """
        key = tuple(ready)
        batch = self._batches.get(key)
        if batch is None:
            lanes = [self._pool.lanes[lane] for lane in ready]
            contiguous = all(a.stop == b.start for a, b in zip(lanes, lanes[1:]))
            ids = np.concatenate([np.arange(r.start, r.stop) for r in lanes])
            ids.flags.writeable = False  # so that send() can tell them by identity (see send)
            index = slice(lanes[0].start, lanes[-1].stop) if contiguous else ids
            batch = self._batches[key] = (ids, index, contiguous, list(ready))
        return batch

    def _lanes_of(self, ids: np.ndarray) -> list[int]:
        """The idle lanes that ``ids`` covers exactly, or a ValueError saying what is expected."""
        lanes, states = self._pool.lanes, self._lane_states
        hint = (
            "the env_ids returned by the last recv()"
            if self._last is not None
            else "env ids of whole idle workers' blocks"
        )
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise ValueError(f"env_ids must be a 1-d integer array of {hint}; got {ids!r:.120}")
        starts = {envs.start: lane for lane, envs in enumerate(lanes)}
        out: list[int] = []
        pos = 0
        while pos < ids.size:
            lane = starts.get(int(ids[pos]), -1)
            envs = lanes[lane] if lane >= 0 else None
            if envs is None or not np.array_equal(ids[pos : pos + len(envs)], np.arange(envs.start, envs.stop)):
                raise ValueError(f"env_ids must be {hint} (whole blocks of workers' envs); got {ids!r:.120}")
            if lane in out:
                raise ValueError(f"env_ids repeats a block: {ids!r:.120}")
            if states[lane] is not LaneState.IDLE:
                raise ValueError(f"envs {envs.start}..{envs.stop - 1} are already stepping: send() takes {hint}")
            out.append(lane)
            pos += len(envs)
        return out

    def _submit(self, cmd: int, lanes: list[int], payloads: list | None) -> None:
        self._held = None
        with self._closing:
            self._pool.submit(cmd, lanes, payloads)
        self._last = None
        self._current_obs = self._obs_views  # where a later rollout() starts from

    def _drain(self) -> None:
        """Wait for every command in flight and drop its results (before a synchronous round)."""
        if _IN_FLIGHT not in self._lane_states:  # the usual case, on the step path: no list built
            return
        with self._closing:
            _, _, failures = self._pool.receive(len(self._lane_states))
            self._pool.raise_first({lane: e for lane, e in failures.items() if not isinstance(e, WorkerError)})

    # -- rollouts written in place --------------------------------------------------------
    def rollout(self, policy: Callable[[Any], Any], num_steps: int) -> dict[str, Any]:
        """Step every env ``num_steps`` times with ``policy``; the workers write each step in place.

        ``policy(obs)`` gets the ``[N, ...]`` observations of one step (views of the storage:
        ``torch.from_numpy`` takes them as they are; what the policy writes there, the batch keeps) and
        returns the actions, or ``(actions, extras)`` with ``extras`` a dict of ``[N, ...]``
        arrays to keep per step (log-probabilities, values: anything ``numpy.asarray`` takes,
        e.g. a detached CPU torch tensor). The workers write observations, rewards and flags
        straight into ``[T, N]`` storage in shared memory; the calling process only runs the
        policy. The rollout continues where the last ``step``, ``reset`` or ``rollout`` left
        off (episodes span calls) and is identical, bit for bit, to the same ``step`` loop.

        >>> import numpy as np, shmvec
        >>> envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2)
        >>> _ = envs.reset(seed=0)
        >>> def policy(obs):
        ...     return (obs[:, 2] > 0).astype(np.int64), {"value": obs[:, 0] * 0.5}
        >>> batch = envs.rollout(policy, num_steps=32)
        >>> batch["obs"].shape, batch["actions"].shape, batch["rewards"].shape, batch["value"].shape
        ((32, 4, 4), (32, 4), (32, 4), (32, 4))
        >>> advantages, returns = shmvec.gae(batch["rewards"], batch["value"].astype(np.float32),
        ...     batch["terminations"], batch["truncations"], policy(batch["next_obs"])[1]["value"],
        ...     autoreset="next_step", valid=batch["valid"])
        >>> envs.close()

        Parameters
        ----------
        policy : callable
            ``obs -> actions`` or ``obs -> (actions, extras)``. With a Tuple action space, return
            ``(actions, extras)`` with ``actions`` a tuple to pass extras.
        num_steps : int
            Rows ``T`` of the rollout. The storage is allocated on the first call and reused
            while ``num_steps`` stays the same.

        Returns
        -------
        dict
            ``obs`` ``[T, N, ...]`` (what each action was taken on), ``actions``, ``rewards``,
            ``terminations``, ``truncations`` ``[T, N]``, ``next_obs`` ``[N, ...]`` (the
            observation after the last step: ``last_values`` comes from it), each extra
            ``[T, N, ...]``, and ``infos``: one Gymnasium info dict per step. Under NEXT_STEP,
            ``valid`` ``[T, N]``: False on the reset step that follows an episode end (its action
            was ignored), the mask ``shmvec.gae(..., autoreset="next_step", valid=...)`` takes; a
            truncated episode's final observation is the next row's ``obs`` (or ``next_obs``).
            Under SAME_STEP, ``final_obs`` ``[T, N, ...]``: the final observation where step
            ``t`` ended an episode (undefined elsewhere).

            The arrays are views of storage that the next ``rollout`` overwrites: copy what you
            keep longer. They are writable (for in-place reward scaling, say).

        Raises
        ------
        ValueError
            For ``batch_size < num_envs`` or autoreset mode DISABLED, a bad ``num_steps``, or
            actions or extras of the wrong shape (the envs stay usable: a later call continues
            from the last step that ran).
        """
        self._check_rollout(policy, num_steps)
        self._drain()  # sends not received: finish them before row 0 is taken
        storage = self._storage
        if storage is None or storage.num_steps != num_steps:
            with self._closing:
                segment = self._pool.attach_rollout(num_steps)
            storage = self._storage = RolloutStorage(
                segment.layout,
                segment.views,
                self.single_observation_space,
                self.single_action_space,
                next_step=self.autoreset_mode is AutoresetMode.NEXT_STEP,
            )
        storage.start(self._current_obs, self._autoreset)
        act_space, check_finite = self.single_action_space, self.check_finite
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        restarted: list[tuple[int, list[int]]] = []
        done = 0
        try:
            for t in range(num_steps):
                actions, extras = split_policy_output(policy(storage.policy_obs[t]), act_space)
                out = storage.rows[t]
                self._write_actions(actions, views=out.act)
                storage.record_extras(t, extras)
                self._restarted = None
                replies = self._run(Command.ROLLOUT_STEP, arg=t, out=out)
                done = t + 1
                if self._restarted:
                    restarted.append((t, self._restarted))
                if self._restarted or any(replies):
                    storage.infos[t] = self._merge_infos(replies, same_step, out=out)
                if check_finite:
                    self._check_finite(rewards=True, out=out)
        finally:
            self._current_obs = [o[done] for o in storage.obs]
        storage.finish(restarted)
        return storage.batch()

    def _check_rollout(self, policy: Any, num_steps: Any) -> None:
        if self._needs_reset:
            if self.closed:
                raise ClosedError("rollout() on a closed ShmVecEnv")
            raise ResetNeeded("ShmVecEnv.rollout() was called before reset(); call reset() first")
        pickled = pickled_fields(self.single_observation_space, self.single_action_space)
        if pickled:
            raise ValueError(
                f"rollout() keeps every step in shared memory, which cannot hold {', '.join(pickled)}: "
                "its samples have no fixed size. Use step() or send()/recv() for this env."
            )
        if self.batch_size != self.num_envs:
            raise ValueError(
                f"rollout() steps every env together; this ShmVecEnv collects asynchronously "
                f"(batch_size={self.batch_size} < num_envs={self.num_envs}): use shmvec.AsyncRollout"
            )
        if self.autoreset_mode is AutoresetMode.DISABLED:
            raise ValueError(
                "rollout() needs autoreset_mode NEXT_STEP or SAME_STEP: under DISABLED an env "
                "that ends its episode mid-rollout could not go on"
            )
        positive_int(num_steps, "rollout(num_steps=...)")
        if not callable(policy):
            raise TypeError(f"rollout(policy=...) must be callable (obs -> actions), got {type(policy).__name__}")

    def __enter__(self) -> ShmVecEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def validate_actions(self) -> bool:
        """Whether actions are checked against the action space before any worker sees them."""
        return self._actions.validate

    @validate_actions.setter
    def validate_actions(self, value: bool) -> None:
        self._actions = ActionBatch(self.single_action_space, bool(value))

    @property
    def buffers(self) -> SharedBuffers:
        """The shared result buffers, as read-only views: for zero-copy consumers
        (``shmvec.torch`` pins them for asynchronous copies to a GPU).
        """
        return SharedBuffers(self._obs_readonly, self._rewards_ro, self._terms_ro, self._truncs_ro)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes (empty once closed)."""
        return self._pool.worker_pids

    # -- episode statistics ---------------------------------------------------------------
    @property
    def episode_returns(self) -> np.ndarray:
        """Return of each env's last finished episode (0 until one finishes), counted in the workers."""
        return self._stats["last_return"].copy()

    @property
    def episode_lengths(self) -> np.ndarray:
        """Length of each env's last finished episode (0 until one finishes)."""
        return self._stats["last_length"].copy()

    @property
    def episode_counts(self) -> np.ndarray:
        """Number of finished episodes per env since construction."""
        return self._stats["episode_count"].copy()

    # -- internals ------------------------------------------------------------------------
    def _run(
        self,
        cmd: int,
        payloads: list | None = None,
        closes_on_error: bool = True,
        arg: int = 0,
        out: Targets | None = None,
        drained: bool = False,
    ) -> list:
        """One command round; apply ``on_error`` to the lanes that failed (a step's results go to
        ``out``, by default the regular regions). ``drained``: the caller has just drained.
        """
        if self.closed:
            raise ClosedError("this ShmVecEnv is closed; create a new one")
        if not drained:
            self._drain()  # sends not received (a sync round after send/async_reset)
        self._held = None
        with self._closing:
            replies, failures = self._pool.run(cmd, payloads, arg=arg)
        if failures:
            self._settle(
                failures,
                cmd == Command.STEP or cmd == Command.ROLLOUT_STEP,
                self._home if out is None else out,
                closes_on_error,
            )
        return replies

    def _settle(
        self, failures: dict[int, Exception], restartable: bool, out: Targets, closes_on_error: bool = True
    ) -> None:
        """Apply ``on_error`` to the lanes that failed: restart them (a step's results go to
        ``out``) when ``restartable`` and asked to, else raise the first failure. Raising closes
        the env, unless ``closes_on_error`` is False and only envs raised (call, set_attr).
        """
        if restartable and self.on_error == "restart":
            with self._closing:
                self._restart(failures, out)
            return
        if closes_on_error or any(not isinstance(exc, WorkerError) for exc in failures.values()):
            with self._closing:  # a lost worker, or a step or reset half done: the envs' state is unknown
                self._pool.raise_first(failures)
        else:
            self._pool.raise_first(failures)

    def _restart(self, failures: dict[int, Exception], out: Targets) -> None:
        """Give the failed lanes new envs, reset them, and mark them in this step's results ``out``."""
        pool, lanes = self._pool, sorted(failures)
        for lane in lanes:
            pool.restart_lane(lane)
        payloads = [(None, None, None) if lane in failures else None for lane in range(len(pool.lanes))]
        _, again = pool.run(Command.RESET, payloads, lane_ids=lanes)
        pool.raise_first(again)
        for lane in lanes:
            sl = slice(pool.lanes[lane].start, pool.lanes[lane].stop)
            if out is not self._home:  # the reset wrote the regular regions
                for dst, src in zip(out.obs, self._obs_views):
                    dst[sl] = src[sl]
            out.rewards[sl] = 0.0
            out.terminations[sl] = False
            out.truncations[sl] = True
            self.restarts.append((lane, pool.lanes[lane], failures[lane]))
        self._restarted = [i for lane in lanes for i in pool.lanes[lane]]

    def _check_finite(self, rewards: bool, index: slice | np.ndarray = slice(None), out: Targets | None = None) -> None:
        out = self._home if out is None else out
        arrays = [("reward", out.rewards)] if rewards else []
        arrays += [
            (f"observation{leaf.field}", view)
            for leaf, view in zip(self._obs_leaves, out.obs)
            if view.dtype.kind == "f"
        ]
        for name, arr in arrays:
            finite = np.isfinite(arr[index])
            if not finite.all():
                env = int(np.arange(self.num_envs)[index][np.argwhere(~finite)[0][0]])
                raise NonFiniteError(f"env {env} returned a non-finite {name}: {arr[env]!r}", env)

    def _merge_infos(
        self, replies: list, same_step: bool, ids: range | np.ndarray | None = None, out: Targets | None = None
    ) -> dict[str, Any]:
        """Gymnasium's dict-of-arrays infos, built in env order exactly as SyncVectorEnv does.

        ``ids``: the envs of the batch (all envs when ``None``); info arrays are indexed by
        position in the batch. ``out``: where the step wrote its flags and final observations.
        """
        out = self._home if out is None else out
        terms, truncs = out.terminations, out.truncations
        reports = {env: (final_info, info) for lane in replies if lane for env, final_info, info in lane}
        restarted = self._restarted or ()
        if not (reports or same_step or restarted):
            return {}  # the usual step: nothing to say
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
        if reports or ended or restarted:
            for i in sorted(reports.keys() | set(ended) | set(restarted)):
                k = i if pos is None else pos[i]
                final_info, info = reports.get(i, (None, None))
                if i in ended:
                    final_obs = assemble(
                        self.single_observation_space, [item(v, i) for v, item in zip(out.final_obs, self._final_item)]
                    )
                    add_info(infos, {"final_obs": final_obs, "final_info": final_info or {}}, k, size)
                if info:
                    add_info(infos, info, k, size, columns)
                if i in restarted:
                    add_info(infos, {"restarted": True}, k, size)
        return infos

    def _observations(self) -> Any:
        if self._pickled_obs is not None:
            return self._with_objects(slice(None), True)
        if not self.copy:
            return self._obs_readonly
        if self._flat_obs:
            return self._obs_views[0].copy()
        return assemble(self.single_observation_space, [v.copy() for v in self._obs_views])

    def _with_objects(self, index: slice | np.ndarray, contiguous: bool) -> Any:
        """The observations of the envs ``index`` when the space has pickled leaves: those are
        a tuple of one object per env (deep copies with ``copy=True``), as Gymnasium's
        ``concatenate`` batches them; the other leaves as :meth:`recv` gives them.
        """
        leaves = []
        views = self._obs_views if self.copy or not contiguous else self._obs_readonly_leaves
        for view, pickled in zip(views, self._pickled_obs):
            part = view[index]
            if pickled:
                part = deepcopy(tuple(part)) if self.copy else tuple(part)
            elif self.copy and contiguous:
                part = part.copy()
            leaves.append(part)
        return assemble(self.single_observation_space, leaves)

    def _write_actions(
        self, actions: Any, batch: tuple[int, slice | np.ndarray] | None = None, views: list | None = None
    ) -> None:
        """Check ``actions`` (for all envs, or for a ``batch``: its size and its index into the
        regions, from :meth:`_batch_of`) and write them into shared memory (the regular
        regions, or the per-leaf ``views`` of a rollout row).
        """
        # Under NEXT_STEP an env that ended its episode is reset by this step and never sees its
        # action; Gymnasium hands it any value, so its row is not checked against the space.
        ignored = None
        if self.autoreset_mode is AutoresetMode.NEXT_STEP:
            ignored = self._autoreset if batch is None else self._autoreset[batch[1]]
        checked = self._actions.leaf_arrays(actions, self.num_envs if batch is None else batch[0], ignored)
        # Written only once every leaf passed: a refused action leaves nothing half-written.
        # Item assignment casts as np.copyto(casting="unsafe") does, at a third of its cost.
        index = Ellipsis if batch is None else batch[1]
        for view, a in zip(self._act_views if views is None else views, checked):
            view[index] = a


_IN_FLIGHT = LaneState.IN_FLIGHT


class _ClosingOnError:
    """``with env._closing:`` closes the env if the code inside raises (and lets the error through).

    One object per env, made once: entering it allocates nothing on the step path.
    """

    __slots__ = ("_env",)

    def __init__(self, env: weakref.ref) -> None:
        self._env = env

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is not None and not issubclass(exc_type, PayloadError):  # nothing was sent
            env = self._env()
            if env is not None:
                env.close()


def _int_item(view: np.ndarray, i: int) -> int:
    return view[i].item()


def _array_item(view: np.ndarray, i: int) -> np.ndarray:
    return view[i, ...].copy()


def _object_item(view: np.ndarray, i: int) -> Any:
    return view[i]


class _MakeEnv:
    """A picklable ``gym.make`` call (plus wrappers) for one env."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], wrappers: Sequence[Callable] | None) -> None:
        self.env_id, self.env_kwargs, self.wrappers = env_id, env_kwargs, list(wrappers or [])

    def __call__(self) -> gym.Env:
        env = gym.make(self.env_id, **self.env_kwargs)
        for wrapper in self.wrappers:
            env = wrapper(env)
        return env


def make(
    env_id: str,
    num_envs: int = 1,
    *,
    env_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] | None = None,
    **vector_kwargs: Any,
) -> ShmVecEnv:
    """Create a :class:`ShmVecEnv` of ``num_envs`` copies of a registered Gymnasium env.

    >>> import shmvec
    >>> envs = shmvec.make("CartPole-v1", num_envs=8, num_workers=2)
    >>> envs.num_envs
    8
    >>> envs.close()

    ``env_kwargs`` go to ``gymnasium.make``; ``wrappers`` are applied to each env in order;
    everything else goes to :class:`ShmVecEnv`.
    """
    positive_int(num_envs, "num_envs")
    factory = _MakeEnv(env_id, dict(env_kwargs or {}), wrappers)
    return ShmVecEnv([factory] * num_envs, **vector_kwargs)
