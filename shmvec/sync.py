"""Spin-then-block waiting on words of the shared control block, and the wake pipes behind it.

Why this shape (figures in ``docs/architecture.md``): on a small VM a kernel wake-up (pipe,
semaphore, eventfd) costs 30-60 us one way, while a spin on a shared word sees a change in
well under a microsecond. Spinning pays while the spinner has a core of its own, or yields it
often enough to a process with work, so every wait spins for a bounded budget (``spin_policies``)
and then blocks on a pipe; the side that completes a wait
writes a wake byte only when the waiter has announced (``SLEEPING``) that it is blocking.

The announce/check handshake is Dekker's: each side stores its word, issues a full barrier
(:func:`shmvec.barrier.fence`; ``docs/architecture.md``, "Memory ordering", [SLEEP]), then loads
the other side's word, so at least one of them sees the other. Every block also has a
short timeout after which the words are checked again, so even a lost wake-up costs latency,
never a hang.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from shmvec import probes
from shmvec.barrier import fence
from shmvec.protocol import SLEEPING

if TYPE_CHECKING:
    import numpy as np

# Seconds a blocked waiter sleeps at most before it looks at the words again: a lost wake-up
# costs this much latency, never a hang.
POLL_S = 0.5


def ring(fd: int) -> None:
    """Write one wake byte; a full pipe already holds a pending wake-up, so that is fine."""
    if probes.probe:
        probes.probe("ring")
    try:
        os.write(fd, b"\x01")
    except (BlockingIOError, BrokenPipeError):
        pass


def drain(fd: int) -> None:
    """Read every pending wake byte from the non-blocking ``fd``."""
    try:  # (a few bytes at most, usually one: a small read allocates less)
        while len(os.read(fd, 64)) == 64:
            pass
    except (BlockingIOError, InterruptedError):
        pass


class SpinPolicy:
    """How long to spin before blocking, adapted to the gaps actually seen.

    A wait that was satisfied within ``max_spin`` keeps the full budget (spinning pays: the
    next event will likely come as quickly). A wait that had to block shrinks the budget to
    ``min_spin``, so a waiter whose partner is busy for long (a policy forward pass, a slow
    env) stops burning a core the partner may need.
    """

    __slots__ = ("max_spin", "min_spin", "budget", "yield_every")

    def __init__(self, max_spin: float, min_spin: float, oversubscribed: bool) -> None:
        self.max_spin = max_spin
        self.min_spin = min(min_spin, max_spin)
        self.budget = max_spin
        # A spinner yields its core every few polls: free when no one else wants the core
        # (the call returns at once), and essential when the process it waits for shares
        # the core (oversubscribed, or a foreign process busy on the other cores).
        self.yield_every = 4 if oversubscribed else 16

    def update(self, waited: float) -> None:
        self.budget = self.max_spin if waited <= self.max_spin else self.min_spin


def spin_policies(
    num_workers: int, num_blocks: int, cores: int, spin_us: float | None = None, asynchronous: bool = False
) -> tuple[SpinPolicy, SpinPolicy]:
    """The ``(worker, main)`` spin policies of a pool, from its processes and the usable cores.

    Workers wait for GO while main is between steps (or, stepping a block itself, busy as they
    are), main for DONE while the blocks run. Where the blocks fit the cores, both spin up to
    2000 us, except main when it shares the cores with exactly as many worker blocks as cores
    (every env in a worker, the default): 150 us, which catches a cheap step's round trip
    without a kernel wake-up and leaves the workers their cores.

    With more blocks than cores, synchronous rounds still spin 2000 us: a spinner then yields
    its core every 4 polls rather than 16, handing it to a working process within
    microseconds, which beats blocking, whose wake-ups queue up behind each other.
    ``asynchronous`` collection (``batch_size < num_envs``) never spins there: the blocks that
    get fewer turns would come back ever more rarely, as spinners took the cores they need.

    ``docs/architecture.md`` has the measurements behind these budgets. ``spin_us`` (the
    ``ShmVecEnv`` option) sets both budgets.
    """
    if num_blocks <= cores:
        worker_spin = 2000.0
        main_spin = 150.0 if num_workers + 1 > cores and num_blocks == cores else 2000.0
    elif asynchronous:
        worker_spin = main_spin = 0.0
    else:
        worker_spin = main_spin = 2000.0
    if spin_us is not None:
        worker_spin = main_spin = float(spin_us)
    oversubscribed = num_workers + 1 > cores
    return (
        SpinPolicy(worker_spin * 1e-6, min(50e-6, worker_spin * 1e-6), oversubscribed),
        SpinPolicy(main_spin * 1e-6, min(50e-6, main_spin * 1e-6), oversubscribed),
    )


def readable(fds: list[int], timeout: float | None) -> list[int]:
    """The descriptors of ``fds`` (wake pipes, process sentinels) readable within ``timeout``
    seconds (0: a look, no wait; ``None``: no limit).

    The one call in which the shared-memory path blocks: POSIX ``select`` over pipes and
    sentinels. A Windows port replaces this function (``multiprocessing.connection.wait`` over
    handles: ``select`` there takes sockets only); ``docs/architecture.md``, "Platforms".
    """
    ready, _, _ = select.select(fds, [], [], timeout)
    return ready


def poll_array(count: int) -> np.ndarray:
    """``count`` of poll(2)'s ``struct pollfd``, each waiting to read (no descriptor: -1)."""
    import numpy as np  # (here: a worker unpickles its SpinPolicy, from this module, before numpy loads)

    fds = np.zeros(count, dtype=np.dtype([("fd", np.int32), ("events", np.int16), ("revents", np.int16)]))
    fds["fd"] = -1
    fds["events"] = 1  # POLLIN (1 on Linux and macOS)
    return fds


def spin_until(done: Callable[[], bool], policy: SpinPolicy) -> bool:
    """Spin on ``done()`` for at most the policy's budget; return whether it became true."""
    if done():
        return True
    budget = policy.budget
    if budget <= 0:
        return False
    clock = time.perf_counter
    end = clock() + budget
    yield_every = policy.yield_every
    i = 0
    while clock() < end:
        if done():
            return True
        i += 1
        if yield_every and i % yield_every == 0:
            os.sched_yield()
    return False


def block_until(
    done: Callable[[], bool],
    ctrl_line,
    wake_fd: int,
    watch: list[int],
    timeout: float | None,
    poll_interval: float = POLL_S,
    announce: int | Callable[[], int] = 1,
) -> list[int]:
    """Block on ``wake_fd`` (and ``watch`` fds) until ``done()``; announce it in ``ctrl_line``.

    ``announce`` is the ``SLEEPING`` value written before each sleep: a worker's 1; main's
    ``protocol.ANY_BLOCK`` (any worker rings it), ``protocol.at_count(n)`` (the worker whose
    count makes a broadcast round's n rings it) or ``k + 1`` (worker ``k`` rings it). A callable
    gives the value that ``done()`` moves on (the next block, or the next count). Returns the
    fds in ``watch`` that became readable (sentinels of processes that died), or an empty list
    when ``done()`` became true or the value named moved on (the caller looks, and names the
    next one). Raises ``TimeoutError`` after ``timeout`` seconds (``None``: never).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    fds = [wake_fd, *watch]
    finished = done
    if callable(announce):
        moving, named = announce, announce()

        def finished() -> bool:  # done, or the value named moved on: the caller names the next one
            return done() or moving() != named

    else:
        named = announce

    probe = probes.probe
    try:
        while True:
            ctrl_line[SLEEPING] = named
            fence()  # ordering [SLEEP]: SLEEPING before the word waited on is read
            if probe:
                probe("sleep:announced")
            if finished():
                return []
            wait = poll_interval
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError
            ready = readable(fds, wait)
            if probe:
                probe("sleep:woken")
            ctrl_line[SLEEPING] = 0
            if wake_fd in ready:
                drain(wake_fd)
            dead = [fd for fd in ready if fd != wake_fd]
            if finished():
                return []
            if dead:
                return dead
    finally:
        ctrl_line[SLEEPING] = 0
