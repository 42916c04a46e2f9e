"""PPO on CartPole-v1 through ``envs.rollout``: the workers write each [T, N] batch in place.

    python examples/ppo_rollout.py                        # 500k steps, 8 envs, seed 1
    python examples/ppo_rollout.py --total-steps 50000 --num-envs 16

The same agent and update as ``examples/ppo_cartpole.py``; only the collection differs. There
the loop calls ``envs.step`` and copies every step into its buffers. Here one call,
``envs.rollout(policy, T)``, steps the envs ``T`` times: the workers write observations,
rewards and flags straight into ``[T, N]`` storage, and the policy (:class:`TorchPolicy`, the
agent in sampling mode) keeps its log-probabilities and values beside them.

The rollout uses NEXT_STEP autoreset, Gymnasium's default: after an episode ends, the env's next
step is a reset whose action is ignored. ``batch["valid"]`` marks those rows False;
``shmvec.rollout_gae(batch, last_values)`` reads that mode from the batch: it skips them and
bootstraps a truncated episode from the value of the following row (its final observation),
and the update trains only on valid rows.

:func:`train` takes any vector env with ``reset`` and ``rollout``: a :class:`shmvec.ShmVecEnv`
(the default) or a :class:`shmvec.ray.RayVecEnv` (``examples/ppo_ray.py``), where the policy is
sent to the actors once per rollout and runs next to their envs.

Needs torch (``pip install 'shmvec[torch]'``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

import shmvec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling example, run from anywhere
from ppo_cartpole import Agent, Hyperparams, Tracker, cli, ppo_update, run  # noqa: E402

# make_vector_env(env_fns, autoreset_mode) -> an env with reset() and rollout()
RolloutEnvFactory = Callable[[Sequence[Callable[[], gym.Env]], AutoresetMode], Any]


class TorchPolicy:
    """The agent as a rollout policy: ``obs -> (actions, {"logprob": ..., "value": ...})``.

    Picklable (weights included), so a :class:`~shmvec.ray.RayVecEnv` can ship it to its
    actors; there it sets torch's threads to ``threads``, if given (``None``: torch's default,
    which each actor's vector env lowers while its rollout is collected).
    """

    def __init__(self, agent: Agent, threads: int | None = None) -> None:
        self.agent = agent
        self.threads = threads

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        with torch.no_grad():
            action, logprob, _, value = self.agent.act(torch.from_numpy(obs))
        return action.numpy(), {"logprob": logprob.numpy(), "value": value.numpy()}

    def value(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.agent.value(torch.from_numpy(np.asarray(obs, dtype=np.float32))).numpy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.threads is not None:  # unpickled in another process: an actor
            torch.set_num_threads(self.threads)


def train(
    total_steps: int = 500_000,
    num_envs: int = 8,
    seed: int = 1,
    *,
    make_vector_env: RolloutEnvFactory | None = None,
    num_workers: int | None = None,
    progress: bool = True,
    torch_threads: int | None = None,
    **hyperparams: Any,
) -> dict[str, Any]:
    """Train PPO from rollouts and return statistics of the run.

    Parameters and result as :func:`ppo_cartpole.train` (whose ``shmvec_factory`` is the
    default), except that ``make_vector_env`` returns an env with ``reset`` and ``rollout``
    under ``AutoresetMode.NEXT_STEP``, and the
    result also has ``valid_fraction`` (the share of rows that were real transitions).
    """
    return run(_train, AutoresetMode.NEXT_STEP, total_steps, num_envs, seed, make_vector_env, num_workers,
               progress, torch_threads, hyperparams)


def _train(envs: Any, hp: Hyperparams, total_steps: int, n: int, seed: int, progress: bool) -> dict[str, Any]:
    """The PPO loop over ``envs.rollout`` batches of ``n`` rows (envs, or agents of
    ``examples/ppo_multiagent.py``)."""
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    agent = Agent(obs_dim, int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=hp.learning_rate, eps=1e-5)
    T = hp.num_steps
    iterations = total_steps // (T * n)

    running_return = np.zeros(n)
    valid_rows = 0

    envs.reset(seed=seed)
    steps = 0
    tracker = Tracker(hp, iterations * T * n, progress)
    for iteration in range(iterations):
        if hp.anneal_lr:
            optimizer.param_groups[0]["lr"] = hp.learning_rate * (1.0 - iteration / iterations)

        # 1. Collect: one call, T steps of every env, written in place.
        policy = TorchPolicy(agent)
        batch = envs.rollout(policy, num_steps=T)
        steps += T * n
        # A real transition: not the reset step after an episode end (nor, with a row per agent,
        # the row of an agent that has left its episode).
        valid = batch["valid"] & batch["active"] if "active" in batch else batch["valid"]
        valid_rows += int(valid.sum())
        for t in range(T):  # episode returns, from the rewards and flags
            running_return += np.where(valid[t], batch["rewards"][t], 0.0)
            ended = valid[t] & (batch["terminations"][t] | batch["truncations"][t])
            if ended.any():
                tracker.ended(running_return[ended])
                running_return[ended] = 0.0

        # 2. Advantages: invalid rows are skipped, truncations bootstrap from the next row.
        values = batch["value"]
        advantages, returns = shmvec.rollout_gae(
            batch, policy.value(batch["next_obs"]), gamma=hp.gamma, lam=hp.gae_lambda
        )

        # 3. Optimise on the valid rows only (a reset row's action did nothing).
        ppo_update(agent, optimizer, hp, batch["obs"][valid], batch["actions"][valid], batch["logprob"][valid],
                   advantages[valid], returns[valid], values[valid])

        # 4. Report.
        tracker.update_done(steps)
    return tracker.result(steps, valid_fraction=valid_rows / steps if steps else float("nan"))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    return cli(train, __doc__, argv)


if __name__ == "__main__":
    main()
