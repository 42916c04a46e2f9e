"""PPO that checkpoints its envs with its model, and resumes bit for bit in a new process.

    python examples/ppo_checkpoint.py --iterations 40 --checkpoint ckpt/        # saves every 10
    python examples/ppo_checkpoint.py --iterations 40 --checkpoint ckpt/ --resume

The loop is ``examples/ppo_rollout.py``'s (the same agent, rollout and update). A checkpoint
holds the model, the optimizer, torch's random generator (actions are sampled from it), the
iteration, and ``envs.state_dict()`` (every env mid-episode, pending autoresets, episode
statistics), written by ``shmvec.save_state``. A resumed run continues exactly where the saved
one was: each later iteration prints the same fingerprint as an uninterrupted run.

Needs torch (``pip install 'shmvec[torch]'``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import shmvec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling examples, run from anywhere
from ppo_cartpole import Agent, Hyperparams, ppo_update  # noqa: E402
from ppo_rollout import TorchPolicy  # noqa: E402


def train(
    iterations: int,
    checkpoint: str,
    resume: bool = False,
    every: int = 10,
    stop_after: int | None = None,
    num_envs: int = 4,
    seed: int = 1,
) -> list[float]:
    """Run PPO iterations up to ``iterations``, saving to the folder ``checkpoint`` every ``every``
    (and stopping after ``stop_after``, to play an interruption); return one fingerprint per
    iteration run here (a sum over its batch and the updated weights).
    """
    torch.set_num_threads(1)
    hp = Hyperparams()
    os.makedirs(checkpoint, exist_ok=True)
    model_path, envs_path = os.path.join(checkpoint, "model.pt"), os.path.join(checkpoint, "envs.ckpt")
    envs = shmvec.make("CartPole-v1", num_envs=num_envs, num_workers=2)
    torch.manual_seed(seed)  # the initial weights (a resumed run loads its own)
    agent = Agent(4, 2)
    optimizer = torch.optim.Adam(agent.parameters(), lr=hp.learning_rate, eps=1e-5)
    start = 0
    if resume:
        saved = torch.load(model_path, weights_only=False)
        agent.load_state_dict(saved["agent"])
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["torch_rng"])
        start = saved["iteration"]
        shmvec.load_state(envs, envs_path)
    else:
        envs.reset(seed=seed)
    fingerprints = []
    try:
        for iteration in range(start, iterations):
            policy = TorchPolicy(agent)
            batch = envs.rollout(policy, num_steps=hp.num_steps)
            valid = batch["valid"]
            advantages, returns = shmvec.rollout_gae(
                batch, policy.value(batch["next_obs"]), gamma=hp.gamma, lam=hp.gae_lambda
            )
            ppo_update(agent, optimizer, hp, batch["obs"][valid], batch["actions"][valid], batch["logprob"][valid],
                       advantages[valid], returns[valid], batch["value"][valid])
            weights = sum(float(p.detach().double().sum()) for p in agent.parameters())
            fingerprints.append(float(batch["obs"].sum(dtype=np.float64)) + float(batch["rewards"].sum()) + weights)
            done = iteration + 1
            if done % every == 0:
                torch.save({"agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
                            "torch_rng": torch.get_rng_state(), "iteration": done}, model_path)
                shmvec.save_state(envs, envs_path)  # the envs as the model saw them
            if stop_after is not None and done >= stop_after:
                break
    finally:
        envs.close()
    return fingerprints


def main(argv: Sequence[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--checkpoint", default="ckpt")
    parser.add_argument("--every", type=int, default=10, help="iterations between checkpoints")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    parser.add_argument("--stop-after", type=int, default=None, help="stop after this many iterations")
    args = parser.parse_args(argv)
    fingerprints = train(args.iterations, args.checkpoint, args.resume, args.every, args.stop_after)
    for value in fingerprints:
        print(repr(value))
    return fingerprints


if __name__ == "__main__":
    main()
