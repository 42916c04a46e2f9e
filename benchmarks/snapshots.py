"""What a snapshot costs: ``get_state`` and ``set_state`` of every env, against one ``step``.

    make bench-snapshots                  # CartPole, Pong and Ant, 16 envs on 2 workers
    .venv/bin/python benchmarks/snapshots.py --envs 16 --rounds 9 --json results/snapshots.json

Per workload: the median over rounds of the time of ``get_state()`` and of ``set_state()`` of all
envs, the same round's median ``step`` time (so the cost reads as a number of steps, a ratio
measured in the same run), and the bytes of one env's state. Pong and Ant are skipped where
their extras are not installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from shmvec import ShmVecEnv
from shmvec.bench.output import write_study
from shmvec.bench.workloads import get_workloads

WORKLOADS = ("cartpole", "atari-pong", "mujoco-ant")


def measure(workload, num_envs: int, workers: int, rounds: int) -> dict:
    envs = ShmVecEnv([workload.make_env] * num_envs, num_workers=workers)
    try:
        envs.reset(seed=0)
        space = envs.action_space
        space.seed(0)
        actions = [space.sample() for _ in range(20)]
        for a in actions:
            envs.step(a)
        step_s, get_s, set_s = [], [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for a in actions:
                envs.step(a)
            t1 = time.perf_counter()
            states = envs.get_state()
            t2 = time.perf_counter()
            envs.set_state(states)
            t3 = time.perf_counter()
            step_s.append((t1 - t0) / len(actions))
            get_s.append(t2 - t1)
            set_s.append(t3 - t2)
        step, get, put = (statistics.median(x) for x in (step_s, get_s, set_s))
        return {
            "workload": workload.key,
            "num_envs": num_envs,
            "workers": workers,
            "step_ms": step * 1e3,
            "get_state_ms": get * 1e3,
            "set_state_ms": put * 1e3,
            "round_trip_in_steps": statistics.median((g + s) / st for g, s, st in zip(get_s, set_s, step_s)),
            "state_kb_per_env": float(np.mean([s.nbytes for s in states])) / 1024,
        }
    finally:
        envs.close()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    rows = []
    for workload in get_workloads(list(WORKLOADS)):
        why = workload.unavailable()
        if why:
            print(f"{workload.key}: skipped ({why})")
            continue
        row = measure(workload, args.envs, args.workers, args.rounds)
        rows.append(row)
        print(
            f"{row['workload']:<12} {args.envs} envs: get_state {row['get_state_ms']:.1f} ms, "
            f"set_state {row['set_state_ms']:.1f} ms, step {row['step_ms']:.2f} ms "
            f"(snapshot + restore = {row['round_trip_in_steps']:.1f} steps), {row['state_kb_per_env']:.0f} KB per env"
        )
    if args.json:
        write_study(args.json, {"config": vars(args), "rows": {r["workload"]: r for r in rows}})
    return rows


if __name__ == "__main__":
    main()
