"""What each start method costs a vector env: building it, and replacing a worker that died.

    .venv/bin/python benchmarks/start_methods.py --json benchmarks/results-2core/start_methods-py311.json

For each case below, a ``ShmVecEnv`` of ``--num-envs`` CartPole envs on ``--workers`` workers:

- ``build_s``: from the call to the first ``reset`` returned, the first vector env of the
  process (a forkserver starts then);
- ``rebuild_s``: the same for the next one (the forkserver already runs);
- ``restart_s``: under ``on_error="restart"``, a worker SIGKILLed while idle, then the ``step``
  that finds it dead, replaces it (a new process, its envs built and reset) and returns.

The cases: each start method this Python offers, named (``context="fork"``...); forkserver
with only Python's own preload (``__main__``), to show what shmvec's preload saves; and shmvec's
default (``context=None``) from a caller with one thread and from one running a thread of its
own (docs/architecture.md, "Platforms"). Medians of ``--repeats``, the cases alternating, each
in a fresh process. Run it under each Python (``tests/chroot/run.sh`` roots hold 3.13 and
3.14): the figures say what a start method costs, on this machine, at start-up and at each
restart.
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
import threading
import time
from pathlib import Path

import numpy as np

# label: (context, a thread of the caller's own runs, Python's preload only)
CASES = {
    "fork": ("fork", False, False),
    "forkserver": ("forkserver", False, False),
    "forkserver, Python's preload": ("forkserver", False, True),
    "spawn": ("spawn", False, False),
    "default, one thread": (None, False, False),
    "default, threaded": (None, True, False),
}


def measure(case: str, num_envs: int, workers: int, steps: int) -> dict[str, float]:
    """One build, one rebuild and one restart in ``case``, in seconds."""
    import shmvec
    from shmvec import start_methods

    context, threaded, plain = CASES[case]
    if plain:
        start_methods._preloaded = True  # shmvec adds nothing to the forkserver's preload
    if threaded:
        threading.Thread(target=threading.Event().wait, daemon=True).start()

    def build() -> tuple[float, object]:
        t0 = time.perf_counter()
        envs = shmvec.make("CartPole-v1", num_envs=num_envs, num_workers=workers, context=context, on_error="restart")
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
    methods = envs.start_methods
    envs.close()
    return {"build_s": first, "rebuild_s": again, "restart_s": restart, "started_by": methods[0]}


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
    cases = [case for case, (context, _, _) in CASES.items() if context is None or context in methods]
    runs: dict[str, list[dict]] = {case: [] for case in cases}
    for _ in range(args.repeats):
        for case in cases:  # alternately, each in a process of its own
            cmd = [sys.executable, __file__, "--child", case, "--num-envs", str(args.num_envs),
                   "--workers", str(args.workers), "--steps", str(args.steps)]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[case].append(json.loads(out.stdout.strip().splitlines()[-1]))
    cells = {
        case: {key: statistics.median(r[key] for r in rs) for key in ("build_s", "rebuild_s", "restart_s")}
        for case, rs in runs.items()
    }
    for case, rs in runs.items():
        cells[case]["started_by"] = "/".join(sorted({r["started_by"] for r in rs}))
    result = {
        "python": platform.python_version(),
        "pythons_default": methods[0],
        "num_envs": args.num_envs,
        "workers": args.workers,
        "repeats": args.repeats,
        "cells": cells,
        "runs": runs,
    }
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_table(result: dict) -> str:
    """The medians of one results file, as the Markdown table docs/architecture.md shows."""
    lines = [
        f"Python {result['python']} (its default: {result['pythons_default']}), {result['num_envs']} envs "
        f"on {result['workers']} workers, medians of {result['repeats']}:",
        "",
        "| start | worker started by | first vector env | next one | restart after SIGKILL |",
        "|---|---|---:|---:|---:|",
    ]
    for case, cell in result["cells"].items():
        times = " | ".join(f"{cell[key] * 1e3:,.0f} ms" for key in ("build_s", "rebuild_s", "restart_s"))
        lines.append(f"| {case} | {cell['started_by']} | {times} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
