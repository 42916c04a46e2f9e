"""Stable-Baselines3's PPO on shmvec: the only change from an SB3 script is the import.

    python examples/sb3_ppo.py                            # 100k steps, 8 envs, seed 0
    python examples/sb3_ppo.py --total-steps 50000 --num-envs 4

Needs SB3 (``pip install 'shmvec[sb3]'``). :func:`train` takes the vector env class, so the
benchmark runs the very same code with SB3's own ``SubprocVecEnv``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from shmvec.sb3 import SubprocVecEnv  # was: from stable_baselines3.common.vec_env import SubprocVecEnv


def train(
    total_steps: int = 100_000,
    num_envs: int = 8,
    seed: int = 0,
    *,
    vec_env_cls: type = SubprocVecEnv,
    vec_env_kwargs: dict[str, Any] | None = None,
    eval_episodes: int = 10,
    verbose: int = 0,
    torch_threads: int | None = None,
) -> dict[str, Any]:
    """Train SB3's PPO on CartPole-v1 with ``vec_env_cls`` and return statistics.

    Parameters
    ----------
    total_steps, num_envs, seed : int
        Env steps in all, envs stepped together, seed of everything.
    vec_env_cls : type
        ``shmvec.sb3.SubprocVecEnv`` (default) or any SB3 ``VecEnv`` class.
    vec_env_kwargs : dict, optional
        Passed to ``vec_env_cls``.
    eval_episodes : int
        Episodes of the deterministic policy evaluated at the end (0: none).
    verbose : int
        SB3's verbosity (1 prints its training tables).
    torch_threads : int, optional
        ``torch.set_num_threads`` if given; ``None`` (the default) leaves torch as users run it
        (``shmvec.sb3.SubprocVecEnv`` lowers its threads while a rollout is collected).

    Returns
    -------
    dict
        ``steps``, ``wall_time_s`` (environment construction and training),
        ``steps_per_s``, ``train_return`` (mean of the last 100 training episodes, SB3's
        ``ep_rew_mean``), ``eval_return`` and ``eval_std``.
    """
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    start = time.perf_counter()
    venv = make_vec_env("CartPole-v1", n_envs=num_envs, seed=seed, vec_env_cls=vec_env_cls,
                        vec_env_kwargs=vec_env_kwargs)  # fmt: skip
    try:
        # rl-baselines3-zoo's tuned CartPole settings (its 8 x 32 rollout spread over num_envs),
        # the learning rate and clip range decaying linearly to 0.
        model = PPO(
            "MlpPolicy", venv, n_steps=max(1, 256 // num_envs), batch_size=256, n_epochs=20, gamma=0.98,
            gae_lambda=0.8, ent_coef=0.0, learning_rate=lambda left: 1e-3 * left,
            clip_range=lambda left: 0.2 * left, seed=seed, device="cpu", verbose=verbose,
        )  # fmt: skip
        model.learn(total_timesteps=total_steps)
        wall = time.perf_counter() - start
        stats: dict[str, Any] = {
            "steps": model.num_timesteps,
            "wall_time_s": wall,
            "steps_per_s": model.num_timesteps / wall,
            "train_return": float(np.mean([ep["r"] for ep in model.ep_info_buffer])) if model.ep_info_buffer else float("nan"),
        }
        if eval_episodes:
            mean, std = evaluate_policy(model, venv, n_eval_episodes=eval_episodes, deterministic=True)
            stats.update(eval_return=float(mean), eval_std=float(std))
        return stats
    finally:
        venv.close()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=100_000)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    stats = train(args.total_steps, args.num_envs, args.seed, verbose=1)
    print(
        f"{stats['steps']:,} steps in {stats['wall_time_s']:.1f} s ({stats['steps_per_s']:,.0f} steps/s); "
        f"training return {stats['train_return']:.1f}; evaluation {stats['eval_return']:.1f} +/- {stats['eval_std']:.1f}"
    )
    return stats


if __name__ == "__main__":
    main()
