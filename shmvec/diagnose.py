"""Where a training loop's time goes, over a window of its own steps (``ShmVecEnv.diagnose``).

A vector env owns the waits of the loop around it, so it can say what the loop spent its time
on: the caller's time inside shmvec (stepping, waiting for the workers), the time between
steps (the loop's own code: the policy, the update), the workers' time on a core and their
time runnable but waiting for one (starved), the calling process's other threads (torch's
OpenMP pool, BLAS), and the cores other processes took. The kernel counts each thread's time on
a core and its time in the run queue (``/proc/<pid>/task/<tid>/schedstat``), and each worker
counts its time running commands (the ``busy`` line of the segment, apart from waiting for a
command, which it may spend spinning on a core; one addition per command, always); a window
reads them at its edges, so measuring costs two clock reads per step.

The kernel's counters are Linux's (``/proc``, :mod:`shmvec.cpu_counters`); elsewhere the report
has the caller's times alone and says what it could not measure.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from shmvec.checks import usable_cores
from shmvec.cpu_counters import MEASURABLE, cores_busy, loaded_pools, thread_times
from shmvec.session import Session

__all__ = ["Diagnosable", "Diagnosis", "LoopWindow", "ThreadTime"]

# A verdict is only given on a clear case: the workers waited for a core longer than this share
# of their time on one, or the loop's own code took this share of the wall time.
STARVED_SHARE = 0.5
OWN_CODE_SHARE = 0.5
# Cores below this are not named as a cause.
MIN_CORES = 0.25


@dataclass(frozen=True)
class ThreadTime:
    """One thread's (or process's) seconds over a window: on a core, and runnable but waiting
    for one; for a worker, also its time running commands (``busy_s``: stepping its envs, on a
    core or waiting for one; the rest of its time on a core was spent waiting for a command).
    """

    name: str
    cpu_s: float
    starved_s: float
    busy_s: float | None = None


@dataclass
class Diagnosis:
    """What a window of the loop spent its time on (see :meth:`ShmVecEnv.diagnose`).

    Attributes
    ----------
    wall_s : float
        The window's length.
    steps : int
        Calls of ``step`` (or ``recv``, or ``rollout`` rows) in the window.
    in_shmvec_s : float
        The caller's time inside those calls: writing actions, waiting for the workers,
        handing out results.
    between_steps_s : float
        The rest: the loop's own code (the policy, the update, logging).
    workers : list of ThreadTime
        Each worker process: its time on a core, runnable but waiting for one, and running
        commands (stepping its envs).
    caller_threads : list of ThreadTime
        The calling process's threads other than the loop's, that were on a core in the window
        (torch's OpenMP pool, BLAS threads, the user's own).
    other_cores : float or None
        Cores that other processes on the machine kept busy, on average (``None``: unknown).
    cores : int
        The cores this process may run on.
    pools : list of str
        The thread pools loaded in the calling process.
    measured : bool
        Whether the kernel's per-thread CPU counters could be read (Linux's ``/proc``). Where
        they cannot (macOS, Windows), the times on a core and waiting for one are 0, the other
        processes unknown, and the report says so: only the caller's clock and the workers'
        command time are measured.
    """

    wall_s: float
    steps: int
    in_shmvec_s: float
    between_steps_s: float
    workers: list[ThreadTime]
    caller_threads: list[ThreadTime]
    other_cores: float | None
    cores: int
    pools: list[str] = field(default_factory=list)
    measured: bool = True

    @property
    def starved_share(self) -> float:
        """The workers' time waiting for a core, over their time on one."""
        on_core = sum(w.cpu_s for w in self.workers)
        return sum(w.starved_s for w in self.workers) / on_core if on_core else 0.0

    def causes(self) -> list[str]:
        """The clear cases the window shows, each with its numbers and the fix (empty: none)."""
        found = []
        wall = self.wall_s or 1e-9
        if self.workers and self.starved_share > STARVED_SHARE:
            numbers, seen = self.starvation(wall)
            if not seen and len(self.workers) + 1 > self.cores:
                seen = [
                    f"{len(self.workers)} workers and the calling process take turns on {self.cores} cores: "
                    f"try num_workers={max(1, self.cores - 1)}"
                ]
            found.append("; ".join([numbers, *seen]))
        if self.between_steps_s > OWN_CODE_SHARE * wall:
            found.append(
                f"the loop's own code (between steps: the policy, the update) took "
                f"{self.between_steps_s / wall:.0%} of the time: a faster vector env speeds up at most the other "
                f"{self.in_shmvec_s / wall:.0%}"
            )
        return found

    def starvation(self, wall: float) -> tuple[str, list[str]]:
        """The starved workers' numbers, and each cause seen that is not their own (the calling
        process's other threads, other processes), with its fix.
        """
        starved = sum(w.starved_s for w in self.workers)
        on_core = sum(w.cpu_s for w in self.workers)
        numbers = (
            f"the workers waited {starved:.2f} s for a core and ran {on_core:.2f} s in {wall:.2f} s "
            f"({self.starved_share:.1f} s waiting per second running)"
        )
        seen = []
        threads = sum(t.cpu_s for t in self.caller_threads) / wall
        if threads >= MIN_CORES:
            pools = f" ({'; '.join(self.pools)})" if self.pools else ""
            seen.append(
                f"the calling process's other threads{pools} kept {threads:.1f} cores busy: lower them while "
                "the envs step (ShmVecEnv(torch_threads='auto'), or torch.set_num_threads)"
            )
        if self.other_cores is not None and self.other_cores >= MIN_CORES:
            seen.append(
                f"other processes kept {self.other_cores:.1f} of the {self.cores} cores busy: "
                "fewer workers (num_workers=...) can be faster while they run"
            )
        return numbers, seen

    def __str__(self) -> str:
        wall = self.wall_s or 1e-9
        lines = [
            f"{self.steps} steps in {self.wall_s:.2f} s: inside shmvec {self.in_shmvec_s:.2f} s "
            f"({self.in_shmvec_s / wall:.0%}), between steps {self.between_steps_s:.2f} s "
            f"({self.between_steps_s / wall:.0%})"
        ]
        for k, w in enumerate(self.workers):
            busy = "" if w.busy_s is None else f"running commands {w.busy_s:.2f} s, "
            lines.append(
                f"  worker {k} ({w.name}): {busy}on a core {w.cpu_s:.2f} s, waiting for one {w.starved_s:.2f} s"
            )
        for t in self.caller_threads:
            lines.append(f"  caller thread {t.name}: on a core {t.cpu_s:.2f} s, waiting for one {t.starved_s:.2f} s")
        if self.other_cores is not None:
            lines.append(f"  other processes: {self.other_cores:.1f} of {self.cores} cores")
        if not self.measured:
            lines.append(
                "  not measured here: time on a core and waiting for one, the caller's other threads, other "
                "processes (this system has no per-thread CPU counters in /proc)"
            )
        causes = self.causes()
        lines += [f"why: {c}" for c in causes] if causes else ["why: nothing stands out"]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Counters:
    """What a window reads at each of its edges."""

    t: float
    workers: dict[int, tuple[float, float, float]]  # pid: (on a core, waiting for one, running commands)
    caller: dict[int, tuple[str, float, float]]  # the calling process's threads
    machine: float | None  # seconds the usable cores were busy

    @classmethod
    def read(cls, workers: Callable[[], list[tuple[int, float]]]) -> _Counters:
        times = {}
        for pid, commands in workers():
            tasks = thread_times(pid).values()
            times[pid] = (sum(cpu for _, cpu, _ in tasks), sum(starved for _, _, starved in tasks), commands)
        return cls(time.perf_counter(), times, thread_times(os.getpid()), cores_busy())


class LoopWindow:
    """A window of a loop, measured: the clock around each step (a step hook: :meth:`enter`,
    :meth:`leave`), the kernel's CPU counters at its edges (:meth:`start`, :meth:`stop`, and
    :meth:`pause`/:meth:`resume` to leave a stretch out: the automatic window leaves out the
    updates between rollouts).

    Parameters
    ----------
    workers : callable
        The vector env's worker processes now, each ``(pid, seconds running commands so far)``
        (``WorkerPool.worker_clocks``). A worker replaced inside the window is left out of it.
    cores : int
        The cores the calling process may run on.

    Attributes
    ----------
    diagnosis : Diagnosis or None
        What the window shows, once it stopped.
    """

    __slots__ = ("workers", "cores", "steps", "inside", "diagnosis", "_edge", "_active", "_sums", "_threads", "_ours",
                 "_machine", "_entered")  # fmt: skip

    def __init__(self, workers: Callable[[], list[tuple[int, float]]], cores: int) -> None:
        self.workers, self.cores = workers, cores
        self.steps, self.inside = 0, 0.0
        self.diagnosis: Diagnosis | None = None
        self._edge: _Counters | None = None  # where the running stretch started (None: paused)
        self._active = 0.0  # seconds of the stretches that ended
        self._sums: dict[int, list[float]] = {}  # worker pid: [on a core, waiting for one, running commands]
        self._threads: dict[int, list[Any]] = {}  # caller's tid: [name, on a core, waiting for one]
        self._ours = 0.0  # CPU seconds of the workers and the calling process
        self._machine: float | None = 0.0  # busy seconds of the usable cores
        self._entered: float | None = None  # perf_counter() as the step now running started

    # -- a step hook (shmvec.step_hooks): the clock around each step ---------------------------
    def enter(self) -> None:
        self._entered = time.perf_counter()

    def leave(self) -> None:
        entered, self._entered = self._entered, None
        if entered is not None:  # (a window added while a step ran counts from the next one)
            self.inside += time.perf_counter() - entered
            self.steps += 1

    def close(self) -> None:
        return None

    def __str__(self) -> str:
        return "(a window still open)" if self.diagnosis is None else str(self.diagnosis)

    @property
    def paused(self) -> bool:
        return self._edge is None

    def elapsed(self) -> float:
        """Seconds the window has run (paused stretches left out)."""
        edge = self._edge
        return self._active + (time.perf_counter() - edge.t if edge is not None else 0.0)

    def start(self) -> None:
        self.resume()

    def resume(self) -> None:
        if self._edge is None:
            self._edge = _Counters.read(self.workers)

    def pause(self) -> None:
        edge = self._edge
        if edge is not None:
            self._edge = None
            self._add(edge, _Counters.read(self.workers))

    def _add(self, before: _Counters, now: _Counters) -> None:
        self._active += now.t - before.t
        for pid, (cpu, starved, commands) in now.workers.items():
            if pid not in before.workers:
                continue  # started inside the stretch (a restart): not the process whose counters began it
            cpu0, starved0, commands0 = before.workers[pid]
            sums = self._sums.setdefault(pid, [0.0, 0.0, 0.0])
            sums[0] += max(0.0, cpu - cpu0)
            sums[1] += max(0.0, starved - starved0)
            sums[2] += max(0.0, commands - commands0)
            self._ours += cpu - cpu0
        for tid, (name, cpu, starved) in now.caller.items():
            _, cpu0, starved0 = before.caller.get(tid, (name, 0.0, 0.0))
            thread = self._threads.setdefault(tid, [name, 0.0, 0.0])
            thread[1] += cpu - cpu0
            thread[2] += starved - starved0
            self._ours += cpu - cpu0
        if self._machine is not None and now.machine is not None and before.machine is not None:
            self._machine += now.machine - before.machine
        else:
            self._machine = None

    def stop(self) -> Diagnosis:
        """Close the window; its :class:`Diagnosis` (also kept as :attr:`diagnosis`)."""
        self.pause()
        wall = self._active
        workers = [ThreadTime(f"pid {pid}", cpu, starved, busy) for pid, (cpu, starved, busy) in self._sums.items()]
        loop_tid = threading.get_native_id()  # the loop's thread: the others are reported
        threads = [
            ThreadTime(f"{tid} ({name})", cpu, starved)
            for tid, (name, cpu, starved) in self._threads.items()
            if tid != loop_tid and cpu > 1e-3
        ]
        other = None
        if self._machine is not None and wall > 0:
            other = min(float(self.cores), max(0.0, (self._machine - self._ours) / wall))
        self.diagnosis = Diagnosis(
            wall_s=wall,
            steps=self.steps,
            in_shmvec_s=self.inside,
            between_steps_s=max(0.0, wall - self.inside),
            workers=workers,
            caller_threads=sorted(threads, key=lambda t: -t.cpu_s),
            other_cores=other,
            cores=self.cores,
            pools=loaded_pools(),
            measured=MEASURABLE,
        )
        return self.diagnosis


def window_over(session: Session) -> LoopWindow:
    """A window over the workers of ``session``'s pool (not started)."""
    return LoopWindow(session.pool.worker_clocks, usable_cores())


class Diagnosable:
    """The ``diagnose`` part of :class:`~shmvec.ShmVecEnv`'s API (a base class of it)."""

    _session: Session

    @contextmanager
    def diagnose(self) -> Iterator[LoopWindow]:
        """Measure where your loop's time goes while the ``with`` block runs its steps.

        The window's :attr:`~shmvec.diagnose.LoopWindow.diagnosis` (printable) gives the
        time inside :meth:`step` (or :meth:`recv`, or the rounds of :meth:`rollout`) and between
        steps (your own code: the policy, the update), each worker's time running commands (its
        envs' code), on a core and runnable but waiting for one, the calling process's
        other threads (torch's OpenMP pool, BLAS), the cores other processes took, and the
        cause, with the fix, when the numbers show a clear case (``docs/benchmarks.md``, "Why
        is my loop slow?"). It costs two clock reads per step; outside a window, nothing.

        >>> import numpy as np, shmvec
        >>> envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2)
        >>> _ = envs.reset(seed=0)
        >>> with envs.diagnose() as window:
        ...     for _ in range(100):
        ...         _ = envs.step(np.zeros(4, dtype=np.int64))
        >>> window.diagnosis.steps, len(window.diagnosis.workers)
        (100, 2)
        >>> envs.close()
        """
        session = self._session
        session.guard("diagnose", needs_reset=False, sync=False)
        window = window_over(session)
        session.hooks.add(window)
        window.start()
        try:
            yield window
        finally:
            session.hooks.remove(window)
            window.stop()
