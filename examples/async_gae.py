"""Asynchronous collection into per-env rollout columns, then GAE: the loop of an async PPO.

    .venv/bin/python examples/async_gae.py --num-envs 32 --num-workers 4 --batch-size 16

Envs with uneven step times (shmvec.envs.HeavyTailEnv: most steps ~10 us, 5% ~5 ms) are
stepped by ``num_workers`` workers; ``recv`` hands back whichever blocks are ready, so a slow
step in one block never holds up the others. ``AsyncRollout`` puts each env's transitions in
its own column, in order, so ``shmvec.gae`` sees ordinary ``[T, N]`` arrays. The policy here
is a fixed random linear map (numpy only): swap in your actor-critic.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import shmvec
from shmvec.envs import HeavyTailEnv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-steps", type=int, default=64, help="steps per env per rollout")
    parser.add_argument("--rollouts", type=int, default=3)
    args = parser.parse_args()

    envs = shmvec.ShmVecEnv([HeavyTailEnv] * args.num_envs, num_workers=args.num_workers,
                            batch_size=args.batch_size)
    obs_dim = envs.single_observation_space.shape[0]
    n_actions = int(envs.single_action_space.n)
    rng = np.random.default_rng(0)
    actor = rng.normal(size=(obs_dim, n_actions))
    critic = rng.normal(size=obs_dim) * 0.1

    def policy(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (obs @ actor).argmax(axis=1), (obs @ critic).astype(np.float32)

    rollout = shmvec.AsyncRollout(
        args.num_envs, args.num_steps,
        fields={"obs": ((obs_dim,), np.float32), "actions": ((), np.int64), "values": ((), np.float32)},
        autoreset_mode=envs.autoreset_mode,
    )
    envs.async_reset(seed=0)
    for k in range(args.rollouts):
        t0 = time.perf_counter()
        if k > 0:
            # The next rollout starts where the last one stopped: act on the saved last states.
            ids = rollout.clear()
            actions, values = policy(rollout.last["obs"])
            rollout.record_step(ids, obs=rollout.last["obs"], actions=actions, values=values)
            envs.send(actions, ids)
        while not rollout.full:
            obs, rewards, terminations, truncations, infos, ids = envs.recv()
            rollout.record_outcome(ids, rewards, terminations, truncations)
            actions, values = policy(obs)
            go = rollout.record_step(ids, obs=obs, actions=actions, values=values)
            if go.any():
                envs.send(actions[go], ids[go])
        elapsed = time.perf_counter() - t0
        advantages, returns = shmvec.gae(
            rollout.rewards, rollout["values"], rollout.terminations, rollout.truncations,
            rollout.last["values"], gamma=0.99, lam=0.95, autoreset="next_step", valid=rollout.valid,
        )
        steps = args.num_envs * args.num_steps
        print(f"rollout {k}: {steps} steps in {elapsed:.2f} s ({steps / elapsed:,.0f} steps/s), "
              f"episodes ended {int((rollout.terminations | rollout.truncations).sum())}, "
              f"mean advantage {advantages[rollout.valid].mean():+.3f}")
    envs.close()


if __name__ == "__main__":
    main()
