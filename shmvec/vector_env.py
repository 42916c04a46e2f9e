"""``ShmVecEnv``: Gymnasium's ``VectorEnv`` API over a :class:`~shmvec.session.Session`.

The front the user holds: it checks each call, says which round the session runs, and hands
out the results. Its asynchronous half (:mod:`shmvec.async_collection`), its rollouts
(:mod:`shmvec.rollouts`) and its snapshots (:mod:`shmvec.states`) are base classes
in files of their own; the options are declared once, in :mod:`shmvec.options`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from shmvec.async_collection import AsyncCollection
from shmvec.batched_spaces import BatchedSpace
from shmvec.blocks import reset_payloads, set_attr_payloads
from shmvec.checks import env_factories, seeds_per_env
from shmvec.diagnose import Diagnosable
from shmvec.lifecycle import Lifecycle, refuse
from shmvec.options import Options
from shmvec.pool import BlockState
from shmvec.protocol import Command
from shmvec.results import SharedBuffers
from shmvec.rollouts import Rollouts
from shmvec.session import Session
from shmvec.slow_loop import SlowLoopWatch
from shmvec.states import Snapshots
from shmvec.torch_threads import TorchThreads

__all__ = ["ShmVecEnv", "SharedBuffers"]

_READY = Lifecycle.READY
_DISABLED = AutoresetMode.DISABLED
_IN_FLIGHT = BlockState.IN_FLIGHT
_STEP = int(Command.STEP)


class ShmVecEnv(AsyncCollection, Rollouts, Snapshots, Diagnosable, VectorEnv):
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
        ``multiprocessing`` start method for every worker: ``"fork"``, ``"forkserver"`` or
        ``"spawn"``. ``None`` (or ``"auto"``) chooses per start: fork while the calling process
        runs one thread, else forkserver; spawn where that is Python's default (macOS, Windows),
        or the method set with ``multiprocessing.set_start_method`` if it is not the default.
        The choice is in :attr:`context` (``"auto"`` for the per-start policy) and, per worker,
        :attr:`start_methods`.
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
        torch's intra-op threads in the calling process while :meth:`step` (or :meth:`recv`, or
        :meth:`rollout`) collects a rollout. torch's OpenMP threads spin after every parallel
        op, on the cores the workers need; in a loop that collects a fixed number of steps
        between updates (PPO's), the vector env lowers torch to this many threads from the
        second rollout on, as a rollout's first step starts, and gives the user's number back as
        its last step returns, so the update runs unchanged (``docs/benchmarks.md``, "In a
        training loop with torch"). ``"auto"``: the usable cores less the worker processes, at
        least 1. ``None`` leaves torch alone; so does a loop that never imported torch or has no
        such rhythm. Said once per process (a :class:`~shmvec.torch_threads.ThreadsNotice`
        warning); undone by :meth:`close`.
    warn_slow_loop : bool, default True
        Once the loop runs in its steady rhythm, measure one window of it (at least 2 s of its
        rollouts, updates left out, as :meth:`diagnose` measures) and warn, once, with the
        numbers and the fix, if its workers waited for a core longer than they ran because the
        calling process's other threads or other processes took the cores (a
        :class:`~shmvec.slow_loop.SlowLoopWarning`; ``docs/benchmarks.md``, "Why is my loop
        slow?"). ``False`` never measures.
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
        warn_slow_loop: bool = True,
    ) -> None:
        super().__init__()
        given = locals()  # the options, as passed: one per field of Options (a test checks the signature)
        env_fns = env_factories(env_fns, "ShmVecEnv")
        self.num_envs = len(env_fns)
        self.options = options = Options.resolve(self.num_envs, {name: given[name] for name in Options.names()})
        self.autoreset_mode: AutoresetMode = options.autoreset_mode  # type: ignore[assignment]
        self.num_workers: int = options.num_workers  # type: ignore[assignment]
        self.num_blocks = options.num_blocks
        self.batch_size: int = options.batch_size  # type: ignore[assignment]
        self.copy = options.copy
        self.ordered = options.ordered
        self._step_refusable = self.batch_size != self.num_envs or self.autoreset_mode is _DISABLED
        self.worker_threads = options.worker_threads
        self._session = session = Session(env_fns, options, self)
        # What runs as each step starts and returns: the one automatic window (it reads the
        # loop's rhythm from torch's threads), torch's threads for the rollout.
        threads = TorchThreads(options.torch_threads)  # type: ignore[arg-type]
        if options.warn_slow_loop:
            session.hooks.add(SlowLoopWatch(threads, session.hooks, session.pool.worker_clocks))
        session.hooks.add(threads)
        self._finalizer = weakref.finalize(self, session.pool.shutdown)
        self.context = session.pool.context
        spaces = session.spaces
        self.single_observation_space = spaces.observation_space
        self.single_action_space = spaces.action_space
        self.metadata = dict(spaces.metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = spaces.render_mode
        self._start_collection(self.batch_size)

    @property
    def on_error(self) -> str:
        """What a fault during ``step`` does: ``"raise"`` or ``"restart"`` (settable)."""
        return self._session.options.on_error

    @on_error.setter
    def on_error(self, value: str) -> None:
        self._session.set_option("on_error", value)

    @property
    def check_finite(self) -> bool:
        """Whether non-finite rewards and observations raise :class:`~shmvec.NonFiniteError` (settable)."""
        return self._session.options.check_finite

    @check_finite.setter
    def check_finite(self, value: bool) -> None:
        self._session.set_option("check_finite", bool(value))

    @property
    def restarts(self) -> list[tuple[int | None, range, Exception]]:
        """Every restart ``on_error="restart"`` made: ``(worker_index, env_range, exception)``."""
        return self._session.restarts

    # -- the VectorEnv API ----------------------------------------------------------------
    def _guard(self, method: str) -> None:
        """Before a synchronous round that needs no reset: refuse it on a closed env, wait for
        what ``send`` started, and drop a batch held back for ``recv``.
        """
        self._session.guard(method, needs_reset=False)

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset all envs (or those in ``options["reset_mask"]``) and return ``(obs, infos)``.

        ``seed=int`` seeds env ``i`` with ``seed + i``; a list gives one seed (or ``None``) per env.
        """
        session = self._session
        session.guard("reset", needs_reset=False)
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
        payloads = reset_payloads(seeds, options, mask, session.pool.blocks)
        infos = session.reset(payloads)
        return session.results.observations(self.copy), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its row of ``actions``; see Gymnasium's ``VectorEnv.step``."""
        session = self._session
        if session.state is not _READY:
            session.guard("step", sync=False)  # (raises; a refused step must not drain what send() started)
        if self._step_refusable:  # (asynchronous collection, or no autoreset)
            self._refuse_step()
        if _IN_FLIGHT in session.states:
            session.drain()
        copy, results = self.copy, session.results
        # Large observations are copied out block by block, as the blocks finish.
        taken = results.copy_out() if copy and results.copies_as_done else None
        infos, _ = session.step(_STEP, actions, session.home, 0, taken)
        return (*results.step(copy, taken), infos)

    def _refuse_step(self) -> None:
        """Raise if ``step`` cannot be taken now: the env collects asynchronously, or an env's
        episode ended under DISABLED autoreset and was not reset.
        """
        if self.batch_size != self.num_envs:
            raise ValueError(
                f"this ShmVecEnv collects asynchronously (batch_size={self.batch_size} < "
                f"num_envs={self.num_envs}): use send(actions, env_ids) and recv()"
            )
        if self.autoreset_mode is _DISABLED and self._session.autoreset.any():
            ended = np.flatnonzero(self._session.autoreset).tolist()
            raise ValueError(
                f"envs {ended} ended their episode and autoreset_mode is DISABLED: reset them first "
                "with reset(options={'reset_mask': mask})"
            )

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every env (or read the attribute if not callable)."""
        self._guard("call")
        replies = self._session.round(Command.CALL, [(name, args, kwargs)] * self.num_blocks)
        return tuple(result for block in replies for result in block)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute ``name`` of every env."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set attribute ``name`` of every env: one value for all, or a list/tuple of one per env."""
        self._guard("set_attr")
        self._session.round(Command.SET_ATTR, set_attr_payloads(name, values, self._session.pool.blocks))

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
        if hasattr(self, "_session"):
            self._session.state = Lifecycle.CLOSED
            self._session.hooks.close()
            self._finalizer()
            # Nothing of this env holds the segments any more: they are unmapped now, unless
            # the caller holds views of them (copy=False, buffers), which stay valid.
            self._session.release()
            self._storage = None

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

    # -- properties -----------------------------------------------------------------------
    @property
    def validate_actions(self) -> bool:
        """Whether actions are checked against the action space before any worker sees them."""
        return self._session.actions.validate

    @validate_actions.setter
    def validate_actions(self, value: bool) -> None:
        self._session.validate_actions(bool(value))

    @property
    def buffers(self) -> SharedBuffers:
        """The shared result buffers, as read-only views: for zero-copy consumers
        (``shmvec.torch`` pins them for asynchronous copies to a GPU).
        """
        if self._session.state is Lifecycle.CLOSED:
            refuse(Lifecycle.CLOSED, "ShmVecEnv", "buffers", False)
        return self._session.results.buffers

    @property
    def blocks(self) -> list[range]:
        """The envs of each block: block ``k`` is stepped by worker ``k``; with ``step_in_main``
        the last one by the calling process. Asynchronous batches are made of whole blocks.
        """
        return list(self._session.pool.blocks)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes (empty once closed)."""
        return self._session.pool.worker_pids

    @property
    def start_methods(self) -> list[str | None]:
        """How each worker's current process was started (``"fork"``, ``"forkserver"`` or
        ``"spawn"``): under ``context=None`` a restart may differ from the first start
        (``docs/architecture.md``, "Platforms").
        """
        return list(self._session.pool.workers.methods)

    @property
    def episode_returns(self) -> np.ndarray:
        """Return of each env's last finished episode (0 until one finishes), counted in the workers.

        Exact for the envs not in flight; an env whose step ``send`` started is read while its
        worker may write it, so its return and length may come from different episodes (read
        them after ``recv``; docs/architecture.md, "Memory ordering").
        """
        return self._session.pool.views["last_return"].copy()

    @property
    def episode_lengths(self) -> np.ndarray:
        """Length of each env's last finished episode (0 until one finishes)."""
        return self._session.pool.views["last_length"].copy()

    @property
    def episode_counts(self) -> np.ndarray:
        """Number of finished episodes per env since construction."""
        return self._session.pool.views["episode_count"].copy()
