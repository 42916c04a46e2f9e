"""Where a small vector's time goes in a torch loop: the policy's forward pass and the step, apart.

    .venv/bin/python benchmarks/torch_loop_phases.py --num-envs 4,8,32 --json results/torch_loop_phases.json

The rollout half of ``examples/ppo_cartpole.py`` (its agent, 1 torch thread, an action sampled
from the policy before every step), on ``SyncVectorEnv``, on shmvec's defaults (a worker per
core) and on ``num_workers`` = cores - 1 (a core left to this process). All of them live in one
process and take turns, ``--steps`` steps each per round; each figure is the median over
rounds, and each ``speed`` the median of the per-round ratios of SyncVectorEnv's time per
step to the engine's. ``forward_us`` is the time outside ``step`` (the forward pass and
sampling), ``step_us`` the time inside it: where workers and this process share the cores,
the first grows too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import gymnasium as gym
import numpy as np

from shmvec.bench.output import write_study
from shmvec.checks import usable_cores

ENGINES = ("sync", "default", "caller-core")


def measure(num_envs: int, steps: int, rounds: int, cores: int) -> dict:
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    import ppo_cartpole as ppo

    import shmvec

    torch.set_num_threads(1)
    torch.manual_seed(0)
    fns = [ppo.MakeEnv("CartPole-v1")] * num_envs
    envs = {
        "sync": gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP),
        "default": shmvec.ShmVecEnv(fns, autoreset_mode="SameStep"),
        "caller-core": shmvec.ShmVecEnv(fns, autoreset_mode="SameStep", num_workers=max(1, cores - 1)),
    }
    try:
        agent = ppo.Agent(4, 2)
        obs = {name: env.reset(seed=1)[0] for name, env in envs.items()}
        total: dict[str, list[float]] = {name: [] for name in envs}
        inside: dict[str, list[float]] = {name: [] for name in envs}
        clock = time.perf_counter
        for _ in range(rounds):
            for name, env in envs.items():
                o, stepping = obs[name], 0.0
                start = clock()
                for _ in range(steps):
                    with torch.no_grad():
                        action = agent.act(torch.from_numpy(np.asarray(o, dtype=np.float32)))[0].numpy()
                    t = clock()
                    o, *_ = env.step(action)
                    stepping += clock() - t
                total[name].append((clock() - start) / steps * 1e6)
                inside[name].append(stepping / steps * 1e6)
                obs[name] = o
    finally:
        for env in envs.values():
            env.close()
    out = {}
    for name in envs:
        out[name] = {
            "step_us": statistics.median(inside[name]),
            "forward_us": statistics.median(a - b for a, b in zip(total[name], inside[name])),
            "speed": statistics.median(s / e for s, e in zip(total["sync"], total[name])),
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", default="4,8,32")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cores = usable_cores()
    out: dict = {"config": {"steps": args.steps, "rounds": args.rounds, "cores": cores}, "sizes": {}}
    for n in (int(x) for x in args.num_envs.split(",")):
        row = out["sizes"][str(n)] = measure(n, args.steps, args.rounds, cores)
        for name in ENGINES:
            r = row[name]
            print(f"{n:>3} envs, {name:<11}: forward {r['forward_us']:6.0f} us, step {r['step_us']:6.0f} us, "
                  f"{r['speed']:.2f}x SyncVectorEnv")
    if args.json:
        write_study(args.json, out)
    return out


if __name__ == "__main__":
    main()
