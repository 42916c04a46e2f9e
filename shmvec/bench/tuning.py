"""``shmvec tune``: measure a small grid of shmvec configurations for one env on this machine.

The grid: ``num_workers`` (1, powers of two up to the usable cores, the cores, twice the cores)
x ``step_in_main`` (True/False) x ``spin_us`` (automatic/0). Without a fixed ``num_envs`` it
first sweeps ``envs_per_worker`` at the default options, then tries the options on the best.
About a minute in all: short windows, few repeats.

Isolation first: the configuration it recommends keeps every env in a worker process (an env
that crashes or hangs cannot take the caller down). Where ``step_in_main=True`` (the opt-in
speed mode) is faster, the summary says by how much and what it gives up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import gymnasium as gym

from shmvec.bench.engines import Driver, Engine, RunSpec, VectorEnvDriver, get_engines
from shmvec.bench.machine import machine_info, parallel_scaling
from shmvec.bench.measure import RunResult, Timing, measure
from shmvec.bench.progress import Progress
from shmvec.bench.report import format_rate, format_ratio, markdown_table
from shmvec.bench.workloads import GymMake, Workload
from shmvec.checks import positive_int, usable_cores

__all__ = ["Candidate", "TuneResult", "tune", "worker_choices"]

ENVS_PER_WORKER = (4, 16, 64)


@dataclass(frozen=True)
class Candidate:
    """One shmvec configuration; ``spin_us=None`` is shmvec's automatic choice.

    ``num_workers`` counts the blocks stepped in parallel, the calling process's included with
    ``step_in_main`` (:meth:`kwargs` gives the ShmVecEnv options that build it).
    """

    num_envs: int
    num_workers: int
    step_in_main: bool = False
    spin_us: float | None = None

    @property
    def envs_per_worker(self) -> float:
        return self.num_envs / self.num_workers

    def kwargs(self) -> dict[str, Any]:
        """The ``ShmVecEnv`` keyword arguments that build exactly this configuration: its
        ``num_workers`` blocks in parallel are worker processes, less the calling process's own
        block with ``step_in_main``."""
        kw: dict[str, Any] = {"num_workers": self.num_workers - self.step_in_main, "step_in_main": self.step_in_main}
        if self.spin_us is not None:
            kw["spin_us"] = self.spin_us
        return kw

    def engine(self) -> Engine:
        kwargs = self.kwargs()

        def build(spec: RunSpec) -> Driver:
            from shmvec.vector_env import ShmVecEnv

            return VectorEnvDriver(ShmVecEnv(spec.env_fns(), **kwargs), self.num_workers)

        return Engine("shmvec", "shmvec", str(kwargs), build, lambda spec: kwargs["num_workers"])


def worker_choices(cores: int, num_envs: int | None = None) -> list[int]:
    """1, the powers of two below ``cores``, ``cores`` and ``2 * cores`` (at most ``num_envs``)."""
    choices = {1, cores, 2 * cores}
    p = 2
    while p < cores:
        choices.add(p)
        p *= 2
    return sorted(c for c in choices if num_envs is None or c <= num_envs)


@dataclass
class TuneResult:
    """What :func:`tune` measured; ``best`` is the fastest configuration with every env in a
    worker, ``best_in_main`` the fastest with ``step_in_main=True``."""

    env_name: str
    env_ref: str  # how the ready-to-paste code names the env
    from_id: bool
    rows: list[tuple[Candidate, RunResult]]
    serial: dict[int, RunResult] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    scaling: float | None = None  # parallel capacity measured first (see machine.parallel_scaling)

    @property
    def best(self) -> Candidate | None:
        """The fastest configuration that keeps every env in a worker process (``None``: none ran)."""
        return self._fastest(in_main=False)

    @property
    def best_in_main(self) -> Candidate | None:
        """The fastest configuration in which the calling process steps a block itself."""
        return self._fastest(in_main=True)

    def _fastest(self, in_main: bool) -> Candidate | None:
        ok = [(r.steps_per_s, c) for c, r in self.rows if r.ok and r.steps_per_s and c.step_in_main == in_main]
        return max(ok, key=lambda t: t[0])[1] if ok else None

    def rate(self, cand: Candidate) -> float | None:
        for c, r in self.rows:
            if c == cand and r.ok:
                return r.steps_per_s
        return None

    def table(self) -> str:
        """A markdown table of every configuration, fastest first."""

        def key(row: tuple[Candidate, RunResult]) -> float:
            return -(row[1].steps_per_s or 0.0)

        rows = []
        for c, r in sorted(self.rows, key=key):
            ref = self.serial.get(c.num_envs)
            base = ref.steps_per_s if ref is not None and ref.ok else None
            ratio = r.steps_per_s / base if r.ok and r.steps_per_s is not None and base else None
            rows.append(
                [
                    str(c.num_envs),
                    str(c.num_workers),
                    f"{c.envs_per_worker:g}",
                    str(c.step_in_main),
                    "auto" if c.spin_us is None else f"{c.spin_us:g}",
                    format_rate(r.steps_per_s) if r.ok else f"{r.status}: {r.reason}",
                    format_ratio(ratio),
                ]
            )
        for n, ref in sorted(self.serial.items()):
            rows.append(
                [
                    str(n),
                    "-",
                    "-",
                    "-",
                    "-",
                    format_rate(ref.steps_per_s) if ref.ok else ref.reason,
                    "1.00x (serial loop)",
                ]
            )
        header = ["num_envs", "num_workers", "envs/worker", "step_in_main", "spin_us", "steps/s", "x serial"]
        return markdown_table(header, "rrrllrr", rows)

    def code(self) -> str:
        """The recommended configuration (:attr:`best`) as code to paste."""
        best = self.best
        if best is None:
            return "# no configuration ran successfully"
        args = ", ".join(f"{k}={v!r}" for k, v in best.kwargs().items())
        if self.from_id:
            if self.env_kwargs:
                args += f", env_kwargs={self.env_kwargs!r}"
            return f'import shmvec\n\nenvs = shmvec.make("{self.env_ref}", num_envs={best.num_envs}, {args})'
        return f"import shmvec\n\nenvs = shmvec.ShmVecEnv([{self.env_ref}] * {best.num_envs}, {args})"

    def summary(self) -> str:
        """Table, fastest configuration and how the default compares, as printed by ``shmvec tune``."""
        best = self.best
        cores = self.machine.get("usable_cores") or usable_cores()
        lines = [f"shmvec tune {self.env_name} on {cores} usable cores ({self.machine.get('cpu')})"]
        if self.scaling is not None and cores >= 2:
            lines.append(
                f"Parallel capacity: CPU-bound work in {cores} processes ran {format_ratio(self.scaling)} "
                f"as fast as in one (ideal {cores}x)."
            )
            if self.scaling < 0.8 * cores:
                lines[-1] = (
                    "Warning: " + lines[-1] + " The machine is busy or its vCPUs share cores: "
                    "rerun when it is idle before trusting the choice below."
                )
        lines += ["", self.table(), ""]
        if best is None:
            lines.append("No configuration ran successfully: see the table.")
            return "\n".join(lines)
        best_rate = self.rate(best) or 0.0
        lines.append(
            f"Fastest with every env in a worker: {format_rate(best_rate)} steps/s with num_envs={best.num_envs}, "
            + ", ".join(f"{k}={v}" for k, v in best.kwargs().items())
        )
        in_main = self.best_in_main
        main_rate = self.rate(in_main) if in_main is not None else None
        if in_main is not None and main_rate is not None and main_rate > best_rate:
            lines.append(
                f"With your process stepping a block itself: {format_rate(main_rate)} steps/s "
                f"({100 * (main_rate / best_rate - 1):.0f}% more) with num_envs={in_main.num_envs}, "
                + ", ".join(f"{k}={v}" for k, v in in_main.kwargs().items())
                + ". An env of that block that crashes or hangs takes your process with it: opt in only "
                "for envs you trust."
            )
        default = Candidate(best.num_envs, min(usable_cores(), best.num_envs))
        d = self.rate(default)
        if d is not None and default != best:
            lines.append(
                f"The defaults (num_workers={default.num_workers}, step_in_main=False, spin_us auto) reach "
                f"{100 * d / best_rate:.0f}% of that; differences of a few % are within noise."
            )
        ref = self.serial.get(best.num_envs)
        if ref is not None and ref.ok and ref.steps_per_s and ref.steps_per_s > best_rate:
            lines.append(
                f"Note: the plain serial loop is faster here ({format_rate(ref.steps_per_s)} steps/s): "
                "this env is too cheap for parallel stepping to pay at this size; try more envs."
            )
        lines += ["", "```python", self.code(), "```"]
        return "\n".join(lines)


def _grid(num_envs: int | None, workers: list[int]) -> list[Candidate]:
    out = []
    sizes = [num_envs] if num_envs else None
    for w in workers:
        for n in sizes or [w * epw for epw in ENVS_PER_WORKER]:
            for step_in_main in (True, False):
                for spin in (None, 0):
                    if step_in_main and w == 1 and spin is not None:
                        continue  # no worker process: nothing waits, spin_us changes nothing
                    if num_envs is None and (step_in_main or spin is not None):
                        continue  # options are tried later, on the best size only
                    out.append(Candidate(n, w, step_in_main, spin))
    return out


def _options(best: Candidate) -> list[Candidate]:
    """The other options at ``best``'s size and blocks, once the sweep over sizes (every env in a
    worker, automatic spin) has picked it."""
    return [
        Candidate(best.num_envs, best.num_workers, step_in_main, spin)
        for step_in_main in (True, False)
        for spin in (None, 0)
        if (step_in_main, spin) != (False, None)
        and not (step_in_main and best.num_workers == 1 and spin is not None)  # no worker: spin_us idle
    ]


def tune(
    env: str | Callable[[], gym.Env],
    num_envs: int | None = None,
    *,
    env_kwargs: dict[str, Any] | None = None,
    workers: list[int] | None = None,
    seconds: float = 0.5,
    repeats: int = 2,
    warmup: float = 0.1,
    progress: bool = True,
    stream: TextIO | None = None,
    probe: bool = True,
) -> TuneResult:
    """Find the fastest shmvec configuration for ``env`` on this machine: with every env in a
    worker (recommended), and with the calling process stepping a block (``step_in_main``).

    Parameters
    ----------
    env : str or callable
        A Gymnasium env id (``"CartPole-v1"``, ``"shmvec/AtariLike-v0"``) or a picklable
        factory returning an env.
    num_envs : int, optional
        The number of envs you will run; ``None`` also searches ``envs_per_worker``.
    env_kwargs : dict, optional
        Keyword arguments for ``gymnasium.make`` (with an id).
    workers : list of int, optional
        ``num_workers`` values to try; default :func:`worker_choices`.
    seconds, repeats, warmup : float, int, float
        Timing of each measurement (median of ``repeats`` windows of ``seconds``).
    progress : bool
        Show a progress bar on ``stream`` (stderr).
    probe : bool
        First measure how CPU-bound work scales over the usable cores (half a second), so a
        busy machine is reported instead of silently skewing the choice.

    Returns
    -------
    TuneResult
        ``.best`` is the fastest :class:`Candidate` with every env in a worker (what it
        recommends), ``.best_in_main`` the fastest with ``step_in_main``, ``.summary()`` the
        printed report, ``.code()`` the recommended configuration as code.

    Examples
    --------
    >>> from shmvec.bench import tune
    >>> result = tune("CartPole-v1", num_envs=64)      # doctest: +SKIP
    >>> print(result.code())                           # doctest: +SKIP
    """
    if num_envs is not None:
        positive_int(num_envs, "num_envs")
    env_kwargs = dict(env_kwargs or {})
    if isinstance(env, str):
        make_env: Callable[[], gym.Env] = GymMake(env, **env_kwargs)
        name = env
        # In the pasted code a spawn/forkserver worker has not imported shmvec.envs: the
        # "module:id" form makes gymnasium import it first.
        ref = f"shmvec.envs:{env}" if env.startswith("shmvec/") else env
        from_id = True
    else:
        make_env, from_id = env, False
        name = ref = getattr(env, "__name__", "make_env")
    workload = Workload(name, name, "", make_env)
    sample_env = make_env()  # not `probe`: that argument says whether to probe the cores below
    try:
        action_space = sample_env.action_space
    finally:
        sample_env.close()

    cores = usable_cores()
    workers = sorted(set(workers)) if workers else worker_choices(cores, num_envs)
    timing = Timing(seconds=seconds, repeats=repeats, warmup=warmup)
    serial = get_engines(["serial"])[0]
    result = TuneResult(name, ref, from_id, rows=[], machine=machine_info(), env_kwargs=env_kwargs)

    def run(cands: list[Candidate], sizes: list[int], bar: Progress) -> None:
        for n in sizes:
            if n not in result.serial:
                bar.show(f"serial loop, {n} envs")
                result.serial[n] = measure(serial, RunSpec(workload, n, 1), timing, action_space, timeout=120)
                bar.advance()
        for c in cands:
            bar.show(f"num_envs={c.num_envs} " + ", ".join(f"{k}={v}" for k, v in c.kwargs().items()))
            result.rows.append(
                (
                    c,
                    measure(
                        c.engine(), RunSpec(workload, c.num_envs, c.num_workers), timing, action_space, timeout=120
                    ),
                )
            )
            bar.advance()

    first = _grid(num_envs, workers)
    sizes = sorted({c.num_envs for c in first})
    second_count = 3 if num_envs is None else 0  # at most: _options of the best size
    per = timing.estimate() + 0.3
    bar = Progress([per] * (len(first) + len(sizes) + second_count), stream=stream, enabled=progress)
    if probe:
        bar.show("probing how CPU-bound work scales over processes")
        result.scaling = parallel_scaling(cores)["speedup"]
    run(first, sizes, bar)
    if num_envs is None and result.best is not None:
        run(_options(result.best), [], bar)
    bar.finish()
    return result
