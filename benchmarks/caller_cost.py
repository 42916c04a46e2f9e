"""The calling process's work per synchronous round, against the number of worker blocks.

    .venv/bin/python benchmarks/caller_cost.py                         # the table, 1..64 workers
    .venv/bin/python benchmarks/caller_cost.py --workers 2,16 --obs none --rounds 500 --no-instructions

Past a few cores, what caps a vector env is the caller's serial work per round: it writes each
block's command words, wakes the sleepers, waits, and reads each block's status, then copies
the observations out (``copy=True``). Each cell is a ``ShmVecEnv`` of ``W`` do-nothing envs
(``SyntheticEnv(step_us=0)``), one per worker, waits that block at once (``spin_us=0``: a
spinning caller's CPU would measure idle time), and either a small observation (``none``: 8
float32) or a Pong frame (``pong``: 210 x 160 x 3 uint8); ``pong-300us`` adds a step of 300 us
of CPU, about an Atari step's, so that the blocks finish apart, as real ones do. Per round it
reports:

- ``cpu_us``: the calling thread's CPU time (``time.thread_time``), the caller on a core of
  its own and every worker on the others (as on a machine with a core per process: no worker
  evicts the caller's caches or preempts it); ``None`` with a single usable core;
- ``cpu_shared_us``: the same, every process on every core (on 2 cores, 33 processes share
  them: the caller's CPU then includes the kernel's and the caches' share of that);
- ``instructions``: the calling process's instructions under callgrind (its workers' own
  counts left out), the difference of two runs, start-up cancelled out;
- ``dispatch_us``, ``wait_us``, ``collect_us``: its wall time (every core shared), split at
  ``WorkerPool.submit`` and ``WorkerPool.wait`` (``collect``: everything after the wait:
  statuses, infos, results);
- ``copy_us``: the part of ``collect`` spent copying the results out (``copy=True``);
  ``early_copy_us``: the copying done inside the wait, block by block as the blocks finished
  (observations of 64 KiB a block or more, ``results.COPY_AS_DONE_BYTES``);
  ``blocks_after_last``: how many blocks' observations were copied after the round's last
  block finished, per round (one: only the last block's share is left); these three with the
  caller on a core of its own, as ``cpu_us``.

Figures vary with the machine: a ratio between cells of one run is what to read (the caller's
CPU at W workers over its CPU at 2).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

# Each obs kind: (observation shape, dtype, CPU microseconds a step spends).
OBS = {
    "none": ((8,), "float32", 0.0),
    "pong": ((210, 160, 3), "uint8", 0.0),
    "pong-300us": ((210, 160, 3), "uint8", 300.0),
}
WARMUP = 100
# The worker counts each obs kind is measured at by default, and the kinds counted under callgrind
# (a step of 300 us of CPU runs 50 times slower there, for the same count of the caller's).
WORKERS = {"none": "1,2,4,8,16,32,64", "pong": "2,16,32", "pong-300us": "2,16,32"}
COUNTED = ("none", "pong")
OWN_CORE = ("cpu_us", "copy_us", "early_copy_us", "blocks_after_last")  # measured with the caller on a core of its own
_COUNT = re.compile(r"==(\d+)== Collected\s*:\s*(\d+)")
_FIRST = re.compile(r"==(\d+)==")


def build(workers: int, obs: str):
    import shmvec
    from shmvec.envs import SyntheticEnv

    shape, dtype, step_us = OBS[obs]
    fns = [lambda: SyntheticEnv(obs_shape=shape, obs_dtype=dtype, step_us=step_us, reset_us=0.0)] * workers
    return shmvec.ShmVecEnv(fns, num_workers=workers, spin_us=0.0, warn_slow_loop=False)


@contextmanager
def own_core(workers: int, obs: str):
    """The cell's vector env, its caller on a core of its own and its workers on the other
    usable cores (they inherit the affinity they are started with); ``None`` on one core.
    """
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2:
        yield None
        return
    try:
        os.sched_setaffinity(0, cores[1:])
        envs = build(workers, obs)
        os.sched_setaffinity(0, cores[:1])
        with envs:
            yield envs
    finally:
        os.sched_setaffinity(0, cores)


def timed(envs, rounds: int) -> dict[str, float]:
    """Per-round figures of ``rounds`` steps, every core shared: CPU, the wall split at the
    pool's phases, and the copy out (after the round, and inside the wait as blocks finished).
    """
    from shmvec import results as R
    from shmvec.protocol import DONE

    session = envs._session
    pool, results = session.pool, session.results
    spent = {"dispatch": 0.0, "wait": 0.0, "copy": 0.0, "early": 0.0, "after": 0.0}
    waiting = [False]
    main_line, workers = pool.main_line, len(pool.worker_blocks)

    def clocked(name, method):
        def run(*args, **kwargs):
            t = time.perf_counter()
            waiting[0] = name == "wait"
            try:
                return method(*args, **kwargs)
            finally:
                waiting[0] = False
                spent[name] += time.perf_counter() - t

        return run

    block = R.CopyOut.block

    def copy_block(self, b):  # a block copied inside the wait is early unless every block was done
        t = time.perf_counter()
        block(self, b)
        if waiting[0]:
            spent["early"] += time.perf_counter() - t
        if not waiting[0] or main_line[DONE] == workers:
            spent["after"] += 1

    pool.submit = clocked("dispatch", pool.submit)
    pool.wait = clocked("wait", pool.wait)
    results.step = clocked("copy", results.step)
    R.CopyOut.block = copy_block
    try:
        actions = envs.action_space.sample() * 0
        envs.reset(seed=0)
        for _ in range(WARMUP):
            envs.step(actions)
        spent.update(dispatch=0.0, wait=0.0, copy=0.0, early=0.0, after=0.0)
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        for _ in range(rounds):
            envs.step(actions)
        wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
    finally:
        R.CopyOut.block = block
    per = 1e6 / rounds
    copied_by_block = results.copy_out() is not None
    return {
        "cpu_us": cpu * per,
        "wall_us": wall * per,
        "dispatch_us": spent["dispatch"] * per,
        "wait_us": spent["wait"] * per,
        "collect_us": (wall - spent["dispatch"] - spent["wait"]) * per,
        "copy_us": spent["copy"] * per,
        "early_copy_us": spent["early"] * per,
        "blocks_after_last": spent["after"] / rounds if copied_by_block else float(workers),
    }


def child(workers: int, obs: str, rounds: int) -> None:
    """Under callgrind: build, warm up, step ``rounds`` times, close."""
    envs = build(workers, obs)
    try:
        actions = envs.action_space.sample() * 0
        envs.reset(seed=0)
        for _ in range(WARMUP + rounds):
            envs.step(actions)
    finally:
        envs.close()


def instructions(workers: int, obs: str, rounds: int) -> float:
    """The calling process's instructions per round (callgrind; forked workers stay under it
    and report their own counts, left out here: the caller's is the one of the first pid).
    """

    def run(n: int) -> int:
        return callers_count([sys.executable, __file__, "--child", str(workers), obs, str(n)])

    return (run(1 + rounds) - run(1)) / rounds


def callers_count(argv: list[str], env: dict[str, str] | None = None) -> int:
    """The instructions of the process ``argv`` starts, under callgrind, its children left out
    (they report their own counts: the caller's is the one of the first pid).
    """
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    first = _FIRST.search(out.stderr)
    found = {pid: int(n) for pid, n in _COUNT.findall(out.stderr)}
    if out.returncode != 0 or first is None or first.group(1) not in found:
        raise RuntimeError(f"callgrind run failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return found[first.group(1)]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", help="comma-separated worker counts (default: WORKERS, per obs kind)")
    parser.add_argument("--obs", default="none,pong,pong-300us", help=f"comma-separated, from {list(OBS)}")
    parser.add_argument("--rounds", type=int, default=2000, help="timed rounds per cell (default 2000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell, the median kept (default 3)")
    parser.add_argument("--instruction-rounds", type=int, default=2000, help="rounds counted under callgrind")
    parser.add_argument("--no-instructions", action="store_true", help="skip the callgrind counts")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--write-docs", action="store_true", help="write the tables into docs/benchmarks.md")
    parser.add_argument("--from-json", type=Path, help="no measuring: the tables of these results (with --write-docs)")
    parser.add_argument("--child", nargs=3, metavar=("WORKERS", "OBS", "ROUNDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(int(args.child[0]), args.child[1], int(args.child[2]))
        return []
    if args.from_json:
        rows = json.loads(args.from_json.read_text())
        print_table(rows)
        if args.write_docs:
            write_docs(rows)
        return rows
    counting = not args.no_instructions and shutil.which("valgrind") is not None
    rows = []
    for obs in args.obs.split(","):
        for workers in [int(w) for w in (args.workers or WORKERS[obs]).split(",")]:
            with build(workers, obs) as envs:
                shared = [timed(envs, args.rounds) for _ in range(args.repeats)]
            with own_core(workers, obs) as envs:
                own = None if envs is None else [timed(envs, args.rounds) for _ in range(args.repeats)]
            row: dict = {"obs": obs, "workers": workers}
            for key in shared[0]:  # the caller's CPU and its copying with a core of its own, the rest shared
                runs = own if own is not None and key in OWN_CORE else shared
                row[key] = float(np.median([r[key] for r in runs]))
            row["cpu_shared_us"] = float(np.median([r["cpu_us"] for r in shared]))
            if own is None:
                row["cpu_us"] = None
            if counting and obs in COUNTED:
                row["instructions"] = instructions(workers, obs, args.instruction_rounds)
            rows.append(row)
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    print_table(rows)
    if args.json:
        from shmvec.bench.output import write_study

        write_study(args.json, rows)
    if args.write_docs:
        write_docs(rows)
    return rows


def format_table(rows: list[dict]) -> str:
    """The results as the Markdown table docs/benchmarks.md quotes (a test compares them)."""
    keys = ["cpu_us", "cpu_shared_us", "instructions", "dispatch_us", "wait_us", "collect_us", "copy_us",
            "early_copy_us", "blocks_after_last", "wall_us"]  # fmt: skip
    keys = [k for k in keys if k in rows[0]]
    heads = {"cpu_us": "CPU us, own core", "cpu_shared_us": "CPU us, shared", "instructions": "instructions",
             "dispatch_us": "dispatch us", "wait_us": "wait us", "collect_us": "collect us",
             "copy_us": "of which copy us", "early_copy_us": "copied in the wait us",
             "blocks_after_last": "blocks copied after the last", "wall_us": "wall us"}  # fmt: skip
    ratios = [k for k in ("cpu_us", "cpu_shared_us", "instructions") if k in rows[0]]
    names = {"cpu_us": "CPU own / at 2", "cpu_shared_us": "CPU shared / at 2", "instructions": "instructions / at 2"}
    out = ["| obs | workers | " + " | ".join([heads[k] for k in keys] + [names[k] for k in ratios]) + " |"]
    out.append("|---|---:|" + "---:|" * (len(keys) + len(ratios)))

    def cell(key: str, value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value:,.0f}" if key == "instructions" else f"{value:.1f}"

    for row in rows:
        base = next((r for r in rows if r["obs"] == row["obs"] and r["workers"] == 2), None)
        cells = [cell(k, row.get(k)) for k in keys]
        for k in ratios:
            ok = base is not None and row.get(k) is not None and base.get(k)
            cells.append(f"{row[k] / base[k]:.2f}x" if ok else "-")  # type: ignore[index]
        out.append(f"| {row['obs']} | {row['workers']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


# The projection's envs: a block's step time on its own core (one env per block), in microseconds.
PROJECTED_STEPS = {"HalfCheetah (about 40 us)": 40.0, "Ant (about 100 us)": 100.0, "Pong (about 300 us)": 300.0}


def format_projection(rows: list[dict], workers: tuple[int, ...] = (16, 64)) -> str:
    """A model, not a measurement: the efficiency of a synchronous round on ``workers`` cores,
    one block per core, from this machine's figures (do-nothing envs, small observations):

        efficiency = step / (step + serial + wake)

    ``serial`` is the caller's CPU per round at that many workers with a core of its own (its
    work between the blocks' steps), ``wake`` the part of a round at 2 workers that is neither
    the caller's CPU nor a step (the wake-up round trip, every core shared).
    """
    small = {r["workers"]: r for r in rows if r["obs"] == "none"}
    wake = max(0.0, small[2]["wall_us"] - small[2]["cpu_shared_us"])
    out = ["| env (step per block) | " + " | ".join(f"{w} cores" for w in workers) + " |"]
    out.append("|---|" + "---:|" * len(workers))
    for name, step in PROJECTED_STEPS.items():
        cells = [f"{step / (step + small[w]['cpu_us'] + wake):.2f}" for w in workers]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append("")
    serial = ", ".join(f"{small[w]['cpu_us']:.0f} us at {w}" for w in workers)
    out.append(
        f"(serial: the caller's CPU per round on a core of its own, {serial}; wake: {wake:.0f} us, from 2 workers)"
    )
    return "\n".join(out)


DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
BLOCKS = {"caller-cost": format_table, "caller-projection": format_projection}


def docs_blocks(text: str) -> dict[str, str]:
    """The blocks of docs/benchmarks.md that this study's tables fill, by name."""
    return {name: text.split(f"<!-- {name}:begin -->\n", 1)[1].split(f"<!-- {name}:end -->", 1)[0] for name in BLOCKS}


def write_docs(rows: list[dict]) -> None:
    text = DOCS.read_text()
    for name, block in docs_blocks(text).items():
        text = text.replace(f"<!-- {name}:begin -->\n{block}", f"<!-- {name}:begin -->\n{BLOCKS[name](rows)}\n")
    DOCS.write_text(text)


def print_table(rows: list[dict]) -> None:
    print()
    print(format_table(rows))
    if any(r["obs"] == "none" and r["workers"] == 2 for r in rows):
        print()
        print(format_projection(rows, tuple(w for w in (16, 64) if any(r["workers"] == w for r in rows))))


if __name__ == "__main__":
    main()
