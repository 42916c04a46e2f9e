"""Go-Explore's exploration phase on MountainCar-v0: return to promising states, then explore.

    python examples/go_explore.py                       # 16 envs, 300 rounds
    python examples/go_explore.py --rounds 100 --num-envs 8

Random play on MountainCar almost never reaches the flag: the car must swing back and forth,
and random actions undo each other. Go-Explore keeps an archive of *cells* (here: position and
velocity, coarsely binned), each with the snapshot of the first state that reached it. Every
round it picks cells (rarely visited ones first), puts each env back in one of them with
``envs.set_state``, explores with random actions for a few steps, and adds every new cell it
finds with ``envs.get_state``. No env is reset and nothing is replayed: a return to a cell is one
restore.

Prints the furthest position reached, against random play with the same number of steps.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

import shmvec

GOAL = 0.5  # MountainCar's flag


def cell(obs: np.ndarray) -> tuple[int, int]:
    """A coarse bin of (position, velocity): states that are alike share a cell."""
    return int((obs[0] + 1.2) // 0.1), int((obs[1] + 0.07) // 0.01)


def make_env() -> gym.Env:
    return gym.make("MountainCar-v0", max_episode_steps=10_000)


def explore(rounds: int, num_envs: int, explore_steps: int, seed: int, num_workers: int | None = None) -> dict[str, Any]:
    """Go-Explore for ``rounds`` rounds; returns the furthest position and the archive size."""
    rng = np.random.default_rng(seed)
    with shmvec.ShmVecEnv([make_env] * num_envs, num_workers=num_workers) as envs:
        obs, _ = envs.reset(seed=seed)
        archive: dict[tuple[int, int], list] = {}  # cell -> [state, visits]
        for i, state in enumerate(envs.get_state()):
            archive.setdefault(cell(obs[i]), [state, 0])
        best = float(obs[:, 0].max())
        for _ in range(rounds):
            # Return: rarely visited cells are picked first (weight 1 / sqrt(visits + 1)).
            keys = list(archive)
            weights = np.array([1.0 / np.sqrt(archive[k][1] + 1) for k in keys])
            picks = rng.choice(len(keys), size=num_envs, p=weights / weights.sum())
            for k in picks:
                archive[keys[k]][1] += 1
            envs.set_state([archive[keys[k]][0] for k in picks])
            # Explore: random actions, each repeated a few steps, so that they do not cancel out.
            for _ in range(explore_steps // 4):
                action = rng.integers(0, 3, size=num_envs)
                for _ in range(4):
                    obs, _, terminated, _, _ = envs.step(action)
                    best = max(best, float(obs[:, 0].max()))
                    new = [i for i in range(num_envs) if cell(obs[i]) not in archive and not terminated[i]]
                    if new:
                        for i, state in zip(new, envs.get_state(new)):
                            archive.setdefault(cell(obs[i]), [state, 0])
        return {"best_position": best, "cells": len(archive), "steps": rounds * (explore_steps // 4) * 4 * num_envs}


def random_play(steps: int, num_envs: int, seed: int) -> float:
    """The furthest position random play reaches in ``steps`` env steps."""
    rng = np.random.default_rng(seed)
    envs = gym.vector.SyncVectorEnv([make_env] * num_envs)
    obs, _ = envs.reset(seed=seed)
    best = float(obs[:, 0].max())
    for _ in range(steps // num_envs):
        obs, *_ = envs.step(rng.integers(0, 3, size=num_envs))
        best = max(best, float(obs[:, 0].max()))
    envs.close()
    return best


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--explore-steps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    found = explore(args.rounds, args.num_envs, args.explore_steps, args.seed)
    baseline = random_play(found["steps"], args.num_envs, args.seed)
    print(
        f"Go-Explore: furthest position {found['best_position']:.3f} ({found['cells']} cells) in "
        f"{found['steps']} steps; random play: {baseline:.3f}; the flag is at {GOAL}"
    )
    return {**found, "random_best_position": baseline}


if __name__ == "__main__":
    main()
