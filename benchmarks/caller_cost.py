"""The calling process's work per synchronous round, against the number of worker blocks.

    .venv/bin/python benchmarks/caller_cost.py                         # the table, 1..64 workers
    .venv/bin/python benchmarks/caller_cost.py --workers 2,16 --obs none --rounds 500 --no-instructions

Past a few cores, what caps a vector env is the caller's serial work per round: it writes each
block's command words, wakes the sleepers, waits, and reads each block's status, then copies
the observations out (``copy=True``). Each cell is a ``ShmVecEnv`` of ``W`` do-nothing envs
(``SyntheticEnv(step_us=0)``), one per worker, waits that block at once (``spin_us=0``: a
spinning caller's CPU would measure idle time), and either a small observation (``none``: 8
float32) or a Pong frame (``pong``: 210 x 160 x 3 uint8). Per round it reports:

- ``cpu_us``: the calling thread's CPU time (``time.thread_time``);
- ``instructions``: the calling process's instructions under callgrind (its workers' own
  counts left out), the difference of two runs, start-up cancelled out;
- ``dispatch_us``, ``wait_us``, ``collect_us``: its wall time, split at ``WorkerPool.submit``
  and ``WorkerPool.wait`` (``collect``: everything after the wait: statuses, infos, results);
- ``copy_us``: the part of ``collect`` spent copying the results out (``copy=True``).

Figures vary with the machine: a ratio between cells of one run is what to read (the caller's
CPU at W workers over its CPU at 2).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

OBS = {"none": ((8,), "float32"), "pong": ((210, 160, 3), "uint8")}
WARMUP = 100
_COUNT = re.compile(r"==(\d+)== Collected\s*:\s*(\d+)")
_FIRST = re.compile(r"==(\d+)==")


def build(workers: int, obs: str):
    import shmvec
    from shmvec.envs import SyntheticEnv

    shape, dtype = OBS[obs]
    fns = [lambda: SyntheticEnv(obs_shape=shape, obs_dtype=dtype, step_us=0)] * workers
    return shmvec.ShmVecEnv(fns, num_workers=workers, spin_us=0.0, warn_slow_loop=False)


def timed(envs, rounds: int) -> dict[str, float]:
    """Per-round figures of ``rounds`` steps: CPU, and the wall split at the pool's phases."""
    session = envs._session
    pool, results = session.pool, session.results
    spent = {"dispatch": 0.0, "wait": 0.0, "copy": 0.0}

    def clocked(name, method):
        def run(*args, **kwargs):
            t = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t

        return run

    pool.submit = clocked("dispatch", pool.submit)
    pool.wait = clocked("wait", pool.wait)
    results.step = clocked("copy", results.step)
    actions = envs.action_space.sample() * 0
    envs.reset(seed=0)
    for _ in range(WARMUP):
        envs.step(actions)
    spent.update(dispatch=0.0, wait=0.0, copy=0.0)
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    for _ in range(rounds):
        envs.step(actions)
    wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
    per = 1e6 / rounds
    return {
        "cpu_us": cpu * per,
        "wall_us": wall * per,
        "dispatch_us": spent["dispatch"] * per,
        "wait_us": spent["wait"] * per,
        "collect_us": (wall - spent["dispatch"] - spent["wait"]) * per,
        "copy_us": spent["copy"] * per,
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
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, __file__, "--child", str(workers), obs, str(n)]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True)
        first = _FIRST.search(out.stderr)
        found = {pid: int(n) for pid, n in _COUNT.findall(out.stderr)}
        if out.returncode != 0 or first is None or first.group(1) not in found:
            raise RuntimeError(f"callgrind run failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
        return found[first.group(1)]

    return (run(1 + rounds) - run(1)) / rounds


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8,16,32,64", help="comma-separated worker counts")
    parser.add_argument("--obs", default="none,pong", help=f"comma-separated, from {list(OBS)}")
    parser.add_argument("--rounds", type=int, default=2000, help="timed rounds per cell (default 2000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell, the median kept (default 3)")
    parser.add_argument("--instruction-rounds", type=int, default=300, help="rounds counted under callgrind")
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
        for workers in [int(w) for w in args.workers.split(",")]:
            with build(workers, obs) as envs:
                runs = [timed(envs, args.rounds) for _ in range(args.repeats)]
            row = {"obs": obs, "workers": workers}
            for key in runs[0]:
                row[key] = float(np.median([r[key] for r in runs]))
            if counting:
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
    keys = ["cpu_us", "instructions", "dispatch_us", "wait_us", "collect_us", "copy_us", "wall_us"]
    keys = [k for k in keys if k in rows[0]]
    heads = {"cpu_us": "CPU us", "instructions": "instructions", "dispatch_us": "dispatch us", "wait_us": "wait us",
             "collect_us": "collect us", "copy_us": "of which copy us", "wall_us": "wall us"}  # fmt: skip
    out = ["| obs | workers | " + " | ".join(heads[k] for k in keys) + " | CPU / at 2 | instructions / at 2 |"]
    out.append("|---|---:|" + "---:|" * (len(keys) + 2))
    for row in rows:
        base = next((r for r in rows if r["obs"] == row["obs"] and r["workers"] == 2), None)
        cpu = f"{row['cpu_us'] / base['cpu_us']:.2f}x" if base else "-"
        ins = f"{row['instructions'] / base['instructions']:.2f}x" if base and "instructions" in row else "-"
        cells = [f"{row[k]:,.0f}" if k == "instructions" else f"{row[k]:.1f}" for k in keys]
        out.append(f"| {row['obs']} | {row['workers']} | " + " | ".join(cells) + f" | {cpu} | {ins} |")
    return "\n".join(out)


# The projection's envs: a block's step time on its own core (one env per block), in microseconds.
PROJECTED_STEPS = {"HalfCheetah (about 40 us)": 40.0, "Ant (about 100 us)": 100.0, "Pong (about 300 us)": 300.0}


def format_projection(rows: list[dict], workers: tuple[int, ...] = (16, 64)) -> str:
    """A model, not a measurement: the efficiency of a synchronous round on ``workers`` cores,
    one block per core, from this machine's figures (do-nothing envs, small observations):

        efficiency = step / (step + serial + wake)

    ``serial`` is the caller's CPU per round at that many workers (its work between the
    blocks' steps), ``wake`` the part of a round at 2 workers that is neither the caller's CPU
    nor a step (the wake-up round trip).
    """
    small = {r["workers"]: r for r in rows if r["obs"] == "none"}
    wake = max(0.0, small[2]["wall_us"] - small[2]["cpu_us"])
    out = ["| env (step per block) | " + " | ".join(f"{w} cores" for w in workers) + " |"]
    out.append("|---|" + "---:|" * len(workers))
    for name, step in PROJECTED_STEPS.items():
        cells = [f"{step / (step + small[w]['cpu_us'] + wake):.2f}" for w in workers]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append("")
    serial = ", ".join(f"{small[w]['cpu_us']:.0f} us at {w}" for w in workers)
    out.append(f"(serial: the caller's CPU per round, {serial}; wake: {wake:.0f} us, from 2 workers)")
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
