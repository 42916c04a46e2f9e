"""Time engines on one (workload, num_envs): build, reset, warm up, step for fixed wall-time windows.

Engines measured together take their windows in turn (round-robin), so that a change in the
machine's speed during the cell (a busy neighbour on a shared host) hits each of them alike:
window ``r`` of every engine ran in round ``r``, and ratios between them can be taken round by
round (:meth:`RunResult.paired_with`).
"""

from __future__ import annotations

import contextlib
import gc
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shmvec.bench.engines import Driver, Engine, RunSpec, make_actions
from shmvec.bench.memory import tree_memory

__all__ = ["RunResult", "Timing", "measure", "measure_group", "step_for"]


@dataclass(frozen=True)
class Timing:
    """How long to measure: ``repeats`` windows of ``seconds`` each after ``warmup`` seconds."""

    seconds: float = 1.0
    repeats: int = 3
    warmup: float = 0.2

    def estimate(self) -> float:
        return self.warmup + self.seconds * self.repeats


@dataclass
class RunResult:
    """The outcome of one (workload, num_envs, engine).

    ``status`` is ``"ok"``, ``"skipped"`` (with ``reason``) or ``"failed"`` (with ``reason``:
    the exception). ``steps_per_s`` counts env steps (``num_envs`` per vector step; agent steps
    for a multi-agent workload): the median over ``repeats``, each ``rows * vector steps /
    elapsed`` of one window.
    """

    workload: str
    num_envs: int
    engine: str
    status: str
    reason: str = ""
    steps_per_s: float | None = None
    repeats: list[float] = field(default_factory=list)
    vector_steps: int = 0
    workers: int | None = None
    processes: int | None = None
    setup_s: float | None = None
    rss_mb: float | None = None
    pss_mb: float | None = None
    base_rss_mb: float | None = None  # the same, measured just before the engine was built
    base_pss_mb: float | None = None
    # Runs measured round-robin share a group number; their ``repeats`` line up round by round.
    group: int | None = None

    def paired_with(self, other: RunResult) -> bool:
        """Whether window ``r`` of this run and of ``other`` ran in the same round."""
        return self.group is not None and self.group == other.group and len(self.repeats) == len(other.repeats) > 0

    def added_mb(self, kind: str = "pss") -> float | None:
        """Memory the engine added: the tree's total after its warm-up less the total before it was built.

        Independent of what the benchmark process itself has loaded (an optional peer's import
        of torch, say), which the absolute totals include.
        """
        end, base = getattr(self, f"{kind}_mb"), getattr(self, f"base_{kind}_mb")
        return None if end is None or base is None else end - base

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


def step_for(driver: Driver, actions: list[Any], seconds: float, min_steps: int = 2) -> tuple[int, float]:
    """Step until ``seconds`` have passed (and at least ``min_steps``); returns ``(vector steps, elapsed)``.

    The clock is read once per step: ~0.1 us against the microseconds a vector step costs.
    """
    step = driver.step
    k = len(actions)
    per_call = getattr(driver, "steps_per_call", 1)
    steps = calls = 0
    start = time.perf_counter()
    end = start + seconds
    now = start
    while now < end or steps < min_steps:
        step(actions[calls % k])
        calls += 1
        steps += per_call
        now = time.perf_counter()
    return steps, now - start


class RunTimeout(Exception):
    """A run took far longer than planned (a hung engine)."""


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`RunTimeout` in the main thread after ``seconds`` (a no-op elsewhere)."""
    usable = (
        seconds is not None and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return
    assert seconds is not None  # usable says so

    def on_alarm(signum: int, frame: Any) -> None:
        raise RunTimeout(f"gave up after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def measure(
    engine: Engine, spec: RunSpec, timing: Timing, single_action_space: Any, timeout: float | None = None
) -> RunResult:
    """Build ``engine`` for ``spec``, time it, record memory, and always close it.

    Any exception (construction, reset, step, a hang past ``timeout`` seconds) gives a
    ``"failed"`` result carrying its message instead of ending the sweep; ``KeyboardInterrupt``
    still closes the engine and propagates.
    """
    return measure_group([engine], spec, timing, single_action_space, timeout)[0]


def measure_group(
    engines: list[Engine],
    spec: RunSpec,
    timing: Timing,
    single_action_space: Any,
    timeout: float | None = None,
    group: int | None = None,
) -> list[RunResult]:
    """Build every engine for ``spec``, then time them in turn: ``timing.repeats`` rounds of one
    window each (the order rotating every round, so none is always first).

    Each engine's memory is read after its warm-up (at least one ``step`` call, so buffers a
    first call allocates count), less the tree's memory just before it was built: the engines
    built before it are in both figures. A failure (or a hang past ``timeout`` seconds in one
    build or one window) fails that engine alone: it is closed and the others go on. Every
    engine is closed at the end; ``KeyboardInterrupt`` closes them all and propagates.
    """
    results = [RunResult(spec.workload.key, spec.num_envs, e.key, status="failed", group=group) for e in engines]
    drivers: list[Driver | None] = [None] * len(engines)

    def fail(i: int, exc: BaseException) -> None:
        results[i].status, results[i].reason = "failed", _one_line(exc)
        _close(drivers[i], results[i], timeout)
        drivers[i] = None

    def window(i: int, seconds: float, min_steps: int) -> tuple[int, float] | None:
        """Step engine ``i`` for ``seconds``; on a failure or hang, fail it and return ``None``."""
        try:
            driver = drivers[i]
            assert driver is not None  # called for the engines still alive only
            with deadline(timeout):
                return step_for(driver, actions, seconds, min_steps=min_steps)
        except Exception as exc:
            fail(i, exc)
            return None

    try:
        actions = make_actions(single_action_space, spec.num_envs, spec.seed)
    except Exception as exc:
        for result in results:
            result.reason = f"no actions to step with: {_one_line(exc)}"
        return results
    try:
        for i, engine in enumerate(engines):
            result = results[i]
            try:
                with deadline(timeout):
                    base = tree_memory()
                    result.base_rss_mb, result.base_pss_mb = base.rss_mb, base.pss_mb
                    t0 = time.perf_counter()
                    built = drivers[i] = engine.build(spec)
                    built.reset(spec.seed)
                    result.setup_s = time.perf_counter() - t0
                    result.workers = built.workers
                    result.processes = engine.processes(spec)
                    step_for(built, actions, timing.warmup, min_steps=1)
                    mem = tree_memory()
                    result.rss_mb, result.pss_mb = mem.rss_mb, mem.pss_mb
            except Exception as exc:
                fail(i, exc)
        # A second, untimed warm-up in turn, once every engine is built: whatever the builds set
        # going (memory being mapped, processes starting) settles before round 0.
        if len(engines) > 1:
            for i in [i for i, s in enumerate(drivers) if s is not None]:
                window(i, timing.warmup, 1)
        _timed_rounds(drivers, results, timing, spec.rows, window)
        for i, driver in enumerate(drivers):
            if driver is not None:
                results[i].steps_per_s = statistics.median(results[i].repeats)
                results[i].status = "ok"
    finally:
        for i, driver in enumerate(drivers):
            _close(driver, results[i], timeout)
        drivers.clear()
        gc.collect()  # free these engines' buffers before the next ones are measured
    return results


def _timed_rounds(
    drivers: list[Driver | None],
    results: list[RunResult],
    timing: Timing,
    rows: int,
    window: Callable[[int, float, int], tuple[int, float] | None],
) -> None:
    """``timing.repeats`` rounds of one timed window per engine still alive, each engine's rate in
    its result's ``repeats``.

    The order rotates every round, so that no engine is always first. ``window`` is
    :func:`measure_group`'s: it fails an engine that fails or hangs (its driver becomes
    ``None``), so the engines alive are counted again each round.
    """
    for r in range(timing.repeats):
        live = [i for i, s in enumerate(drivers) if s is not None]
        turn = r % len(live) if live else 0
        for i in live[turn:] + live[:turn]:
            timed = window(i, timing.seconds, 2)
            if timed is not None:
                steps, elapsed = timed
                results[i].vector_steps += steps
                results[i].repeats.append(rows * steps / elapsed)


def _close(driver: Driver | None, result: RunResult, timeout: float | None) -> None:
    if driver is None:
        return
    try:
        with deadline(None if timeout is None else 30.0):
            driver.close()
    except Exception as exc:
        if result.ok:
            result.status, result.reason = "failed", f"close: {_one_line(exc)}"


def spread(rates: list[float]) -> float | None:
    """Half the range of the repeats, relative to their median (``None`` for one repeat)."""
    if len(rates) < 2:
        return None
    med = float(np.median(rates))
    return (max(rates) - min(rates)) / 2 / med if med > 0 else None
