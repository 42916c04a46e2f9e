"""The shipped benchmark report: shmvec against Gymnasium's vector envs, the classic baseline and peers.

This package is what ``shmvec bench`` runs on a user's machine; the developer studies
(scaling, GPU, instruction counts, Ray, micro-benchmarks) live in the repository's
``benchmarks/`` folder and are not installed.

Command line: ``shmvec bench [--quick]`` and ``shmvec tune ENV_ID``. From Python:

>>> from shmvec.bench import SweepConfig, run_sweep, render_markdown    # doctest: +SKIP
>>> sweep = run_sweep(SweepConfig.quick_preset(workloads=["cartpole"]))  # doctest: +SKIP
>>> print(render_markdown(sweep))                                       # doctest: +SKIP
>>> from shmvec.bench import tune
>>> print(tune("CartPole-v1", num_envs=64).summary())                   # doctest: +SKIP

Modules: ``workloads`` (what is stepped), ``engines`` (who steps it), ``classic`` (the
pipe-per-env baseline), ``serial`` (the per-core reference), ``measure`` (timing one cell),
``sweep`` (planning and running all cells), ``targets``, ``report`` (markdown/JSON),
``plots``, ``output`` (results folder, docs page), ``tuning`` and ``cli``.
"""

from __future__ import annotations

from shmvec._lazy import lazy_exports

_LAZY = {
    "SweepConfig": "shmvec.bench.sweep",
    "SweepResult": "shmvec.bench.sweep",
    "run_sweep": "shmvec.bench.sweep",
    "plan_sweep": "shmvec.bench.sweep",
    "Timing": "shmvec.bench.measure",
    "RunResult": "shmvec.bench.measure",
    "render_markdown": "shmvec.bench.report",
    "load_json": "shmvec.bench.report",
    "write_json": "shmvec.bench.report",
    "write_results": "shmvec.bench.output",
    "update_docs": "shmvec.bench.output",
    "ENGINES": "shmvec.bench.engines",
    "WORKLOADS": "shmvec.bench.workloads",
    "TARGETS": "shmvec.bench.targets",
    "tune": "shmvec.bench.tuning",
    "TuneResult": "shmvec.bench.tuning",
    "ClassicSubprocVecEnv": "shmvec.bench.classic",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports("shmvec.bench", _LAZY, globals())
