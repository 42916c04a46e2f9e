"""``shmvec.make``: a :class:`~shmvec.ShmVecEnv` of copies of a registered Gymnasium env."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from shmvec.checks import positive_int
from shmvec.vector_env import ShmVecEnv

__all__ = ["make"]


class _MakeEnv:
    """A picklable ``gym.make`` call (plus wrappers) for one env."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], wrappers: Sequence[Callable] | None) -> None:
        self.env_id, self.env_kwargs, self.wrappers = env_id, env_kwargs, list(wrappers or [])

    def __call__(self) -> gym.Env:
        env = gym.make(self.env_id, **self.env_kwargs)
        for wrapper in self.wrappers:
            env = wrapper(env)
        return env


def make(
    env_id: str,
    num_envs: int = 1,
    *,
    env_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] | None = None,
    **vector_kwargs: Any,
) -> ShmVecEnv:
    """Create a :class:`ShmVecEnv` of ``num_envs`` copies of a registered Gymnasium env.

    >>> import shmvec
    >>> envs = shmvec.make("CartPole-v1", num_envs=8, num_workers=2)
    >>> envs.num_envs
    8
    >>> envs.close()

    ``env_kwargs`` go to ``gymnasium.make``; ``wrappers`` are applied to each env in order;
    everything else goes to :class:`ShmVecEnv`.
    """
    positive_int(num_envs, "num_envs")
    factory = _MakeEnv(env_id, dict(env_kwargs or {}), wrappers)
    return ShmVecEnv([factory] * num_envs, **vector_kwargs)
