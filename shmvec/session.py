"""The engine under a :class:`~shmvec.ShmVecEnv`: command rounds, and what every round's results go through.

A :class:`Session` owns the :class:`~shmvec.pool.WorkerPool` and the calling process's side of
the shared segment. Every round the vector env runs goes through it, so that what follows a
round is written once: the error policy (``on_error``: raise and close, or restart the failed
blocks), and, after every step round (``step``, a rollout's row, ``recv``), one path,
:meth:`Session._after`: the merge of the envs' infos, the discovery of scalar info columns,
and the ``check_finite`` test. The step hooks (:mod:`shmvec.step_hooks`) run around those
rounds here. The public classes (the synchronous API, asynchronous collection, rollouts,
snapshots) only say which round to run and hand out its results.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from shmvec.actions import ActionBatch
from shmvec.async_batches import Batch, Batches
from shmvec.broadcast import Refused, Staged
from shmvec.errors import NonFiniteError, NothingInFlightError, PayloadError, WorkerDied, WorkerError
from shmvec.info_columns import ColumnReader, InfoLayout, InfoSchema
from shmvec.infos import InfoMerger
from shmvec.layout import RolloutLayout
from shmvec.lifecycle import Lifecycle, refuse
from shmvec.options import Options
from shmvec.pool import BlockState, Failures, PoolState, WorkerPool
from shmvec.protocol import Command, Restart
from shmvec.protocol import restart as restart_of
from shmvec.results import CopyOut, Results
from shmvec.segment import Segment
from shmvec.step_hooks import StepHooks
from shmvec.stepper import Targets

__all__ = ["Session"]

# Replacements of one block that may die in a row while they start, before on_error="restart" gives up.
RESTARTS_IN_A_ROW = 5
NO_ENVS: tuple[int, ...] = ()  # no env restarted (shared: never changed)
_IN_FLIGHT = BlockState.IN_FLIGHT
_READY = Lifecycle.READY
_RESET, _STEP = int(Command.RESET), int(Command.STEP)


class Session:
    """The rounds of one vector env over its pool, with its error policy and its results.

    Parameters
    ----------
    env_fns : sequence of callables returning ``gymnasium.Env``
    options : Options
        Resolved options (:meth:`Options.resolve`).
    owner : object
        The vector env, held weakly: a round that raises closes it (see :class:`ClosingOnError`).

    Attributes
    ----------
    pool : WorkerPool
    results : Results
        The result regions; ``home`` is where a synchronous step writes.
    latest : list of ndarray
        The leaves that hold every env's latest observation: the regular regions, or the rows
        of a rollout's storage after one ran.
    restarts : list of (worker index or None, env range, exception)
        Every block that ``on_error="restart"`` replaced.
    hooks : StepHooks
        What runs as each step round starts and returns.
    batches : Batches
        The asynchronous batches (whole blocks) made so far.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], options: Options, owner: Any) -> None:
        self.options = options
        self.pool = pool = WorkerPool(env_fns, options)
        self.num_envs = pool.num_envs
        self.spaces = pool.spaces
        self.restarts: list[tuple[int | None, range, Exception]] = []
        self.closing = ClosingOnError(weakref.ref(owner), pool)
        obs_space, layout, views = pool.spaces.observation_space, pool.layout, pool.views
        self.actions: ActionBatch  # (validate_actions, below)
        self.results = Results(obs_space, layout, views, pool.blocks)
        self.home: Targets = self.results.home
        self.infos = InfoMerger(obs_space, layout.obs_leaves, pool.num_envs)
        self.autoreset = views["autoreset"]
        self.latest = self.home.obs
        self.states = pool.states  # read on the step path
        self.next_step = options.autoreset_mode is AutoresetMode.NEXT_STEP
        # Under NEXT_STEP an env that ended its episode is reset by the next step and never sees
        # its action; Gymnasium hands it any value, so its row is not checked against the space.
        self.ignored = self.autoreset if self.next_step else None
        self.staging: np.ndarray | None = None
        self.validate_actions(options.validate_actions)
        self.same_step = options.autoreset_mode is AutoresetMode.SAME_STEP
        self.check_finite = options.check_finite  # (read on the step path)
        self._learn_infos = True  # until the first step with infos picked the info columns
        self.state = Lifecycle.NEEDS_RESET  # the vector env's, checked by every public method
        self.hooks = StepHooks()
        self.batches = Batches(pool.blocks)
        # A recv() result that check_finite refused, with its batch: the next recv() hands it
        # over; any other round (synchronous, or a submit) drops it.
        self.held: tuple[tuple, Batch] | None = None

    def validate_actions(self, validate: bool) -> None:
        """Check the actions against the action space (``validate``) or not, from the next step
        on. A step's Discrete batch is staged, and checked and copied by the compiled round.
        """
        self.actions = ActionBatch(self.pool.spaces.action_space, validate)
        bounds = self.actions.bounds()
        self.staging = None
        if bounds is not None and self.pool.broadcasts and self.pool.round is not None:  # (None: closed)
            self.staging = np.zeros(self.num_envs, np.int64)
            self._staging_rows: dict[int, np.ndarray] = {}  # a batch's rows of it, by their number
            self.pool.round.check_actions(self.staging, *bounds)
            # The compiled check skips the rows of envs the next step resets (see ignored).
            self._ignored_at = 0 if self.ignored is None else self.ignored.ctypes.data
            self._home_staged = self.num_envs, self.home.act_address, self._ignored_at  # (a step's, made once)

    def release(self) -> None:
        """Drop this session's views of the segments, once its pool is shut down: the memory is
        unmapped as soon as no one else holds a view (no reference cycle keeps it either).
        """
        self.results = self.home = self.latest = self.autoreset = self.ignored = None  # type: ignore[assignment]
        self.staging = None
        self.held = None
        self.batches.release()
        self.infos.columns = None

    def set_option(self, name: str, value: Any) -> None:
        """Change option ``name`` of a running vector env (one the calling process applies)."""
        self.options = self.options.replace(name, value)
        self.check_finite = self.options.check_finite

    def guard(self, method: str, needs_reset: bool = True, sync: bool = True) -> None:
        """Refuse ``method`` on a closed env (and, where it ``needs_reset``, on one not reset
        yet); before a synchronous round (``sync``), wait for the commands in flight that
        ``send``/``async_reset`` started and drop their results (:meth:`drain`).
        """
        if self.state is not _READY:
            refuse(self.state, "ShmVecEnv", method, needs_reset)
        if sync:
            self.drain()

    # -- the rounds --------------------------------------------------------------------------
    def round(self, cmd: int, payloads: list | None = None, block_ids: list[int] | None = None) -> list:
        """A round whose replies are the caller's to read (call, set_attr, snapshots): one reply
        per block. A failure is raised; the env stays open if only envs raised (a lost worker,
        or a step or reset half done, closes it).
        """
        replies, failures = self._run(cmd, payloads, 0, block_ids)
        if failures:
            self.settle(failures, Restart.RAISE, self.home, closes_on_error=False)
        return replies

    def reset(self, payloads: list | None) -> dict[str, Any]:
        """A RESET round (``payloads``: one per block): the envs' reset infos. A failure is raised."""
        if self.latest is not self.home.obs:
            self.to_home()  # a masked reset keeps the other envs' latest observations
        replies, failures = self._run(_RESET, payloads, 0, None)
        if failures:
            self.settle(failures, Restart.RAISE, self.home)
        self.state = _READY  # (before the check: a non-finite observation leaves the envs reset)
        infos = self.infos.merge(replies, False, self.home, NO_ENVS, with_columns=False)
        if self.check_finite:
            self.finite(self.home, rewards=False)
        return infos

    def step(
        self, cmd: int, actions: Any, out: Targets, arg: int = 0, taken: CopyOut | None = None
    ) -> tuple[dict, Sequence[int]]:
        """A STEP, or ROLLOUT_STEP into row ``arg``, of every env with ``actions``, written into
        ``out``: the hooks around it, ``on_error`` applied, then :meth:`_after`. Returns
        ``(infos, envs restarted)``. ``taken`` (:meth:`Results.copy_out`) copies each block's
        observations as the block finishes.
        """
        hooks = self.hooks
        hooks.enter()
        try:  # (leave() on a failed step too: the rhythm's clock and torch's threads stay right)
            pool = self.pool
            broadcast = taken is None and pool.broadcasts
            # A Discrete batch is staged, and checked and copied by the compiled round.
            staging = self.staging if broadcast and out.act_address else None
            staged = None
            if staging is not None and self.actions.stage(actions, staging):
                staged = self._home_staged if out is self.home else (self.num_envs, out.act_address, self._ignored_at)
            else:
                self.actions.write(actions, out.act, self.num_envs, self.ignored)
            if out is self.home and self.latest is not out.obs:
                self.to_home()
            held, self.held = self.held, None
            try:  # (as _run does; a broadcast where it is one, without run's tests of its arguments)
                if broadcast:
                    result = pool.broadcast(cmd, arg, None, staged)
                else:
                    on_done = None if taken is None else taken.block
                    result = pool.run(cmd, None, None, None, arg, None, on_done)
            except BaseException as exc:
                self._raised(exc)
                raise
            if result is None:  # the compiled round refused the staged batch, and posted nothing
                self.held = held  # (a batch held back for recv stays held, as nothing ran)
                self.actions.write(actions, out.act, self.num_envs, self.ignored)  # (raises why)
                raise AssertionError("the compiled round refused actions that ActionBatch.write accepts")
            replies, failures = result
            restarted: Sequence[int] = NO_ENVS
            if failures:
                restarted = self.settle(failures, restart_of(cmd), out)
            return self._after(replies, restarted, out, self.same_step), restarted
        finally:
            hooks.leave()

    def recv(self, count: int, ordered: bool, copy: bool) -> tuple[tuple, Batch]:
        """Wait for ``count`` blocks in flight and hand out their results (``ordered``: the
        oldest submissions): ``((obs, rewards, terminations, truncations, infos, env_ids),
        batch)``. The hooks run around it, the failures are settled as a step's are (a restart
        only where every failed block stepped), then :meth:`_after`; a batch that
        ``check_finite`` refused is held for the next call.
        """
        held = self.held
        if held is not None:
            self.held = None
            return held
        if not self.in_flight():
            raise NothingInFlightError("recv() with no env in flight: call send() (or async_reset()) first")
        pool, hooks = self.pool, self.hooks
        hooks.enter()
        try:
            try:  # (ClosingOnError's work, as in _run)
                ready, got, failures = pool.receive(count, ordered)
            except BaseException as exc:
                self.closing.after(type(exc))
                raise
            restarted: Sequence[int] = NO_ENVS
            commands = pool.commands
            if failures:
                steps = all(restart_of(commands[b]) is Restart.REPLACE for b in failures)
                restarted = self.settle(failures, Restart.REPLACE if steps else Restart.RAISE, self.home)
            batch = self.batches.of(ready)
            same_step = self.same_step and any(commands[b] == _STEP for b in ready)
            try:
                infos = self._after([got.get(b) for b in ready], restarted, self.home, same_step, batch)
            except NonFiniteError as exc:
                # Nothing is lost: the next recv() hands this batch over as it is.
                exc.env_ids = batch.ids
                results = self.results.batch(batch.rows, batch.contiguous, copy, batch.views)
                self.held = (*results, exc.infos, batch.ids), batch
                raise
            return (*self.results.batch(batch.rows, batch.contiguous, copy, batch.views), infos, batch.ids), batch
        finally:
            hooks.leave()

    def _after(
        self, replies: list | None, restarted: Sequence[int], out: Targets, same_step: bool, batch: Batch | None = None
    ) -> dict[str, Any]:
        """What follows every step round (``step``, a rollout's row, ``recv``), written once: the
        infos of the ``replies`` merged as Gymnasium merges them (after the first synchronous
        step that has some, their scalar keys get columns in shared memory), then the
        ``check_finite`` test (a :class:`~shmvec.NonFiniteError` carries the infos).

        A caller-side per-step feature goes here: ``out`` holds the step's results, in the rows
        of ``batch`` (``None``: every env; an asynchronous batch's infos teach no columns, as
        attaching them is a round of every block while others are in flight). ``replies`` is
        ``None`` after a quiet broadcast round (no block replied, none restarted).
        """
        if replies is None:
            if self.infos.columns is None and not self.check_finite:
                return {}  # (what the merge would find: no report, no column, nothing to test)
            replies = []
        if batch is None:
            infos = self.infos.merge(replies, same_step, out, restarted)
            if infos and self._learn_infos:
                self._columns_for(infos)
        else:
            infos = self.infos.merge(replies, same_step, out, restarted, batch.ids)
        if self.check_finite:
            try:
                self.finite(out, batch)
            except NonFiniteError as exc:
                exc.infos = infos
                raise
        return infos

    def finite(self, out: Targets, batch: Batch | None = None, rewards: bool = True) -> None:
        """Raise :class:`~shmvec.NonFiniteError` if a result in ``out`` (of ``batch``'s envs,
        default all) is NaN or infinite: what ``check_finite`` asks after every step and reset.
        """
        if batch is None:
            self.results.check_finite(rewards=rewards, out=out)
        else:
            self.results.check_finite(rewards=rewards, index=batch.rows)

    def to_home(self) -> None:
        """Make the regular regions hold every env's latest observation again, where a rollout
        left them in its storage's rows.
        """
        home = self.home.obs
        if self.latest is not home:
            for dst, src in zip(home, self.latest):
                dst[...] = src
            self.latest = home

    def _run(self, cmd: int, payloads: list | None, arg: int, block_ids: list[int] | None) -> tuple[list, Failures]:
        self.held = None
        try:
            return self.pool.run(cmd, payloads, arg=arg, block_ids=block_ids)
        except BaseException as exc:
            self._raised(exc)
            raise

    def _raised(self, exc: BaseException) -> None:
        """A round raised ``exc``: ClosingOnError's work, without a `with` on the step path."""
        if isinstance(exc, KeyboardInterrupt) and self.state is _READY:
            # The round finishes in the workers and is dropped (ClosingOnError keeps the env
            # open): its results are lost, so the caller starts again from a reset.
            self.state = Lifecycle.NEEDS_RESET
        self.closing.after(type(exc))

    def submit(self, cmd: int, blocks: list[int], payloads: list | None, actions: Staged | None = None) -> None:
        """Start ``cmd`` on ``blocks`` without waiting (asynchronous collection); ``actions``:
        a staged batch (see :meth:`send`).
        """
        self.held = None
        if self.latest is not self.home.obs:
            self.to_home()  # (before the workers write there: the envs not submitted keep theirs)
        try:  # (ClosingOnError's work, as in _run)
            self.pool.submit(cmd, blocks, payloads, actions=actions)
        except Refused:  # nothing was posted: the Python check says why
            raise
        except BaseException as exc:
            self.closing.after(type(exc))
            raise

    def send(self, actions: Any, batch: Batch) -> None:
        """Step the envs of ``batch`` with ``actions`` without waiting. A Discrete batch of
        adjacent envs is staged, and checked and copied by the compiled post; any other is
        checked and written here (:meth:`write_actions`).
        """
        staged = None
        act_address = self.home.act_address
        if self.staging is not None and batch.contiguous and act_address:
            n, start = len(batch.ids), batch.rows.start  # type: ignore[union-attr]
            staging = self._staging_rows.get(n)
            if staging is None:
                staging = self._staging_rows[n] = self.staging[:n]
            if self.actions.stage(actions, staging):
                ignored = self._ignored_at
                staged = n, act_address + 8 * start, ignored + start if ignored else 0
        if staged is None:
            self.write_actions(actions, self.home.act, batch)
        held = self.held
        try:
            self.submit(_STEP, batch.blocks, None, staged)
            return
        except Refused:  # nothing was posted: a batch held back for recv stays held
            self.held = held
        self.write_actions(actions, self.home.act, batch)  # (raises why, outside the except: no chained Refused)
        raise AssertionError("the compiled check refused actions that ActionBatch.write accepts")

    def drain(self) -> None:
        """Wait for every command in flight and drop its results (before a synchronous round:
        their actions must not be overwritten, and nothing may answer two commands).
        """
        if _IN_FLIGHT not in self.states:  # the usual case, on the step path
            return
        pool = self.pool
        with self.closing:
            _, _, failures = pool.receive(len(self.states))
            lost = {b: e for b, e in failures.items() if not isinstance(e, WorkerError)}
            # A worker lost in a step whose results are dropped is replaced as in that step
            # (on_error="restart"), not raised from the round that drained it.
            if lost and self.options.on_error == "restart":
                if all(restart_of(pool.commands[b]) is Restart.REPLACE for b in lost):
                    self._restart(lost, self.home)
                    return
            pool.raise_first(lost)

    def in_flight(self, blocks: Sequence[int] | None = None) -> bool:
        """Whether any block (of ``blocks``) has a command in flight."""
        states = self.states
        if blocks is None:
            return _IN_FLIGHT in states  # (on recv's path: one C-level scan)
        return any(states[b] is _IN_FLIGHT for b in blocks)

    # -- the error policy --------------------------------------------------------------------
    def settle(self, failures: Failures, restart: Restart, out: Targets, closes_on_error: bool = True) -> list[int]:
        """Apply ``on_error`` to the blocks that failed: restart them (a step's results go to
        ``out``) where the command allows it (``restart``) and the user asked to, and return
        the envs restarted; else raise the first failure. Raising closes the env, unless
        ``closes_on_error`` is False and only envs raised.
        """
        if restart is Restart.REPLACE and self.options.on_error == "restart":
            with self.closing:
                return self._restart(failures, out)
        if closes_on_error or any(not isinstance(exc, WorkerError) for exc in failures.values()):
            with self.closing:  # a lost worker, or a step or reset half done: the envs' state is unknown
                self.pool.raise_first(failures)
        self.pool.raise_first(failures)
        return []  # not reached: raise_first raised

    def _restart(self, failures: Failures, out: Targets) -> list[int]:
        """Give the failed blocks new envs, reset them, and mark them in this step's results
        ``out``; return the envs restarted. A replacement that dies while it starts (built,
        joined or reset: the OOM killer, a storm of kills) is replaced again, up to
        ``RESTARTS_IN_A_ROW`` times in a row; then the error says so.
        """
        pool, home = self.pool, self.home
        blocks = sorted(failures)
        died_starting = dict.fromkeys(blocks, 0)
        todo = blocks
        while todo:
            joined, lost = [], {}
            for block in todo:
                try:
                    pool.restart_block(block)
                    joined.append(block)
                except WorkerDied as exc:
                    lost[block] = exc
            if joined:
                payloads = [(None, None, None) if b in joined else None for b in range(len(pool.blocks))]
                _, again = pool.run(Command.RESET, payloads, block_ids=joined)
                lost.update((b, e) for b, e in again.items() if isinstance(e, WorkerDied))
                pool.raise_first({b: e for b, e in again.items() if b not in lost})
            for block, died in lost.items():
                died_starting[block] += 1
                if died_starting[block] >= RESTARTS_IN_A_ROW:
                    pool.state = PoolState.BROKEN
                    raise WorkerDied(
                        died.worker_index,
                        died.exitcode,
                        died.envs,
                        f"; it was replaced {RESTARTS_IN_A_ROW} times in a row, and each replacement died "
                        "while it started (the last as shown)",
                    ) from died
            todo = sorted(lost)
        for block in blocks:
            sl = slice(pool.blocks[block].start, pool.blocks[block].stop)
            if out is not home:  # the reset wrote the regular regions
                for dst, src in zip(out.obs, home.obs):
                    dst[sl] = src[sl]
            out.rewards[sl] = 0.0
            out.terminations[sl] = False
            out.truncations[sl] = True
            self.restarts.append((None if block == pool.main_index else block, pool.blocks[block], failures[block]))
        return [i for block in blocks for i in pool.blocks[block]]

    # -- what the rounds read and write --------------------------------------------------------
    def write_actions(self, actions: Any, views: list[np.ndarray], batch: Batch) -> None:
        """Check the actions of a ``batch`` and write them into its rows of ``views`` (the regular
        action regions); a step of every env writes its own (:meth:`step`), as this does.
        """
        ignored = None if self.ignored is None else self.ignored[batch.rows]
        self.actions.write(actions, views, len(batch.ids), ignored, batch.rows)

    def rollout_segment(self, num_steps: int) -> Segment:
        """The rollout segment of ``num_steps`` steps every block holds: the one attached, or a
        new one handed to every block in place of it (views of the old one stay valid while
        they live). A block that fails to map it leaves the vector env closed.
        """
        pool = self.pool
        segment = pool.attached.get(Command.ROLLOUT_ATTACH)
        if segment is None or segment.layout.num_steps != num_steps:
            with self.closing:
                layout = RolloutLayout.build(pool.layout, num_steps)
                segment = pool.attach(Command.ROLLOUT_ATTACH, Segment(layout), self.options.on_error == "restart")
        return segment

    def _columns_for(self, infos: dict[str, Any]) -> None:
        """Once, after the first step that reports infos: give its scalar keys shared columns
        (:mod:`shmvec.info_columns`), so that the workers stop pickling them.
        """
        self._learn_infos = False
        schema = InfoSchema.discover(infos)
        if schema is not None:
            with self.closing:  # a block that cannot map the segment leaves the pool broken
                layout = InfoLayout.build(schema, self.pool.num_envs)
                segment = self.pool.attach(Command.INFO_ATTACH, Segment(layout), self.options.on_error == "restart")
            self.infos.columns = ColumnReader(segment.layout, segment.views)


class ClosingOnError:
    """``with session.closing:`` closes the vector env if the code inside raises (and lets the
    error through).

    One object per env, made once: entering it allocates nothing on the step path.
    """

    __slots__ = ("_env", "_pool")

    def __init__(self, env: weakref.ref, pool: WorkerPool) -> None:
        self._env, self._pool = env, pool

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is not None:
            self.after(exc_type)

    def after(self, exc_type: type[BaseException]) -> None:
        """Close the vector env after ``exc_type`` was raised, unless the env is still whole."""
        if issubclass(exc_type, PayloadError):  # nothing was sent
            return
        if issubclass(exc_type, KeyboardInterrupt) and self._pool.state is PoolState.OPEN:
            return  # Ctrl-C while the workers ran: what they run is drained later; the env goes on
        env = self._env()
        if env is not None:
            env.close()
