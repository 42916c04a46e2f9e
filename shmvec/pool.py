"""Command rounds over the lanes of a vector env: submit, wait, collect, and the main lane.

A :class:`WorkerPool` splits ``num_envs`` envs into contiguous lanes. Each lane is served by
a worker process (:mod:`shmvec.processes`), so no env can take the calling process down. With
``step_in_main`` (an opt-in speed mode) the last lane is a :class:`~shmvec.worker.Lane` stepped
by the calling process itself while the workers step theirs, so on an N-core machine N lanes
run at once and no core idles in a wait.

The pool knows nothing of the Gymnasium API: it runs protocol commands and returns replies.
"""

from __future__ import annotations

import pickle
import select
import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

import numpy as np

from shmvec import protocol as P
from shmvec.blocks import split
from shmvec.checks import usable_cores
from shmvec.errors import ClosedError, PayloadError, StepTimeout, WorkerDied, WorkerError
from shmvec.layout import Layout, RolloutLayout, control_lines
from shmvec.processes import WorkerProcesses, raise_construct_failure
from shmvec.protocol import DONE, Command, Status
from shmvec.segment import Segment
from shmvec.sync import SpinPolicy, block_until, fence, ring, spin_until
from shmvec.worker import Lane, build_envs

# Seconds between looks for dead workers while the others keep finishing (asynchronous waits).
SENTINEL_CHECK_S = 0.02


def _pickle_payloads(payloads: list, lane_ids: list[int]) -> dict[int, bytes]:
    """The worker lanes' payloads, pickled before any worker is told that one is coming: a payload
    that cannot be pickled then fails with every worker still idle, instead of leaving them
    waiting for it. A payload shared by several lanes (a ``call``'s arguments) is pickled once.
    """
    from multiprocessing.reduction import ForkingPickler

    blobs: dict[int, bytes] = {}
    done: dict[int, bytes] = {}
    for lane in lane_ids:
        payload = payloads[lane]
        if payload is not None:
            blob = done.get(id(payload))
            if blob is None:
                try:
                    blob = done[id(payload)] = bytes(ForkingPickler.dumps(payload))
                except Exception as exc:
                    raise PayloadError(
                        f"the arguments for worker {lane} cannot be pickled: {type(exc).__name__}: {exc}"
                    ) from exc
            blobs[lane] = blob
    return blobs


class LaneState(Enum):
    """Where a lane stands in the asynchronous API (synchronous rounds leave it IDLE)."""

    IDLE = "idle"  # nothing submitted, or its results received
    IN_FLIGHT = "in flight"  # a command submitted with :meth:`WorkerPool.submit`, its results not received


class WorkerPool:
    """Lanes of envs stepped in one shared-memory segment, by worker processes (and the caller).

    Parameters
    ----------
    env_fns : sequence of callables returning ``gymnasium.Env``
    num_lanes : int
        Lanes stepped in parallel (``1 <= num_lanes <= len(env_fns)``).
    step_in_main : bool
        Whether the calling process steps the last lane itself.
    context : str or None
        ``multiprocessing`` start method (``"fork"``, ``"forkserver"``, ``"spawn"``).
    autoreset_mode : str
        Gymnasium's autoreset mode value (``"NextStep"``, ``"SameStep"``, ``"Disabled"``).
    timeout : float or None
        Seconds a command may take (construction too) before :class:`StepTimeout`.
    spin_us : float or None
        Spin budget of a wait, in microseconds, before it blocks; ``None`` picks one from the
        number of cores (spinning only where the spinner has a core of its own).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        num_lanes: int,
        step_in_main: bool,
        context: str | None,
        autoreset_mode: str,
        timeout: float | None,
        spin_us: float | None = None,
    ) -> None:
        self.num_envs = len(env_fns)
        self.lanes: list[range] = split(self.num_envs, num_lanes)  # the envs of each lane
        num_workers = num_lanes - 1 if step_in_main else num_lanes
        self.worker_lanes: list[int] = list(range(num_workers))  # the lanes served by worker processes
        self.main_lane: int | None = num_lanes - 1 if step_in_main else None  # the caller's lane
        self.timeout = timeout
        self.autoreset_mode = autoreset_mode
        self.closed = False
        self.broken = False  # a fault left workers in an unknown state: only shutdown is allowed

        # Spinning pays only for a waiter with a core of its own. Workers wait for GO while
        # main is between steps (or, stepping a lane itself, busy as they are). Main waits for
        # DONE while the lanes run: with a core of its own it spins long; sharing the cores
        # with as many workers as cores (every env in a worker, the default) it spins briefly,
        # yielding its core every few polls, which catches a cheap step's round trip without a
        # kernel wake-up (measured on 2 cores, CartPole at 8/32/128 envs: 1.49x/1.20x/1.05x the
        # speed of blocking at once; 150 us beat 50 and matched 400 and 2000).
        cores = usable_cores()
        worker_spin = 2000.0 if num_lanes <= cores else 0.0
        if num_workers + 1 <= cores:
            main_spin = 2000.0
        else:
            main_spin = 150.0 if num_lanes <= cores else 0.0
        if spin_us is not None:
            worker_spin = main_spin = float(spin_us)
        oversubscribed = num_workers + 1 > cores
        self._worker_spin = SpinPolicy(worker_spin * 1e-6, min(50e-6, worker_spin * 1e-6), oversubscribed)
        self._wait_policy = SpinPolicy(main_spin * 1e-6, min(50e-6, main_spin * 1e-6), oversubscribed)
        self._next_sentinel_check = 0.0

        # Filled in by the set-up below.
        self.spaces: P.Spaces | None = None  # what every env reported: spaces, metadata, render mode, spec
        self.layout: Layout | None = None
        self.views: dict[str, np.ndarray] = {}
        self.lines: list[memoryview] = []  # one int64 memoryview per control line: a third of a numpy scalar's cost
        self.replies: list[memoryview] = []  # each lane's row of the replies region
        self.main_line: memoryview | None = None
        self.main: Lane | None = None  # the envs of the main lane, stepped by this process
        self._main_envs: list = []  # the main lane's envs while the set-up runs
        self._segment: Segment | None = None
        self.rollout: Segment | None = None  # the rollout segment, once attach_rollout made one
        # Pickled leaves (variable-size spaces): the action regions a STEP sends each worker in
        # its payload, and whether STEP and RESET replies carry observation regions.
        self._pickled_act: list[str] = []
        self._pickled_obs = False

        # Command rounds. Per lane, the main one included: its asynchronous state, the sequence
        # number it must reach, its last command, and perf_counter() of its last submission.
        self.seq = 0
        self.states = [LaneState.IDLE] * num_lanes
        self._target = [0] * num_lanes
        self.commands: list[int] = [0] * num_lanes
        self._submitted = [0.0] * num_lanes
        self._all_seq: int | None = None  # set while every worker lane's target is this one number
        self._all_done: Callable[[], bool] = lambda: False  # see _set_up
        # Asynchronous rounds: the main lane's command submitted but not run yet, and once
        # wait() ran it, its (reply, failure) until collect takes it.
        self._main_pending: tuple[int, Any, int] | None = None  # (cmd, payload, arg)
        self._main_result: tuple[Any, Exception | None] | None = None

        self._env_fns = env_fns  # the main lane's are called again by a restart
        self.workers = WorkerProcesses(env_fns, self.lanes[:num_workers], context)
        self.context = self.workers.context
        try:
            for lane in self.worker_lanes:
                self.workers.start(lane)
            self._set_up()
        except BaseException:
            self.broken = True
            self.shutdown(timeout=1.0)
            raise

    # -- set-up ----------------------------------------------------------------------------
    def _set_up(self) -> None:
        """The handshake (see ``docs/architecture.md``): spaces from every lane, the segment,
        then every worker attached to it.
        """
        deadline = self._deadline()
        found = []  # (first env, Spaces) of each lane
        if self.main_lane is not None:
            self._main_envs = self._build_main_envs()
            found.append((self.lanes[-1].start, P.Spaces.of(self._main_envs[0])))
        found += [(self.lanes[lane].start, self.workers.spaces(lane, deadline)) for lane in self.worker_lanes]
        found.sort(key=lambda f: f[0])
        spaces = found[0][1]
        for start, other in found[1:]:
            self._check_spaces(start, other, spaces)
        self.spaces = spaces

        self.layout = Layout.build(
            spaces.observation_space,
            spaces.action_space,
            self.num_envs,
            len(self.lanes),
            with_final_obs=self.autoreset_mode == "SameStep",
        )
        self._segment = Segment(self.layout)
        self.views = self._segment.views
        self._pickled_act = self.layout.pickled("act/")
        self._pickled_obs = bool(self.layout.pickled("obs/"))
        self.lines = control_lines(self.views)
        self.main_line = self.lines[len(self.lanes)]
        self.replies = [memoryview(row) for row in self.views["replies"]]
        worker_lines = self.lines[: len(self.worker_lanes)]

        def all_done() -> bool:  # every worker lane reached _all_seq (what a sync round waits for)
            seq = self._all_seq
            for line in worker_lines:
                if line[DONE] != seq:
                    return False
            return True

        self._all_done = all_done
        for lane in self.worker_lanes:
            self._attach(lane)
        for lane in self.worker_lanes:
            self.workers.ready(lane, deadline)
        if self.main_lane is not None:
            self.main = self._main(self._main_envs)
            self._main_envs = []

    def _build_main_envs(self) -> list:
        envs = self.lanes[-1]
        built = build_envs(self._env_fns[envs.start : envs.stop], envs.start, len(self.lanes) - 1)
        raise_construct_failure(built, envs.start)
        return built

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + max(self.timeout, 30.0)

    @staticmethod
    def _check_spaces(start: int, found: P.Spaces, spaces: P.Spaces) -> None:
        if found.observation_space != spaces.observation_space:
            raise ValueError(
                f"env {start} has observation_space {found.observation_space}, but env 0 has {spaces.observation_space}"
            )
        if found.action_space != spaces.action_space:
            raise ValueError(f"env {start} has action_space {found.action_space}, but env 0 has {spaces.action_space}")

    def _main(self, envs: list) -> Lane:
        main = Lane(
            envs,
            self.lanes[-1].start,
            self.layout,
            self.views,
            self.autoreset_mode,
            self.spaces.observation_space,
            self.spaces.action_space,
        )
        if self.rollout is not None:
            main.attach_rollout((self.rollout.layout, self.rollout.mapping))
        return main

    def _attach(self, lane: int) -> None:
        self.workers.attach(lane, P.Attach(self.layout, self.autoreset_mode, self._worker_spin), self._segment.fd)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes (empty once shut down)."""
        return [] if self.closed else [p.pid for p in self.workers.procs if p is not None]

    def restart_lane(self, lane: int) -> None:
        """Replace the envs of ``lane`` with new ones (a new worker process for a worker lane).

        The new envs are built but not reset. Raises like construction does if that fails.
        """
        if lane == self.main_lane:
            for env in self.main.envs:
                try:
                    env.close()
                except Exception:
                    pass
            envs = self._build_main_envs()
            try:
                self._check_spaces(self.lanes[lane].start, P.Spaces.of(envs[0]), self.spaces)
            except ValueError:
                for env in envs:
                    env.close()
                raise
            self.main = self._main(envs)
            return
        self.workers.stop(lane)
        # The new worker starts from the current sequence number, with nothing pending.
        line = self.lines[lane]
        line[P.GO] = line[DONE] = self._target[lane] = self.seq
        line[P.SLEEPING] = 0
        self._all_seq = None
        self.workers.start(lane)
        deadline = self._deadline()
        self._check_spaces(self.lanes[lane].start, self.workers.spaces(lane, deadline), self.spaces)
        self._attach(lane)
        self.workers.ready(lane, deadline)
        if self.rollout is not None:
            _, failures = self._attach_rollout([lane])
            self.raise_first(failures)

    def attach_rollout(self, num_steps: int) -> Segment:
        """Create the rollout segment for ``num_steps`` steps and hand it to every lane.

        A previous rollout segment is dropped (views of it stay valid while they live). Raises
        what the round raised if a lane fails to map it (the pool is then broken).
        """
        old, self.rollout = self.rollout, Segment(RolloutLayout.build(self.layout, num_steps))
        if old is not None:
            old.close()
        _, failures = self._attach_rollout(list(range(len(self.lanes))))
        if failures:
            self.broken = True
            self.raise_first(failures)
        return self.rollout

    def _attach_rollout(self, lane_ids: list[int]) -> tuple[list, dict[int, Exception]]:
        rollout = self.rollout
        payloads: list[Any] = [rollout.layout] * len(self.lanes)
        if self.main is not None:
            payloads[-1] = (rollout.layout, rollout.mapping)
        return self.run(Command.ROLLOUT_ATTACH, payloads, lane_ids=lane_ids, fd=rollout.fd)

    # -- command rounds ----------------------------------------------------------------------
    # A round is submit (signal the lanes), then wait (for all, or for some in async mode),
    # then collect (statuses and the rare pickled replies). Sync `run` is the three in a row.

    def submit(
        self,
        cmd: int,
        lane_ids: list[int],
        payloads: list | None = None,
        arg: int = 0,
        fd: int | None = None,
        state: LaneState = LaneState.IN_FLIGHT,
    ) -> None:
        """Start ``cmd`` (with argument ``arg``) on the lanes ``lane_ids`` and put them in ``state``;
        ``fd`` is a descriptor that follows each payload on the pipe.

        Asynchronous rounds leave the lanes IN_FLIGHT until :meth:`receive` takes their
        results; :meth:`run` submits with IDLE, as it collects them itself. Worker lanes start
        and run on their own. The main lane, if listed, is kept for :meth:`wait` to run, and
        its result for :meth:`collect` to take.
        """
        if self.closed or self.broken:
            raise ClosedError("this vector env is closed" + (" after a worker fault" if self.broken else ""))
        main = self.main_lane
        if main is not None and main in lane_ids:
            lane_ids = [lane for lane in lane_ids if lane != main]
        else:
            main = None
        if self._pickled_act and cmd == Command.STEP:
            payloads = self._action_payloads(lane_ids)
        blobs = None if payloads is None else _pickle_payloads(payloads, lane_ids)
        seq = self.seq = self.seq + 1
        lines, target, commands, states = self.lines, self._target, self.commands, self.states
        submitted, now = self._submitted, time.perf_counter()
        for lane in lane_ids:
            line = lines[lane]
            line[P.CMD] = cmd
            line[P.ARG] = arg
            line[P.PAYLOAD] = 1 if payloads is not None and payloads[lane] is not None else 0
            target[lane] = seq
            submitted[lane] = now
            commands[lane] = cmd
            states[lane] = state
        fence()
        for lane in lane_ids:
            lines[lane][P.GO] = seq
        self._all_seq = seq if len(lane_ids) == len(self.worker_lanes) else None
        fence()
        wake_fds = self.workers.wake_fds
        for lane in lane_ids:
            if lines[lane][P.SLEEPING]:
                ring(wake_fds[lane])
        if blobs is not None:
            for lane in lane_ids:
                if lane in blobs:
                    self.workers.send(lane, blobs[lane], fd)
        if main is not None:
            # Deferred to wait(): the main process steps its lane while it would otherwise
            # wait for the workers, and only then, so it keeps handing out their batches first.
            target[main], commands[main], states[main] = seq, cmd, state
            self._main_pending = (cmd, None if payloads is None else payloads[main], arg)

    def _action_payloads(self, lane_ids: list[int]) -> list[dict[str, np.ndarray] | None]:
        """Each worker lane's slice of the pickled action regions (``None`` for other lanes)."""
        payloads: list[dict[str, np.ndarray] | None] = [None] * len(self.lanes)
        for lane in lane_ids:
            sl = slice(self.lanes[lane].start, self.lanes[lane].stop)
            payloads[lane] = {name: self.views[name][sl] for name in self._pickled_act}
        return payloads

    def _absorb(self, lane: int, reply: tuple) -> Any:
        """Copy the pickled observation regions that worker ``lane`` sent with a STEP or RESET
        reply into this process's arrays; return the reply's own part (infos or ``None``).
        """
        reply, regions = reply
        sl = slice(self.lanes[lane].start, self.lanes[lane].stop)
        for name, values in regions.items():
            self.views[name][sl] = values
        return reply

    def receive(self, count: int) -> tuple[list[int], dict[int, Any], dict[int, Exception]]:
        """Wait until ``count`` of the lanes in flight finished (all of them if fewer are in
        flight; at least one must be); take their results.

        Returns ``(ready, replies, failures)``: the lanes taken, in lane order, which are IDLE
        again; the replies of those that sent one; the failures (as :meth:`run` reports them).
        A failed lane counts as finished. When more than ``count`` lanes are done, failures
        come first (not to be lost), then the oldest submissions: a lane that keeps finishing
        fast cannot starve the others.
        """
        states, in_flight = self.states, LaneState.IN_FLIGHT
        flying = [lane for lane, state in enumerate(states) if state is in_flight]
        count = min(count, len(flying))
        failures = self.wait(flying, count, self.timeout)
        lines, target, num_workers = self.lines, self._target, len(self.worker_lanes)
        ready = [
            lane
            for lane in flying  # in lane order
            if (lines[lane][DONE] == target[lane] if lane < num_workers else self._main_result is not None)
        ]
        if failures:
            ready = sorted(set(ready) | set(failures))
        if len(ready) > count:
            ready = sorted(sorted(ready, key=lambda lane: (lane not in failures, target[lane]))[:count])
        failures = {lane: e for lane, e in failures.items() if lane in ready}
        replies, failed = self.collect([lane for lane in ready if lane not in failures], self.timeout)
        failures.update(failed)
        idle = LaneState.IDLE
        for lane in ready:
            states[lane] = idle
        return ready, replies, failures

    def wait(self, lane_ids: list[int], count: int, timeout: float | None) -> dict[int, Exception]:
        """Spin, then block, until ``count`` lanes of ``lane_ids`` have finished or failed.

        Returns the failures (dead or timed-out workers, which count as finished). The main
        lane's submitted command runs here, unless ``count`` worker lanes submitted before it
        have finished already (they are what the caller gets first).
        """
        failures: dict[int, Exception] = {}
        main = self.main_lane
        if main is not None and main in lane_ids:
            lane_ids = [lane for lane in lane_ids if lane != main]
            if self._main_pending is not None:
                target, lines, mine = self._target, self.lines, self._target[main]
                older = sum(1 for lane in lane_ids if target[lane] < mine and lines[lane][DONE] == target[lane])
                if older < count:
                    (cmd, payload, arg), self._main_pending = self._main_pending, None
                    self._main_result = self.run_main(cmd, payload, arg)
                    count -= 1
            else:
                count -= 1
        if count > 0 and lane_ids:
            self._wait_workers(lane_ids, count, timeout, failures)
        if count < len(lane_ids):
            # The caller is served while some lanes are still out: look at those anyway.
            self._check_late(lane_ids, failures, timeout, time.perf_counter())
        return failures

    def _wait_workers(
        self, lane_ids: list[int], count: int, timeout: float | None, failures: dict[int, Exception]
    ) -> None:
        """Spin, then block, until ``count`` worker lanes of ``lane_ids`` have finished or
        failed (the failures go into ``failures``).
        """
        policy = self._wait_policy
        t0 = time.perf_counter()
        # The common case spins on a cheaper test built once: every worker, one sequence number.
        every_worker = count >= len(lane_ids) == len(self.worker_lanes) and self._all_seq is not None
        if every_worker and spin_until(self._all_done, policy):
            policy.update(time.perf_counter() - t0)
            fence()
            return
        lines, target = self.lines, self._target

        def ready() -> bool:  # failed lanes count as finished
            n = len(failures)
            for lane in lane_ids:
                if lines[lane][DONE] == target[lane] and lane not in failures:
                    n += 1
            return n >= count

        if not every_worker and spin_until(ready, policy):
            policy.update(time.perf_counter() - t0)
            fence()
            return
        submitted, workers, procs = self._submitted, self.workers, self.workers.procs
        while True:
            watch = [lane for lane in lane_ids if lane not in failures and lines[lane][DONE] != target[lane]]
            remaining = None
            if timeout is not None and watch:  # each lane's timeout counts from its submission
                remaining = max(0.0, min(submitted[lane] for lane in watch) + timeout - time.perf_counter())
            try:
                dead = block_until(
                    ready, self.main_line, workers.done_fd, [procs[lane].sentinel for lane in watch], remaining
                )
            except TimeoutError:
                now = time.perf_counter()
                for lane in watch:
                    if lines[lane][DONE] != target[lane] and now - submitted[lane] >= timeout - 1e-3:
                        failures[lane] = workers.stop_overdue(lane, timeout)
                if ready():
                    break
                continue
            for lane in watch:
                if procs[lane].sentinel in dead and lines[lane][DONE] != target[lane]:
                    failures[lane] = workers.died(lane)
            if not dead or ready():
                break
        policy.update(time.perf_counter() - t0)
        fence()

    def _check_late(
        self, lane_ids: list[int], failures: dict[int, Exception], timeout: float | None, now: float
    ) -> None:
        """Add to ``failures`` the worker lanes among ``lane_ids`` still out whose worker died
        or overran ``timeout`` since their submission.

        For waits that return while some lanes are still out: a dead or stuck worker must not
        go unnoticed just because the others keep finishing. One ``select`` on their sentinels,
        no waiting, at most every ``SENTINEL_CHECK_S`` (a syscall per recv costs more than the rest).
        """
        if now < self._next_sentinel_check:
            return
        self._next_sentinel_check = now + SENTINEL_CHECK_S
        lines, target, workers, procs = self.lines, self._target, self.workers, self.workers.procs
        late = [lane for lane in lane_ids if lines[lane][DONE] != target[lane] and lane not in failures]
        if not late:
            return
        dead, _, _ = select.select([procs[lane].sentinel for lane in late], [], [], 0)
        for lane in late:
            if lines[lane][DONE] == target[lane]:
                continue
            if procs[lane].sentinel in dead:
                failures[lane] = workers.died(lane)
            elif timeout is not None and now - self._submitted[lane] > timeout:
                failures[lane] = workers.stop_overdue(lane, timeout)

    def collect(self, lane_ids: list[int], timeout: float | None) -> tuple[dict[int, Any], dict[int, Exception]]:
        """Statuses and replies of finished lanes: ``({lane: reply}, {lane: failure})``.

        Only lanes whose status says a reply follows appear in the first dict.
        """
        replies: dict[int, Any] = {}
        failures: dict[int, Exception] = {}
        deadline = -1.0  # computed at the first reply to read: most rounds have none
        lines, commands, num_workers = self.lines, self.commands, len(self.worker_lanes)
        for lane in lane_ids:
            if lane >= num_workers:  # the main lane: what wait kept
                if self._main_result is not None:
                    reply, exc = self._main_result
                    self._main_result = None
                    if exc is not None:
                        failures[lane] = exc
                    elif reply is not None:
                        replies[lane] = reply
                continue
            line = lines[lane]
            status = line[P.STATUS]
            if status == Status.OK:
                continue
            size = line[P.REPLY_LEN]
            if size >= 0:  # in shared memory: no syscall, no wait
                msg = pickle.loads(self.replies[lane][:size])
            else:
                if deadline == -1.0:
                    deadline = None if timeout is None else time.monotonic() + timeout
                try:
                    msg = self.workers.recv(lane, deadline, P.phase(commands[lane]))
                except (WorkerDied, StepTimeout) as exc:
                    failures[lane] = exc
                    continue
            if status == Status.REPLY:
                if self._pickled_obs and commands[lane] in (Command.STEP, Command.RESET):
                    msg = self._absorb(lane, msg)
                    if msg is None:
                        continue
                replies[lane] = msg
            else:
                failures[lane] = WorkerError(msg)
        return replies, failures

    def run_main(self, cmd: int, payload: Any, arg: int = 0) -> tuple[Any, Exception | None]:
        """Run ``cmd`` on the main lane, in this process: ``(reply, failure)``."""
        try:
            return self.main.run(cmd, payload, arg), None
        except (KeyboardInterrupt, SystemExit):
            self.broken = True
            raise
        except Exception as exc:
            return None, WorkerError(P.error_report(exc, self.main_lane, self.main.current, P.phase(cmd)))

    def run(
        self,
        cmd: int,
        payloads: list | None = None,
        timeout: float | None = None,
        lane_ids: list[int] | None = None,
        arg: int = 0,
        fd: int | None = None,
    ) -> tuple[list, dict[int, Exception]]:
        """Run ``cmd`` on every lane (or on ``lane_ids``) and wait; return ``(replies, failures)``.

        ``payloads`` holds one picklable payload per lane (or ``None``); ``timeout`` defaults
        to the pool's. ``replies`` has one entry per lane (``None`` where it had nothing to
        say). ``failures`` maps each lane that failed to its exception: :class:`WorkerError`
        (an env raised; the worker lives on), :class:`WorkerDied` or :class:`StepTimeout` (the
        worker is gone). The caller decides: raise (see :meth:`raise_first`) or restart those lanes.
        """
        if timeout is None:
            timeout = self.timeout
        main = self.main_lane
        if lane_ids is None:
            workers = self.worker_lanes
        else:
            workers = [lane for lane in lane_ids if lane != main]
        replies: list[Any] = [None] * len(self.lanes)
        failures: dict[int, Exception] = {}
        if workers:
            self.submit(cmd, workers, payloads, arg, fd, LaneState.IDLE)  # refuses a closed or broken pool
        elif self.closed or self.broken:
            raise ClosedError("this vector env is closed" + (" after a worker fault" if self.broken else ""))
        if self.main is not None and (lane_ids is None or main in lane_ids):
            replies[main], exc = self.run_main(cmd, None if payloads is None else payloads[main], arg)
            if exc is not None:
                failures[main] = exc
        if workers:
            failures.update(self.wait(workers, len(workers), timeout))
            got, failed = self.collect([lane for lane in workers if lane not in failures], timeout)
            failures.update(failed)
            for lane, reply in got.items():
                replies[lane] = reply
        return replies, failures

    def raise_first(self, failures: dict[int, Exception]) -> None:
        """Raise the failure of the lowest lane; a lost worker leaves the pool broken."""
        if not failures:
            return
        if any(not isinstance(exc, WorkerError) for exc in failures.values()):
            self.broken = True
        raise failures[min(failures)]

    # -- shutdown --------------------------------------------------------------------------
    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the workers (politely, then by force), close the envs, release the segments.

        Idempotent; safe to call from a finalizer or after a fault.
        """
        if self.closed:
            return
        self._main_pending = None  # an asynchronous main-lane command never run: nothing to stop
        try:
            if self.worker_lanes and not self.broken and self.views:
                try:
                    self.run(Command.CLOSE, timeout=timeout)
                except Exception:
                    pass
            else:
                for env in self.main.envs if self.main is not None else self._main_envs:
                    try:
                        env.close()
                    except Exception:
                        pass
        finally:
            self.closed = True
        self.workers.join(timeout if not self.broken else 0.2)
        for seg in (self._segment, self.rollout):
            if seg is not None:
                seg.close()
        self.rollout = None
        # Our mapping is freed when the last view of it is gone (views handed out with
        # copy=False may outlive the env; they stay valid, the name is already unlinked).
        self.main = None
        self.views = {}
        self.replies = []
        self._segment = None
