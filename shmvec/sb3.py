"""Stable-Baselines3's ``SubprocVecEnv``, on shmvec: change the import, keep the rest.

>>> from shmvec.sb3 import SubprocVecEnv          # instead of stable_baselines3's
>>> from stable_baselines3.common.env_util import make_vec_env
>>> venv = make_vec_env("CartPole-v1", n_envs=4, seed=0, vec_env_cls=SubprocVecEnv)
>>> venv.reset().shape
(4, 4)
>>> venv.close()

This module imports SB3 (and so torch); ``import shmvec`` never imports it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from shmvec._adapters import EnvSideFactory, Failure, batched_actions, env_indices, env_info, list_infos
from shmvec.options import passed_on
from shmvec.vector_env import ShmVecEnv

__all__ = ["PettingZooVecEnv", "SubprocVecEnv"]

# The ShmVecEnv options that SB3's semantics decide, and why.
_FIXED = {
    "autoreset_mode": "SB3 resets an env within the step that ends its episode (SAME_STEP)",
    "copy": "SB3 hands the arrays to user code and replay buffers, so they must be owned",
    "context": "pass start_method= instead",
    "batch_size": "SB3 steps every env in every step",
}


class SubprocVecEnv(VecEnv):
    """A drop-in replacement of SB3's ``SubprocVecEnv`` over a :class:`~shmvec.ShmVecEnv`.

    Same contract as SB3's: ``reset()`` returns the observations only (infos in
    :attr:`reset_infos`), ``step`` returns ``(obs, rewards, dones, infos)`` with one info dict
    per env; an env whose episode ends is reset in the same step, its final observation in
    ``info["terminal_observation"]`` and ``info["TimeLimit.truncated"]`` set (that key is in
    every info, as SB3 does). Seeds from :meth:`seed` and options from :meth:`set_options` are
    used at the next ``reset`` only. Works with ``make_vec_env(..., vec_env_cls=SubprocVecEnv)``
    and under ``VecNormalize``, ``VecFrameStack``, ``VecMonitor``.

    Parameters
    ----------
    env_fns : list of callables
        Factories returning Gymnasium envs (OpenAI Gym envs are converted as SB3 does).
    start_method : str, optional
        ``multiprocessing`` start method. Default: shmvec's per-start policy (fork while the
        calling process runs one thread, else forkserver; see :class:`~shmvec.ShmVecEnv`), not
        SB3's ``forkserver`` for every start: a forked worker starts in milliseconds.
    num_workers : int, optional
        Env blocks stepped in parallel (default: the usable cores, at most ``len(env_fns)``).
        SB3 starts one process per env; shmvec steps several envs per process.
    validate_actions : bool, default False
        Check actions against the action space before stepping. Off by default because SB3
        passes actions to the envs unchecked, and code that relies on that should not break.
    **shmvec_kwargs
        Any other :class:`~shmvec.ShmVecEnv` option (:class:`shmvec.options.Options`), but
        those this class sets itself: ``autoreset_mode``, ``copy``, ``context`` and
        ``batch_size`` (a ``TypeError`` says why).

    Attributes
    ----------
    vector_env : ShmVecEnv
        The Gymnasium vector env underneath (``episode_returns``, ``restarts``, ...).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        start_method: str | None = None,
        *,
        num_workers: int | None = None,
        validate_actions: bool = False,
        **shmvec_kwargs: Any,
    ) -> None:
        passed_on(type(self).__name__, shmvec_kwargs, _FIXED)
        self.waiting = False
        self.closed = False
        self._actions: Any = None
        options = dict(
            num_workers=num_workers,
            autoreset_mode=AutoresetMode.SAME_STEP,  # SB3's semantics: reset within the step
            copy=True,  # SB3 hands the arrays to user code and replay buffers: they must be owned
            context=start_method,
            validate_actions=validate_actions,
            **shmvec_kwargs,
        )
        self.vector_env = self._build(list(env_fns), options)
        venv = self.vector_env
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)

    def _build(self, env_fns: list[Callable[[], Any]], options: dict[str, Any]) -> Any:
        """The vector env whose rows are SB3's envs; sets where per-env requests run
        (``_copies``, the ShmVecEnv whose envs answer them, ``_rows_per_copy`` rows each).
        """
        # The envs are wrapped so that per-env requests (indices=...) run in the workers.
        venv = ShmVecEnv([EnvSideFactory(fn, i) for i, fn in enumerate(env_fns)], **options)
        self._copies, self._rows_per_copy = venv, 1
        return venv

    # -- stepping ------------------------------------------------------------------------
    def reset(self) -> VecEnvObs:
        """Reset every env (with the seeds and options set since the last reset) and return
        the observations; the reset infos go to :attr:`reset_infos`.
        """
        venv, n = self.vector_env, self.num_envs
        seeds = None if all(s is None for s in self._seeds) else list(self._seeds)
        groups = _option_groups(self._options)
        if len(groups) == 1 and not groups[0][0]:
            obs, infos = venv.reset(seed=seeds)
            reset_infos = [env_info(infos, i) for i in range(n)] if infos else [{} for _ in range(n)]
        else:
            # Different options per env: one masked reset per distinct options dict.
            reset_infos = [{} for _ in range(n)]
            for options, mask in groups:
                obs, infos = venv.reset(seed=seeds, options={**options, "reset_mask": mask})
                for i in np.flatnonzero(mask):
                    reset_infos[i] = env_info(infos, int(i))
        self.reset_infos = reset_infos
        self.waiting = False
        # Seeds and options are used once, as in SB3.
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        """Remember the actions (``actions[i]`` for env ``i``); :meth:`step_wait` steps every env with them."""
        self._actions = batched_actions(self.action_space, actions, self.num_envs)
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        """Step every env with the actions of :meth:`step_async`; ``(obs, rewards, dones, infos)``."""
        obs, rewards, terminated, truncated, infos = self.vector_env.step(self._actions)
        self.waiting = False
        self._actions = None
        return obs, rewards, terminated | truncated, list_infos(infos, terminated, truncated, self.reset_infos)

    def close(self) -> None:
        """Stop the workers and close the envs (safe to call twice)."""
        if self.closed:
            return
        self.vector_env.close()
        self.closed = True
        self.waiting = False

    # -- rendering -----------------------------------------------------------------------
    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` frame, when the envs were made with ``render_mode="rgb_array"``."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        return list(self.vector_env.render())

    # -- attributes and methods of the envs ------------------------------------------------
    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has the attribute ``attr_name`` (through its wrappers)."""
        return all(self._request(None, "has_attr", (attr_name,)))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """The attribute ``attr_name`` of each env in ``indices`` (all by default)."""
        return self._request(indices, "get_attr", (attr_name,))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set ``attr_name`` to ``value`` on the outermost wrapper of each env, as SB3 does."""
        self._request(indices, "set_attr", (attr_name, value))

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call method ``method_name`` of each env in ``indices``; one result per env."""
        return self._request(indices, "env_method", (method_name, method_args, method_kwargs))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether each env in ``indices`` has a ``wrapper_class`` in its wrapper chain."""
        return self._request(indices, "is_wrapped", (wrapper_class,))

    def _request(self, indices: VecEnvIndices, op: str, args: tuple) -> list[Any]:
        """Run ``op`` in the envs ``indices`` (in that order, repeats allowed) and gather results."""
        targets = env_indices(indices, self.num_envs)
        if not targets:
            return []
        copies = [i // self._rows_per_copy for i in targets]  # the env each row belongs to
        replies = self._copies.call("shmvec_request", tuple(copies), op, args)
        pending = {c: iter(replies[c]) for c in set(copies)}
        results = [next(pending[c]) for c in copies]
        for i, result in zip(targets, results):
            if isinstance(result, Failure):
                result.reraise(i)
        return results


def _option_groups(options: list[dict[str, Any]]) -> list[tuple[dict[str, Any], np.ndarray]]:
    """The distinct options dicts of ``options`` (one per env), each with its envs' mask."""
    groups: list[tuple[dict[str, Any], np.ndarray]] = []
    for i, opts in enumerate(options):
        opts = opts or {}
        for known, mask in groups:
            try:
                same = known == opts
            except Exception:  # values without a plain == (arrays): treat them as distinct
                same = known is opts
            if same:
                mask[i] = True
                break
        else:
            mask = np.zeros(len(options), dtype=bool)
            mask[i] = True
            groups.append((opts, mask))
    return groups


class PettingZooVecEnv(SubprocVecEnv):
    """SB3's ``VecEnv`` over PettingZoo parallel envs, one env per agent: parameter sharing.

    A :class:`~shmvec.pettingzoo.MultiAgentVecEnv` underneath: env ``i * A + j`` of the VecEnv
    is agent ``j`` of copy ``i`` (``A`` agents per copy), with SB3's contract as in
    :class:`SubprocVecEnv` (an episode that ends is reset within the step, its rows'
    ``terminal_observation`` in their infos; an agent that left early keeps a zero observation
    and ``info["active"] = False``: see ``docs/multiagent.md``). Per-env requests
    (``get_attr``, ``set_attr``, ``env_method`` with ``indices``) reach the PettingZoo env of each
    row's copy. Seeds from :meth:`seed` seed each copy with its first row's seed.

    >>> from mpe2 import simple_spread_v3
    >>> from shmvec.sb3 import PettingZooVecEnv
    >>> venv = PettingZooVecEnv([lambda: simple_spread_v3.parallel_env(N=3)] * 2, num_workers=1)
    >>> venv.reset().shape
    (6, 18)
    >>> venv.close()

    Parameters
    ----------
    env_fns : list of callables
        Factories returning PettingZoo parallel (or AEC) envs whose agents share their spaces.
    start_method, num_workers, validate_actions, **shmvec_kwargs
        As for :class:`SubprocVecEnv`.
    """

    def _build(self, env_fns: list[Callable[[], Any]], options: dict[str, Any]) -> Any:
        from shmvec.pettingzoo import MultiAgentVecEnv

        venv = MultiAgentVecEnv(env_fns, copy_wrapper=EnvSideFactory, **options)
        self._copies, self._rows_per_copy = venv.vector_env, venv.agents_per_copy
        return venv
