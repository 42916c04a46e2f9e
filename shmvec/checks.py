"""Argument checks shared by the vector envs, the GAE kernel and the benchmark report.

Each check lives here once, so every class words the same mistake the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

__all__ = ["env_factories", "parse_autoreset_mode", "positive_int", "seeds_per_env", "usable_cores"]


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask where the OS has one
    (``os.process_cpu_count`` from Python 3.13, ``os.sched_getaffinity`` on Linux), else every
    core of the machine (``os.cpu_count``: macOS, Windows before 3.13).
    """
    process_cpu_count = getattr(os, "process_cpu_count", None)
    if process_cpu_count is not None:
        return process_cpu_count() or 1
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1


def env_factories(env_fns: Sequence[Callable[[], Any]], owner: str) -> list[Callable[[], Any]]:
    """``env_fns`` as a list, checked to hold at least one callable.

    Parameters
    ----------
    env_fns : sequence of callables
        The env factories a vector env was given.
    owner : str
        The class named in the error (``"ShmVecEnv"``, ``"RayVecEnv"``).

    Returns
    -------
    list of callables

    Raises
    ------
    ValueError
        If ``env_fns`` is empty.
    TypeError
        If an item is not callable (the message gives its index).
    """
    env_fns = list(env_fns)
    if not env_fns:
        raise ValueError(f"env_fns is empty: {owner} needs at least one environment factory")
    for i, fn in enumerate(env_fns):
        if not callable(fn):
            raise TypeError(f"env_fns[{i}] is {type(fn).__name__}, expected a callable that returns an env")
    return env_fns


def positive_int(value: Any, name: str) -> int:
    """``value`` as an int, checked to be an integer >= 1 (not a bool).

    Raises
    ------
    ValueError
        ``"{name} must be a positive int, got {value!r}"``.
    """
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def seeds_per_env(seed: int | Sequence[int | None] | None, num_envs: int) -> list[int | None] | None:
    """One seed per env, as Gymnasium's vector envs take ``reset(seed=...)``.

    Parameters
    ----------
    seed : int, sequence of int or None, or None
        An int seeds env ``i`` with ``seed + i``; a sequence gives one seed (or ``None``) per env.
    num_envs : int

    Returns
    -------
    list or None
        ``None`` when ``seed`` is ``None`` (the envs keep their generators).

    Raises
    ------
    ValueError
        If a sequence does not hold one seed per env.
    """
    if seed is None:
        return None
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(num_envs)]
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"reset(seed=...) got {len(seeds)} seeds, expected one per env (num_envs={num_envs})")
    return seeds


def parse_autoreset_mode(
    value: Any, name: str = "autoreset_mode", allowed: tuple[AutoresetMode, ...] = tuple(AutoresetMode)
) -> AutoresetMode:
    """The :class:`~gymnasium.vector.AutoresetMode` that ``value`` names.

    Parameters
    ----------
    value : AutoresetMode or str
        A member, its value (``"NextStep"``) or its name in any case (``"NEXT_STEP"``,
        ``"next_step"``).
    name : str
        The argument named in the error.
    allowed : tuple of AutoresetMode
        The modes the caller supports.

    Raises
    ------
    ValueError
        If ``value`` names no mode in ``allowed``; the message lists them as ``'next_step'``.
    """
    mode: AutoresetMode | None
    if isinstance(value, AutoresetMode):
        mode = value
    else:
        key = value.lower().replace("_", "") if isinstance(value, str) else None
        mode = next((m for m in AutoresetMode if m.value.lower() == key), None)
    if mode not in allowed:
        names = " or ".join(repr(m.name.lower()) for m in allowed)
        raise ValueError(f"{name}: expected {names} (or a gymnasium AutoresetMode), got {value!r}")
    assert mode is not None  # (None is never in allowed)
    return mode
