"""``BaselinesVecEnv``: the classic ``SubprocVecEnv`` API (OpenAI baselines, easy-rl, many tutorials) on shmvec.

Not to be confused with SB3's ``SubprocVecEnv``, which is :class:`shmvec.sb3.SubprocVecEnv`.
``shmvec.SubprocVecEnv`` (and ``shmvec.baselines.SubprocVecEnv``) is this class under its
classic name, so that code written for baselines only changes its import.

>>> import gymnasium as gym
>>> from shmvec import BaselinesVecEnv
>>> envs = BaselinesVecEnv([lambda: gym.make("CartPole-v1") for _ in range(4)])
>>> obs = envs.reset()
>>> obs, rews, dones, infos = envs.step([0, 1, 0, 1])
>>> obs.shape, rews.shape, dones.dtype, len(infos)
((4, 4), (4,), dtype('bool'), 4)
>>> envs.close()

Semantics of the classic API, which Gymnasium envs are fitted into:

* ``done = terminated or truncated``;
* an env whose episode is done is reset within the same ``step``: the observation returned
  for it is the first one of the new episode, the episode's last one is in
  ``info["terminal_observation"]`` and ``info["TimeLimit.truncated"]`` says whether the
  episode was cut by a time limit (``truncated and not terminated``); both keys appear only
  in the infos of envs that are done;
* ``reset()`` returns the observations only (reset infos are dropped, as in the classic API).

No SB3 or torch is needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from shmvec._adapters import batched_actions, list_infos
from shmvec.checks import positive_int
from shmvec.options import passed_on
from shmvec.vector_env import ShmVecEnv

__all__ = ["BaselinesVecEnv", "SubprocVecEnv"]

# The ShmVecEnv options that the classic API decides, and why.
_FIXED = {
    "autoreset_mode": "the classic API resets an env within the step that ends its episode (SAME_STEP)",
    "batch_size": "the classic API steps every env in every step",
}


class BaselinesVecEnv:
    """The classic four-tuple vectorized env over a :class:`~shmvec.ShmVecEnv`.

    Parameters
    ----------
    env_fns : sequence of callables
        Factories returning Gymnasium envs.
    spaces : ignored
        Accepted for compatibility with the classic signature
        ``SubprocVecEnv(env_fns, spaces=None)``; the spaces are read from the envs.
    context : str, optional
        ``multiprocessing`` start method (default: shmvec's per-start policy, as in :class:`~shmvec.ShmVecEnv`).
    in_series : int, default 1
        As in OpenAI baselines: envs stepped one after the other by each process. Makes blocks
        of ``in_series`` envs (``ceil(len(env_fns) / in_series)`` of them, the calling process's
        one included with ``step_in_main=True``) unless ``num_workers`` is given. (The
        classic default, one process per env, is not shmvec's: with ``in_series=1`` and no
        ``num_workers``, shmvec uses one block per usable core.)
    num_workers : int, optional
        Worker processes, each stepping a block of envs; see :class:`~shmvec.ShmVecEnv`.
    **shmvec_kwargs
        Any other :class:`~shmvec.ShmVecEnv` option (:class:`shmvec.options.Options`), but
        ``autoreset_mode`` and ``batch_size``, which this class sets (a ``TypeError`` says why).

    Attributes
    ----------
    num_envs, nenvs : int
        Number of envs.
    observation_space, action_space : gymnasium.Space
        The spaces of one env (not batched), as in the classic API.
    vector_env : ShmVecEnv
        The Gymnasium vector env underneath.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        spaces: Any = None,
        context: str | None = None,
        in_series: int = 1,
        *,
        num_workers: int | None = None,
        **shmvec_kwargs: Any,
    ) -> None:
        del spaces  # classic signature only
        passed_on("BaselinesVecEnv", shmvec_kwargs, _FIXED)
        env_fns = list(env_fns)
        in_series = positive_int(in_series, "in_series")
        if num_workers is None and in_series > 1:
            # Blocks of in_series envs, whoever steps them.
            num_workers = math.ceil(len(env_fns) / in_series) - bool(shmvec_kwargs.get("step_in_main"))
        self.waiting = False
        self.closed = False
        self._actions: Any = None
        # SAME_STEP is the classic semantics: reset in the step, final obs in the infos.
        self.vector_env = ShmVecEnv(
            env_fns, num_workers=num_workers, autoreset_mode=AutoresetMode.SAME_STEP, context=context, **shmvec_kwargs
        )
        self.num_envs = self.nenvs = self.vector_env.num_envs
        self.observation_space = self.vector_env.single_observation_space
        self.action_space = self.vector_env.single_action_space

    def reset(self, seed: int | Sequence[int | None] | None = None) -> Any:
        """Reset every env and return the batched observations.

        ``seed`` (an extension of the classic API): an int seeds env ``i`` with ``seed + i``;
        a list gives one seed per env.
        """
        obs, _ = self.vector_env.reset(seed=seed)
        self.waiting = False
        return obs

    def step_async(self, actions: Any) -> None:
        """Remember the actions (``actions[i]`` for env ``i``); :meth:`step_wait` steps every env with them."""
        self._actions = batched_actions(self.action_space, actions, self.num_envs)
        self.waiting = True

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Step with the actions of :meth:`step_async`; ``(obs, rews, dones, infos)``."""
        obs, rews, terminated, truncated, infos = self.vector_env.step(self._actions)
        self.waiting = False
        self._actions = None
        return obs, rews, terminated | truncated, list_infos(infos, terminated, truncated, time_limit_always=False)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Step every env: ``(obs, rews, dones, infos)``, done envs reset (see the module doc)."""
        self.step_async(actions)
        return self.step_wait()

    def get_images(self) -> list[Any]:
        """Each env's ``render()`` result (frames with ``render_mode="rgb_array"``)."""
        return list(self.vector_env.render())

    def close(self) -> None:
        """Stop the workers and close the envs (safe to call twice)."""
        if self.closed:
            return
        self.vector_env.close()
        self.closed = True

    def __len__(self) -> int:
        return self.num_envs

    def __enter__(self) -> BaselinesVecEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


# The classic name, for code ported from baselines (``from shmvec import SubprocVecEnv``).
SubprocVecEnv = BaselinesVecEnv
