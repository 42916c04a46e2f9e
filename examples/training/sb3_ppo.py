"""Stable-Baselines3's PPO on MuJoCo, on a vector env built by SB3's ``make_vec_env``: the one
argument a user changes is ``vec_env_cls``. torch, SB3 and shmvec stay at their defaults.

    python examples/training/sb3_ppo.py                             # HalfCheetah-v5 x8, shmvec
    python examples/training/sb3_ppo.py --vec dummy                 # SB3's DummyVecEnv
    python examples/training/sb3_ppo.py --vec subproc               # SB3's SubprocVecEnv

The script prints each finished episode and, at the end, one JSON line: steps per second, and
the seconds each iteration spent collecting and updating (``make bench-training`` reads it).
"""

import argparse
import json
import time

from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

import shmvec.sb3

VECTOR_ENVS = {"shmvec": shmvec.sb3.SubprocVecEnv, "dummy": DummyVecEnv, "subproc": SubprocVecEnv}


class Progress(BaseCallback):
    """Logs finished episodes, and the time of each rollout and of the update after it."""

    def __init__(self):
        super().__init__()
        self.episodes = 0
        self.times = []  # (collect, update) seconds of each iteration
        self.started = self.ended = None

    def _on_rollout_start(self):
        now = time.perf_counter()
        if self.ended is not None:
            self.times.append((self.ended - self.started, now - self.ended))
        self.started = now

    def _on_rollout_end(self):
        self.ended = time.perf_counter()

    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                self.episodes += 1
                print(f"step={self.num_timesteps}, episodic_return={info['episode']['r']:.1f}")
        return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="HalfCheetah-v5")
    p.add_argument("--vec", choices=sorted(VECTOR_ENVS), default="shmvec")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--n-steps", type=int, default=2048, help="steps per env per rollout")
    p.add_argument("--total-timesteps", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)

    envs = make_vec_env(args.env_id, n_envs=args.num_envs, seed=args.seed, vec_env_cls=VECTOR_ENVS[args.vec])
    model = PPO("MlpPolicy", envs, n_steps=args.n_steps, seed=args.seed)
    progress = Progress()
    start = time.perf_counter()
    model.learn(total_timesteps=args.total_timesteps, callback=progress)
    elapsed = time.perf_counter() - start
    progress._on_rollout_start()  # the last update's time
    envs.close()
    batch = args.n_steps * args.num_envs
    summary = {"sps": model.num_timesteps / elapsed, "steps": model.num_timesteps, "episodes": progress.episodes,
               "batch": batch, "iterations": progress.times}  # fmt: skip
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
