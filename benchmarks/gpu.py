"""Observations to a GPU policy and actions back: TorchVecEnv's pinned asynchronous copies against
the plain conversion (``torch.as_tensor(obs).to(device)`` on ShmVecEnv's numpy batch).

    make bench-gpu
    .venv/bin/python benchmarks/gpu.py --workloads atari-like,atari-pong --num-envs 128 --json results/gpu.json

Engines, all on the same ShmVecEnv settings (``num_workers`` = usable cores, the defaults):

- ``plain``: ``ShmVecEnv.step`` (numpy, owned copies), ``torch.as_tensor(obs).to(device)``,
  the policy, ``actions.cpu().numpy()`` back: what a PPO loop on a numpy vector env does.
- ``pinned``: ``TorchVecEnv.step``: tensors copied from pinned shared memory on a copy stream.
- ``pinned-rollout``: ``TorchVecEnv.rollout(policy, steps)``: the ``[T, N]`` batch on the device.

The policy is the Nature-DQN CNN for image observations (an MLP otherwise), greedy actions. The
engines take their windows in turn, the order rotating each round; a ratio is the median of
per-round ratios (the spread is printed beside it). Throughput is env steps per second (for
Atari, frames = 4 x steps).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch import nn

import shmvec
from shmvec.bench.output import write_study
from shmvec.bench.workloads import get_workloads
from shmvec.checks import usable_cores
from shmvec.torch import TorchVecEnv

ENGINES = ["plain", "pinned", "pinned-rollout"]


def make_policy(obs_space, n_actions: int, device: torch.device) -> nn.Module:
    shape = obs_space.shape
    last = len(shape) == 3 and shape[-1] < shape[0]  # (84, 84, 4) rather than (4, 84, 84)
    if len(shape) == 3:
        net = nn.Sequential(
            nn.Conv2d(shape[-1] if last else shape[0], 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
            nn.LazyLinear(512), nn.ReLU(), nn.Linear(512, n_actions))
        scale = 1.0 / 255.0
    else:
        net = nn.Sequential(nn.Flatten(), nn.LazyLinear(64), nn.Tanh(), nn.Linear(64, n_actions))
        scale = 1.0
    net = net.to(device).eval()

    class Greedy(nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                x = obs.permute(0, 3, 1, 2) if last else obs
                return net(x.float() * scale).argmax(dim=1)

    return Greedy()


class Runner:
    """One engine: ``window(steps)`` runs that many vector steps and returns env steps per second."""

    def __init__(self, engine: str, workload, num_envs: int, device: torch.device) -> None:
        self.engine, self.device, self.num_envs = engine, device, num_envs
        base = shmvec.ShmVecEnv([workload.make_env] * num_envs, num_workers=min(usable_cores(), num_envs))
        space = base.single_action_space
        self.policy = make_policy(base.single_observation_space, int(space.n), device)
        if engine == "plain":
            self.envs = base
            obs, _ = base.reset(seed=0)
            self.obs = torch.as_tensor(obs).to(device)
        else:
            self.envs = TorchVecEnv(base, device=device)
            self.obs, _ = self.envs.reset(seed=0)
        self.policy(self.obs)  # builds the lazy layer, warms cuDNN

    def window(self, steps: int) -> float:
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        if self.engine == "plain":
            obs = self.obs
            for _ in range(steps):
                actions = self.policy(obs).cpu().numpy()
                obs_np = self.envs.step(actions)[0]
                obs = torch.as_tensor(obs_np).to(self.device)
            self.obs = obs
        elif self.engine == "pinned":
            obs = self.obs
            for _ in range(steps):
                obs = self.envs.step(self.policy(obs))[0]
            self.obs = obs
        else:
            batch = self.envs.rollout(self.policy, steps)
            self.obs = batch["next_obs"]
        sync()
        return steps * self.num_envs / (time.perf_counter() - t0)

    def close(self) -> None:
        self.envs.close()


def measure(workload, num_envs: int, device: torch.device, steps: int, rounds: int) -> dict:
    runners = {e: Runner(e, workload, num_envs, device) for e in ENGINES}
    try:
        for r in runners.values():
            r.window(max(steps // 4, 2))  # warm-up
        rates: dict[str, list[float]] = {e: [] for e in ENGINES}
        for k in range(rounds):
            order = ENGINES[k % len(ENGINES):] + ENGINES[:k % len(ENGINES)]
            for e in order:
                rates[e].append(runners[e].window(steps))
    finally:
        for r in runners.values():
            r.close()
    out = {"workload": workload.key, "num_envs": num_envs, "device": str(device), "steps_per_window": steps,
           "rates": rates, "median_steps_per_s": {e: statistics.median(v) for e, v in rates.items()}}
    for e in ENGINES[1:]:
        ratios = [a / b for a, b in zip(rates[e], rates["plain"])]
        out[f"{e}/plain"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="atari-like,atari-pong")
    parser.add_argument("--num-envs", type=int, default=128)
    parser.add_argument("--device", default=None, help="default: cuda if torch sees one, else cpu")
    parser.add_argument("--steps", type=int, default=100, help="vector steps per window")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        print("note: no GPU here; the CPU path shows only the zero-copy side", file=sys.stderr)
    results = []
    for workload in get_workloads(args.workloads.split(",")):
        reason = workload.unavailable()
        if reason:
            print(f"- {workload.label}: skipped, {reason}")
            continue
        res = measure(workload, args.num_envs, device, args.steps, args.rounds)
        results.append(res)
        med = res["median_steps_per_s"]
        print(f"- {workload.label}, {args.num_envs} envs on {device}: plain {med['plain']:,.0f} steps/s, "
              f"pinned {med['pinned']:,.0f} ({res['pinned/plain']['median']:.2f}x, "
              f"{res['pinned/plain']['min']:.2f}-{res['pinned/plain']['max']:.2f}), "
              f"pinned rollout {med['pinned-rollout']:,.0f} ({res['pinned-rollout/plain']['median']:.2f}x, "
              f"{res['pinned-rollout/plain']['min']:.2f}-{res['pinned-rollout/plain']['max']:.2f})", flush=True)
    if args.json:
        write_study(args.json, results)
    return results


if __name__ == "__main__":
    main()
