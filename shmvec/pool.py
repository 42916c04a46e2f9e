"""Command rounds over the blocks of a vector env: submit, wait, collect.

A :class:`WorkerPool` splits ``num_envs`` envs into contiguous blocks. Each block is stepped
by a worker process (:mod:`shmvec.processes`), so no env can take the calling process down.
With ``step_in_main`` (an opt-in speed mode) one more block, the last, is stepped by the
calling process itself while the workers step theirs, so on an N-core machine N blocks run at
once and no core idles in a wait. Either way a command takes one path: :meth:`~WorkerPool.submit`
starts it, :meth:`~WorkerPool.wait` runs the calling process's block (if it has one) and waits
for the workers, and :class:`~shmvec.replies.Replies` collects statuses and replies.

How each block joins the pool, at start-up and on a restart, is :mod:`shmvec.joining`'s; the
pool lays out the segment from the spaces the blocks report. It knows nothing of the
Gymnasium API: it runs protocol commands and returns replies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from shmvec import protocol as P
from shmvec.barrier import fence
from shmvec.barrier import prepare as prepare_barrier
from shmvec.blocks import split
from shmvec.broadcast import NOT_DONE, QUIET, REFUSED, BroadcastRound, Staged
from shmvec.checks import usable_cores
from shmvec.completion import Completion, Failures
from shmvec.errors import ClosedError, WorkerError
from shmvec.joining import Joining, Segments
from shmvec.layout import Layout, control_lines
from shmvec.main_block import MainBlock
from shmvec.options import Options
from shmvec.posting import Posting, pickle_payloads, sigint_held
from shmvec.protocol import DONE, Command, not_ok
from shmvec.replies import Replies
from shmvec.segment import Segment
from shmvec.stepper import close_all
from shmvec.sync import spin_policies


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


_OPEN = PoolState.OPEN


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

        # Filled in by the set-up below.
        self.spaces: P.Spaces  # what every env reported: spaces, metadata, render mode, spec
        self.layout: Layout
        self.views: dict[str, np.ndarray] = {}
        self.lines: list[memoryview] = []  # one int64 memoryview per control line: a third of a numpy scalar's cost
        self.replies: Replies  # the statuses and replies of a round, and the pickled leaves
        self.main_line: memoryview
        self.main: MainBlock | None = None  # the block stepped by this process
        self._segment: Segment | None = None
        # Segments attached after the start, by the command that attached them (the rollout's,
        # the scalar infos'): a replaced block is sent each again (see Restart.RESEND).
        self.attached: dict[Command, Segment] = {}

        # Command rounds. Per block, the main one included: its asynchronous state, the sequence
        # number it must reach, its last command, and perf_counter() of its last submission.
        self.seq = 0
        self.states = [BlockState.IDLE] * num_blocks
        self._idle = [BlockState.IDLE] * num_workers  # (the workers' states after a synchronous round)
        self._workers = num_workers
        self._target: memoryview  # (BroadcastRound.targets: the compiled waits read it too)
        self.commands: list[int] = [0] * num_blocks
        self._submitted = [0.0] * num_blocks
        self.posting: Posting  # how rounds are posted, and
        self.completion: Completion  # how their ends are known (see _lay_out)
        self.round: BroadcastRound  # the broadcast round, compiled (both use it)
        self.broadcasts = False  # (see below)

        prepare_barrier()  # (the workers' count, compiled once here: forked workers inherit it)
        self.joining = Joining(
            env_fns, self.blocks, self.main_index, options.for_worker(worker_spin), options.context, self.timeout
        )
        self.workers = self.joining.workers
        self.context = self.workers.context
        try:
            self.spaces, stepper = self.joining.join(self.all_blocks, None, self._lay_out)
            if stepper is not None:
                self.main = MainBlock(num_workers, stepper)
            # Whether a round of one command for every block, with no payload, is a broadcast:
            # with no block in the calling process, and no action leaf that travels pickled.
            self.broadcasts = self.main is None and not self.replies.pickled_act
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
        self.lines = control_lines(self.views)
        self.main_line = self.lines[len(self.blocks)]
        self.replies = Replies(self.layout, self.views, self.lines, self.workers, self.blocks, self.commands)
        workers = len(self.worker_blocks)
        self.round = BroadcastRound(self.views["ctrl"], self.workers, workers, self._wait_policy)
        self._target = self.round.targets
        self.posting = Posting(self.lines, self.workers, workers, self.round)
        self.completion = Completion(
            self.lines,
            self.workers,
            workers,
            self._wait_policy,
            self._target,
            self._submitted,
            self.commands,
            self.round,
        )
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
            self.completion.begin(None, False)
        assert self._segment is not None
        handed = Segments(self._segment, self.attached)
        _, stepper = self.joining.join([block], self.spaces, lambda _: handed)
        if main is not None and stepper is not None:
            main.stepper = stepper

    def attach(self, cmd: Command, segment: Segment, lost_later: bool = False) -> Segment:
        """Hand ``segment`` to every block with ``cmd`` (a command whose payload is a segment's
        layout, see ``Command.descriptor``), in place of the one ``cmd`` attached before; a
        block that joins later gets it in its ``Attach`` (:mod:`shmvec.joining`).

        ``lost_later``: a worker lost in this round (died, or stopped past the timeout) is left
        for the next round to find, as one killed while idle is (``on_error="restart"``
        replaces it then, and its replacement gets this segment as it joins).
        """
        old = self.attached.pop(cmd, None)
        if old is not None:
            old.close()
        self.attached[cmd] = segment
        # Its layout and descriptor to a worker, the layout and this process's mapping to the main block.
        payloads: list[Any] = [segment.layout] * len(self.blocks)
        if self.main is not None:
            payloads[-1] = (segment.layout, segment.mapping)
        with sigint_held():  # (a Ctrl-C waits the few milliseconds: every block holds the same segment)
            _, failures = self.run(cmd, payloads, fd=segment.fd)
        if lost_later:
            failures = {b: e for b, e in failures.items() if isinstance(e, WorkerError)}
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
        actions: Staged | None = None,
    ) -> None:
        """Start ``cmd`` (with argument ``arg``) on the blocks ``block_ids`` and put them in ``state``;
        ``fd`` is a descriptor that follows each payload on the pipe.

        Asynchronous rounds leave the blocks IN_FLIGHT until :meth:`receive` takes their
        results; :meth:`run` submits with IDLE, as it collects them itself. Worker blocks start
        and run on their own. The main block, if listed, is parked for :meth:`wait` to run, and
        its result for the collection (``Replies.collect``) to take. ``actions``: a staged
        action batch for the workers' blocks (``Posting.post``).
        """
        if self.state is not _OPEN:
            self._refuse_closed()
        main = self.main
        if main is None or main.index not in block_ids:
            main = None
        elif block_ids is self.all_blocks:
            block_ids = self.worker_blocks
        else:
            block_ids = [b for b in block_ids if b != main.index]
        if self.replies.pickled_act and cmd == Command.STEP:
            payloads = self.replies.action_payloads(block_ids)
        blobs = None if payloads is None else pickle_payloads(payloads, block_ids)
        seq = self.seq = self.seq + 1
        target, commands, states = self._target, self.commands, self.states
        if block_ids:
            submitted, now = self._submitted, time.perf_counter()
            every = len(block_ids) == len(self.worker_blocks)
            if every:  # the workers' blocks, 0 .. W - 1: one slice assignment each
                n = len(block_ids)
                submitted[:n], commands[:n], states[:n] = [now] * n, [cmd] * n, [state] * n
                self.round.set_targets(n, seq)
            else:
                for block in block_ids:
                    target[block] = seq
                    submitted[block] = now
                    commands[block] = cmd
                    states[block] = state
            try:
                self.posting.post(cmd, arg, seq, block_ids, payloads, blobs, fd, actions)
            except BaseException:
                self._interrupted(block_ids, seq)
                raise
            self.completion.begin(seq if every else None, self.posting.broadcast)
        if main is not None:
            # Run in wait(): the main process steps its block while it would otherwise wait
            # for the workers, and only then, so it keeps handing out their batches first.
            m = main.index
            target[m], commands[m], states[m] = seq, cmd, state
            main.pending = (cmd, None if payloads is None else payloads[m], arg)

    def _refuse_closed(self) -> None:
        raise ClosedError(
            "this vector env is closed" + (" after a worker fault" if self.state is PoolState.BROKEN else "")
        )

    def _interrupted(self, block_ids: list[int], seq: int) -> None:
        """After an exception (a Ctrl-C) while round ``seq`` was posted or waited for: exactly
        the blocks of ``block_ids`` that were posted it (their GO, or the broadcast's, stored;
        the main block's command parked or run) are IN_FLIGHT, still running it for all this
        process knows (the next drain waits for them); the others are IDLE, never told.
        """
        target, states, main = self._target, self.states, self.main
        for block in block_ids:
            if main is not None and block == main.index:
                posted = target[block] == seq and (main.pending is not None or main.result is not None)
            else:
                posted = self.posting.posted(block, seq)
            states[block] = BlockState.IN_FLIGHT if posted else BlockState.IDLE
        self.completion.begin(None, False)

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
        main = self.main  # the blocks finished, in block order (the main block's is the highest index)
        if main is None or main.index not in flying:
            ready = self.completion.done_of(flying)
        else:
            ready = self.completion.done_of(flying[:-1]) + ([main.index] if main.result is not None else [])
        fence()  # ordering [DONE]: this scan may see blocks the wait did not (finished since)
        if failures:
            ready = sorted(set(ready) | set(failures))
        if len(ready) > count:
            target = self._target
            # (the usual case, no failure: a key in C; sorted() keeps block order among equals)
            key = target.__getitem__ if not failures else lambda b: (b not in failures, target[b])
            ready = sorted(sorted(ready, key=key)[:count])
        if failures:
            failures = {b: e for b, e in failures.items() if b in ready}
            replies, failed = self.replies.collect([b for b in ready if b not in failures], self.timeout, main)
        else:
            replies, failed = self.replies.collect(ready, self.timeout, main)
        failures.update(failed)
        idle = BlockState.IDLE
        for block in ready:
            states[block] = idle
        return ready, replies, failures

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
                target = self._target
                before = [b for b in block_ids if target[b] < target[m]]  # submitted before it
                if count > len(block_ids) or len(self.completion.done_of(before)) < count:
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
            self.completion.wait(block_ids, count, timeout, failures, on_done)
        if count < len(block_ids):
            # The caller is served while some blocks are still out: look at those anyway.
            self.completion.check_late(block_ids, failures, time.perf_counter(), self.timeout)
        return failures

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
        if block_ids is None and payloads is None and on_done is None and fd is None and self.broadcasts:
            result = self.broadcast(cmd, arg, timeout)
            assert result is not None  # (nothing staged: nothing to refuse)
            replies, failures = result
            return ([None] * len(self.blocks) if replies is None else replies), failures
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
        return self._collect(ids, failures, timeout)

    def broadcast(
        self, cmd: int, arg: int = 0, timeout: float | None = None, actions: Staged | None = None
    ) -> tuple[list | None, Failures] | None:
        """:meth:`run` of ``cmd`` with ``arg`` for every worker, where :attr:`broadcasts`: the
        training loop's round, :meth:`submit` and :meth:`wait` cut to what a broadcast needs.
        The compiled round posts it and waits; the per-block records are written only for a
        round that needs them (a reply to collect, a fault to judge, a Ctrl-C). The replies are
        ``None`` when no worker replied (a quiet round; :meth:`run` makes them a list).

        ``actions``: a staged action batch (:meth:`BroadcastRound.run`). ``None`` when the
        compiled check refused a row of it: nothing was written or posted, and the caller's
        own check says why.
        """
        if self.state is not _OPEN:
            self._refuse_closed()
        if timeout is None:
            timeout = self.timeout
        seq = self.seq = self.seq + 1
        try:
            code = self.round.run(cmd, arg, seq, timeout, actions)
            if code == QUIET:  # every worker done, none replied: nothing to collect, nothing to record
                return None, {}
            if code == REFUSED:
                return None
            self._record(cmd, seq)
            failures: Failures = {}
            if code == NOT_DONE:  # the general wait judges it
                self.completion.wait_out_counted(timeout, failures)
        except KeyboardInterrupt:  # (as in run)
            self._record(cmd, seq)
            self._interrupted(self.worker_blocks, seq)
            raise
        return self._collect(self.worker_blocks, failures, timeout)

    def _record(self, cmd: int, seq: int) -> None:
        """What :meth:`submit` and :meth:`wait` would have recorded of broadcast round ``seq``:
        each worker block's target, submission and command, IDLE (as a synchronous round
        leaves it), and the round posted as a broadcast, counted.
        """
        n = self._workers
        self.round.set_targets(n, seq)
        self._submitted[:n] = [self.round.posted_at()] * n
        self.commands[:n] = [cmd] * n
        self.states[:n] = self._idle
        self.posting.broadcast = True
        self.completion.begin(seq, True)

    def _collect(self, ids: list[int], failures: Failures, timeout: float | None) -> tuple[list, Failures]:
        """The replies of a synchronous round on ``ids`` that ended with ``failures``: ``run``'s
        result. A broadcast's count says whether any worker replied only while it is complete
        (a count that came late leaves each block's status to read).
        """
        if failures:
            ids = [b for b in ids if b not in failures]
        elif self.completion.counted and not_ok(self.main_line[DONE]) == 0:  # a broadcast round no worker replied to
            if self.main is None or self.main.index not in ids:
                return [None] * len(self.blocks), failures
            ids = [self.main.index]
        got, failed = self.replies.collect(ids, timeout, self.main)
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
        self.lines = []
        self._segment = None
        # (the control lines' views they hold)
        self.posting = self.completion = self.round = self.main_line = self.replies = None  # type: ignore[assignment]
