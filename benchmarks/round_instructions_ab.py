"""The calling process's instructions per round in this checkout against another one: how much a
change to the round costs the caller (#51 holds it within 2 %).

    git worktree add /tmp/base <commit>
    .venv/bin/python benchmarks/round_instructions_ab.py --base /tmp/base \\
        --json benchmarks/results-2core/round_instructions_ab.json

Two rounds, each of do-nothing envs (``SyntheticEnv(step_us=0)``, 8 float32) on 2 workers, waits
that block at once (``spin_us=0``: a spinning wait's instructions would measure idle time):

- ``step``: ``step`` of 16 envs (a broadcast round, counted by the workers);
- ``send/recv``: ``send`` of one block of 2 envs and ``recv`` of a batch (4 envs, ``batch_size=2``).

Each count is callgrind's for the calling process alone (its forked workers report their own),
the difference of two runs of different lengths (start-up cancelled out), per round; the two
checkouts run alternately, ``--repeats`` times, and each cell keeps its median. The checkout is
picked by ``PYTHONPATH`` (both run this venv's packages).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from caller_cost import callers_count  # (this folder is on the path when run as a script)

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
WARMUP = 100
KINDS = ("step", "send/recv")


def child(kind: str, rounds: int) -> None:
    """Under callgrind: build, warm up, run ``rounds`` rounds of ``kind``, close."""
    import numpy as np

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
        envs = shmvec.ShmVecEnv([fn] * 4, num_workers=2, spin_us=0.0, batch_size=2, warn_slow_loop=False)
        actions = np.zeros(2, np.int64)
        envs.async_reset(seed=0)
        *_, ids = envs.recv()
        *_, other = envs.recv()
        for _ in range(WARMUP + rounds):
            envs.send(actions, ids)
            *_, ids = envs.recv()
    envs.close()


def count(tree: Path, kind: str, rounds: int) -> float:
    """The caller's instructions per round of ``kind`` in the checkout at ``tree``."""
    # (a fixed hash seed: randomized hashing moves the start-up's count by millions)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}

    def run(n: int) -> int:
        return callers_count([sys.executable, str(HERE), "--child", kind, str(n)], env)

    return (run(1 + rounds) - run(1)) / rounds


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="the other checkout (its root directory)")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]))
        return {}
    if not args.base:
        parser.error("--base is required")
    trees = {"base": Path(args.base).resolve(), "this": ROOT}
    counts: dict[str, dict[str, list[float]]] = {kind: {"base": [], "this": []} for kind in KINDS}
    for _ in range(args.repeats):
        for kind in KINDS:
            for name, tree in trees.items():
                counts[kind][name].append(count(tree, kind, args.rounds))
    result = {
        "rounds": args.rounds,
        "repeats": args.repeats,
        "base": subprocess.run(["git", "-C", str(trees["base"]), "rev-parse", "HEAD"], capture_output=True,
                               text=True).stdout.strip(),  # fmt: skip
        "cells": {
            kind: {
                "base": statistics.median(c["base"]),
                "this": statistics.median(c["this"]),
                "ratio": statistics.median(c["this"]) / statistics.median(c["base"]),
                "runs": c,
            }
            for kind, c in counts.items()
        },
    }
    for kind, cell in result["cells"].items():
        print(f"{kind:>10}: base {cell['base']:,.0f}  this {cell['this']:,.0f}  ratio {cell['ratio']:.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
