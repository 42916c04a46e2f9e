"""A vector env's batched spaces, built from its single spaces on first read.

Gymnasium's batched ``Box`` holds its bounds, and which of them are finite, as full arrays:
four times the bytes of one batch of observations (about 210 MB for 16 pistonball copies of
20 agents). Most training loops read only the single spaces, so the vector envs build the
batched ones when asked.
"""

from __future__ import annotations

from typing import Any

from gymnasium.vector.utils import batch_space

__all__ = ["BatchedSpace"]


class BatchedSpace:
    """A vector env attribute: ``batch_space(env.<single>, env.num_envs)``, built on first read.

    Assigning to it stores the assigned space instead, as for a plain attribute.

    Examples
    --------
    >>> class Envs:
    ...     observation_space = BatchedSpace("single_observation_space")
    """

    def __init__(self, single: str) -> None:
        self.single = single
        self.slot = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_batched_{name}"

    def __get__(self, env: Any, owner: type | None = None) -> Any:
        if env is None:
            return self
        space = env.__dict__.get(self.slot)
        if space is None:
            space = env.__dict__[self.slot] = batch_space(getattr(env, self.single), env.num_envs)
        return space

    def __set__(self, env: Any, space: Any) -> None:
        env.__dict__[self.slot] = space
