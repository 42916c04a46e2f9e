"""The workloads the benchmark steps: CartPole, synthetic envs from :mod:`shmvec.envs`, and real
Atari (``ale-py``) and MuJoCo (``mujoco``) envs with the wrappers users train with."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

__all__ = ["AtariMake", "GymMake", "Workload", "WORKLOADS", "get_workloads"]


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


class AtariMake:
    """A picklable Atari env as users train on it: ``ALE/<game>-v5`` with ``frameskip=1``, then
    ``AtariPreprocessing`` (84x84 grey, frame skip 4, up to 30 no-op resets) and
    ``FrameStackObservation(4)``: one step is 4 emulator frames. Needs ``ale-py`` (its wheel
    ships the ROMs)."""

    def __init__(self, game: str) -> None:
        self.game = game

    def __call__(self) -> gym.Env:
        import ale_py
        from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

        gym.register_envs(ale_py)
        env = gym.make(f"ALE/{self.game}-v5", frameskip=1)
        return FrameStackObservation(
            AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True), 4
        )

    def __repr__(self) -> str:
        return f"AtariMake({self.game!r})"


_ATARI = ("ale_py", "cv2")  # AtariPreprocessing resizes with OpenCV
_MUJOCO = ("mujoco", "imageio")  # gymnasium.envs.mujoco imports imageio for rendering
_PACKAGES = {"ale_py": "ale-py", "cv2": "opencv-python-headless"}
REAL_SIZES = (16,)  # real envs cost 40-300 us a step: one size, the one their targets name


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
    requires : tuple of str
        Modules the env needs (optional extras); when one does not import, the workload's runs
        are reported as skipped.
    default : bool
        Part of a sweep that names no workloads (Breakout runs when named).
    sizes : tuple of int
        Fixed sizes to measure it at (the real envs: 16, the size their targets name); empty:
        the sweep's own sizes. A quick sweep leaves out fixed-size workloads it was not asked for.
    """

    key: str
    label: str
    description: str
    make_env: Callable[[], gym.Env] = field(repr=False)
    envpool_id: str | None = None
    requires: tuple[str, ...] = ()
    default: bool = True
    sizes: tuple[int, ...] = ()

    def unavailable(self) -> str | None:
        """Why this workload cannot run here (its package is missing), or ``None``."""
        for module in self.requires:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                return f"not installed: {exc} (pip install {_PACKAGES.get(module, module)})"
        return None


def _synthetic(cls_name: str, **kwargs: Any) -> Callable[[], gym.Env]:
    import shmvec.envs as envs

    return functools.partial(getattr(envs, cls_name), **kwargs)


def _workloads() -> dict[str, Workload]:
    items = [
        Workload(
            "cartpole",
            "CartPole-v1",
            "cheap step (~5 us), tiny observation (4 floats)",
            GymMake("CartPole-v1"),
            envpool_id="CartPole-v1",
        ),
        Workload(
            "atari-like", "Atari-like 84x84x4", "uint8 84x84x4 observation, near-free step", _synthetic("AtariLikeEnv")
        ),
        Workload(
            "cost-100us",
            "100 us step",
            "every step spends 100 us of CPU, 8 floats observation",
            _synthetic("FixedCostEnv", step_us=100.0),
        ),
        Workload(
            "heavy-tail",
            "heavy-tail 10us/5ms",
            "95 % of steps 10 us, 5 % 5 ms (seeded draws)",
            _synthetic("HeavyTailEnv", step_us=10.0, slow_us=5000.0, slow_prob=0.05),
        ),
        Workload(
            "atari-pong",
            "Atari Pong",
            "ALE Pong, AtariPreprocessing + 4-frame stack (1 step = 4 frames)",
            AtariMake("Pong"),
            envpool_id="Pong-v5",
            requires=_ATARI,
            sizes=REAL_SIZES,
        ),
        Workload(
            "atari-breakout",
            "Atari Breakout",
            "ALE Breakout, AtariPreprocessing + 4-frame stack",
            AtariMake("Breakout"),
            envpool_id="Breakout-v5",
            requires=_ATARI,
            default=False,
            sizes=REAL_SIZES,
        ),
        Workload(
            "mujoco-halfcheetah",
            "MuJoCo HalfCheetah",
            "HalfCheetah-v5 (mujoco), 17 floats observation",
            GymMake("HalfCheetah-v5"),
            envpool_id="HalfCheetah-v5",
            requires=_MUJOCO,
            sizes=REAL_SIZES,
        ),
        Workload(
            "mujoco-ant",
            "MuJoCo Ant",
            "Ant-v5 (mujoco), 105 floats observation",
            GymMake("Ant-v5"),
            envpool_id="Ant-v5",
            requires=_MUJOCO,
            sizes=REAL_SIZES,
        ),
    ]
    return {w.key: w for w in items}


WORKLOADS: dict[str, Workload] = _workloads()


def get_workloads(keys: list[str] | None = None) -> list[Workload]:
    """The workloads named by ``keys`` (the default ones, in their standard order, when ``None``)."""
    if keys is None:
        return [w for w in WORKLOADS.values() if w.default]
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    return [WORKLOADS[k] for k in keys]
