"""``shmvec.make``: a :class:`~shmvec.ShmVecEnv` of copies of a registered Gymnasium env."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from shmvec.checks import positive_int
from shmvec.errors import WorkerError
from shmvec.options import Options
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


# The keywords that configure the vector env; any other keyword of make() goes to gymnasium.make.
VECTOR_OPTIONS = frozenset(Options.names())


def make(
    env_id: str,
    num_envs: int = 1,
    vectorization_mode: str | None = None,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] | None = None,
    *,
    env_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> ShmVecEnv:
    """Create a :class:`ShmVecEnv` of ``num_envs`` copies of a registered Gymnasium env, with
    the call shape of ``gymnasium.make_vec``.

    >>> import shmvec
    >>> envs = shmvec.make("CartPole-v1", num_envs=8, num_workers=2)
    >>> envs.num_envs
    8
    >>> envs.close()
    >>> envs = shmvec.make("CartPole-v1", 2, render_mode="rgb_array", max_episode_steps=50,
    ...                    vector_kwargs={"num_workers": 1})
    >>> envs.render_mode, envs.get_attr("spec")[0].max_episode_steps
    ('rgb_array', 50)
    >>> envs.close()

    Parameters
    ----------
    env_id : str
        A registered env id (``"module:Env-v0"`` imports ``module`` first, as ``gymnasium.make``).
    num_envs : int, default 1
    vectorization_mode : {None, "async"}
        Accepted for ``make_vec``'s call shape: shmvec always steps its envs in worker processes.
    vector_kwargs : dict, optional
        :class:`ShmVecEnv`'s options (``num_workers``, ``autoreset_mode``, ...).
    wrappers : sequence of callables, optional
        Applied to each env in order, in its worker.
    env_kwargs : dict, optional
        Keyword arguments of ``gymnasium.make``, as a dict.
    **kwargs
        Each keyword that is a :class:`ShmVecEnv` option goes there (``num_workers=2``); any
        other goes to ``gymnasium.make`` (``render_mode=``, ``max_episode_steps=``, the env's own
        arguments), as ``make_vec`` passes them.

    Raises
    ------
    TypeError
        A keyword that is neither a ShmVecEnv option nor an argument the env takes: the message
        says where each kind belongs.
    """
    positive_int(num_envs, "num_envs")
    if vectorization_mode not in (None, "async"):
        raise ValueError(
            f"shmvec.make(vectorization_mode={vectorization_mode!r}): shmvec always steps its envs in worker "
            "processes; leave it out (or pass 'async'), and use gymnasium.make_vec for the other modes"
        )
    options = dict(vector_kwargs or {})
    gym_kwargs = dict(env_kwargs or {})
    for name, value in kwargs.items():
        (options if name in VECTOR_OPTIONS else gym_kwargs)[name] = value
    factory = _MakeEnv(env_id, gym_kwargs, wrappers)
    try:
        return ShmVecEnv([factory] * num_envs, **options)
    except WorkerError as exc:
        wrong = [name for name in gym_kwargs if f"'{name}'" in exc.remote_message]
        if exc.phase != "construct" or exc.exc_type != "TypeError" or not wrong:
            raise
        options_list = ", ".join(sorted(VECTOR_OPTIONS))
        raise TypeError(
            f"shmvec.make({env_id!r}): {wrong[0]!r} is neither an option of ShmVecEnv ({options_list}) "
            f"nor an argument that {env_id} takes (gymnasium.make raised: {exc.remote_message})"
        ) from exc
