"""RayVecEnv.rollout against a local ShmVecEnv.rollout over the same envs: the price of Ray.

    make bench-ray                       # 2 actors x 64 CartPole envs, T=256, on a local cluster
    .venv/bin/python benchmarks/ray_rollout.py --actors 2 --envs 128 --steps 256 --rounds 7

Both engines step the same ``--envs`` CartPole-v1 envs with the same cheap deterministic
policy, on the same number of stepping processes (``--actors`` actors of one process each,
against a local ``ShmVecEnv`` of ``--actors`` workers). Rounds alternate between the two, so
both see the same machine load; the figure is the median over rounds of the ratio within each
round. It also times the per-step ``VectorEnv`` API through Ray (one round trip per step).

Kept out of ``make bench``: a Ray cluster runs daemons (GCS, raylet) that would load the cores
under the other cells of the report.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np

import shmvec
from shmvec.bench.output import write_study


def policy(obs: np.ndarray) -> np.ndarray:
    """Push toward the side the pole leans to: deterministic, as cheap as a policy gets."""
    return (obs[:, 2] > 0).astype(np.int64)


def make_cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--envs", type=int, default=128)
    parser.add_argument("--steps", type=int, default=256, help="rollout length T")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--step-calls", type=int, default=200, help="per-step API calls timed per engine")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)

    import ray

    from shmvec.ray import RayVecEnv

    ray.init(num_cpus=args.actors, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    env_fns = [make_cartpole] * args.envs
    local = shmvec.ShmVecEnv(env_fns, num_workers=args.actors)
    remote = RayVecEnv(env_fns, num_actors=args.actors, num_workers_per_actor=1)
    try:
        for envs in (local, remote):
            envs.reset(seed=0)
        remote.set_policy(policy)  # broadcast once: rollout(None, ...) reuses it
        for _ in range(2):  # warm up: storage allocation, imports, Ray's first transfers
            local.rollout(policy, args.steps)
            remote.rollout(None, args.steps)
        steps = args.steps * args.envs
        local_rates, ray_rates, ratios = [], [], []
        for _ in range(args.rounds):
            t_local = timed(local.rollout, policy, args.steps)
            t_ray = timed(remote.rollout, None, args.steps)
            local_rates.append(steps / t_local)
            ray_rates.append(steps / t_ray)
            ratios.append(t_local / t_ray)

        actions = np.zeros(args.envs, np.int64)
        step_us = {}
        for name, envs in (("local", local), ("ray", remote)):
            t = timed(lambda e=envs: [e.step(actions) for _ in range(args.step_calls)])
            step_us[name] = t / args.step_calls * 1e6
    finally:
        remote.close()
        local.close()
        ray.shutdown()

    result = {
        "config": {"actors": args.actors, "envs": args.envs, "steps": args.steps, "rounds": args.rounds},
        "local_rollout_steps_per_s": statistics.median(local_rates),
        "ray_rollout_steps_per_s": statistics.median(ray_rates),
        "ray_over_local": statistics.median(ratios),
        "step_call_us": step_us,
    }
    print(f"CartPole-v1, {args.envs} envs, rollouts of {args.steps} steps, median of {args.rounds} rounds")
    print(f"  local ShmVecEnv.rollout ({args.actors} workers): {result['local_rollout_steps_per_s']:>10,.0f} steps/s")
    print(f"  RayVecEnv.rollout ({args.actors} actors x 1):     {result['ray_rollout_steps_per_s']:>10,.0f} steps/s")
    print(f"  Ray / local (median of per-round ratios): {result['ray_over_local']:.2f}x  (target >= 0.80x)")
    print(f"  one step() call: local {step_us['local']:,.0f} us, through Ray {step_us['ray']:,.0f} us")
    if args.json:
        write_study(args.json, result)
    return result


if __name__ == "__main__":
    main()
