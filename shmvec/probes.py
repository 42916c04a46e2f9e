"""Test-only probe points on the round: where a test pauses, kills or interrupts a process at a
chosen step of a round, and where the jitter mode (``SHMVEC_JITTER``) sleeps or yields at random.

A probe is a callable given the name of the point it is at (one of :data:`POINTS`). It may
sleep, send its process a signal (a real SIGINT in the calling process, SIGKILL in a worker) or
raise. None is installed in production: each point then costs one test of a local name. Forked
workers inherit the probe installed in the calling process (:func:`install`); every process,
spawned ones included, reads ``SHMVEC_JITTER`` when it first imports this module.

``SHMVEC_JITTER=<seed>[,<max_us>[,<rate>]]``: at each point, with probability ``rate`` (default
0.3), sleep up to ``max_us`` microseconds (default 300), and yield the core as often again, so
that the processes' steps interleave in orders a quiet machine never shows
(``tests/test_round_jitter.py``, ``make stress``).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

__all__ = ["POINTS", "Jitter", "install", "probe"]

# Every point, by side; docs/architecture.md ("Memory ordering") places each beside the word it
# publishes or reads.
POINTS = frozenset(
    {
        # the calling process
        "main:post",  # a round's command words written, before its [GO] barrier
        "main:posted",  # GO stored (the broadcast's, or a block's), before the next store or wake-up
        "main:sent",  # a payload sent on a worker's pipe
        "main:waited",  # a wait looked at the words once and found the round not done
        "main:seen",  # a wait ended, before the [DONE] barrier and the results
        # a worker
        "worker:go",  # a new GO seen, before the [GO] barrier
        "worker:ran",  # the command run, its STATUS and reply written, before the [DONE] barrier
        "worker:done",  # DONE stored, before the count (a broadcast round) or the [SLEEP] barrier
        "worker:counted",  # counted on main's line, before reading main's SLEEPING
        # both sides
        "sleep:announced",  # SLEEPING stored and fenced, before the word waited on is read
        "sleep:woken",  # back from select, before SLEEPING is cleared
        "ring",  # before a wake byte is written
    }
)

probe: Callable[[str], None] | None = None


def install(fn: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """Make ``fn`` this process's probe (``None``: none); return the one it replaces."""
    global probe
    previous, probe = probe, fn
    return previous


class Jitter:
    """A probe that sleeps up to ``max_us`` microseconds, or yields, at a random share
    ``rate`` of the points each (seeded: ``seed`` and the process id).
    """

    def __init__(self, seed: int, max_us: float = 300.0, rate: float = 0.3) -> None:
        self.seed, self.max_s, self.rate = seed, max_us * 1e-6, rate
        self._rng = random.Random(seed)
        self._pid = os.getpid()

    def __call__(self, point: str) -> None:
        if os.getpid() != self._pid:  # a forked child: its own sequence, not a copy of the parent's
            self._pid = os.getpid()
            self._rng = random.Random(self.seed * 1_000_003 + self._pid)
        r = self._rng.random()
        if r < self.rate:
            time.sleep(self._rng.random() * self.max_s)
        elif r < 2 * self.rate:
            os.sched_yield()


def _from_environment() -> None:
    spec = os.environ.get("SHMVEC_JITTER", "")
    if not spec:
        return
    try:
        fields = [float(f) for f in spec.split(",")]
        seed, max_us, rate = int(fields[0]), *(fields[1:] + [300.0, 0.3][len(fields) - 1 :])
    except (ValueError, TypeError) as exc:
        raise ValueError(f"SHMVEC_JITTER must be '<seed>[,<max_us>[,<rate>]]', got {spec!r}") from exc
    install(Jitter(seed, max_us, rate))


_from_environment()
