"""What each start method costs a vector env: building it, and replacing a worker that died.

    .venv/bin/python benchmarks/start_methods.py --json benchmarks/results-2core/start_methods.json

For each start method this Python offers (fork, forkserver, spawn), a ``ShmVecEnv`` of
``--num-envs`` CartPole envs on ``--workers`` workers:

- ``build_s``: from the call to the first ``reset`` returned, the first vector env of the
  process (a forkserver starts then);
- ``rebuild_s``: the same for the next one (the forkserver already runs);
- ``restart_s``: under ``on_error="restart"``, a worker SIGKILLed while idle, then the ``step``
  that finds it dead, replaces it (a new process, its envs built and reset) and returns.

Medians of ``--repeats``. Run it under each Python to compare (``tests/chroot/run.sh`` roots hold
3.13 and 3.14): the figures say what a start method costs, on this machine, at start-up and at
each restart.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import signal
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def measure(method: str, num_envs: int, workers: int, steps: int) -> dict[str, float]:
    """One build, one rebuild and one restart under ``method``, in seconds."""
    import shmvec

    def build() -> tuple[float, object]:
        t0 = time.perf_counter()
        envs = shmvec.make("CartPole-v1", num_envs=num_envs, num_workers=workers, context=method, on_error="restart")
        envs.reset(seed=0)
        return time.perf_counter() - t0, envs

    first, envs = build()
    envs.close()
    again, envs = build()
    actions = np.zeros(num_envs, np.int64)
    for _ in range(steps):
        envs.step(actions)
    os.kill(envs.worker_pids[0], signal.SIGKILL)
    time.sleep(0.2)  # (dead before the step that finds it)
    t0 = time.perf_counter()
    *_, infos = envs.step(actions)
    restart = time.perf_counter() - t0
    assert infos["restarted"].any(), "the killed worker was not replaced"
    envs.close()
    return {"build_s": first, "rebuild_s": again, "restart_s": restart}


def main(argv: list[str] | None = None) -> dict:
    """Measure every start method in a fresh process each (a forkserver's first start counts)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.num_envs, args.workers, args.steps)))
        return {}
    import subprocess

    methods = mp.get_all_start_methods()
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for _ in range(args.repeats):
        for method in methods:  # alternately, each in a process of its own
            cmd = [sys.executable, __file__, "--child", method, "--num-envs", str(args.num_envs),
                   "--workers", str(args.workers), "--steps", str(args.steps)]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[method].append(json.loads(out.stdout.strip().splitlines()[-1]))
    cells = {
        method: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for method, rs in runs.items()
    }
    result = {
        "python": platform.python_version(),
        "default": methods[0],
        "num_envs": args.num_envs,
        "workers": args.workers,
        "repeats": args.repeats,
        "cells": cells,
        "runs": runs,
    }
    print(f"Python {result['python']} (default start method: {methods[0]}), {args.num_envs} envs, {args.workers} workers")
    for method, cell in cells.items():
        print(f"{method:>11}: " + "  ".join(f"{k} {v * 1e3:8.1f} ms" for k, v in cell.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
