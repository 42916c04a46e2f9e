"""PPO on CartPole-v1 with shmvec: a CleanRL-style loop, readable top to bottom.

    python examples/ppo_cartpole.py                       # 500k steps, 8 envs, seed 1
    python examples/ppo_cartpole.py --total-steps 50000 --num-envs 4 --seed 3

What shmvec brings to the loop:

* ``shmvec.ShmVecEnv`` steps the envs in shared memory, with SAME_STEP autoreset: an env whose
  episode ends is reset within the step, and its final observation comes in
  ``infos["final_obs"]``.
* ``shmvec.gae`` computes advantages with the correct bootstrap at a time limit: CartPole
  truncates episodes at 500 steps, and the value of such an episode's final observation
  (``final_values``) is what the return is bootstrapped from, not 0 (the episode did not fail).
* ``envs.episode_returns`` / ``envs.episode_counts``: the workers count episode returns, no
  wrapper needed.

Needs torch (``pip install 'shmvec[torch]'``). Import it and call :func:`train` to run it
from code; ``make_vector_env`` swaps the vector env (the benchmark passes Gymnasium's
``AsyncVectorEnv``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from torch import nn
from torch.distributions import Categorical

import shmvec

VectorEnvFactory = Callable[[Sequence[Callable[[], gym.Env]], AutoresetMode], VectorEnv]


@dataclass
class Hyperparams:
    """PPO's settings: CleanRL's for CartPole, with the same batch over 8 envs instead of 4."""

    env_id: str = "CartPole-v1"
    num_steps: int = 64  # steps per env per rollout: 8 x 64 = 512 per batch, as CleanRL's 4 x 128
    learning_rate: float = 2.5e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    return_window: int = 20  # episodes in the moving average that is reported
    target_return: float = 475.0  # train() records the first step at which the average reaches it


# -- the agent ----------------------------------------------------------------------------------


def layer(n_in: int, n_out: int, std: float = np.sqrt(2)) -> nn.Linear:
    """A linear layer with orthogonal weights and zero biases (PPO's usual initialisation)."""
    lin = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, 0.0)
    return lin


class Agent(nn.Module):
    """Separate actor and critic MLPs, two hidden layers of 64 tanh units each."""

    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, std=1.0))
        self.actor = nn.Sequential(
            layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, n_actions, std=0.01)
        )

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def act(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        """Sample an action (or score ``action``): ``(action, log_prob, entropy, value)``."""
        dist = Categorical(logits=self.actor(obs))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.value(obs)


# -- vector envs --------------------------------------------------------------------------------


def shmvec_factory(num_workers: int | None = None) -> VectorEnvFactory:
    """The default vector env: a :class:`shmvec.ShmVecEnv`."""

    def make(env_fns: Sequence[Callable[[], gym.Env]], autoreset_mode: AutoresetMode) -> VectorEnv:
        return shmvec.ShmVecEnv(env_fns, num_workers=num_workers, autoreset_mode=autoreset_mode)

    return make


class MakeEnv:
    """A picklable env factory (spawned and forkserver workers need one)."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id

    def __call__(self) -> gym.Env:
        return gym.make(self.env_id)


class Tracker:
    """A run's episode returns and progress: the statistics :func:`train` returns."""

    def __init__(self, hp: Hyperparams, total_steps: int, progress: bool) -> None:
        self.hp, self.total_steps, self.progress = hp, total_steps, progress
        self.recent: deque[float] = deque(maxlen=hp.return_window)
        self.history: list[tuple[int, float]] = []
        self.best_avg, self.step_at_target, self.episodes = -np.inf, None, 0
        self.start = time.perf_counter()

    def ended(self, returns: np.ndarray) -> None:
        """Record the returns of episodes that just ended."""
        self.recent.extend(returns.tolist())
        self.episodes += len(returns)

    def update_done(self, steps: int) -> None:
        """After each rollout and update: the moving average, and the progress line."""
        avg = float(np.mean(self.recent)) if self.recent else float("nan")
        self.history.append((steps, avg))
        if len(self.recent) == self.recent.maxlen:
            self.best_avg = max(self.best_avg, avg)
            if self.step_at_target is None and avg >= self.hp.target_return:
                self.step_at_target = steps
        if self.progress:
            rate = steps / (time.perf_counter() - self.start)
            print(f"\rstep {steps:>8,}/{self.total_steps:,}  avg return {avg:6.1f}  {rate:7,.0f} steps/s",
                  end="", file=sys.stderr, flush=True)

    def result(self, steps: int, **extra: Any) -> dict[str, Any]:
        wall = time.perf_counter() - self.start
        if self.progress:
            print(file=sys.stderr)
        return {
            "steps": steps,
            "episodes": self.episodes,
            "wall_time_s": wall,
            "steps_per_s": steps / wall if wall > 0 else float("nan"),
            "avg_return": float(np.mean(self.recent)) if self.recent else float("nan"),
            "best_avg_return": float(self.best_avg),
            "step_at_target": self.step_at_target,
            "history": self.history,
            "hyperparams": asdict(self.hp),
            **extra,
        }


# -- training -----------------------------------------------------------------------------------


def train(
    total_steps: int = 500_000,
    num_envs: int = 8,
    seed: int = 1,
    *,
    make_vector_env: VectorEnvFactory | None = None,
    num_workers: int | None = None,
    progress: bool = True,
    torch_threads: int | None = None,
    **hyperparams: Any,
) -> dict[str, Any]:
    """Train PPO and return statistics of the run.

    Parameters
    ----------
    total_steps : int
        Env steps in all (over all envs); rounded down to whole rollouts.
    num_envs : int
        Envs stepped together.
    seed : int
        Seeds torch and the envs (env ``i`` gets ``seed + i``).
    make_vector_env : callable, optional
        ``make_vector_env(env_fns, autoreset_mode) -> VectorEnv``; default
        :func:`shmvec_factory` ``(num_workers)``. It must honour ``AutoresetMode.SAME_STEP``.
    num_workers : int, optional
        For the default factory: ``ShmVecEnv``'s ``num_workers``.
    progress : bool
        Print a progress line (rewritten in place) to stderr.
    torch_threads : int, optional
        ``torch.set_num_threads`` if given; ``None`` (the default) leaves torch as users run it
        (``ShmVecEnv(torch_threads="auto")`` lowers its threads while a rollout is collected).
    **hyperparams
        Fields of :class:`Hyperparams` to override.

    Returns
    -------
    dict
        ``steps``, ``episodes``, ``wall_time_s``, ``steps_per_s``, ``avg_return`` (mean return
        of the last ``return_window`` episodes at the end), ``best_avg_return``,
        ``step_at_target`` (first step at which the average reached ``target_return``, or
        ``None``), ``history`` (``(step, avg_return)`` after each rollout) and ``hyperparams``.
    """
    return run(_train, AutoresetMode.SAME_STEP, total_steps, num_envs, seed, make_vector_env, num_workers,
               progress, torch_threads, hyperparams)


def run(loop: Callable[..., dict[str, Any]], autoreset_mode: AutoresetMode, total_steps: int, num_envs: int,
        seed: int, make_vector_env: Callable[..., Any] | None, num_workers: int | None, progress: bool,
        torch_threads: int | None, hyperparams: dict[str, Any]) -> dict[str, Any]:
    """The set-up the PPO examples share: settings, torch threads and seed, the vector env (closed
    at the end), then ``loop(envs, hp, total_steps, num_envs, seed, progress)``."""
    hp = Hyperparams(**hyperparams)
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    torch.manual_seed(seed)
    make_vector_env = make_vector_env or shmvec_factory(num_workers)
    envs = make_vector_env([MakeEnv(hp.env_id)] * num_envs, autoreset_mode)
    try:
        return loop(envs, hp, total_steps, num_envs, seed, progress)
    finally:
        envs.close()


def ppo_update(agent: Agent, optimizer: torch.optim.Optimizer, hp: Hyperparams, obs: np.ndarray,
               actions: np.ndarray, logprobs: np.ndarray, advantages: np.ndarray, returns: np.ndarray,
               values: np.ndarray) -> None:
    """``update_epochs`` passes of the clipped surrogate objective over ``num_minibatches``
    shuffled minibatches of the flat batch (one row per transition, any number of rows)."""
    b_obs, b_actions, b_logprobs, b_adv, b_returns, b_values = (
        torch.from_numpy(np.ascontiguousarray(x)) for x in (obs, actions, logprobs, advantages, returns, values))
    for _ in range(hp.update_epochs):
        # Near-equal minibatches: a ragged one-row tail would have no advantage std.
        for mb in torch.randperm(len(b_obs)).tensor_split(hp.num_minibatches):
            _, new_logprob, entropy, new_value = agent.act(b_obs[mb], b_actions[mb])
            ratio = (new_logprob - b_logprobs[mb]).exp()
            adv = b_adv[mb]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - hp.clip_coef, 1 + hp.clip_coef)).mean()
            if hp.clip_vloss:
                clipped = b_values[mb] + (new_value - b_values[mb]).clamp(-hp.clip_coef, hp.clip_coef)
                v_loss = 0.5 * torch.max((new_value - b_returns[mb]) ** 2, (clipped - b_returns[mb]) ** 2).mean()
            else:
                v_loss = 0.5 * ((new_value - b_returns[mb]) ** 2).mean()
            loss = pg_loss - hp.ent_coef * entropy.mean() + hp.vf_coef * v_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), hp.max_grad_norm)
            optimizer.step()


def _train(envs: VectorEnv, hp: Hyperparams, total_steps: int, n: int, seed: int, progress: bool) -> dict[str, Any]:
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    agent = Agent(obs_dim, int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=hp.learning_rate, eps=1e-5)

    T = hp.num_steps
    batch_size = T * n
    iterations = total_steps // batch_size
    # The rollout, time-major [T, N] as shmvec.gae wants it.
    obs_buf = np.zeros((T, n, obs_dim), np.float32)
    actions = np.zeros((T, n), np.int64)
    logprobs = np.zeros((T, n), np.float32)
    values = np.zeros((T, n), np.float32)
    rewards = np.zeros((T, n), np.float32)
    terminated = np.zeros((T, n), bool)
    truncated = np.zeros((T, n), bool)
    final_values = np.zeros((T, n), np.float32)  # V(final obs), read only where truncated

    # shmvec counts episode returns in its workers; other vector envs get them summed here.
    own_stats = not hasattr(envs, "episode_returns")
    running_return = np.zeros(n)

    obs, _ = envs.reset(seed=seed)
    steps = 0
    tracker = Tracker(hp, iterations * batch_size, progress)
    for iteration in range(iterations):
        if hp.anneal_lr:
            optimizer.param_groups[0]["lr"] = hp.learning_rate * (1.0 - iteration / iterations)

        # 1. Collect a rollout.
        for t in range(T):
            obs_buf[t] = obs
            with torch.no_grad():
                action, logprob, _, value = agent.act(torch.from_numpy(obs_buf[t]))
            actions[t], logprobs[t], values[t] = action.numpy(), logprob.numpy(), value.numpy()
            obs, rewards[t], terminated[t], truncated[t], infos = envs.step(actions[t])
            ended = terminated[t] | truncated[t]
            if own_stats:
                running_return += rewards[t]
            if ended.any():
                # Truncated episodes are bootstrapped from the value of their final observation
                # (obs already holds the next episode's first one: SAME_STEP autoreset).
                cut = np.flatnonzero(truncated[t] & ~terminated[t])
                if len(cut):
                    final_obs = torch.from_numpy(np.stack(infos["final_obs"][cut]).astype(np.float32))
                    with torch.no_grad():
                        final_values[t, cut] = agent.value(final_obs).numpy()
                tracker.ended(running_return[ended] if own_stats else envs.episode_returns[ended])
                running_return[ended] = 0.0
        steps += batch_size

        # 2. Advantages: GAE with the truncation bootstrap (the Numba kernel).
        with torch.no_grad():
            last_values = agent.value(torch.from_numpy(np.asarray(obs, dtype=np.float32))).numpy()
        advantages, returns = shmvec.gae(
            rewards, values, terminated, truncated, last_values,
            final_values=final_values, gamma=hp.gamma, lam=hp.gae_lambda,
        )  # fmt: skip

        # 3. Optimise the clipped surrogate objective on shuffled minibatches.
        ppo_update(agent, optimizer, hp, obs_buf.reshape(batch_size, obs_dim), actions.reshape(-1),
                   logprobs.reshape(-1), advantages.reshape(-1), returns.reshape(-1), values.reshape(-1))

        # 4. Report.
        tracker.update_done(steps)
    return tracker.result(steps)


def report(stats: dict[str, Any]) -> str:
    """One line summing up a run of :func:`train`."""
    reached = stats["step_at_target"]
    return (
        f"{stats['steps']:,} steps in {stats['wall_time_s']:.1f} s ({stats['steps_per_s']:,.0f} steps/s), "
        f"{stats['episodes']} episodes; average return of the last {stats['hyperparams']['return_window']}: "
        f"{stats['avg_return']:.1f} (best {stats['best_avg_return']:.1f}); "
        + (f"reached {stats['hyperparams']['target_return']:g} at step {reached:,}" if reached else "target not reached")
    )


def cli(train_fn: Callable[..., dict[str, Any]], description: str, argv: Sequence[str] | None) -> dict[str, Any]:
    """The command line of a PPO example: parse, train with ``train_fn``, print the report."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=500_000)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-workers", type=int, default=None, help="ShmVecEnv num_workers (default: the cores)")
    args = parser.parse_args(argv)
    stats = train_fn(args.total_steps, args.num_envs, args.seed, num_workers=args.num_workers)
    print(report(stats))
    return stats


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    return cli(train, __doc__, argv)


if __name__ == "__main__":
    main()
