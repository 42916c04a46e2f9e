"""The per-core reference: a plain Python loop over the raw envs in the calling process."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["SerialLoop"]


class SerialLoop:
    """Step ``num_envs`` envs one after the other, resetting each when its episode ends.

    No batching, no copies, no processes: the least work any engine could do per env step on
    one core, so ``engine steps/s / serial steps/s`` says what an engine gains (or costs)
    over writing the loop yourself.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]]) -> None:
        self.envs = []
        try:
            for fn in env_fns:
                self.envs.append(fn())
        except BaseException:
            self.close()
            raise
        self.num_envs = len(self.envs)

    def reset(self, seed: int | None = None) -> list[Any]:
        """Reset every env (env ``i`` with ``seed + i``); returns the list of observations."""
        return [env.reset(seed=None if seed is None else seed + i)[0] for i, env in enumerate(self.envs)]

    def step(self, actions: Any) -> None:
        """Step env ``i`` with ``actions[i]``; the results are dropped (a reference needs no more)."""
        for env, action in zip(self.envs, actions):
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []
