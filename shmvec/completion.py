"""Knowing when a round's worker blocks are done: the tests of done (a broadcast's count, each
block's ``DONE``), the wait for them (spin, then block), and the one judgement of a worker that
does not answer (died, or past the timeout).

What main may read once a block is done, and the barriers that make it so, are argued in
``docs/architecture.md`` ("Memory ordering": [DONE], [COUNT], [SLEEP]).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from shmvec import probes
from shmvec import protocol as P
from shmvec.barrier import fence
from shmvec.broadcast import BroadcastRound
from shmvec.processes import WorkerProcesses
from shmvec.protocol import ANY_BLOCK, DONE, at_count, for_block
from shmvec.sync import SpinPolicy, block_until, readable, spin_until

__all__ = ["Completion", "Failures", "SENTINEL_CHECK_S"]

# Seconds between looks for dead workers while the others keep finishing (asynchronous waits).
SENTINEL_CHECK_S = 0.02

Failures = dict[int, Exception]  # block index -> what went wrong there


class Completion:
    """The done tests and waits of a pool's worker blocks.

    Parameters
    ----------
    lines : list of memoryview
        The control lines (the workers' blocks first, main's last).
    workers : WorkerProcesses
        Their processes: sentinels, the done pipe, and what stops or reports a lost one.
    num_workers : int
    policy : SpinPolicy
        How main spins before it blocks (the compiled broadcast round keeps its own budget).
    target : memoryview
    submitted, commands : list
        The pool's per-block records (shared, not copied): the sequence number each block
        must reach (``BroadcastRound.targets``), when it was submitted, its command.
    round_ : BroadcastRound
        The compiled broadcast round, whose wait :meth:`wait_counted` runs.
    """

    def __init__(
        self,
        lines: list[memoryview],
        workers: WorkerProcesses,
        num_workers: int,
        policy: SpinPolicy,
        target: memoryview,
        submitted: list[float],
        commands: list[int],
        round_: BroadcastRound,
    ) -> None:
        self.lines, self.main_line, self.workers, self.policy = lines, lines[-1], workers, policy
        self.round = round_
        self.worker_blocks = list(range(num_workers))
        self.target, self.submitted, self.commands = target, submitted, commands
        # The round in flight for every worker: [its sequence number (None: the blocks' targets
        # differ), the first worker block all_done() has not seen done]; and whether it is a
        # broadcast, counted on main's line. Lists, not attributes: the tests below are closures
        # over them, which hold no reference back to this object.
        self._round: list = [None, 0]
        self.counted = False
        self._everyone = at_count(num_workers)  # main's SLEEPING for a broadcast round's last worker
        self._next_sentinel_check = 0.0
        self.all_done, self.counted_done, self._first_not_done = _tests(lines[:num_workers], lines[-1], self._round)

    def begin(self, seq: int | None, counted: bool) -> None:
        """A round was posted: ``seq`` to every worker (``None``: to some), ``counted`` (a broadcast)."""
        self._round[0], self._round[1], self.counted = seq, 0, counted

    def done_of(self, block_ids: list[int]) -> list[int]:
        """The worker blocks of ``block_ids`` whose ``DONE`` reached their target: the one
        per-block test of done (the waits, the scan of ready blocks and the late look use it).
        """
        lines, target = self.lines, self.target
        return [b for b in block_ids if lines[b][DONE] == target[b]]

    # -- waiting ---------------------------------------------------------------------------
    def wait(
        self,
        block_ids: list[int],
        count: int,
        timeout: float | None,
        failures: Failures,
        on_done: Callable[[int], None] | None,
    ) -> None:
        """Spin, then block, until ``count`` worker blocks of ``block_ids`` have finished or
        failed (the failures go into ``failures``); ``on_done`` as in ``WorkerPool.wait``.
        """
        # Every worker, one sequence number: the round's own test (its count, or each DONE in turn).
        every = count >= len(block_ids) == len(self.worker_blocks) and self._round[0] is not None
        counted = every and self.counted
        if counted and on_done is None:
            self.wait_counted(self._round[0], timeout, failures)
            return
        if not every and timeout is None:
            # Some blocks (an asynchronous recv's), no deadline: the compiled wait spins, then
            # sleeps until any block rings; what it cannot settle goes on in the general wait.
            if self.round.wait_some(block_ids, count):
                return
            done = self._some_test(block_ids, count, failures)
            self._wait_out(block_ids, count, None, failures, False, False, done, ANY_BLOCK, time.perf_counter())
            return
        policy = self.policy
        t0 = time.perf_counter()
        if every:
            done, wake = self._every_test(counted, on_done)
        else:
            done, wake = self._some_test(block_ids, count, failures), ANY_BLOCK
        if spin_until(done, policy):
            policy.update(time.perf_counter() - t0)
            fence()  # ordering [DONE]: DONE (or the count) seen before the results are read
            return
        self._wait_out(block_ids, count, timeout, failures, every, counted, done, wake, t0)

    def wait_counted(self, seq: int, timeout: float | None, failures: Failures) -> None:
        """Wait for broadcast round ``seq``'s count, just posted (the training loop's round): the
        compiled round spins, then sleeps until the last worker counted rings main
        (:meth:`shmvec.broadcast.BroadcastRound.wait`). A worker that dies, or a round past
        ``timeout``, goes to the general wait, which judges it (``failures``).
        """
        self._round[0], self._round[1], self.counted = seq, 0, True  # (begin)
        if not self.round.wait(timeout):
            self.wait_out_counted(timeout, failures)

    def wait_out_counted(self, timeout: float | None, failures: Failures) -> None:
        """The rest of a broadcast round's wait, begun and found not done by the compiled round."""
        workers = self.worker_blocks
        self._wait_out(
            workers, len(workers), timeout, failures, True, True, self.counted_done, self._everyone, time.perf_counter()
        )

    def _wait_out(
        self,
        block_ids: list[int],
        count: int,
        timeout: float | None,
        failures: Failures,
        every: bool,
        counted: bool,
        done: Callable[[], bool],
        wake: int | Callable[[], int],
        t0: float,
    ) -> None:
        """The blocking part of :meth:`wait`, every case: sleep, judge the workers that died or
        are past ``timeout``, and go on with the test that still applies.
        """
        policy = self.policy
        probe = probes.probe
        while True:
            if probe:
                probe("main:waited")
            # (a broadcast round's wait, the usual one, watches every worker: no list to build)
            watch = self.worker_blocks if counted else self._watched(block_ids, failures, every)
            sentinels = self.workers.sentinels
            try:
                dead = block_until(
                    done,
                    self.main_line,
                    self.workers.done_fd,
                    sentinels if counted else [sentinels[b] for b in watch],
                    None if timeout is None else self._remaining(watch or block_ids, timeout),
                    announce=wake,
                )
            except TimeoutError:
                dead = []
                if counted:
                    # The count is late: each block's own DONE decides from now on (a worker held
                    # between its DONE and its count has its results written, and its tagged
                    # count cannot land in a later round); those not done are overdue, below.
                    # Its status is then each block's to read: the count's not-OK field may lack one.
                    counted = self.counted = False
                    done, wake = self._every_test(False, None)
            if dead or timeout is not None:
                failed = len(failures)
                self.lost(watch, dead, time.perf_counter(), timeout, failures, counted)
                if every and len(failures) > failed:  # after a failure, the blocks one by one; any worker rings
                    every = counted = self.counted = False
                    done, wake = self._some_test(block_ids, count, failures), ANY_BLOCK
            if done():
                break
        policy.update(time.perf_counter() - t0)
        if probe:
            probe("main:seen")
        fence()  # ordering [DONE]

    def _watched(self, block_ids: list[int], failures: Failures, every: bool) -> list[int]:
        """The workers whose sentinels a blocking wait watches, but in a broadcast round (there:
        every worker; one that died fails the round whatever its DONE says, as it may have died
        before it counted itself): in another round for every worker, the first not seen done
        (main names it, and reaches each in turn); otherwise every block still out.
        """
        if every:
            return [self._round[1]]
        done = set(self.done_of(block_ids))
        return [b for b in block_ids if b not in failures and b not in done]

    def _remaining(self, block_ids: list[int], timeout: float) -> float:
        """Seconds left of ``timeout``, counted from the earliest submission of ``block_ids``."""
        first = min(self.submitted[b] for b in block_ids)
        return max(0.0, first + timeout - time.perf_counter())

    # -- the tests of done -----------------------------------------------------------------
    def _every_test(
        self, counted: bool, on_done: Callable[[int], None] | None
    ) -> tuple[Callable[[], bool], int | Callable[[], int]]:
        """The test of a round for every worker done, and main's ``SLEEPING`` while it waits
        for it: a broadcast's count (``at_count``), or the first block not seen done.
        """
        if not counted:
            return self.all_done, self._first_not_done
        if on_done is None:
            return self.counted_done, self._everyone
        return _each_done(self.lines, self.worker_blocks, self._round[0], on_done)

    def _some_test(self, block_ids: list[int], count: int, failures: Failures) -> Callable[[], bool]:
        """The test that ``count`` of ``block_ids`` are done or failed (failures count as finished)."""
        lines, target = self.lines, self.target

        def ready() -> bool:
            n = len(failures)
            for block in block_ids:
                if lines[block][DONE] == target[block] and block not in failures:
                    n += 1
            return n >= count

        return ready

    # -- workers that do not answer ------------------------------------------------------------
    def check_late(self, block_ids: list[int], failures: Failures, now: float, timeout: float | None) -> None:
        """Add to ``failures`` the worker blocks among ``block_ids`` still out whose worker died
        or overran ``timeout`` since their submission.

        For waits that return while some blocks are still out: a dead or stuck worker must not
        go unnoticed just because the others keep finishing. One ``select`` on their sentinels,
        no waiting, at most every ``SENTINEL_CHECK_S`` (a syscall per recv costs more than the rest).
        """
        if now < self._next_sentinel_check:
            return
        self._next_sentinel_check = now + SENTINEL_CHECK_S
        done = set(self.done_of(block_ids))
        late = [b for b in block_ids if b not in done and b not in failures]
        if late:
            dead = readable([self.workers.sentinels[b] for b in late], 0)
            self.lost(late, dead, now, timeout, failures)

    def lost(
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
        done = set(self.done_of(block_ids))
        sentinels, workers = self.workers.sentinels, self.workers
        for block in block_ids:
            if block in failures:
                continue
            if sentinels[block] in dead and (counted or block not in done):
                failures[block] = workers.died(block)
            elif block not in done and timeout is not None and now - self.submitted[block] >= timeout - 1e-3:
                failures[block] = workers.stop_overdue(block, P.phase(self.commands[block]), timeout)


def _tests(worker_lines: list[memoryview], main_line: memoryview, round_: list) -> tuple:
    """``all_done()``, every worker block's DONE at the round's number (each read until seen
    done, then never again this round); ``counted_done()``, a broadcast round's count complete;
    ``first_not_done()``, main's ``SLEEPING`` while it waits for the first block not seen done.
    """
    count = len(worker_lines)

    def all_done() -> bool:
        seq, i = round_[0], round_[1]
        while i < count and worker_lines[i][DONE] == seq:
            i += 1
        round_[1] = i
        return i == count

    def counted_done() -> bool:
        return main_line[DONE] & 0xFFFF == count  # (protocol.counted; main set the round's tag)

    def first_not_done() -> int:
        return for_block(round_[1])

    return all_done, counted_done, first_not_done


def _each_done(
    lines: list[memoryview], worker_blocks: list[int], seq: int, on_done: Callable[[int], None]
) -> tuple[Callable[[], bool], Callable[[], int]]:
    """A broadcast round's test of done that also hands ``on_done`` each worker block as it is
    seen done, and main's ``SLEEPING`` for its next sleep: rung once half the blocks not handed
    out yet have finished, the last alone (``at_count``: the count says how many finished, not
    which; each worker wrote its own ``DONE`` before it counted itself). Main wakes about
    log2(workers) times a round, not once per block, and the block that finishes last is the
    one left to take after the round.
    """
    main_line = lines[-1]
    workers = len(worker_blocks)
    left = list(worker_blocks)  # the blocks not handed out yet
    seen = [0]  # the count word when they were last looked at

    def done() -> bool:
        word = main_line[DONE]
        if word != seen[0]:
            seen[0] = word
            fence()  # ordering [COUNT]: the count before the DONE words of the workers it counts
            finished = [b for b in left if lines[b][DONE] == seq]
            if finished:
                fence()  # ordering [DONE]: each DONE seen before that block's results are read
                for block in finished:
                    left.remove(block)
                    on_done(block)
        return P.counted(word) == workers

    def wake() -> int:  # rung when half the blocks still out have finished (the last: alone)
        copied = workers - len(left)
        return at_count(min(copied + max(1, (workers - copied) // 2), workers))

    return done, wake
