"""Synthetic environments with a chosen CPU cost per step and a chosen observation size.

They are what ``shmvec bench`` measures besides CartPole, shipped in the package so anyone can
reproduce the figures or build a workload of their own:

>>> from shmvec.envs import SyntheticEnv
>>> env = SyntheticEnv(obs_shape=(84, 84, 4), obs_dtype="uint8", step_us=0)
>>> obs, info = env.reset(seed=0)
>>> obs.shape, obs.dtype
((84, 84, 4), dtype('uint8'))

Every class is a plain :class:`gymnasium.Env` (no registration needed); importing this module
also registers ``shmvec/Synthetic-v0``, ``shmvec/AtariLike-v0``, ``shmvec/FixedCost-v0`` and
``shmvec/HeavyTail-v0`` for ``gymnasium.make``. A process that has not imported it (a
``spawn``/``forkserver`` worker) finds them through the module prefix form
``gym.make("shmvec.envs:shmvec/AtariLike-v0")``.

The step cost is real CPU work: a busy loop on the calling thread's CPU clock
(:func:`time.thread_time`). A CPU clock rather than a wall clock because a process that is
descheduled mid-step must not get its work done for free: with more processes than cores a
wall-clock loop would shrink the very work that oversubscribed engines have to fit in.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "AtariLikeEnv",
    "FixedCostEnv",
    "HeavyTailEnv",
    "SyntheticEnv",
    "burn_cpu",
    "register_envs",
]


def burn_cpu(us: float) -> None:
    """Spend ``us`` microseconds of this thread's CPU time in a busy loop."""
    if us <= 0:
        return
    end = time.thread_time() + us * 1e-6
    while time.thread_time() < end:
        pass


class SyntheticEnv(gym.Env):
    """An env whose step costs a set amount of CPU and returns an observation of a set size.

    Parameters
    ----------
    obs_shape : tuple of int, default (8,)
        Shape of one observation.
    obs_dtype : numpy dtype or str, default "float32"
        ``uint8`` gives ``Box(0, 255)`` image-like observations, a float dtype ``Box(-1, 1)``.
    step_us : float, default 0
        CPU microseconds a step spends (in a busy loop) on top of its own small overhead.
    slow_us : float, optional
        CPU microseconds of a *slow* step; a step is slow with probability ``slow_prob``,
        drawn from the env's ``np_random`` (so the sequence of slow steps follows the seed).
    slow_prob : float, default 0
        Probability that a step costs ``slow_us`` instead of ``step_us``.
    reset_us : float, optional
        CPU microseconds a reset spends; defaults to ``step_us``.
    episode_steps : int, default 1000
        Mean episode length. Each episode lasts a length drawn at reset, uniformly in
        ``[episode_steps // 2, 3 * episode_steps // 2]``, so vectorized copies end (and
        autoreset) at different times, as real envs do.
    num_actions : int, default 4
        Size of the ``Discrete`` action space.

    Notes
    -----
    Given the seed, observations, rewards, episode ends and which steps are slow are
    deterministic. A step writes one element of a state array (chosen by the step count,
    set from the action) and returns a copy of it: a fresh array per step, as real envs
    return, at the cost of one ``memcpy`` of the observation.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        obs_shape: tuple[int, ...] = (8,),
        obs_dtype: Any = "float32",
        step_us: float = 0.0,
        slow_us: float | None = None,
        slow_prob: float = 0.0,
        reset_us: float | None = None,
        episode_steps: int = 1000,
        num_actions: int = 4,
    ) -> None:
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.obs_dtype = np.dtype(obs_dtype)
        if step_us < 0 or (slow_us is not None and slow_us < 0):
            raise ValueError("step_us and slow_us must be >= 0")
        if not 0.0 <= slow_prob <= 1.0:
            raise ValueError(f"slow_prob must be in [0, 1], got {slow_prob}")
        if slow_prob > 0 and slow_us is None:
            raise ValueError("slow_prob > 0 needs slow_us")
        if episode_steps < 1:
            raise ValueError(f"episode_steps must be >= 1, got {episode_steps}")
        self.step_us = float(step_us)
        self.slow_us = None if slow_us is None else float(slow_us)
        self.slow_prob = float(slow_prob)
        self.reset_us = self.step_us if reset_us is None else float(reset_us)
        self.episode_steps = int(episode_steps)
        if self.obs_dtype == np.uint8:
            self.observation_space = spaces.Box(0, 255, shape=self.obs_shape, dtype=np.uint8)
        elif self.obs_dtype.kind == "f":
            self.observation_space = spaces.Box(-1.0, 1.0, shape=self.obs_shape, dtype=self.obs_dtype)
        else:
            raise ValueError(f"obs_dtype must be uint8 or a float dtype, got {self.obs_dtype}")
        self._num_actions = int(num_actions)
        self.action_space = spaces.Discrete(self._num_actions)
        self._state = np.zeros(self.obs_shape, dtype=self.obs_dtype)
        self._t = 0
        self._horizon = self.episode_steps
        self.slow_steps = 0  # how many slow steps this env has taken (handy for checks)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        burn_cpu(self.reset_us)
        rng = self.np_random
        if self.obs_dtype == np.uint8:
            self._state = rng.integers(0, 256, size=self.obs_shape, dtype=np.uint8)
        else:
            self._state = rng.uniform(-1.0, 1.0, size=self.obs_shape).astype(self.obs_dtype)
        self._t = 0
        lo = max(1, self.episode_steps // 2)
        self._horizon = int(rng.integers(lo, lo + self.episode_steps + 1))
        return self._state.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = int(action)
        if self.slow_prob > 0 and self.np_random.random() < self.slow_prob:
            self.slow_steps += 1
            burn_cpu(self.slow_us)  # type: ignore[arg-type]
        else:
            burn_cpu(self.step_us)
        self._t += 1
        flat = self._state.reshape(-1)
        if self.obs_dtype == np.uint8:
            flat[self._t % flat.size] = (a * 37 + self._t) & 0xFF
        else:
            flat[self._t % flat.size] = (a / max(1, self._num_actions - 1)) * 2.0 - 1.0
        reward = 1.0 if a == self._t % self._num_actions else 0.0
        terminated = self._t >= self._horizon
        return self._state.copy(), reward, terminated, False, {}


class AtariLikeEnv(SyntheticEnv):
    """Atari-shaped observations (``uint8`` 84x84x4, a stacked frame) and a near-free step.

    What an Atari pipeline costs a vector env besides the emulator: moving 28 KB per env
    per step. Keyword arguments are those of :class:`SyntheticEnv`.
    """

    def __init__(self, obs_shape: tuple[int, ...] = (84, 84, 4), step_us: float = 0.0, **kwargs: Any) -> None:
        kwargs.setdefault("obs_dtype", "uint8")
        kwargs.setdefault("num_actions", 6)
        super().__init__(obs_shape=obs_shape, step_us=step_us, **kwargs)


class FixedCostEnv(SyntheticEnv):
    """Every step spends ``step_us`` (default 100) CPU microseconds; small float observations.

    The workload where parallel stepping should pay: the env, not the plumbing, dominates.
    """

    def __init__(self, step_us: float = 100.0, **kwargs: Any) -> None:
        super().__init__(step_us=step_us, **kwargs)


class HeavyTailEnv(SyntheticEnv):
    """Uneven, heavy-tailed step times: most steps ``step_us`` (10), some ``slow_us`` (5000).

    By default 5 % of the steps are slow: the mean step costs about 260 us, but a vector
    step waits for its slowest env, so engines that balance work (or do not wait on the
    slowest process) pull ahead.
    """

    def __init__(self, step_us: float = 10.0, slow_us: float = 5000.0, slow_prob: float = 0.05, **kwargs: Any) -> None:
        super().__init__(step_us=step_us, slow_us=slow_us, slow_prob=slow_prob, **kwargs)


_REGISTERED = {
    "shmvec/Synthetic-v0": "shmvec.envs:SyntheticEnv",
    "shmvec/AtariLike-v0": "shmvec.envs:AtariLikeEnv",
    "shmvec/FixedCost-v0": "shmvec.envs:FixedCostEnv",
    "shmvec/HeavyTail-v0": "shmvec.envs:HeavyTailEnv",
}


def register_envs() -> None:
    """Register the synthetic envs with Gymnasium (done on import; safe to call again)."""
    for env_id, entry_point in _REGISTERED.items():
        if env_id not in gym.registry:
            # No TimeLimit: the envs end their own episodes. No env checker: it would add a
            # wrapper's cost to every step of a benchmark env.
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True)


register_envs()
