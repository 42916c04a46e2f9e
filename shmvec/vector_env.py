"""``ShmVecEnv``: Gymnasium's ``VectorEnv`` API over a :class:`~shmvec.pool.WorkerPool`."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from shmvec import checkpoint
from shmvec.actions import ActionBatch
from shmvec.batched import BatchedSpace
from shmvec.batches import Batch, Batches
from shmvec.blocks import reset_payloads, set_attr_payloads
from shmvec.checkpoint import EnvState
from shmvec.checks import env_factories, parse_autoreset_mode, positive_int, seeds_per_env, usable_cores
from shmvec.collect_threads import CollectThreads
from shmvec.errors import NonFiniteError, NothingInFlightError, PayloadError, SnapshotError, WorkerError
from shmvec.info_columns import ColumnReader, InfoSchema
from shmvec.infos import InfoMerger
from shmvec.lifecycle import Lifecycle, refuse
from shmvec.pool import BlockState, Failures, PoolState, WorkerPool
from shmvec.protocol import Command
from shmvec.results import Results, SharedBuffers
from shmvec.rollout_loop import check_rollout, fill
from shmvec.stepper import Targets
from shmvec.storage import RolloutStorage

__all__ = ["ShmVecEnv", "SharedBuffers"]


_READY, _CLOSED = Lifecycle.READY, Lifecycle.CLOSED
_NO_ENVS: tuple[int, ...] = ()  # no env restarted (shared: never changed)
_IN_FLIGHT = BlockState.IN_FLIGHT


class ShmVecEnv(VectorEnv):
    """Vectorized environment whose worker processes step blocks of envs in shared memory.

    Observations, actions, rewards and episode flags live in one shared-memory segment: workers
    write results straight into it; commands are a few words in the same segment, and infos
    travel pickled only on steps that have some. Parts of a space with no fixed size (Text,
    Sequence, Graph, OneOf) travel pickled too, one message per worker and step, and are
    batched as Gymnasium does (a tuple of one sample per env). Semantics (seeding, autoreset
    modes, infos) are those of :class:`gymnasium.vector.SyncVectorEnv`, bit for bit.

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
        Worker processes, each stepping one block (a contiguous range) of the envs. Defaults to
        the usable cores, less one with ``step_in_main`` (at most ``num_envs`` blocks in all).
        ``0`` is allowed with ``step_in_main``: every env then runs in the calling process.
    batch_size : int, optional
        Envs that :meth:`recv` hands back at a time; defaults to ``num_envs`` (synchronous
        collection, :meth:`step` works). Smaller: asynchronous collection with
        :meth:`send`/:meth:`recv` (``docs/async.md``); ``num_envs`` must divide into equal
        blocks, and ``batch_size`` must be a multiple of the block size.
    step_in_main : bool, default False
        ``False`` (the default): every env runs in a worker process, so an env that raises,
        segfaults, calls ``os._exit``, blows up its memory or hangs cannot take the calling
        process down (it comes back as a :class:`~shmvec.WorkerError` or
        :class:`~shmvec.WorkerDied`, or a restart with ``on_error="restart"``). ``True`` is an
        opt-in speed mode: the calling process steps one more block, the last, itself while the
        workers step theirs, which on few cores and cheap envs beats waiting (no core idles). It
        gives up isolation for that block: an env crash there ends your process, and
        ``on_error="restart"`` can only recover from exceptions in it. With asynchronous
        collection and ``True``, :meth:`recv` steps the calling process's block while fewer
        than a batch's worth of worker blocks sent before it are done (``docs/async.md``).
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
        raise the error. ``"restart"``: replace the failed worker (or the calling process's
        block) with new envs, reset them, and carry on: each of its envs returns the first
        observation of a new episode with reward 0, ``terminated=False``, ``truncated=True`` and
        ``infos["restarted"]`` set (no ``final_obs``: the old episode's last observation is
        lost). The step after is a normal step, also under NEXT_STEP. Every restart is
        recorded in :attr:`restarts` as ``(worker_index, env_range, exception)``
        (``worker_index`` is ``None`` for the calling process's block). Faults in ``reset``,
        ``call`` and ``set_attr`` always raise.
    check_finite : bool, default False
        Raise :class:`~shmvec.NonFiniteError` (naming the env and the field) when a step or
        reset returns a NaN or infinite reward or floating-point observation. Costs one
        ``isfinite`` pass over the batch per step. The vector env stays usable.
    spin_us : float, optional
        Microseconds a wait spins before it blocks. Default: 2000 for the workers and the
        calling process, except 150 for the calling process when it shares the cores with as
        many worker blocks as cores (the default layout: a short spin catches a cheap step
        without a kernel wake-up). Where the processes outnumber the cores, spinners yield
        their core every few polls; with more blocks than cores, asynchronous collection does
        not spin. Given, it applies to both sides.
    worker_threads : int or None, default 1
        Threads each worker process lets OpenCV, torch, numba and BLAS use (set before the envs
        are built, and again once they are): a worker steps its envs one after the other, and
        every library sizing its pool by the machine's cores in every worker would
        oversubscribe them. ``None`` leaves the libraries as they are. BLAS pools that numpy
        started before a fork are capped only where ``threadpoolctl`` is installed. The
        calling process is left alone.
    ordered : bool, default False
        With asynchronous collection, :meth:`recv` returns the blocks in the order they were
        sent (oldest first; after :meth:`async_reset`, block 0 first), waiting for them if they
        are not done, instead of whichever finish first. Two runs with the same seeds and
        policy then see identical batches; the price is the wait for a slow block that
        free order would have passed over (``docs/async.md``).
    torch_threads : int, "auto" or None, default "auto"
        torch's intra-op threads in the calling process while :meth:`step` collects a rollout.
        torch's OpenMP threads spin after every parallel op, on the cores the workers need; in
        a loop that collects a fixed number of steps between updates (PPO's), the vector env
        lowers torch to this many threads from the second rollout on, as a rollout's first step
        starts, and gives the user's number back as its last step returns, so the update runs
        unchanged (``docs/benchmarks.md``, "In a training loop with torch"). ``"auto"``: the usable
        cores less the worker processes, at least 1. ``None`` leaves torch alone; so does a loop
        that never imported torch or has no such rhythm. Said once per process (a
        :class:`~shmvec.collect_threads.ThreadsNotice` warning); undone by :meth:`close`.
    """

    observation_space = BatchedSpace("single_observation_space")
    action_space = BatchedSpace("single_action_space")

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
        worker_threads: int | None = 1,
        ordered: bool = False,
        torch_threads: int | str | None = "auto",
    ) -> None:
        super().__init__()
        if on_error not in ("raise", "restart"):
            raise ValueError(f"on_error must be 'raise' or 'restart', got {on_error!r}")
        self.on_error = on_error
        self.check_finite = check_finite
        self.restarts: list[tuple[int | None, range, Exception]] = []
        env_fns = env_factories(env_fns, "ShmVecEnv")
        self.num_envs = len(env_fns)
        self.autoreset_mode = parse_autoreset_mode(autoreset_mode)
        self.num_workers = self._count_workers(num_workers, step_in_main)
        self.num_blocks = self.num_workers + (1 if step_in_main else 0)
        self.batch_size = self._check_batch_size(batch_size)
        self.copy = copy
        self.ordered = bool(ordered)
        self.worker_threads = None if worker_threads is None else positive_int(worker_threads, "worker_threads")
        if torch_threads == "auto":
            torch_threads = max(1, usable_cores() - self.num_workers)
        elif torch_threads is not None:
            torch_threads = positive_int(torch_threads, "torch_threads")
        self._torch_threads = CollectThreads(torch_threads)
        self._pool = WorkerPool(
            env_fns,
            self.num_workers,
            step_in_main,
            context,
            self.autoreset_mode,
            timeout,
            spin_us,
            self.worker_threads,
            asynchronous=self.batch_size < self.num_envs,
        )
        self._finalizer = weakref.finalize(self, self._pool.shutdown)
        # Closes this env when the code it guards raises (a weak reference: no cycle keeps
        # the env alive past its last user, whose garbage collection closes it).
        self._closing = _ClosingOnError(weakref.ref(self))
        pool = self._pool
        self.context = pool.context
        self.single_observation_space = pool.spaces.observation_space
        self.single_action_space = pool.spaces.action_space
        self.metadata = dict(pool.spaces.metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = pool.spaces.render_mode

        layout, views = pool.layout, pool.views
        self._actions = ActionBatch(self.single_action_space, validate_actions)
        self._results = Results(self.single_observation_space, layout, views)
        self._home: Targets = self._results.home  # where a synchronous step's results land
        self._infos = InfoMerger(self.single_observation_space, layout.obs_leaves, self.num_envs)
        self._autoreset = views["autoreset"]
        self._current_obs = self._home.obs  # the leaves holding every env's latest observation
        self._storage: RolloutStorage | None = None
        self._learn_infos = True  # until the first step with infos picked the info columns
        self._stats = {name: views[name] for name in ("last_return", "last_length", "episode_count")}
        self._state = Lifecycle.NEEDS_RESET
        self._block_states = pool.states  # read on the step path (see _guard)
        # Asynchronous collection: the batch the last recv returned (until a send), the batches
        # made so far, and a batch that check_finite refused, for the next recv.
        self._batches = Batches(pool.blocks)
        self._last: Batch | None = None
        self._held: tuple[tuple, Batch] | None = None
        # Whole blocks per recv: all of them in sync mode (whose blocks may differ in size by one env).
        self._batch_blocks = (
            self.num_blocks if self.batch_size == self.num_envs else self.batch_size // len(pool.blocks[0])
        )

    def _count_workers(self, num_workers: int | None, step_in_main: bool) -> int:
        main = 1 if step_in_main else 0
        if num_workers is None:
            return max(0, min(usable_cores(), self.num_envs) - main)
        if step_in_main and num_workers == 0:
            return 0
        return min(positive_int(num_workers, "num_workers"), self.num_envs - main)

    def _check_batch_size(self, batch_size: int | None) -> int:
        n, blocks = self.num_envs, self.num_blocks
        if batch_size is None or batch_size == n:
            return n
        if not isinstance(batch_size, int) or not 0 < batch_size < n:
            raise ValueError(f"batch_size must be an int in 1..num_envs={n}, got {batch_size!r}")
        if self.autoreset_mode is AutoresetMode.DISABLED:
            raise ValueError("asynchronous collection supports autoreset modes NEXT_STEP and SAME_STEP, not DISABLED")
        if n % blocks:
            raise ValueError(
                f"asynchronous collection needs num_envs ({n}) divisible into {blocks} equal blocks "
                f"({self.num_workers} workers{' + the calling process' if blocks > self.num_workers else ''}): "
                "batches are made of whole blocks"
            )
        if batch_size % (n // blocks):
            raise ValueError(
                f"batch_size ({batch_size}) must be a multiple of the envs per block "
                f"({n // blocks} = num_envs {n} / {blocks} blocks)"
            )
        return batch_size

    # -- the one guard -----------------------------------------------------------------------
    def _guard(self, method: str, needs_reset: bool = True, sync: bool = True) -> None:
        """Refuse ``method`` on a closed env (and, where it ``needs_reset``, on one not reset
        yet); before a synchronous round (``sync``), wait for the commands in flight that
        ``send``/``async_reset`` started and drop their results (their actions must not be
        overwritten, and nothing may answer two commands).
        """
        if self._state is not _READY:
            refuse(self._state, "ShmVecEnv", method, needs_reset)
        if sync:
            self._drain()

    def _drain(self) -> None:
        """Wait for every command in flight and drop its results (before a synchronous round)."""
        if _IN_FLIGHT not in self._block_states:  # the usual case, on the step path
            return
        with self._closing:
            _, _, failures = self._pool.receive(len(self._block_states))
            self._pool.raise_first({b: e for b, e in failures.items() if not isinstance(e, WorkerError)})

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
        self._guard("reset", needs_reset=False)
        n = self.num_envs
        seeds = seeds_per_env(seed, n)
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
        replies, _ = self._round(Command.RESET, reset_payloads(seeds, options, mask, self._pool.blocks))
        self._state = _READY
        self._current_obs = self._home.obs
        if self.check_finite:
            self._results.check_finite(rewards=False)
        infos = self._infos.merge(replies, False, self._home, _NO_ENVS, with_columns=False)
        return self._results.observations(self.copy), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its row of ``actions``; see Gymnasium's ``VectorEnv.step``."""
        self._guard("step", sync=False)  # (a refused step must not drain what send() started)
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
        self._drain()
        self._torch_threads.enter()
        self._write_actions(actions, self._home.act)
        self._current_obs = self._home.obs
        replies, restarted = self._round(Command.STEP)
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        infos = self._infos.merge(replies, same_step, self._home, restarted)
        if infos and self._learn_infos:
            self._columns_for(infos)
        if self.check_finite:
            self._results.check_finite(rewards=True)
        self._torch_threads.leave()
        return (*self._results.step(self.copy), infos)

    def _columns_for(self, infos: dict[str, Any]) -> None:
        """Once, after the first step that reports infos: give its scalar keys shared columns
        (:mod:`shmvec.info_columns`), so that the workers stop pickling them.
        """
        self._learn_infos = False
        schema = InfoSchema.discover(infos)
        if schema is not None:
            with self._closing:  # a block that cannot map the segment leaves the pool broken
                segment = self._pool.attach_infos(schema)
            self._infos.columns = ColumnReader(segment.layout, segment.views)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every env (or read the attribute if not callable)."""
        self._guard("call", needs_reset=False)
        payloads = [(name, args, kwargs)] * self.num_blocks
        replies, _ = self._round(Command.CALL, payloads, closes_on_error=False)
        return tuple(result for block in replies for result in block)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute ``name`` of every env."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set attribute ``name`` of every env: one value for all, or a list/tuple of one per env."""
        self._guard("set_attr", needs_reset=False)
        self._round(Command.SET_ATTR, set_attr_payloads(name, values, self._pool.blocks), closes_on_error=False)

    # Gymnasium's VectorEnv types these for one generator; its vector envs, ours too, give one per env.
    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """Each env's ``np_random_seed`` (its last reset's seed), as Gymnasium's vector envs give it."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]  # read-only here: a generator in a worker cannot be replaced from here
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """Each env's random generator (a copy, for envs stepped in worker processes), as
        ``AsyncVectorEnv`` gives them.
        """
        return self.get_attr("np_random")

    def render(self) -> tuple[Any, ...]:
        """The frames rendered by every env (per its ``render_mode``)."""
        return self.call("render")

    def close_extras(self, **kwargs: Any) -> None:
        """Stop the workers, close every env and release the shared memory."""
        self._state = _CLOSED
        self._torch_threads.close()
        self._finalizer()

    def __enter__(self) -> ShmVecEnv:
        return self

    def __reduce__(self) -> Any:
        # (pickle, copy.copy and copy.deepcopy all come here)
        raise TypeError(
            "a ShmVecEnv cannot be pickled or copied: it owns worker processes and shared memory. "
            "Pickle its env factories instead and build a new ShmVecEnv from them where you need one."
        )

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- asynchronous collection (EnvPool style) -------------------------------------------
    def async_reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Start resetting every env without waiting; :meth:`recv` returns the batches.

        ``seed`` and ``options`` are as in :meth:`reset` (``reset_mask`` excepted).
        """
        self._guard("async_reset", needs_reset=False)
        seeds = seeds_per_env(seed, self.num_envs)
        payloads = reset_payloads(seeds, options, None, self._pool.blocks)
        self._submit(Command.RESET, list(range(self.num_blocks)), payloads)
        self._state = _READY

    def send(self, actions: Any, env_ids: Any) -> None:
        """Step the envs ``env_ids`` (those :meth:`recv` just returned) with ``actions``.

        ``actions`` holds one row per env of ``env_ids``, in that order. After :meth:`reset`,
        every env is ready for a ``send``.
        """
        self._guard("send", sync=False)
        batch = self._last
        if batch is None or env_ids is not batch.ids:  # the usual loop passes the (read-only) ids recv() returned
            batch = self._batches.covering(env_ids, self._block_states, self._last is not None)
        self._write_actions(actions, self._home.act, batch)
        self._submit(Command.STEP, batch.blocks, None)

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
        """Wait for ``batch_size`` envs to finish; return their results and ids.

        Returns ``(obs, rewards, terminations, truncations, infos, env_ids)``, each with one row
        per env of ``env_ids`` (a whole number of blocks, in env order): ``batch_size``
        envs, or all those in flight if fewer (when you hold some back). Blocks that finish
        first are returned first. Autoreset, infos and episode statistics behave as in
        :meth:`step`. With ``copy=False`` a batch of adjacent blocks comes as read-only views.
        ``env_ids`` is read-only: pass it back to :meth:`send` as it is (the cheapest check).
        With ``ordered=True`` the blocks sent first are returned first, whenever they finish.
        """
        self._guard("recv", needs_reset=False, sync=False)
        if self._held is not None:
            (result, self._last), self._held = self._held, None
            return result
        if _IN_FLIGHT not in self._block_states:
            raise NothingInFlightError("recv() with no env in flight: call send() (or async_reset()) first")
        pool = self._pool
        with self._closing:  # fewer blocks in flight than a batch (envs held back): what there is
            ready, got, failures = pool.receive(self._batch_blocks, self.ordered)
        commands = pool.commands
        restarted: Sequence[int] = _NO_ENVS
        if failures:
            restartable = all(commands[b] == Command.STEP for b in failures)
            restarted = self._settle(failures, restartable, self._home)
        self._last = batch = self._batches.of(ready)
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP and any(commands[b] == Command.STEP for b in ready)
        infos = self._infos.merge([got.get(b) for b in ready], same_step, self._home, restarted, batch.ids)
        result = (*self._results.batch(batch.rows, batch.contiguous, self.copy), infos, batch.ids)
        if self.check_finite:
            try:
                self._results.check_finite(rewards=True, index=batch.rows)
            except NonFiniteError as exc:
                # Nothing is lost: the next recv() hands this batch over as it is.
                self._held, exc.env_ids = (result, batch), batch.ids
                raise
        return result

    def _submit(self, cmd: int, blocks: list[int], payloads: list | None) -> None:
        self._held = None
        with self._closing:
            self._pool.submit(cmd, blocks, payloads)
        self._last = None
        self._current_obs = self._home.obs  # where a later rollout() starts from

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
        >>> advantages, returns = shmvec.rollout_gae(batch, last_values=policy(batch["next_obs"])[1]["value"])
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
            was ignored), the mask ``shmvec.rollout_gae(batch, ...)`` applies; a
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
        self._guard("rollout", sync=False)
        check_rollout(
            policy,
            num_steps,
            self.single_observation_space,
            self.single_action_space,
            self.batch_size,
            self.num_envs,
            self.autoreset_mode,
        )
        self._drain()  # what send() started finishes before row 0 is taken
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
        try:
            fill(storage, policy, _RolloutRounds(self, storage), self.single_action_space)
        finally:
            self._current_obs = [o[storage.rows_done] for o in storage.obs]
        return storage.batch()

    # -- snapshots and checkpoints ----------------------------------------------------------
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
        self._guard("get_state", sync=False)
        ids = checkpoint.env_ids(env_ids, self.num_envs, "get_state")
        groups = checkpoint.by_block(ids, self._pool.blocks)
        replies = self._state_round(Command.GET_STATE, groups, lambda i, offset: offset, "get_state")
        obs = self._current_obs
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
        self._guard("set_state", needs_reset=not everything, sync=False)
        ids = checkpoint.env_ids(env_ids, self.num_envs, "set_state")
        home = self._home.obs
        states = checkpoint.check_states(states, ids, home)
        groups = checkpoint.by_block(ids, self._pool.blocks)
        by_id = dict(zip(ids, states))

        def record(i: int, offset: int) -> tuple:
            s = by_id[i]
            return offset, (s.snapshot, s.autoreset, s.episode_return, s.episode_length)

        if self._current_obs is not home:  # a rollout left the latest observations in its storage
            for dst, src in zip(home, self._current_obs):
                dst[...] = src
            self._current_obs = home
        self._state_round(Command.SET_STATE, groups, record, "set_state")
        for i, state in by_id.items():
            for dst, saved in zip(home, state.obs):
                dst[i : i + 1] = saved
        if everything:
            self._state = _READY
        rows = np.asarray(ids)
        contiguous = bool(len(ids)) and ids == list(range(ids[0], ids[0] + len(ids)))
        return self._results.batch(slice(ids[0], ids[-1] + 1) if contiguous else rows, contiguous, self.copy)[0]

    def _state_round(
        self, cmd: int, groups: dict[int, list[int]], item: Callable[[int, int], Any], method: str
    ) -> list:
        """A GET_STATE or SET_STATE round on the blocks of ``groups`` (``{block: env ids}``, none
        in flight): each block's payload holds ``item(env id, offset in the block)`` per env. A
        :class:`SnapshotError` in a block is raised as itself.
        """
        blocks = list(groups)
        payloads: list[Any] = [None] * self.num_blocks
        for block, members in groups.items():
            start = self._pool.blocks[block].start
            payloads[block] = [item(i, i - start) for i in members]
        busy = [self._pool.blocks[b] for b in blocks if self._block_states[b] is _IN_FLIGHT]
        if busy:
            raise ValueError(
                f"{method}: envs {[i for r in busy for i in r]} are in flight (sent, not received): recv() them first"
            )
        try:
            replies, _ = self._round(cmd, payloads, closes_on_error=False, block_ids=blocks)
        except WorkerError as exc:
            if exc.exc_type == "SnapshotError":
                raise SnapshotError(exc.remote_message) from exc
            raise
        return replies

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this vector env elsewhere, bit for bit: every env's
        :meth:`get_state`, the episode statistics, and the random generators of the spaces
        (``action_space.sample()``). A picklable dict; see :meth:`load_state_dict` and
        :func:`shmvec.save_state`. Nothing may be in flight (receive every batch first).
        """
        self._guard("state_dict", sync=False)
        if _IN_FLIGHT in self._block_states:
            raise ValueError("state_dict: envs are in flight (sent, not received): recv() every batch first")
        return {
            "format": checkpoint.FORMAT,
            "num_envs": self.num_envs,
            "autoreset_mode": self.autoreset_mode.value,
            "envs": self.get_state(),
            "episode_returns": self.episode_returns,
            "episode_lengths": self.episode_lengths,
            "episode_counts": self.episode_counts,
            "space_rngs": checkpoint.space_rngs(self),
        }

    def load_state_dict(self, state: dict[str, Any]) -> Any:
        """Continue from :meth:`state_dict`'s ``state``, taken from this vector env or another with
        the same env factories and ``num_envs`` (in another process, say); return every env's
        observation. The envs are then ready to step (or, with asynchronous collection, to send).
        """
        if not isinstance(state, dict) or state.get("format") != checkpoint.FORMAT:
            raise ValueError(f"load_state_dict: not a ShmVecEnv state_dict (format {checkpoint.FORMAT!r})")
        for key, mine in (("num_envs", self.num_envs), ("autoreset_mode", self.autoreset_mode.value)):
            if state[key] != mine:
                raise ValueError(f"load_state_dict: the checkpoint has {key}={state[key]!r}, this vector env {mine!r}")
        self._guard("load_state_dict", needs_reset=False)
        obs = self.set_state(state["envs"])
        for name, key in (
            ("last_return", "episode_returns"),
            ("last_length", "episode_lengths"),
            ("episode_count", "episode_counts"),
        ):
            self._stats[name][...] = state[key]
        checkpoint.set_space_rngs(self, state["space_rngs"])
        return obs

    # -- properties -----------------------------------------------------------------------
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
        return self._results.buffers

    @property
    def blocks(self) -> list[range]:
        """The envs of each block: block ``k`` is stepped by worker ``k``; with ``step_in_main``
        the last one by the calling process. Asynchronous batches are made of whole blocks.
        """
        return list(self._pool.blocks)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes (empty once closed)."""
        return self._pool.worker_pids

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

    # -- rounds and the error policy --------------------------------------------------------
    def _round(
        self,
        cmd: int,
        payloads: list | None = None,
        closes_on_error: bool = True,
        arg: int = 0,
        out: Targets | None = None,
        block_ids: list[int] | None = None,
    ) -> tuple[list, Sequence[int]]:
        """One synchronous command round (after :meth:`_guard`); apply ``on_error`` to the blocks
        that failed. Returns ``(replies, envs restarted)``; a step's results go to ``out``
        (default: the regular regions). ``block_ids``: the blocks addressed (default: all).
        """
        self._held = None
        with self._closing:
            try:
                replies, failures = self._pool.run(cmd, payloads, arg=arg, block_ids=block_ids)
            except KeyboardInterrupt:
                # The round finishes in the workers and is dropped (_ClosingOnError keeps the env
                # open): its results are lost, so the caller starts again from a reset.
                if self._state is _READY:
                    self._state = Lifecycle.NEEDS_RESET
                raise
        if not failures:
            return replies, _NO_ENVS
        restartable = cmd == Command.STEP or cmd == Command.ROLLOUT_STEP
        return replies, self._settle(failures, restartable, self._home if out is None else out, closes_on_error)

    def _settle(self, failures: Failures, restartable: bool, out: Targets, closes_on_error: bool = True) -> list[int]:
        """Apply ``on_error`` to the blocks that failed: restart them (a step's results go to
        ``out``) when ``restartable`` and asked to, and return the envs restarted; else raise
        the first failure. Raising closes the env, unless ``closes_on_error`` is False and only
        envs raised (call, set_attr).
        """
        if restartable and self.on_error == "restart":
            with self._closing:
                return self._restart(failures, out)
        if closes_on_error or any(not isinstance(exc, WorkerError) for exc in failures.values()):
            with self._closing:  # a lost worker, or a step or reset half done: the envs' state is unknown
                self._pool.raise_first(failures)
        self._pool.raise_first(failures)
        return []  # not reached: raise_first raised

    def _restart(self, failures: Failures, out: Targets) -> list[int]:
        """Give the failed blocks new envs, reset them, and mark them in this step's results
        ``out``; return the envs restarted.
        """
        pool, blocks = self._pool, sorted(failures)
        for block in blocks:
            pool.restart_block(block)
        payloads = [(None, None, None) if b in failures else None for b in range(self.num_blocks)]
        _, again = pool.run(Command.RESET, payloads, block_ids=blocks)
        pool.raise_first(again)
        main = pool.main_index
        for block in blocks:
            sl = slice(pool.blocks[block].start, pool.blocks[block].stop)
            if out is not self._home:  # the reset wrote the regular regions
                for dst, src in zip(out.obs, self._home.obs):
                    dst[sl] = src[sl]
            out.rewards[sl] = 0.0
            out.terminations[sl] = False
            out.truncations[sl] = True
            self.restarts.append((None if block == main else block, pool.blocks[block], failures[block]))
        return [i for block in blocks for i in pool.blocks[block]]

    def _write_actions(self, actions: Any, views: list[np.ndarray], batch: Batch | None = None) -> None:
        """Check ``actions`` (for all envs, or for a ``batch``) and write them into ``views``
        (the regular action regions, or a rollout row's).
        """
        # Under NEXT_STEP an env that ended its episode is reset by this step and never sees its
        # action; Gymnasium hands it any value, so its row is not checked against the space.
        ignored = None
        if self.autoreset_mode is AutoresetMode.NEXT_STEP:
            ignored = self._autoreset if batch is None else self._autoreset[batch.rows]
        checked = self._actions.leaf_arrays(actions, self.num_envs if batch is None else len(batch.ids), ignored)
        # Written only once every leaf passed: a refused action leaves nothing half-written.
        # Item assignment casts as np.copyto(casting="unsafe") does, at a third of its cost.
        index = Ellipsis if batch is None else batch.rows
        for view, a in zip(views, checked):
            view[index] = a


class _RolloutRounds:
    """A rollout's rounds, row by row (:class:`shmvec.rollout_loop.RowRound`), for one env."""

    __slots__ = ("_env", "_rows", "_same_step")

    def __init__(self, env: ShmVecEnv, storage: RolloutStorage) -> None:
        self._env, self._rows = env, storage.rows
        self._same_step = env.autoreset_mode is AutoresetMode.SAME_STEP

    def write_actions(self, t: int, actions: Any) -> None:
        self._env._write_actions(actions, self._rows[t].act)

    def step_row(self, t: int) -> tuple[dict[str, Any], Sequence[int]]:
        env, out = self._env, self._rows[t]
        replies, restarted = env._round(Command.ROLLOUT_STEP, arg=t, out=out)
        infos = env._infos.merge(replies, self._same_step, out, restarted)
        if infos and env._learn_infos:
            env._columns_for(infos)
        if env.check_finite:
            env._results.check_finite(rewards=True, out=out)
        return infos, restarted


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
        if exc_type is None or issubclass(exc_type, PayloadError):  # nothing was sent
            return
        env = self._env()
        if env is None:
            return
        if issubclass(exc_type, KeyboardInterrupt) and env._pool.state is PoolState.OPEN:
            return  # Ctrl-C while the workers ran: what they run is drained later; the env goes on
        env.close()
