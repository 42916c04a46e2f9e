"""The calling process's instructions per round in this checkout against another one: how much a
change to the round costs the caller (#51 holds it within 2 %).

    git worktree add /tmp/base <commit>
    .venv/bin/python benchmarks/round_instructions_ab.py --base /tmp/base \\
        --json benchmarks/results-2core/round_instructions_ab.json

Rounds of do-nothing envs (``SyntheticEnv(step_us=0)``, 8 float32) on 2 workers, waits that
block at once (``spin_us=0``: a spinning wait's instructions would measure idle time):

- ``step``: ``step`` of 16 envs (a broadcast round, counted by the workers);
- ``send/recv``: ``send`` of one block of 2 envs and ``recv`` of a batch (4 envs, ``batch_size=2``);
- ``send/sleep/recv``: the same with a 5 ms sleep between the two, so that the block is done
  when ``recv`` looks: every round takes the same path, and the count is the caller's own work
  on it, with no wait in it.

Each count is callgrind's for the calling process alone (its forked workers report their own),
the difference of two runs of different lengths (start-up cancelled out), per round; the two
checkouts run alternately, ``--repeats`` times, and each cell keeps its median. The checkout is
picked by ``PYTHONPATH`` (both run this venv's packages).

Every process runs on one CPU (``--cpu``): the caller and a worker then take turns, so the
runs repeat each other closely. Still, whether the caller finds a block done or has to sleep
for it is a race (how soon the kernel runs the worker it woke), and a sleep costs the caller
tens of thousands of instructions (``select``, the wake pipe, the loop around them). Each cell
therefore also reports ``sleeps``: the caller's ``select`` calls per round (and ``poll`` calls
of the compiled broadcast round, ``BroadcastRound.sleeps``). Two checkouts whose
``send/recv`` counts differ while their ``send/sleep/recv`` counts agree differ in that race,
not in the work of either path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from caller_cost import callers_count  # (this folder is on the path when run as a script)

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
WARMUP = 100
KINDS = ("step", "send/recv", "send/sleep/recv")
SETTLE_S = 0.005  # send/sleep/recv: long enough for a worker under callgrind to finish its step


def child(kind: str, rounds: int, sleeps_file: str) -> None:
    """Under callgrind: build, warm up, run ``rounds`` rounds of ``kind``, close; write the
    caller's ``select`` calls (its sleeps) to ``sleeps_file``.
    """
    import select
    import time

    import numpy as np

    calls = [0]
    real_select = select.select

    def counted_select(*args):  # (shmvec's one blocking call, sync.readable, looks it up per call)
        calls[0] += 1
        return real_select(*args)

    select.select = counted_select

    import shmvec
    from shmvec.envs import SyntheticEnv

    def fn():
        return SyntheticEnv(obs_shape=(8,), obs_dtype="float32", step_us=0.0, reset_us=0.0)

    if kind == "step":
        envs = shmvec.ShmVecEnv([fn] * 16, num_workers=2, spin_us=0.0, warn_slow_loop=False)
        actions = envs.action_space.sample() * 0
        envs.reset(seed=0)
        for _ in range(WARMUP + rounds):
            envs.step(actions)
    else:
        settle = kind == "send/sleep/recv"
        envs = shmvec.ShmVecEnv([fn] * 4, num_workers=2, spin_us=0.0, batch_size=2, warn_slow_loop=False)
        actions = np.zeros(2, np.int64)
        envs.async_reset(seed=0)
        *_, ids = envs.recv()
        *_, other = envs.recv()
        for _ in range(WARMUP + rounds):
            envs.send(actions, ids)
            if settle:
                time.sleep(SETTLE_S)
            *_, ids = envs.recv()
    # (and the compiled broadcast round's own sleeps, in poll, where the checkout has one)
    compiled = getattr(envs._session.pool, "round", None)
    envs.close()
    Path(sleeps_file).write_text(str(calls[0] + (compiled.sleeps if compiled is not None else 0)))


def count(tree: Path, kind: str, rounds: int) -> tuple[float, float]:
    """The caller's instructions and sleeps per round of ``kind`` in the checkout at ``tree``."""
    # (a fixed hash seed: randomized hashing moves the start-up's count by millions)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}

    def run(n: int) -> tuple[int, int]:
        with tempfile.NamedTemporaryFile("r", suffix=".sleeps") as f:
            instructions = callers_count([sys.executable, str(HERE), "--child", kind, str(n), f.name], env)
            return instructions, int(Path(f.name).read_text())

    (long, long_sleeps), (short, short_sleeps) = run(1 + rounds), run(1)
    return (long - short) / rounds, (long_sleeps - short_sleeps) / rounds


def format_table(result: dict) -> str:
    """The Markdown table docs/benchmarks.md quotes from a result (``--json``'s)."""
    lines = [
        "| round | base | this | this / base | sleeps per round (base, this) |",
        "|---|---:|---:|---:|---|",
    ]
    for kind, cell in result["cells"].items():
        s = cell["sleeps"]
        lines.append(
            f"| `{kind}` | {cell['base']:,.0f} | {cell['this']:,.0f} | {cell['ratio']:.3f}x "
            f"| {s['base']:.2f}, {s['this']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="the other checkout (its root directory)")
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, from {list(KINDS)}")
    parser.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)), help="the one CPU of every process")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return {}
    if not args.base:
        parser.error("--base is required")
    os.sched_setaffinity(0, {args.cpu})  # (inherited by valgrind, the caller and its workers)
    kinds = args.kinds.split(",")
    trees = {"base": Path(args.base).resolve(), "this": ROOT}
    counts: dict[str, dict[str, list[tuple[float, float]]]] = {kind: {"base": [], "this": []} for kind in kinds}
    for _ in range(args.repeats):
        for kind in kinds:
            for name, tree in trees.items():
                counts[kind][name].append(count(tree, kind, args.rounds))
    cells = {}
    for kind, c in counts.items():
        base = statistics.median(i for i, _ in c["base"])
        this = statistics.median(i for i, _ in c["this"])
        cells[kind] = {
            "base": base,
            "this": this,
            "ratio": this / base,
            "sleeps": {name: statistics.median(s for _, s in runs) for name, runs in c.items()},
            "runs": {name: [i for i, _ in runs] for name, runs in c.items()},
        }
    result = {
        "rounds": args.rounds,
        "repeats": args.repeats,
        "base": subprocess.run(["git", "-C", str(trees["base"]), "rev-parse", "HEAD"], capture_output=True,
                               text=True).stdout.strip(),  # fmt: skip
        "this": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                               text=True).stdout.strip(),  # fmt: skip
        "cells": cells,
    }
    for kind, cell in cells.items():
        s = cell["sleeps"]
        print(
            f"{kind:>16}: base {cell['base']:,.0f}  this {cell['this']:,.0f}  ratio {cell['ratio']:.4f}"
            f"  (sleeps per round: base {s['base']:.2f}, this {s['this']:.2f})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
