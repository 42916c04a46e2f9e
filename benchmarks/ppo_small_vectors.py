"""The CleanRL-style PPO loop (examples/ppo_cartpole.py) at a handful of envs: shmvec against SyncVectorEnv.

    .venv/bin/python benchmarks/ppo_small_vectors.py --num-envs 4,8,32 --rounds 5 --json results/ppo_small_vectors.json

Each round trains the same PPO (torch policy in the calling process, 1 torch thread, 30
rollouts of 128 steps) once per vector env, each in a fresh process, and records its steps per
second; a figure is the median over rounds of the ratio to ``SyncVectorEnv`` in the same round.
Variants: shmvec's defaults (a worker per core), one worker less than the cores (the calling
process keeps a core for torch), and ``step_in_main=True`` with one worker less (opt-in: the
caller steps a block itself).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from shmvec.bench.output import write_study
from shmvec.checks import usable_cores

TRAIN = r"""
import sys
sys.path.insert(0, sys.argv[1])
import gymnasium as gym
import ppo_cartpole as ppo
import shmvec

examples, variant, n, cores = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
options = {
    "default": {},
    "caller-core": {"num_workers": max(1, cores - 1)},
    "step-in-main": {"num_workers": max(1, cores - 1), "step_in_main": True},
}
if variant == "sync":
    make = lambda fns, mode: gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
else:
    make = lambda fns, mode: shmvec.ShmVecEnv(fns, autoreset_mode=mode, **options[variant])
stats = ppo.train(total_steps=n * 128 * 30, num_envs=n, seed=1, make_vector_env=make, progress=False)
print(stats["steps_per_s"])
"""

VARIANTS = ("sync", "default", "caller-core", "step-in-main")


def sps(variant: str, num_envs: int, cores: int) -> float:
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    out = subprocess.run(
        [sys.executable, "-c", TRAIN, examples, variant, str(num_envs), str(cores)],
        capture_output=True, text=True, check=True,
    )
    return float(out.stdout.split()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", default="4,8,32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cores = usable_cores()
    out: dict = {"config": {"rounds": args.rounds, "cores": cores}, "sizes": {}}
    for n in (int(x) for x in args.num_envs.split(",")):
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for variant in VARIANTS:
                rates[variant].append(sps(variant, n, cores))
        row = {"sync_sps": statistics.median(rates["sync"])}
        for variant in VARIANTS[1:]:
            row[variant] = statistics.median(a / b for a, b in zip(rates[variant], rates["sync"]))
        out["sizes"][str(n)] = row
        print(f"{n:>3} envs: " + ", ".join(f"{v} {row[v]:.2f}x" for v in VARIANTS[1:]) + " of SyncVectorEnv's SPS")
    if args.json:
        write_study(args.json, out)
    return out


if __name__ == "__main__":
    main()
