"""Plan and run a sweep: every (workload, num_envs, engine), with caps and skips.

At each (workload, num_envs) the engines that start no more processes than there are workers
(shmvec's modes, the serial references, in-process peers) are measured together, window by
window in turn, so that the ratios between them are taken round by round; the
process-per-env peers follow, one at a time.
"""

from __future__ import annotations

import datetime as dt
import gc
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from itertools import groupby
from typing import Any, TextIO

from shmvec.bench.engines import Engine, RunSpec, get_engines
from shmvec.bench.machine import machine_info, parallel_scaling
from shmvec.bench.measure import RunResult, Timing, measure_group
from shmvec.bench.memory import available_mb
from shmvec.bench.progress import Progress
from shmvec.bench.workloads import Workload, get_workloads
from shmvec.checks import usable_cores

__all__ = ["PlannedRun", "SweepConfig", "SweepResult", "plan_sweep", "run_sweep"]

# Rough resident memory a one-process-per-env worker adds (a forked interpreter with numpy
# and gymnasium, counted proportionally); used only to skip sizes this machine cannot hold.
MB_PER_PROCESS = 25.0
# Set-up and tear-down time of a run, for the time estimate only.
SETUP_S, SETUP_S_PER_PROCESS = 0.3, 0.02
# Pause before measuring after an engine that started more processes than there are workers:
# their exit (and the kernel reclaiming their memory) goes on for a while after close, and
# slows a 2-process engine measured right after them.
SETTLE_S = 1.0


# The engines of the default report: the serial reference and the ceiling, shmvec's defaults, and
# the vector envs users move from (Gymnasium's, SB3's, EnvPool, SuperSuit for multi-agent envs).
STANDARD_ENGINES = ("serial", "split-serial", "shmvec", "gym-sync", "gym-async-shm", "sb3", "envpool", "supersuit-mp")


@dataclass(frozen=True)
class SweepConfig:
    """What a sweep measures and for how long.

    Parameters
    ----------
    workloads, engines : list of str, optional
        Keys from :data:`~shmvec.bench.workloads.WORKLOADS` / :data:`~shmvec.bench.engines.ENGINES`;
        ``None`` means all.
    num_envs : list of int
        Sizes to sweep.
    timing : Timing
        Warm-up, window length and repeats of each measurement.
    num_workers : int, optional
        shmvec's ``num_workers`` (and EnvPool's threads); default: the usable cores.
    max_procs : int
        Engines that would start more processes than this at a size are skipped there.
    seed : int
        Seed of ``reset`` and of the pre-generated actions.
    run_timeout : float, optional
        Seconds after which a run counts as hung and fails; default: generous, from the timing.
    probe_scaling : bool
        Measure, before each workload and at the end, how much faster CPU-bound work runs in
        ``num_workers`` processes than in one (:func:`~shmvec.bench.machine.parallel_scaling`):
        the ceiling of any engine's speedup here, reported with the results.
    sizes_as_given : bool
        Measure every workload at ``num_envs``, the real envs too (by default those run at their
        own fixed sizes): for studies of one size, such as ``benchmarks/scaling.py``.
    """

    workloads: list[str] | None = None
    num_envs: list[int] = field(default_factory=lambda: [8, 32, 128, 256])
    engines: list[str] | None = None
    timing: Timing = field(default_factory=Timing)
    num_workers: int | None = None
    max_procs: int = 128
    seed: int = 0
    run_timeout: float | None = None
    quick: bool = False
    probe_scaling: bool = True
    sizes_as_given: bool = False

    @classmethod
    def full(cls, **overrides: Any) -> SweepConfig:
        """Every engine at every size (``shmvec bench --full``, ``make bench-full``; what the docs
        quote): about 25 minutes on 2 cores. Five rounds per cell, so that every ratio is a median
        of five per-round ratios."""
        return replace(cls(timing=Timing(seconds=0.8, repeats=5, warmup=0.2)), **overrides)

    @classmethod
    def standard(cls, **overrides: Any) -> SweepConfig:
        """The default ``shmvec bench`` (``make bench``): the full sweep's timing and workloads up
        to 128 envs, with shmvec's defaults against what users run today and the ceiling
        (:data:`STANDARD_ENGINES`), so that with its training section ``make bench`` ends within
        15 minutes on 2 cores, installation included."""
        return replace(cls.full(engines=list(STANDARD_ENGINES), num_envs=[8, 32, 128]), **overrides)

    @classmethod
    def quick_preset(cls, **overrides: Any) -> SweepConfig:
        """``--quick``: a small sweep for smoke tests (short windows: no figures to quote)."""
        base = cls(num_envs=[8, 32], timing=Timing(seconds=0.15, repeats=2, warmup=0.1), max_procs=32, quick=True)
        return replace(base, **overrides)

    def workers(self) -> int:
        return self.num_workers or usable_cores()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["num_workers"] = self.workers()
        return d


@dataclass(frozen=True)
class PlannedRun:
    """One cell of the sweep; ``skip`` says why it will not run (``None``: it will)."""

    workload: Workload
    num_envs: int
    engine: Engine
    skip: str | None
    estimate_s: float

    @property
    def label(self) -> str:
        return f"{self.workload.key} N={self.num_envs} {self.engine.label}"

    def interleaved(self, workers: int) -> bool:
        """Whether this run is measured round-robin with the others of its cell: engines that start
        at most ``workers`` processes, so that several can stay built at once."""
        spec = RunSpec(self.workload, self.num_envs, workers, 0)
        return self.engine.processes(spec) <= workers


def plan_sweep(config: SweepConfig) -> list[PlannedRun]:
    """Every cell of the sweep in run order, with the skips decided up front."""
    workloads = get_workloads(config.workloads)
    if config.quick and config.workloads is None:
        workloads = [w for w in workloads if not w.sizes]  # the real envs: only when named
    engines = get_engines(config.engines)
    missing = {e.key: e.unavailable() for e in engines}
    free_mb = available_mb()
    plan = []
    for workload in workloads:
        sizes = config.num_envs if config.sizes_as_given else workload.sizes or config.num_envs
        for n in sorted(set(sizes)):
            spec = RunSpec(workload, n, config.workers(), config.seed)
            for engine in engines:
                procs = engine.processes(spec)
                skip = workload.unavailable() or missing[engine.key] or engine.unsupported(workload)
                if skip is None and procs > config.max_procs:
                    skip = f"capped: would start {procs} processes (max_procs={config.max_procs})"
                need_mb = procs * MB_PER_PROCESS
                if skip is None and free_mb is not None and need_mb > 0.8 * free_mb:
                    skip = f"capped: {procs} processes need ~{need_mb:.0f} MB, {free_mb:.0f} MB available"
                estimate = 0.0 if skip else config.timing.estimate() + SETUP_S + SETUP_S_PER_PROCESS * procs
                plan.append(PlannedRun(workload, n, engine, skip, estimate))
    return plan


@dataclass
class SweepResult:
    """Everything a report needs: the machine, the configuration and every run's result."""

    machine: dict[str, Any]
    config: dict[str, Any]
    results: list[RunResult]
    started: str
    elapsed_s: float
    workload_labels: dict[str, str] = field(default_factory=dict)
    engine_labels: dict[str, str] = field(default_factory=dict)

    def get(self, workload: str, num_envs: int, engine: str) -> RunResult | None:
        for r in self.results:
            if r.workload == workload and r.num_envs == num_envs and r.engine == engine:
                return r
        return None

    def rate(self, workload: str, num_envs: int, engine: str) -> float | None:
        """Median steps/s of a successful run, else ``None``."""
        r = self.get(workload, num_envs, engine)
        return r.steps_per_s if r is not None and r.ok else None

    def ratio(self, workload: str, num_envs: int, engine: str, peer: str) -> float | None:
        """``engine``'s steps/s over ``peer``'s, or ``None`` unless both ran.

        For runs measured round-robin, the median of the per-round ratios (each from two windows
        that ran moments apart); otherwise the ratio of the medians.
        """
        rounds = self.round_ratios(workload, num_envs, engine, peer)
        if rounds:
            return statistics.median(rounds)
        a, b = self.get(workload, num_envs, engine), self.get(workload, num_envs, peer)
        if a is None or b is None or not a.ok or not b.ok or a.steps_per_s is None or not b.steps_per_s:
            return None
        return a.steps_per_s / b.steps_per_s

    def round_ratios(self, workload: str, num_envs: int, engine: str, peer: str) -> list[float]:
        """The per-round ratios of two runs measured round-robin (empty for unpaired runs)."""
        a, b = self.get(workload, num_envs, engine), self.get(workload, num_envs, peer)
        if a is None or b is None or not a.ok or not b.ok or not a.paired_with(b) or not all(y > 0 for y in b.repeats):
            return []
        return [x / y for x, y in zip(a.repeats, b.repeats)]

    def workloads(self) -> list[str]:
        return list(dict.fromkeys(r.workload for r in self.results))

    def engines(self) -> list[str]:
        return list(dict.fromkeys(r.engine for r in self.results))

    def sizes(self, workload: str | None = None) -> list[int]:
        return sorted({r.num_envs for r in self.results if workload is None or r.workload == workload})

    def workload_label(self, key: str) -> str:
        return self.workload_labels.get(key, key)

    def engine_label(self, key: str) -> str:
        return self.engine_labels.get(key, key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "started": self.started,
            "elapsed_s": round(self.elapsed_s, 2),
            "machine": self.machine,
            "config": self.config,
            "workload_labels": self.workload_labels,
            "engine_labels": self.engine_labels,
            "results": [r.to_dict() for r in self.results],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepResult:
        return cls(
            machine=d.get("machine", {}),
            config=d.get("config", {}),
            results=[RunResult.from_dict(r) for r in d.get("results", [])],
            started=d.get("started", ""),
            elapsed_s=d.get("elapsed_s", 0.0),
            workload_labels=d.get("workload_labels", {}),
            engine_labels=d.get("engine_labels", {}),
        )


def _action_space(workload: Workload) -> Any:
    env = workload.make_env()
    try:
        return env.action_space
    finally:
        env.close()


def run_sweep(
    config: SweepConfig, *, progress: bool = True, stream: TextIO | None = None, plan: list[PlannedRun] | None = None
) -> SweepResult:
    """Measure every cell of ``config`` and return the results, in plan order.

    Nothing steps concurrently. At each (workload, num_envs) the engines that start at most
    ``num_workers`` processes are built together and take their windows in turn
    (:func:`~shmvec.bench.measure.measure_group`); each process-per-env peer is then built,
    measured and closed alone, after a pause that lets the previous one's processes go.
    """
    plan = plan_sweep(config) if plan is None else plan
    started = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    t0 = time.perf_counter()
    runs = [p for p in plan if p.skip is None]
    bar = Progress([p.estimate_s for p in runs], stream=stream, enabled=progress)
    samples: list[float] = []

    def probe() -> None:
        # Sampled several times: a neighbour's burst during one probe should not decide it.
        if config.probe_scaling:
            bar.show("probing how CPU-bound work scales over processes")
            samples.append(parallel_scaling(config.workers())["speedup"])

    spaces: dict[str, Any] = {}
    probed: set[str] = set()
    results: dict[int, RunResult] = {}
    settle = False  # the last run started more processes than there are workers
    workers = config.workers()
    # Everything alive now (numpy, gymnasium, torch once SB3 was checked) is frozen out of the
    # collector: the gc.collect() after each run then takes microseconds instead of ~0.1 s.
    gc.collect()
    gc.freeze()
    try:
        indexed = list(enumerate(plan))
        for (workload, n), members in groupby(indexed, key=lambda ip: (ip[1].workload, ip[1].num_envs)):
            cell = list(members)
            for i, p in cell:
                if p.skip is not None:
                    results[i] = RunResult(p.workload.key, p.num_envs, p.engine.key, "skipped", p.skip)
            todo = [(i, p) for i, p in cell if p.skip is None]
            if not todo:
                continue
            if workload.key not in probed:
                probed.add(workload.key)
                probe()
            try:
                if workload.key not in spaces:
                    spaces[workload.key] = _action_space(workload)
            except Exception as exc:
                for i, p in todo:
                    results[i] = RunResult(
                        p.workload.key,
                        p.num_envs,
                        p.engine.key,
                        "failed",
                        f"the workload's env cannot be built: {type(exc).__name__}: {exc}",
                    )
                    bar.advance()
                continue
            spec = RunSpec(workload, n, workers, config.seed)
            together = [(i, p) for i, p in todo if p.interleaved(workers)]
            alone = [[(i, p)] for i, p in todo if not p.interleaved(workers)]
            for batch in ([together] if together else []) + alone:
                if settle:
                    time.sleep(SETTLE_S)
                names = ", ".join(p.engine.label for _, p in batch)
                bar.show(f"{workload.key} N={n} {names}")
                timeout = config.run_timeout or 60.0 + 10.0 * max(p.estimate_s for _, p in batch)
                group = batch[0][0] if len(batch) > 1 else None
                measured = measure_group(
                    [p.engine for _, p in batch],
                    spec,
                    config.timing,
                    spaces[workload.key],
                    timeout=timeout,
                    group=group,
                )
                for (i, _), r in zip(batch, measured):
                    results[i] = r
                    bar.advance()
                settle = batch is not together
    finally:
        gc.unfreeze()
    probe()
    bar.finish()
    engines = get_engines(config.engines)
    machine = machine_info()
    if samples:
        machine["parallel_scaling"] = {"processes": config.workers(), "samples": samples}
    return SweepResult(
        machine=machine,
        config=config.to_dict(),
        results=[results[i] for i in sorted(results)],
        started=started,
        elapsed_s=time.perf_counter() - t0,
        workload_labels={w.key: w.label for w in get_workloads(config.workloads)},
        engine_labels={e.key: e.label for e in engines},
    )
