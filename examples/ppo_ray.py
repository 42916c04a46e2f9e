"""PPO on CartPole-v1 across Ray actors: ``examples/ppo_rollout.py`` with a ``RayVecEnv``.

    python examples/ppo_ray.py                                   # a local cluster of 2 CPUs
    python examples/ppo_ray.py --num-actors 4 --num-envs 64 --address auto   # a running cluster

Each actor hosts a :class:`shmvec.ShmVecEnv` over its share of the envs. Once per update the
driver sends the policy (the agent's weights, pickled once into Ray's object store); each
actor runs the whole ``[T, N_actor]`` rollout next to its envs and sends the batch back, which
``RayVecEnv.rollout`` joins along the env axis. The training loop is the one of
``ppo_rollout.py``, unchanged.

On a real cluster, every node needs shmvec, torch and the envs installed (``pip install
'shmvec[ray,torch]'``); the example's own code travels with the policy (see
:func:`ship_examples`). Needs ``pip install 'shmvec[ray,torch]'``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import ray
from gymnasium.vector import AutoresetMode

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling examples, run from anywhere
import ppo_cartpole  # noqa: E402
import ppo_rollout  # noqa: E402

from shmvec.ray import RayVecEnv  # noqa: E402


def ship_examples() -> None:
    """Pickle the examples' classes (agent, policy, env factory) by value: the actors, possibly
    on other machines, do not have these script files to import them from."""
    for module in (ppo_cartpole, ppo_rollout):
        ray.cloudpickle.register_pickle_by_value(module)


def ray_factory(num_actors: int, num_workers_per_actor: int = 1) -> Callable[..., RayVecEnv]:
    """A ``make_vector_env`` for :func:`ppo_rollout.train` that builds a :class:`RayVecEnv`."""

    def make(env_fns: Sequence[Callable[[], gym.Env]], autoreset_mode: AutoresetMode) -> RayVecEnv:
        return RayVecEnv(env_fns, num_actors=num_actors, num_workers_per_actor=num_workers_per_actor,
                         autoreset_mode=autoreset_mode)

    return make


def train(total_steps: int = 200_000, num_envs: int = 16, seed: int = 1, *, num_actors: int = 2,
          num_workers_per_actor: int = 1, **kwargs: Any) -> dict[str, Any]:
    """:func:`ppo_rollout.train` through a :class:`RayVecEnv`; Ray must be initialised."""
    ship_examples()
    return ppo_rollout.train(total_steps, num_envs, seed,
                             make_vector_env=ray_factory(num_actors, num_workers_per_actor), **kwargs)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=200_000)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-actors", type=int, default=2)
    parser.add_argument("--num-workers-per-actor", type=int, default=1)
    parser.add_argument("--address", default=None,
                        help="a running cluster's address ('auto' on one of its nodes); default: start a local one")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local cluster (default: the cores)")
    args = parser.parse_args(argv)
    started = not ray.is_initialized()
    if started:
        if args.address:
            ray.init(address=args.address)
        else:
            ray.init(num_cpus=args.num_cpus, include_dashboard=False)
    try:
        stats = train(args.total_steps, args.num_envs, args.seed, num_actors=args.num_actors,
                      num_workers_per_actor=args.num_workers_per_actor)
    finally:
        if started:
            ray.shutdown()
    print(ppo_cartpole.report(stats))
    return stats


if __name__ == "__main__":
    main()
