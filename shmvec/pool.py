"""Command rounds over the blocks of a vector env: submit, wait, collect.

A :class:`WorkerPool` splits ``num_envs`` envs into contiguous blocks. Each block is stepped
by a worker process (:mod:`shmvec.processes`), so no env can take the calling process down.
With ``step_in_main`` (an opt-in speed mode) one more block, the last, is stepped by the
calling process itself while the workers step theirs, so on an N-core machine N blocks run at
once and no core idles in a wait. Either way a command takes one path: :meth:`~WorkerPool.submit`
starts it, :meth:`~WorkerPool.wait` runs the calling process's block (if it has one) and waits
for the workers, :meth:`~WorkerPool.collect` takes statuses and replies.

How each block joins the pool, at start-up and on a restart, is :mod:`shmvec.joining`'s; the
pool lays out the segment from the spaces the blocks report. It knows nothing of the
Gymnasium API: it runs protocol commands and returns replies.
"""

from __future__ import annotations

import pickle
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from shmvec import probes
from shmvec import protocol as P
from shmvec.barrier import fence
from shmvec.barrier import prepare as prepare_barrier
from shmvec.blocks import split
from shmvec.checks import usable_cores
from shmvec.errors import ClosedError, PayloadError, StepTimeout, WorkerDied, WorkerError
from shmvec.info_columns import InfoLayout, InfoSchema
from shmvec.joining import Joining, Segments
from shmvec.layout import Layout, RolloutLayout, control_lines
from shmvec.options import Options
from shmvec.protocol import ANY_BLOCK, DONE, Command, Status, at_count, count_base, for_block
from shmvec.protocol import counted as counted_of
from shmvec.protocol import not_ok
from shmvec.segment import Segment
from shmvec.stepper import Stepper, close_all
from shmvec.sync import block_until, readable, ring, spin_policies, spin_until

# Seconds between looks for dead workers while the others keep finishing (asynchronous waits).
SENTINEL_CHECK_S = 0.02

Failures = dict[int, Exception]  # block index -> what went wrong there


def _pickle_payloads(payloads: list, block_ids: list[int]) -> dict[int, bytes]:
    """The worker blocks' payloads, pickled before any worker is told that one is coming: a payload
    that cannot be pickled then fails with every worker still idle, instead of leaving them
    waiting for it. A payload shared by several blocks (a ``call``'s arguments) is pickled once.
    """
    from multiprocessing.reduction import ForkingPickler

    blobs: dict[int, bytes] = {}
    done: dict[int, bytes] = {}
    for block in block_ids:
        payload = payloads[block]
        if payload is not None:
            blob = done.get(id(payload))
            if blob is None:
                try:
                    blob = done[id(payload)] = bytes(ForkingPickler.dumps(payload))
                except Exception as exc:
                    raise PayloadError(
                        f"the arguments for block {block} cannot be pickled: {type(exc).__name__}: {exc}"
                    ) from exc
            blobs[block] = blob
    return blobs


@contextmanager
def sigint_held() -> Iterator[None]:
    """Hold SIGINT back for the block inside (a Ctrl-C then arrives as it ends)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


class BlockState(Enum):
    """Where a block stands in the asynchronous API (synchronous rounds leave it IDLE)."""

    IDLE = "idle"  # nothing submitted, or its results received
    IN_FLIGHT = "in flight"  # a command submitted with :meth:`WorkerPool.submit`, its results not received


class PoolState(Enum):
    """The pool's life: OPEN serves commands; BROKEN (a fault left workers in an unknown state)
    and CLOSED serve none (only :meth:`WorkerPool.shutdown`, which leaves CLOSED).
    """

    OPEN = "open"
    BROKEN = "broken"
    CLOSED = "closed"


class MainBlock:
    """The block the calling process steps (``step_in_main``), driven like a worker's.

    :meth:`WorkerPool.submit` parks a command here, :meth:`WorkerPool.wait` runs it (in this
    process, while the workers step theirs), :meth:`WorkerPool.collect` takes its result: the
    same path for synchronous and asynchronous rounds.
    """

    __slots__ = ("index", "stepper", "pending", "result")

    def __init__(self, index: int, stepper: Stepper) -> None:
        self.index = index
        self.stepper = stepper
        self.pending: tuple[int, Any, int] | None = None  # (cmd, payload, arg) submitted, not run yet
        self.result: tuple[Any, Exception | None] | None = None  # (reply, failure) run, not collected yet

    def run_pending(self) -> None:
        """Run the submitted command; keep its ``(reply, failure)`` for :meth:`take`."""
        (cmd, payload, arg), self.pending = self.pending, None  # type: ignore[misc]
        stepper = self.stepper
        try:
            self.result = stepper.run(cmd, payload, arg), None
        except Exception as exc:
            report = P.error_report(exc, self.index, stepper.current, P.phase(cmd), cmd)
            report["worker_index"] = None  # no worker: the calling process stepped it
            self.result = None, WorkerError(report)

    def take(self) -> tuple[Any, Exception | None]:
        result, self.result = self.result, None
        return result if result is not None else (None, None)


class WorkerPool:
    """Blocks of envs stepped in one shared-memory segment, by worker processes (and the caller).

    Parameters
    ----------
    env_fns : sequence of callables returning ``gymnasium.Env``
    options : Options
        The vector env's options, resolved. The pool uses ``num_workers``, ``step_in_main``
        (the calling process steps one more block, the last), ``context``, ``timeout`` (seconds
        a command, construction included, may take before :class:`StepTimeout`), ``spin_us``
        (``None``: :func:`shmvec.sync.spin_policies` picks it), whether collection is
        asynchronous (for the spin policy), and what the blocks apply
        (:meth:`~shmvec.options.Options.for_worker`, with the workers' spin policy).
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], options: Options) -> None:
        num_workers, step_in_main = int(options.num_workers or 0), options.step_in_main
        self.num_envs = len(env_fns)
        num_blocks = num_workers + (1 if step_in_main else 0)
        self.blocks: list[range] = split(self.num_envs, num_blocks)  # the envs of each block
        self.worker_blocks: list[int] = list(range(num_workers))  # the blocks stepped by worker processes
        self.all_blocks: list[int] = list(range(num_blocks))  # what a synchronous round addresses
        self.main_index: int | None = num_workers if step_in_main else None  # the caller's block
        self.timeout = options.timeout
        self.autoreset_mode = options.autoreset_mode
        self.state = PoolState.OPEN

        asynchronous = options.batch_size is not None and options.batch_size < self.num_envs
        worker_spin, self._wait_policy = spin_policies(
            num_workers, num_blocks, usable_cores(), options.spin_us, asynchronous
        )
        self._next_sentinel_check = 0.0

        # Filled in by the set-up below.
        self.spaces: P.Spaces  # what every env reported: spaces, metadata, render mode, spec
        self.layout: Layout
        self.views: dict[str, np.ndarray] = {}
        self.lines: list[memoryview] = []  # one int64 memoryview per control line: a third of a numpy scalar's cost
        self.replies: list[memoryview] = []  # each block's row of the replies region
        self.main_line: memoryview
        self.main: MainBlock | None = None  # the block stepped by this process
        self._segment: Segment | None = None
        # Segments attached after the start, by the command that attached them (the rollout's,
        # the scalar infos'): a replaced block is sent each again (see Restart.RESEND).
        self.attached: dict[Command, Segment] = {}
        # Pickled leaves (variable-size spaces): the action regions a STEP sends each worker in
        # its payload, and whether STEP and RESET replies carry observation regions.
        self._pickled_act: list[str] = []
        self._pickled_obs = False

        # Command rounds. Per block, the main one included: its asynchronous state, the sequence
        # number it must reach, its last command, and perf_counter() of its last submission.
        self.seq = 0
        self.states = [BlockState.IDLE] * num_blocks
        self._target = [0] * num_blocks
        self.commands: list[int] = [0] * num_blocks
        self._submitted = [0.0] * num_blocks
        self._all_seq: int | None = None  # set while every worker block's target is this one number
        self._all_done: Callable[[], bool] = lambda: False  # see _lay_out
        self._next_done = 0  # the first worker block all_done() has not seen done this round
        self._counted = False  # the round in flight is a broadcast: its workers count themselves done
        self._roots = P.relay_children(None, num_workers)  # the workers main wakes in a broadcast round
        self._counted_done: Callable[[], bool] = lambda: False  # see _lay_out
        self._everyone = at_count(num_workers)  # main's SLEEPING for a broadcast round's last worker

        prepare_barrier()  # (the workers' atomic add, compiled once here: forked workers inherit it)
        self.joining = Joining(
            env_fns, self.blocks, self.main_index, options.for_worker(worker_spin), options.context, self.timeout
        )
        self.workers = self.joining.workers
        self.context = self.workers.context
        try:
            self.spaces, stepper = self.joining.join(self.all_blocks, None, self._lay_out)
            if stepper is not None:
                self.main = MainBlock(num_workers, stepper)
        except BaseException:
            self.state = PoolState.BROKEN
            self.shutdown(timeout=1.0)
            raise

    # -- set-up ----------------------------------------------------------------------------
    def _lay_out(self, spaces: P.Spaces) -> Segments:
        """The segment, laid out for the spaces every block reported (see ``docs/architecture.md``),
        and this process's views of it: what the joining blocks are handed.
        """
        self.layout = Layout.build(
            spaces.observation_space,
            spaces.action_space,
            self.num_envs,
            len(self.blocks),
            with_final_obs=self.autoreset_mode is AutoresetMode.SAME_STEP,
        )
        self._segment = segment = Segment(self.layout)
        self.views = segment.views
        self._pickled_act = self.layout.pickled("act/")
        self._pickled_obs = bool(self.layout.pickled("obs/"))
        self.lines = control_lines(self.views)
        self.main_line = self.lines[len(self.blocks)]
        self.replies = [memoryview(row) for row in self.views["replies"]]
        worker_lines = self.lines[: len(self.worker_blocks)]

        count = len(worker_lines)

        def all_done() -> bool:  # every worker block reached _all_seq (what a sync round waits for)
            # Each block's DONE is read until it is seen done, then never again this round.
            seq, i = self._all_seq, self._next_done
            while i < count and worker_lines[i][DONE] == seq:
                i += 1
            self._next_done = i
            return i == count

        main_line = self.main_line

        def counted_done() -> bool:  # a broadcast round: every worker counted itself done
            return main_line[DONE] & 0xFFFF == count  # (protocol.counted; main set the tag)

        self._all_done = all_done
        self._counted_done = counted_done
        return Segments(segment, self.attached)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes (empty once shut down)."""
        if self.state is PoolState.CLOSED:
            return []
        return [p.pid for p in self.workers.procs if p is not None]

    def worker_clocks(self) -> list[tuple[int, float]]:
        """Each worker's process id and its seconds spent running commands so far (stepping its
        envs, not waiting for a command); empty once shut down.
        """
        if self.state is PoolState.CLOSED or not self.views:
            return []
        busy = self.views["busy"]
        return [(p.pid, float(busy[b, 0])) for b, p in enumerate(self.workers.procs) if p is not None]

    def restart_block(self, block: int) -> None:
        """Replace the envs of ``block`` with new ones (a new worker process for a worker block),
        which join as at start-up, with the segments attached since.

        The new envs are built but not reset. Raises like construction does if that fails.
        """
        main = self.main
        if main is not None and block == main.index:
            close_all(main.stepper.envs)
        else:
            self.workers.stop(block)
            # The new worker starts from the current sequence number, with nothing pending.
            line = self.lines[block]
            line[P.GO] = line[DONE] = self._target[block] = self.seq
            line[P.SLEEPING] = 0
            self._all_seq, self._counted = None, False
        assert self._segment is not None
        handed = Segments(self._segment, self.attached)
        _, stepper = self.joining.join([block], self.spaces, lambda _: handed)
        if main is not None and stepper is not None:
            main.stepper = stepper

    def attach_rollout(self, num_steps: int) -> Segment:
        """Create the rollout segment for ``num_steps`` steps and hand it to every block.

        A previous rollout segment is dropped (views of it stay valid while they live). Raises
        what the round raised if a block fails to map it (the pool is then broken).
        """
        return self.attach(Command.ROLLOUT_ATTACH, Segment(RolloutLayout.build(self.layout, num_steps)))

    def attach_infos(self, schema: InfoSchema) -> Segment:
        """Create the segment of the scalar infos of ``schema`` and hand it to every block; raise
        like :meth:`attach_rollout`.
        """
        return self.attach(Command.INFO_ATTACH, Segment(InfoLayout.build(schema, self.num_envs)))

    def attach(self, cmd: Command, segment: Segment) -> Segment:
        """Hand ``segment`` to every block with ``cmd`` (a command whose payload is a segment's
        layout, see ``Command.descriptor``), in place of the one ``cmd`` attached before; a
        block that joins later gets it in its ``Attach`` (:mod:`shmvec.joining`).
        """
        old = self.attached.pop(cmd, None)
        if old is not None:
            old.close()
        self.attached[cmd] = segment
        # Its layout and descriptor to a worker, the layout and this process's mapping to the main block.
        payloads: list[Any] = [segment.layout] * len(self.blocks)
        if self.main is not None:
            payloads[-1] = (segment.layout, segment.mapping)
        _, failures = self.run(cmd, payloads, fd=segment.fd)
        if failures:
            self.state = PoolState.BROKEN
            self.raise_first(failures)
        return segment

    # -- command rounds ----------------------------------------------------------------------
    # A round is submit (signal the blocks), then wait (for all, or for some in async mode),
    # then collect (statuses and the rare pickled replies). Sync `run` is the three in a row.

    def submit(
        self,
        cmd: int,
        block_ids: list[int],
        payloads: list | None = None,
        arg: int = 0,
        fd: int | None = None,
        state: BlockState = BlockState.IN_FLIGHT,
    ) -> None:
        """Start ``cmd`` (with argument ``arg``) on the blocks ``block_ids`` and put them in ``state``;
        ``fd`` is a descriptor that follows each payload on the pipe.

        Asynchronous rounds leave the blocks IN_FLIGHT until :meth:`receive` takes their
        results; :meth:`run` submits with IDLE, as it collects them itself. Worker blocks start
        and run on their own. The main block, if listed, is parked for :meth:`wait` to run, and
        its result for :meth:`collect` to take.
        """
        if self.state is not PoolState.OPEN:
            raise ClosedError(
                "this vector env is closed" + (" after a worker fault" if self.state is PoolState.BROKEN else "")
            )
        main = self.main
        if main is None or main.index not in block_ids:
            main = None
        elif block_ids is self.all_blocks:
            block_ids = self.worker_blocks
        else:
            block_ids = [b for b in block_ids if b != main.index]
        if self._pickled_act and cmd == Command.STEP:
            payloads = self._action_payloads(block_ids)
        blobs = None if payloads is None else _pickle_payloads(payloads, block_ids)
        probe = probes.probe
        seq = self.seq = self.seq + 1
        target, commands, states = self._target, self.commands, self.states
        if block_ids:
            submitted, now = self._submitted, time.perf_counter()
            every = len(block_ids) == len(self.worker_blocks)
            broadcast = every and payloads is None and fd is None
            if every:  # the workers' blocks, 0 .. W - 1: one slice assignment each
                n = len(block_ids)
                target[:n], submitted[:n], commands[:n], states[:n] = [seq] * n, [now] * n, [cmd] * n, [state] * n
            else:
                for block in block_ids:
                    target[block] = seq
                    submitted[block] = now
                    commands[block] = cmd
                    states[block] = state
            self._all_seq, self._next_done = (seq if every else None), 0
            try:
                if broadcast:
                    self._post_broadcast(cmd, arg, seq)
                elif blobs is None:
                    self._post(cmd, arg, seq, block_ids, payloads)
                else:
                    # A GO and its payload go together: a Ctrl-C between them would leave the
                    # worker waiting for a payload never sent (SIGINT is held until both are out).
                    with sigint_held():
                        self._post(cmd, arg, seq, block_ids, payloads)
                        for block in block_ids:
                            if block in blobs:
                                self.workers.send(block, blobs[block], fd)
                                if probe:
                                    probe("main:sent")
            except BaseException:
                self._interrupted(block_ids, seq)
                raise
        if main is not None:
            # Run in wait(): the main process steps its block while it would otherwise wait
            # for the workers, and only then, so it keeps handing out their batches first.
            m = main.index
            target[m], commands[m], states[m] = seq, cmd, state
            main.pending = (cmd, None if payloads is None else payloads[m], arg)

    def _interrupted(self, block_ids: list[int], seq: int) -> None:
        """After an exception (a Ctrl-C) while round ``seq`` was posted or waited for: exactly
        the blocks of ``block_ids`` that were posted it (their GO, or the broadcast's, stored;
        the main block's command parked or run) are IN_FLIGHT, still running it for all this
        process knows (the next drain waits for them); the others are IDLE, never told.
        """
        lines, main_line, target, states = self.lines, self.main_line, self._target, self.states
        broadcast = self._counted and main_line[P.GO] == seq
        main = self.main
        for block in block_ids:
            if main is not None and block == main.index:
                posted = target[block] == seq and (main.pending is not None or main.result is not None)
            else:
                posted = broadcast or lines[block][P.GO] == seq
            states[block] = BlockState.IN_FLIGHT if posted else BlockState.IDLE

    def _post_broadcast(self, cmd: int, arg: int, seq: int) -> None:
        """Post ``cmd`` to every worker at once, on main's line, with at most ``protocol.ROOTS``
        wake-ups (the tree's roots; the workers relay the others, ``protocol.relay_children``).
        """
        main_line = self.main_line
        main_line[P.CMD] = cmd
        main_line[P.ARG] = arg
        # The round's count, tagged with it: a late worker of an earlier round cannot count here.
        main_line[DONE] = count_base(seq)
        self._counted = True
        probe = probes.probe
        if probe:
            probe("main:post")
        fence()  # ordering [GO]: the actions, the command words and the count before the broadcast GO
        main_line[P.GO] = seq
        if probe:
            probe("main:posted")
        fence()  # ordering [SLEEP]: the broadcast GO before reading the tree's roots' SLEEPING
        lines, wake_fds = self.lines, self.workers.wake_fds
        for block in self._roots:
            if lines[block][P.SLEEPING]:
                ring(wake_fds[block])

    def _post(self, cmd: int, arg: int, seq: int, block_ids: list[int], payloads: list | None) -> None:
        """Post ``cmd`` on the lines of ``block_ids``, and wake those that sleep."""
        self._counted = False
        lines = self.lines
        for block in block_ids:
            line = lines[block]
            line[P.CMD] = cmd
            line[P.ARG] = arg
            line[P.PAYLOAD] = 1 if payloads is not None and payloads[block] is not None else 0
        probe = probes.probe
        if probe:
            probe("main:post")
        fence()  # ordering [GO]: the actions and the command words before GO
        for block in block_ids:
            lines[block][P.GO] = seq
            if probe:
                probe("main:posted")
        fence()  # ordering [SLEEP]: GO before reading each worker's SLEEPING
        wake_fds = self.workers.wake_fds
        for block in block_ids:
            if lines[block][P.SLEEPING]:
                ring(wake_fds[block])

    def _action_payloads(self, block_ids: list[int]) -> list[dict[str, np.ndarray] | None]:
        """Each worker block's slice of the pickled action regions (``None`` for other blocks)."""
        payloads: list[dict[str, np.ndarray] | None] = [None] * len(self.blocks)
        for block in block_ids:
            sl = slice(self.blocks[block].start, self.blocks[block].stop)
            payloads[block] = {name: self.views[name][sl] for name in self._pickled_act}
        return payloads

    def _absorb(self, block: int, reply: tuple) -> Any:
        """Copy the pickled observation regions that worker ``block`` sent with a STEP or RESET
        reply into this process's arrays; return the reply's own part (infos or ``None``).
        """
        reply, regions = reply
        sl = slice(self.blocks[block].start, self.blocks[block].stop)
        for name, values in regions.items():
            self.views[name][sl] = values
        return reply

    def receive(self, count: int, ordered: bool = False) -> tuple[list[int], dict[int, Any], Failures]:
        """Wait until ``count`` of the blocks in flight finished (all of them if fewer are in
        flight; at least one must be); take their results. ``ordered``: not any ``count``
        blocks, but the ``count`` submitted first (lowest block first among those submitted
        together), so that the order of batches depends on the calls alone, not on timing.

        Returns ``(ready, replies, failures)``: the blocks taken, in block order, which are IDLE
        again; the replies of those that sent one; the failures (as :meth:`run` reports them).
        A failed block counts as finished. When more than ``count`` blocks are done, failures
        come first (not to be lost), then the oldest submissions: a block that keeps finishing
        fast cannot starve the others.
        """
        states, in_flight = self.states, BlockState.IN_FLIGHT
        flying = [block for block, state in enumerate(states) if state is in_flight]
        count = min(count, len(flying))
        if ordered:
            target = self._target
            flying = sorted(sorted(flying, key=lambda b: (target[b], b))[:count])
        failures = self.wait(flying, count, self.timeout)
        ready = [block for block in flying if self._finished(block)]  # in block order
        fence()  # ordering [DONE]: this scan may see blocks the wait did not (finished since)
        if failures:
            ready = sorted(set(ready) | set(failures))
        if len(ready) > count:
            target = self._target
            ready = sorted(sorted(ready, key=lambda b: (b not in failures, target[b]))[:count])
        failures = {b: e for b, e in failures.items() if b in ready}
        replies, failed = self.collect([b for b in ready if b not in failures], self.timeout)
        failures.update(failed)
        idle = BlockState.IDLE
        for block in ready:
            states[block] = idle
        return ready, replies, failures

    def _finished(self, block: int) -> bool:
        main = self.main
        if main is not None and block == main.index:
            return main.result is not None
        return self.lines[block][DONE] == self._target[block]

    def wait(
        self, block_ids: list[int], count: int, timeout: float | None, on_done: Callable[[int], None] | None = None
    ) -> Failures:
        """Spin, then block, until ``count`` blocks of ``block_ids`` have finished or failed.

        Returns the failures (dead or timed-out workers, which count as finished). The main
        block's submitted command runs here, unless ``count`` worker blocks submitted before it
        have finished already (they are what the caller gets first). ``on_done(block)``, if
        given, is called in a broadcast round with each block that finished without failing,
        as soon as this process sees it done, while the others still run (the caller takes
        that block's results then); it may miss a block: the caller takes what it missed after.
        """
        failures: Failures = {}
        main = self.main
        if main is not None and main.index in block_ids:
            m = main.index
            block_ids = self.worker_blocks if block_ids is self.all_blocks else [b for b in block_ids if b != m]
            if main.pending is not None:
                # Its turn comes unless `count` worker blocks submitted before it are done already
                # (a wait for every block needs it anyway).
                if count > len(block_ids) or self._done_before(block_ids, m) < count:
                    try:
                        main.run_pending()
                    except BaseException:  # KeyboardInterrupt, SystemExit: the block is half stepped
                        self.state = PoolState.BROKEN
                        raise
                    if on_done is not None and main.result[1] is None:  # type: ignore[index]
                        on_done(m)
                    count -= 1
            else:
                count -= 1
        if count > 0 and block_ids:
            self._wait_workers(block_ids, count, timeout, failures, on_done)
        if count < len(block_ids):
            # The caller is served while some blocks are still out: look at those anyway.
            self._check_late(block_ids, failures, time.perf_counter())
        return failures

    def _done_before(self, block_ids: list[int], main: int) -> int:
        """How many worker blocks of ``block_ids``, submitted before the main block's
        command, are done.
        """
        target, lines, mine = self._target, self.lines, self._target[main]
        return sum(1 for b in block_ids if target[b] < mine and lines[b][DONE] == target[b])

    def _wait_workers(
        self,
        block_ids: list[int],
        count: int,
        timeout: float | None,
        failures: Failures,
        on_done: Callable[[int], None] | None,
    ) -> None:
        """Spin, then block, until ``count`` worker blocks of ``block_ids`` have finished or
        failed (the failures go into ``failures``); ``on_done`` as in :meth:`wait`.
        """
        policy = self._wait_policy
        t0 = time.perf_counter()
        # The common case spins on a cheaper test built once: every worker, one sequence number.
        every_worker = count >= len(block_ids) == len(self.worker_blocks) and self._all_seq is not None
        # A broadcast round is done when its count is (one word); another round for every worker
        # when each block's DONE is (each read until seen done).
        counted = every_worker and self._counted
        all_done, named_wake = self._done_test(counted, on_done)
        if every_worker and spin_until(all_done, policy):
            policy.update(time.perf_counter() - t0)
            fence()  # ordering [DONE]: DONE seen before the results are read
            return
        lines, target = self.lines, self._target

        def ready() -> bool:  # failed blocks count as finished
            n = len(failures)
            for block in block_ids:
                if lines[block][DONE] == target[block] and block not in failures:
                    n += 1
            return n >= count

        if not every_worker and spin_until(ready, policy):
            policy.update(time.perf_counter() - t0)
            fence()  # ordering [DONE]
            return
        submitted, sentinels = self._submitted, self.workers.sentinels
        probe = probes.probe
        while True:
            # Waiting for every worker, main sleeps until the last of a broadcast round rings it
            # (or the next to finish, taking each block's results), watching every worker; or
            # it names the first worker not done and watches that one alone: only it rings,
            # and main reaches each in turn (a later one that died or hangs is found when
            # named). After a failure, any worker rings.
            named = every_worker and not failures
            if named and all_done():
                break
            if probe:
                probe("main:waited")
            if named and counted:
                # Every worker: one that died is this round's failure even if its DONE is stored
                # (it may have died before it counted itself; the count would never be complete).
                watch = self.worker_blocks
            elif named:
                watch = [self.worker_blocks[self._next_done]]
            else:
                watch = [b for b in block_ids if b not in failures and lines[b][DONE] != target[b]]
            remaining = None
            if timeout is not None:  # each block's timeout counts from its submission
                first = min(submitted[b] for b in (watch or block_ids))
                remaining = max(0.0, first + timeout - time.perf_counter())
            try:
                dead = block_until(
                    all_done if named else ready,
                    self.main_line,
                    self.workers.done_fd,
                    sentinels if watch is self.worker_blocks else [sentinels[b] for b in watch],
                    remaining,
                    announce=named_wake if named else ANY_BLOCK,
                )
            except TimeoutError:
                dead = []
                if named and counted:
                    # The count is late: each block's own DONE decides from now on (a worker held
                    # between its DONE and its count has its results written, and its tagged
                    # count cannot land in a later round); those not done are overdue, below.
                    counted = False
                    all_done, named_wake = self._done_test(False, None)
            if dead or timeout is not None:
                self._lost(watch, dead, time.perf_counter(), timeout, failures, named and counted)
            if all_done() if every_worker and not failures else ready():
                break
        policy.update(time.perf_counter() - t0)
        if probe:
            probe("main:seen")
        fence()  # ordering [DONE]

    def _done_test(
        self, counted: bool, on_done: Callable[[int], None] | None
    ) -> tuple[Callable[[], bool], int | Callable[[], int]]:
        """The test of a round for every worker done, and main's ``SLEEPING`` while it waits for
        that round: a broadcast's count (``at_count``), or the first block not seen done.
        """
        if not counted:
            return self._all_done, self._first_not_done
        if on_done is None:
            return self._counted_done, self._everyone
        return self._each_done(on_done)

    def _each_done(self, on_done: Callable[[int], None]) -> tuple[Callable[[], bool], Callable[[], int]]:
        """A broadcast round's test of done that also hands ``on_done`` each worker block as it
        is seen done, and main's ``SLEEPING`` for its next sleep: rung once half the blocks not
        handed out yet have finished, the last alone (``at_count``: main's count word says how
        many finished, not which; each worker wrote its own ``DONE`` before it counted itself).
        Main wakes about log2(workers) times a round, not once per block, and the block that
        finishes last is the one left to take after the round.
        """
        lines, main_line, seq = self.lines, self.main_line, self._all_seq
        workers = len(self.worker_blocks)
        left = list(self.worker_blocks)  # the blocks not handed out yet
        counted = [0]  # the count when they were last looked at

        def done() -> bool:
            word = main_line[DONE]
            if word != counted[0]:
                counted[0] = word
                fence()  # ordering [COUNT]: the count before the DONE words of the workers it counts
                finished = [b for b in left if lines[b][DONE] == seq]
                if finished:
                    fence()  # ordering [DONE]: each DONE seen before that block's results are read
                    for block in finished:
                        left.remove(block)
                        on_done(block)
            return counted_of(word) == workers

        def wake() -> int:  # rung when half the blocks still out have finished (the last: alone)
            copied = workers - len(left)
            return at_count(min(copied + max(1, (workers - copied) // 2), workers))

        return done, wake

    def _first_not_done(self) -> int:
        """Main's ``SLEEPING`` while it waits for every worker: ``k + 1``, ``k`` the first worker
        block it has not seen done.
        """
        return for_block(self._next_done)

    def _check_late(self, block_ids: list[int], failures: Failures, now: float) -> None:
        """Add to ``failures`` the worker blocks among ``block_ids`` still out whose worker died
        or overran the timeout since their submission.

        For waits that return while some blocks are still out: a dead or stuck worker must not
        go unnoticed just because the others keep finishing. One ``select`` on their sentinels,
        no waiting, at most every ``SENTINEL_CHECK_S`` (a syscall per recv costs more than the rest).
        """
        if now < self._next_sentinel_check:
            return
        self._next_sentinel_check = now + SENTINEL_CHECK_S
        lines, target, procs = self.lines, self._target, self.workers.procs
        late = [b for b in block_ids if lines[b][DONE] != target[b] and b not in failures]
        if late:
            dead = readable([procs[b].sentinel for b in late], 0)
            self._lost(late, dead, now, self.timeout, failures)

    def _lost(
        self,
        block_ids: list[int],
        dead: list[int],
        now: float,
        timeout: float | None,
        failures: Failures,
        counted: bool = False,
    ) -> None:
        """The one judgement of a worker that does not answer: among ``block_ids`` still out, a
        worker whose sentinel is in ``dead`` died; one past ``timeout`` since its submission is
        stopped. Each goes into ``failures``. In a ``counted`` round (a broadcast whose count is
        not complete) a worker that died fails it whatever its DONE says: it may have died
        after storing DONE and before counting itself.
        """
        lines, target, procs, workers = self.lines, self._target, self.workers.procs, self.workers
        for block in block_ids:
            if block in failures:
                continue
            done = lines[block][DONE] == target[block]
            if procs[block].sentinel in dead and (counted or not done):
                failures[block] = workers.died(block)
            elif not done and timeout is not None and now - self._submitted[block] >= timeout - 1e-3:
                failures[block] = workers.stop_overdue(block, P.phase(self.commands[block]), timeout)

    def collect(self, block_ids: list[int], timeout: float | None) -> tuple[dict[int, Any], Failures]:
        """Statuses and replies of finished blocks: ``({block: reply}, {block: failure})``.

        Only blocks whose status says a reply follows appear in the first dict.
        """
        replies: dict[int, Any] = {}
        failures: Failures = {}
        deadline: float | None = -1.0  # computed at the first reply to read: most rounds have none
        lines, commands, main = self.lines, self.commands, self.main
        for block in block_ids:
            if main is not None and block == main.index:
                reply, exc = main.take()
                if exc is not None:
                    failures[block] = exc
                elif reply is not None:
                    replies[block] = reply
                continue
            line = lines[block]
            status = line[P.STATUS]
            if status == Status.OK:
                continue
            size = line[P.REPLY_LEN]
            if size >= 0:  # in shared memory: no syscall, no wait
                msg = pickle.loads(self.replies[block][:size])
            else:
                if deadline == -1.0:
                    deadline = None if timeout is None else time.monotonic() + timeout
                try:
                    msg = self.workers.recv(block, deadline, P.phase(commands[block]))
                except (WorkerDied, StepTimeout) as exc:
                    failures[block] = exc
                    continue
            if status == Status.REPLY:
                if self._pickled_obs and commands[block] in (Command.STEP, Command.RESET):
                    msg = self._absorb(block, msg)
                    if msg is None:
                        continue
                replies[block] = msg
            else:
                failures[block] = WorkerError(msg)
        return replies, failures

    def run(
        self,
        cmd: int,
        payloads: list | None = None,
        timeout: float | None = None,
        block_ids: list[int] | None = None,
        arg: int = 0,
        fd: int | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> tuple[list, Failures]:
        """Run ``cmd`` on every block (or on ``block_ids``) and wait; return ``(replies, failures)``.

        ``payloads`` holds one picklable payload per block (or ``None``); ``timeout`` defaults
        to the pool's. ``replies`` has one entry per block (``None`` where it had nothing to
        say). ``failures`` maps each block that failed to its exception: :class:`WorkerError`
        (an env raised; the worker lives on), :class:`WorkerDied` or :class:`StepTimeout` (the
        worker is gone). The caller decides: raise (see :meth:`raise_first`) or restart those blocks.
        ``on_done``: see :meth:`wait`.
        """
        if timeout is None:
            timeout = self.timeout
        ids = self.all_blocks if block_ids is None else block_ids
        seq = self.seq + 1
        try:
            self.submit(cmd, ids, payloads, arg, fd, BlockState.IDLE)
            failures = self.wait(ids, len(ids), timeout, on_done)
        except KeyboardInterrupt:
            # Ctrl-C while the blocks run: they finish the command on their own. In flight, the
            # next receive (a drain) waits for them and drops their results; the pool goes on.
            self._interrupted(ids, seq)
            raise
        if failures:
            ids = [b for b in ids if b not in failures]
        elif self._counted and not_ok(self.main_line[DONE]) == 0:  # a broadcast round no worker replied to
            ids = [] if self.main is None or self.main.index not in ids else [self.main.index]
        got, failed = self.collect(ids, timeout)
        failures.update(failed)
        replies: list[Any] = [None] * len(self.blocks)
        for block, reply in got.items():
            replies[block] = reply
        return replies, failures

    def raise_first(self, failures: Failures) -> None:
        """Raise the failure of the lowest block; a lost worker leaves the pool broken."""
        if not failures:
            return
        if any(not isinstance(exc, WorkerError) for exc in failures.values()):
            self.state = PoolState.BROKEN
        raise failures[min(failures)]

    # -- shutdown --------------------------------------------------------------------------
    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the workers (politely, then by force), close the envs, release the segments.

        Idempotent; safe to call from a finalizer or after a fault.
        """
        if self.state is PoolState.CLOSED:
            return
        broken = self.state is PoolState.BROKEN
        if self.main is not None:
            self.main.pending = None  # an asynchronous main-block command never run: nothing to stop
        try:
            if not broken and self.views:
                try:
                    self.run(Command.CLOSE, timeout=timeout)
                except Exception:
                    pass
            elif self.main is not None:
                close_all(self.main.stepper.envs)
        finally:
            self.state = PoolState.CLOSED
        self.workers.join(timeout if not broken else 0.2)
        for seg in (self._segment, *self.attached.values()):
            if seg is not None:
                seg.close()
        self.attached = {}
        # Our mapping is freed when the last view of it is gone (views handed out with
        # copy=False may outlive the env; they stay valid, the name is already unlinked).
        self.main = None
        self.views = {}
        self.replies = []
        self._segment = None
