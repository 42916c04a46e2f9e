"""The engine behind a vector env: worker processes, the shared segment, one command round at a time.

A :class:`WorkerPool` splits ``num_envs`` envs into contiguous blocks ("lanes"). Each lane runs
in its own worker process, so no env can take the calling process down. With ``step_in_main``
(an opt-in speed mode) the last lane is an :class:`~shmvec.worker.EnvBlock` stepped by the
calling process itself while the workers step theirs, so on an N-core machine N blocks run at
once and no core idles in a wait.

The pool knows nothing of the Gymnasium API: it runs protocol commands and returns replies.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait as mp_wait
from typing import Any

import numpy as np

from shmvec import protocol as P
from shmvec.errors import ClosedError, StepTimeout, WorkerDied, WorkerError
from shmvec import segment
from shmvec.blocks import split
from shmvec.checks import usable_cores
from shmvec.layout import Layout, RolloutLayout, control_lines
from shmvec.sync import SpinPolicy, block_until, fence, ring, spin_until
from shmvec.worker import EnvBlock, worker_main

# Seconds between looks for dead workers while the others keep finishing (asynchronous waits).
SENTINEL_CHECK_S = 0.02


def main_in(lanes: list[int], num_procs: int) -> bool:
    """Whether ``lanes`` lists the lane of the main process (the one after the worker lanes)."""
    return bool(lanes) and max(lanes) >= num_procs


class WorkerPool:
    """Worker processes stepping blocks of envs in one shared-memory segment.

    Parameters
    ----------
    env_fns : sequence of callables returning ``gymnasium.Env``
    num_lanes : int
        Blocks stepped in parallel (``1 <= num_lanes <= len(env_fns)``).
    step_in_main : bool
        Whether the calling process steps the last block itself.
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
        import cloudpickle

        self.num_envs = len(env_fns)
        self.lanes = split(self.num_envs, num_lanes)
        self.num_procs = num_lanes - 1 if step_in_main else num_lanes
        self.timeout = timeout
        self.autoreset_mode = autoreset_mode
        self.closed = False
        self.broken = False  # a fault left workers in an unknown state: only shutdown is allowed
        self.seq = 0
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.wake_w: list[int] = []
        self._wake_conns: list[Any] = []
        self.main_block: EnvBlock | None = None
        self._seg_fd: int | None = None
        self.views: dict[str, np.ndarray] = {}
        # The rollout segment, once attach_rollout made one: (layout, fd, mapping).
        self.rollout: tuple[RolloutLayout, int, Any] | None = None

        # Spinning pays only for a waiter with a core of its own. Workers wait for GO while
        # main is between steps (or, stepping a block itself, busy as they are); main waits
        # for DONE while the workers run.
        cores = usable_cores()
        worker_spin = 2000.0 if len(self.lanes) <= cores else 0.0
        main_spin = 2000.0 if self.num_procs + 1 <= cores else 0.0
        if spin_us is not None:
            worker_spin = main_spin = float(spin_us)
        oversubscribed = self.num_procs + 1 > cores
        self._worker_spin = SpinPolicy(worker_spin * 1e-6, min(50e-6, worker_spin * 1e-6), oversubscribed)
        self._wait_policy = SpinPolicy(main_spin * 1e-6, min(50e-6, main_spin * 1e-6), oversubscribed)
        self._next_sentinel_check = 0.0

        ctx = mp.get_context(context)
        self._ctx = ctx
        self.context = ctx.get_start_method()
        self._env_fns = env_fns
        self._step_in_main = step_in_main
        done_r, done_w = ctx.Pipe(duplex=False)
        self._done_conns = (done_r, done_w)  # done_w stays open: restarted workers get it too
        self.done_r = done_r.fileno()
        os.set_blocking(self.done_r, False)
        os.set_blocking(done_w.fileno(), False)
        self._blobs: list[bytes] = []
        try:
            for w in range(self.num_procs):
                lane = self.lanes[w]
                try:
                    self._blobs.append(cloudpickle.dumps(list(env_fns[lane.start:lane.stop])))
                except Exception as exc:
                    raise TypeError(f"env_fns[{lane.start}:{lane.stop}] cannot be pickled for the workers: {exc}") from exc
                self.procs.append(None)
                self.conns.append(None)
                self._wake_conns.append(None)
                self.wake_w.append(-1)
                self._start_worker(w)
            self._handshake()
        except BaseException:
            self.broken = True
            self.shutdown(timeout=1.0)
            raise

    # -- set-up ----------------------------------------------------------------------------
    def _start_worker(self, w: int) -> None:
        """Start (or restart) the worker process of lane ``w``."""
        ctx, lane = self._ctx, self.lanes[w]
        parent_conn, child_conn = ctx.Pipe()
        wake_r, wake_w = ctx.Pipe(duplex=False)
        os.set_blocking(wake_r.fileno(), False)
        os.set_blocking(wake_w.fileno(), False)
        proc = ctx.Process(
            target=worker_main,
            args=(w, lane.start, self._blobs[w], child_conn, wake_r, self._done_conns[1]),
            name=f"shmvec-worker-{w}",
            daemon=True,
        )
        proc.start()
        child_conn.close()
        wake_r.close()
        self.procs[w], self.conns[w] = proc, parent_conn
        self._wake_conns[w], self.wake_w[w] = wake_w, wake_w.fileno()

    def _build_main_envs(self) -> list:
        lane, envs = self.lanes[-1], []
        for i in lane:
            try:
                envs.append(self._env_fns[i]())
            except BaseException as exc:
                for env in envs:
                    env.close()
                raise WorkerError(P.error_report(exc, len(self.lanes) - 1, i, "construct")) from exc
        e0 = envs[0]
        for k, env in enumerate(envs[1:], 1):
            if env.observation_space != e0.observation_space or env.action_space != e0.action_space:
                raise ValueError(f"env {lane.start + k} has spaces that differ from env {lane.start}")
        return envs

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + max(self.timeout, 30.0)

    def _recv_spaces(self, w: int, deadline: float | None) -> tuple:
        msg = self._recv(w, deadline, "construct")
        if isinstance(msg, P.ConstructError):
            raise WorkerError(msg.report)
        if isinstance(msg, P.Mismatch):
            raise ValueError(f"env {msg.env_index} has spaces {msg.spaces} that differ from those of env "
                             f"{self.lanes[w].start}")
        return (self.lanes[w].start, *msg)

    def _handshake(self) -> None:
        deadline = self._deadline()
        main_envs = self._build_main_envs() if self._step_in_main else []
        self._main_envs = main_envs
        found = [self._recv_spaces(w, deadline) for w in range(self.num_procs)]
        if main_envs:
            e0 = main_envs[0]
            found.append((self.lanes[-1].start, e0.observation_space, e0.action_space, dict(e0.metadata),
                          getattr(e0, "render_mode", None), getattr(e0, "spec", None)))
        found.sort(key=lambda f: f[0])
        _, obs_space, act_space, metadata, render_mode, spec = found[0]
        for start, o, a, *_ in found[1:]:
            self._check_spaces(start, o, a, obs_space, act_space)
        self.observation_space, self.action_space = obs_space, act_space
        self.metadata, self.render_mode, self.spec = metadata, render_mode, spec

        self.layout = Layout.build(obs_space, act_space, self.num_envs, len(self.lanes),
                                   with_final_obs=self.autoreset_mode == "SameStep")
        self._seg_fd, self._mmap = segment.create(self.layout.size)
        self.views = self.layout.views(self._mmap)
        # Pickled leaves (variable-size spaces): the action regions a STEP sends each worker
        # in its payload, and whether STEP and RESET replies carry observation regions.
        self._pickled_act = self.layout.pickled("act/")
        self._pickled_obs = bool(self.layout.pickled("obs/"))
        # One int64 memoryview per control line: indexing one costs a third of a numpy scalar.
        self.lines = control_lines(self.views)
        self.main_line = self.lines[len(self.lanes)]
        for w in range(self.num_procs):
            self._attach(w)
        for w in range(self.num_procs):
            self._recv_ready(w, deadline)
        if main_envs:
            self.main_block = self._main_block(main_envs)
        # Per lane, the main one included: the sequence number it must reach, its last command.
        self._target = [0] * len(self.lanes)
        self._cmd = [0] * len(self.lanes)
        self._submitted = [0.0] * len(self.lanes)  # perf_counter() of each lane's last submission
        # Asynchronous rounds: the main lane's command submitted but not run yet, and once
        # wait() ran it, its (reply, failure) until collect takes it.
        self._main_result: tuple[Any, Exception | None] | None = None
        self._main_pending: tuple[int, Any, int] | None = None  # (cmd, payload, arg)
        self._all_procs = list(range(self.num_procs))
        self._all_seq: int | None = None  # set while every lane's target is this one number

    @staticmethod
    def _check_spaces(start: int, o: Any, a: Any, obs_space: Any, act_space: Any) -> None:
        if o != obs_space:
            raise ValueError(f"env {start} has observation_space {o}, but env 0 has {obs_space}")
        if a != act_space:
            raise ValueError(f"env {start} has action_space {a}, but env 0 has {act_space}")

    def _main_block(self, envs: list) -> EnvBlock:
        block = EnvBlock(envs, self.lanes[-1].start, len(self.lanes) - 1, self.layout, self.views,
                         self.autoreset_mode, self.observation_space, self.action_space)
        if self.rollout is not None:
            block.attach_rollout((self.rollout[0], self.rollout[2]))
        return block

    def _attach(self, w: int) -> None:
        from multiprocessing.reduction import send_handle

        self.conns[w].send(P.Attach(self.layout, self.autoreset_mode, self._worker_spin))
        send_handle(self.conns[w], self._seg_fd, self.procs[w].pid)

    def _recv_ready(self, w: int, deadline: float | None) -> None:
        msg = self._recv(w, deadline, "attach")
        if not isinstance(msg, P.Ready):
            raise RuntimeError(f"worker {w} answered {msg!r} to attach")

    def restart_lane(self, w: int) -> None:
        """Replace lane ``w``'s envs with new ones (a new worker process for a worker lane).

        The new envs are built but not reset. Raises like construction does if that fails.
        """
        if w == len(self.lanes) - 1 and self.main_block is not None:
            for env in self.main_block.envs:
                try:
                    env.close()
                except Exception:
                    pass
            self.main_block = self._main_block(self._build_main_envs())
            return
        proc = self.procs[w]
        if proc.is_alive():
            proc.kill()
        proc.join(1.0)
        for conn in (self.conns[w], self._wake_conns[w]):
            conn.close()
        # The new worker starts from the current sequence number, with nothing pending.
        line = self.lines[w]
        line[P.GO] = line[P.DONE] = self._target[w] = self.seq
        line[P.SLEEPING] = 0
        self._all_seq = None
        self._start_worker(w)
        deadline = self._deadline()
        _, o, a, *_ = self._recv_spaces(w, deadline)
        self._check_spaces(self.lanes[w].start, o, a, self.observation_space, self.action_space)
        self._attach(w)
        self._recv_ready(w, deadline)
        if self.rollout is not None:
            _, failures = self._attach_rollout([w])
            self.raise_first(failures)

    def attach_rollout(self, num_steps: int) -> dict[str, np.ndarray]:
        """Create the rollout segment for ``num_steps`` steps, hand it to every lane, return its views.

        A previous rollout segment is dropped (views of it stay valid while they live). Raises
        what the round raised if a lane fails to map it (the pool is then broken).
        """
        layout = RolloutLayout.build(self.layout, num_steps)
        fd, mm = segment.create(layout.size)
        old, self.rollout = self.rollout, (layout, fd, mm)
        if old is not None:
            os.close(old[1])
        _, failures = self._attach_rollout(list(range(len(self.lanes))))
        if failures:
            self.broken = True
            self.raise_first(failures)
        return layout.views(mm)

    def _attach_rollout(self, lanes: list[int]) -> tuple[list, dict[int, Exception]]:
        layout, fd, mm = self.rollout
        payloads: list[Any] = [layout] * len(self.lanes)
        payloads[-1] = layout if self.main_block is None else (layout, mm)
        return self.run(P.Command.ROLLOUT_ATTACH, payloads, lanes=lanes, fd=fd)

    def _recv(self, w: int, deadline: float | None, phase: str) -> Any:
        """Receive one message from worker ``w``, watching its liveness and the deadline."""
        conn, proc = self.conns[w], self.procs[w]
        while True:
            wait = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if wait <= 0:
                if proc.is_alive():
                    proc.kill()
                raise StepTimeout(f"worker {w} did not answer during {phase} within the timeout; it was stopped")
            ready = mp_wait([conn, proc.sentinel], wait)
            if conn in ready:
                try:
                    return conn.recv()
                except EOFError:
                    pass
            if proc.sentinel in ready or not proc.is_alive():
                proc.join(1.0)
                raise WorkerDied(w, proc.exitcode, self.lanes[w])

    # -- command rounds ----------------------------------------------------------------------
    # A round is submit (signal the lanes), then wait (for all, or for some in async mode),
    # then collect (statuses and the rare pickled replies). Sync `run` is the three in a row.

    def submit(self, cmd: int, procs: list[int], payloads: list | None = None, arg: int = 0,
               fd: int | None = None) -> None:
        """Start ``cmd`` (with argument ``arg``) on the lanes ``procs``; ``fd`` is a descriptor
        that follows each payload on the pipe.

        Worker lanes start and run on their own. The main process's lane, if listed, is kept
        for :meth:`wait` to run (the asynchronous API; a synchronous :meth:`run` steps it
        itself instead), and its result for :meth:`collect` to take.
        """
        if self.closed or self.broken:
            raise ClosedError("this vector env is closed" + (" after a worker fault" if self.broken else ""))
        main = len(self.lanes) - 1 if self.main_block is not None and main_in(procs, self.num_procs) else None
        if main is not None:
            procs = [w for w in procs if w < self.num_procs]
        if self._pickled_act and cmd == P.Command.STEP:
            payloads = self._action_payloads(procs)
        seq = self.seq = self.seq + 1
        lines, target, submitted, now = self.lines, self._target, self._submitted, time.perf_counter()
        for w in procs:
            line = lines[w]
            line[P.CMD] = cmd
            line[P.ARG] = arg
            line[P.PAYLOAD] = 1 if payloads is not None and payloads[w] is not None else 0
            target[w] = seq
            submitted[w] = now
            self._cmd[w] = cmd
        fence()
        for w in procs:
            lines[w][P.GO] = seq
        self._all_seq = seq if len(procs) == self.num_procs else None
        fence()
        for w in procs:
            if lines[w][P.SLEEPING]:
                ring(self.wake_w[w])
        if payloads is not None:
            for w in procs:
                if payloads[w] is not None:
                    try:
                        self.conns[w].send(payloads[w])
                        if fd is not None:
                            from multiprocessing.reduction import send_handle

                            send_handle(self.conns[w], fd, self.procs[w].pid)
                    except (BrokenPipeError, ConnectionResetError):
                        # The worker died since its last command (the OOM killer strikes any
                        # time). The other lanes still get their payloads, or they would wait
                        # for them forever; the wait reports this one as WorkerDied (its
                        # sentinel is ready and its DONE never comes).
                        pass
        if main is not None:
            # Deferred to wait(): the main process steps its block while it would otherwise
            # wait for the workers, and only then, so it keeps handing out their batches first.
            self._target[main], self._cmd[main] = seq, cmd
            self._main_pending = (cmd, None if payloads is None else payloads[main], arg)

    def _action_payloads(self, procs: list[int]) -> list[dict[str, np.ndarray] | None]:
        """Each worker lane's slice of the pickled action regions (``None`` for other lanes)."""
        payloads: list[dict[str, np.ndarray] | None] = [None] * len(self.lanes)
        for w in procs:
            sl = slice(self.lanes[w].start, self.lanes[w].stop)
            payloads[w] = {name: self.views[name][sl] for name in self._pickled_act}
        return payloads

    def _absorb(self, w: int, reply: tuple) -> Any:
        """Copy the pickled observation regions that worker ``w`` sent with a STEP or RESET
        reply into this process's arrays; return the reply's own part (infos or ``None``)."""
        reply, regions = reply
        sl = slice(self.lanes[w].start, self.lanes[w].stop)
        for name, values in regions.items():
            self.views[name][sl] = values
        return reply

    def finished(self, procs: list[int]) -> list[int]:
        """The lanes among ``procs`` whose last submitted command has finished."""
        lines, target, n = self.lines, self._target, self.num_procs
        return [w for w in procs if (lines[w][P.DONE] == target[w] if w < n else self._main_result is not None)]

    def wait(self, procs: list[int], count: int, timeout: float | None) -> dict[int, Exception]:
        """Spin, then block, until ``count`` lanes of ``procs`` have finished or failed.

        Returns the failures (dead or timed-out workers, which count as finished). The main
        lane's submitted command runs here, unless ``count`` worker lanes submitted before it
        have finished already (they are what the caller gets first).
        """
        failures: dict[int, Exception] = {}
        if main_in(procs, self.num_procs):
            procs = [w for w in procs if w < self.num_procs]
            if self._main_pending is not None:
                target, lines, mine = self._target, self.lines, self._target[len(self.lanes) - 1]
                older = sum(1 for w in procs if target[w] < mine and lines[w][P.DONE] == target[w])
                if older < count:
                    (cmd, payload, arg), self._main_pending = self._main_pending, None
                    self._main_result = self.run_main(cmd, payload, arg)
                    count -= 1
            else:
                count -= 1
        if count > 0 and procs:
            self._wait_workers(procs, count, timeout, failures)
        if count < len(procs):
            # The caller is served while some lanes are still out: look at those anyway.
            self._check_late(procs, failures, timeout, time.perf_counter())
        return failures

    def _wait_workers(self, procs: list[int], count: int, timeout: float | None,
                      failures: dict[int, Exception]) -> None:
        """Spin, then block, until ``count`` worker lanes of ``procs`` have finished or failed
        (the failures go into ``failures``)."""
        lines, target, DONE = self.lines, self._target, P.DONE
        def ready() -> bool:  # failed lanes count as finished
            n = len(failures)
            for w in procs:
                if lines[w][DONE] == target[w] and w not in failures:
                    n += 1
            return n >= count

        # The spin polls a cheaper test in the common case: every worker, one sequence number.
        quick = ready
        seq = self._all_seq
        if count >= len(procs) == self.num_procs and seq is not None:
            if self.num_procs == 1:
                line0 = lines[0]

                def quick() -> bool:
                    return line0[DONE] == seq
            else:
                worker_lines = lines[: self.num_procs]

                def quick() -> bool:
                    for line in worker_lines:
                        if line[DONE] != seq:
                            return False
                    return True

        policy = self._wait_policy
        t0 = time.perf_counter()
        if spin_until(quick, policy):
            policy.update(time.perf_counter() - t0)
            fence()
            return
        submitted = self._submitted
        while True:
            watch = [w for w in procs if w not in failures and lines[w][DONE] != target[w]]
            remaining = None
            if timeout is not None and watch:  # each lane's timeout counts from its submission
                remaining = max(0.0, min(submitted[w] for w in watch) + timeout - time.perf_counter())
            try:
                dead = block_until(ready, self.main_line, self.done_r, [self.procs[w].sentinel for w in watch],
                                   remaining)
            except TimeoutError:
                now = time.perf_counter()
                for w in watch:
                    if lines[w][DONE] != target[w] and now - submitted[w] >= timeout - 1e-3:
                        failures[w] = self._stop_overdue(w, timeout)
                if ready():
                    break
                continue
            for w in watch:
                proc = self.procs[w]
                if proc.sentinel in dead and lines[w][DONE] != target[w]:
                    proc.join(1.0)
                    failures[w] = WorkerDied(w, proc.exitcode, self.lanes[w])
            if not dead or ready():
                break
        policy.update(time.perf_counter() - t0)
        fence()

    def _check_late(self, procs: list[int], failures: dict[int, Exception], timeout: float | None,
                    now: float) -> None:
        """Add to ``failures`` the worker lanes among ``procs`` still out that died or overran
        ``timeout`` since their submission.

        For waits that return while some lanes are still out: a dead or stuck one must not go
        unnoticed just because the others keep finishing. One ``select`` on their sentinels, no
        waiting, at most every ``SENTINEL_CHECK_S`` (a syscall per recv costs more than the rest).
        """
        if now < self._next_sentinel_check:
            return
        self._next_sentinel_check = now + SENTINEL_CHECK_S
        lines, target = self.lines, self._target
        late = [w for w in procs if lines[w][P.DONE] != target[w] and w not in failures]
        if not late:
            return
        dead, _, _ = select.select([self.procs[w].sentinel for w in late], [], [], 0)
        for w in late:
            if lines[w][P.DONE] == target[w]:
                continue
            if self.procs[w].sentinel in dead:
                self.procs[w].join(1.0)
                failures[w] = WorkerDied(w, self.procs[w].exitcode, self.lanes[w])
            elif timeout is not None and now - self._submitted[w] > timeout:
                failures[w] = self._stop_overdue(w, timeout)

    def _stop_overdue(self, w: int, timeout: float) -> StepTimeout:
        """Kill worker ``w``, which overran ``timeout``; the failure to report."""
        self.procs[w].kill()
        self.procs[w].join(1.0)
        return StepTimeout(f"worker {w} (envs {self.lanes[w].start}..{self.lanes[w].stop - 1}) did not "
                           f"finish within timeout={timeout} s; it was stopped")

    def collect(self, procs: list[int], timeout: float | None) -> tuple[dict[int, Any], dict[int, Exception]]:
        """Statuses and replies of finished lanes: ``({lane: reply}, {lane: WorkerError})``.

        Only lanes whose status says a reply follows appear in the first dict.
        """
        replies: dict[int, Any] = {}
        failures: dict[int, Exception] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        lines = self.lines
        for w in procs:
            if w >= self.num_procs:  # the main lane: what submit kept
                if self._main_result is not None:
                    reply, exc = self._main_result
                    self._main_result = None
                    if exc is not None:
                        failures[w] = exc
                    elif reply is not None:
                        replies[w] = reply
                continue
            status = lines[w][P.STATUS]
            if status == P.Status.OK:
                continue
            phase = P.phase(self._cmd[w])
            try:
                msg = self._recv(w, deadline, phase)
            except (WorkerDied, StepTimeout) as exc:
                failures[w] = exc
                continue
            if status == P.Status.REPLY:
                if self._pickled_obs and self._cmd[w] in (P.Command.STEP, P.Command.RESET):
                    msg = self._absorb(w, msg)
                    if msg is None:
                        continue
                replies[w] = msg
            else:
                failures[w] = WorkerError(msg)
        return replies, failures

    def run_main(self, cmd: int, payload: Any, arg: int = 0) -> tuple[Any, Exception | None]:
        """Run ``cmd`` on the block the main process steps itself."""
        try:
            return self.main_block.run(cmd, payload, arg), None
        except (KeyboardInterrupt, SystemExit):
            self.broken = True
            raise
        except Exception as exc:
            main = len(self.lanes) - 1
            return None, WorkerError(P.error_report(exc, main, self.main_block.current, P.phase(cmd)))

    def run(self, cmd: int, payloads: list | None = None, timeout: float | None = -1.0,
            lanes: list[int] | None = None, arg: int = 0, fd: int | None = None
            ) -> tuple[list, dict[int, Exception]]:
        """Run ``cmd`` on every lane (or on ``lanes``) and wait; return ``(replies, failures)``.

        ``payloads`` holds one picklable payload per lane (or ``None``). ``replies`` has one
        entry per lane (``None`` where it had nothing to say). ``failures`` maps each lane that
        failed to its exception: :class:`WorkerError` (an env raised; the worker lives on),
        :class:`WorkerDied` or :class:`StepTimeout` (the worker is gone). The caller decides:
        raise (see :meth:`raise_first`) or restart those lanes.
        """
        if timeout == -1.0:
            timeout = self.timeout
        procs = self._all_procs if lanes is None else [w for w in lanes if w < self.num_procs]
        replies: list[Any] = [None] * len(self.lanes)
        failures: dict[int, Exception] = {}
        if procs:
            self.submit(cmd, procs, payloads, arg, fd)
        elif self.closed or self.broken:
            raise ClosedError("this vector env is closed")
        main = len(self.lanes) - 1
        if self.main_block is not None and (lanes is None or main in lanes):
            replies[main], exc = self.run_main(cmd, None if payloads is None else payloads[main], arg)
            if exc is not None:
                failures[main] = exc
        if procs:
            failures.update(self.wait(procs, len(procs), timeout))
            got, failed = self.collect([w for w in procs if w not in failures], timeout)
            failures.update(failed)
            for w, reply in got.items():
                replies[w] = reply
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
        """Stop the workers (politely, then by force), close the envs, release the segment.

        Idempotent; safe to call from a finalizer or after a fault.
        """
        if self.closed:
            return
        self.closed = True
        self._main_pending = None  # an asynchronous main-lane command never run: nothing to stop
        if self.procs and not self.broken and self.views:
            try:
                self.closed = False
                self.run(P.Command.CLOSE, timeout=timeout)
            except Exception:
                pass
            finally:
                self.closed = True
        elif self.main_block is not None or getattr(self, "_main_envs", None):
            envs = self.main_block.envs if self.main_block is not None else self._main_envs
            for env in envs:
                try:
                    env.close()
                except Exception:
                    pass
        for proc in self.procs:
            if proc is None:
                continue
            proc.join(timeout if not self.broken else 0.2)
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for conn in (*self.conns, *self._wake_conns, *getattr(self, "_done_conns", ())):
            if conn is None:
                continue
            try:
                conn.close()
            except OSError:
                pass
        if self._seg_fd is not None:
            os.close(self._seg_fd)
            self._seg_fd = None
        if self.rollout is not None:
            os.close(self.rollout[1])
            self.rollout = None
        # Our mapping is freed when the last view of it is gone (views handed out with
        # copy=False may outlive the env; they stay valid, the name is already unlinked).
        self.main_block = None
        self.views = {}
        self._mmap = None
