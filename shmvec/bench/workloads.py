"""The workloads the benchmark steps: CartPole and three synthetic envs from :mod:`shmvec.envs`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

__all__ = ["GymMake", "Workload", "WORKLOADS", "get_workloads"]


class GymMake:
    """A picklable ``gymnasium.make(env_id, **kwargs)`` call, usable as an env factory.

    Importing :mod:`shmvec.envs` first means the ``shmvec/...`` ids resolve in any worker
    process, whatever its start method: unpickling this class imports this module.
    """

    def __init__(self, env_id: str, **kwargs: Any) -> None:
        self.env_id, self.kwargs = env_id, kwargs

    def __call__(self) -> gym.Env:
        import shmvec.envs  # noqa: F401  (registers the shmvec/... ids)

        return gym.make(self.env_id, **self.kwargs)

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"GymMake({self.env_id!r}{args})"


@dataclass(frozen=True)
class Workload:
    """One env to benchmark.

    Attributes
    ----------
    key : str
        Short name used on the command line and in the JSON (``"atari-like"``).
    label : str
        Name shown in tables and plots.
    description : str
        One line on what it stands for.
    make_env : callable
        Picklable factory returning one ``gymnasium.Env``; every engine gets the same one.
    envpool_id : str, optional
        The same env's task id in EnvPool, where EnvPool has it.
    """

    key: str
    label: str
    description: str
    make_env: Callable[[], gym.Env] = field(repr=False)
    envpool_id: str | None = None


def _synthetic(cls_name: str, **kwargs: Any) -> Callable[[], gym.Env]:
    import shmvec.envs as envs

    return functools.partial(getattr(envs, cls_name), **kwargs)


def _workloads() -> dict[str, Workload]:
    items = [
        Workload("cartpole", "CartPole-v1", "cheap step (~5 us), tiny observation (4 floats)",
                 GymMake("CartPole-v1"), envpool_id="CartPole-v1"),
        Workload("atari-like", "Atari-like 84x84x4", "uint8 84x84x4 observation, near-free step",
                 _synthetic("AtariLikeEnv")),
        Workload("cost-100us", "100 us step", "every step spends 100 us of CPU, 8 floats observation",
                 _synthetic("FixedCostEnv", step_us=100.0)),
        Workload("heavy-tail", "heavy-tail 10us/5ms", "95 % of steps 10 us, 5 % 5 ms (seeded draws)",
                 _synthetic("HeavyTailEnv", step_us=10.0, slow_us=5000.0, slow_prob=0.05)),
    ]
    return {w.key: w for w in items}


WORKLOADS: dict[str, Workload] = _workloads()


def get_workloads(keys: list[str] | None = None) -> list[Workload]:
    """The workloads named by ``keys`` (all, in their standard order, when ``None``)."""
    if keys is None:
        return list(WORKLOADS.values())
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    return [WORKLOADS[k] for k in keys]
