"""The workloads the benchmark steps: CartPole, synthetic envs from :mod:`shmvec.envs`, real
Atari (``ale-py``) and MuJoCo (``mujoco``) envs with the wrappers users train with, and
multi-agent PettingZoo envs (MPE's simple_spread, Butterfly's pistonball)."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

__all__ = ["AtariMake", "GymMake", "JointEnv", "JointMake", "ParallelMake", "Workload", "WORKLOADS", "get_workloads"]


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


class ParallelMake:
    """A picklable ``<module>.parallel_env(**kwargs)`` call: a PettingZoo parallel env factory."""

    def __init__(self, module: str, **kwargs: Any) -> None:
        self.module, self.kwargs = module, kwargs

    def __call__(self) -> Any:
        return importlib.import_module(self.module).parallel_env(**self.kwargs)

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"ParallelMake({self.module!r}{args})"


class JointEnv(gym.Env):
    """One PettingZoo parallel env as one Gymnasium env, for the references that loop over envs.

    The action holds every agent's, in ``possible_agents`` order (agents that left are not
    passed on); the episode ends when no agent is left. Observations and rewards are dropped: a
    reference needs the env's work, not its results.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.possible_agents = list(env.possible_agents)
        spaces = [env.action_space(a) for a in self.possible_agents]
        if any(s != spaces[0] for s in spaces):
            raise ValueError(f"JointEnv: the agents of {env} have different action spaces: {spaces}")
        from gymnasium.vector.utils import batch_space

        self.action_space = batch_space(spaces[0], len(spaces))
        self.observation_space = gym.spaces.Discrete(1)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.env.reset(seed=seed, options=options)
        return 0, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        live = self.env.agents
        self.env.step({a: action[j] for j, a in enumerate(self.possible_agents) if a in live})
        return 0, 0.0, not self.env.agents, False, {}

    def close(self) -> None:
        self.env.close()


class JointMake:
    """A picklable factory of :class:`JointEnv` over ``make_parallel()``."""

    def __init__(self, make_parallel: Callable[[], Any]) -> None:
        self.make_parallel = make_parallel

    def __call__(self) -> JointEnv:
        return JointEnv(self.make_parallel())

    def __repr__(self) -> str:
        return f"JointMake({self.make_parallel!r})"


_ATARI = ("ale_py", "cv2")  # AtariPreprocessing resizes with OpenCV
_MUJOCO = ("mujoco", "imageio")  # gymnasium.envs.mujoco imports imageio for rendering
_MPE = ("mpe2",)
_BUTTERFLY = ("pettingzoo.butterfly", "pymunk")
_PACKAGES = {"ale_py": "ale-py", "cv2": "opencv-python-headless", "pettingzoo.butterfly": "pettingzoo"}
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
    make_parallel : callable, optional
        For a multi-agent workload: the picklable PettingZoo parallel env factory the multi-agent
        engines vectorize (one row per agent); ``make_env`` is then its :class:`JointMake`, which
        the serial references loop over. ``num_envs`` counts env copies.
    agents : int
        Agents per copy (rows per env; 1 for single-agent workloads). Steps/s count agent steps.
    """

    key: str
    label: str
    description: str
    make_env: Callable[[], gym.Env] = field(repr=False)
    envpool_id: str | None = None
    requires: tuple[str, ...] = ()
    default: bool = True
    sizes: tuple[int, ...] = ()
    make_parallel: Callable[[], Any] | None = field(default=None, repr=False)
    agents: int = 1

    @property
    def multi_agent(self) -> bool:
        return self.make_parallel is not None

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
        _multi_agent(
            "mpe-simple-spread",
            "MPE simple_spread (3 agents)",
            "mpe2 simple_spread_v3, N=3 agents, max_cycles=25: cheap step, 18 floats per agent",
            ParallelMake("mpe2.simple_spread_v3", N=3, max_cycles=25),
            agents=3,
            requires=_MPE,
        ),
        _multi_agent(
            "butterfly-pistonball",
            "Butterfly pistonball (20 agents)",
            "pettingzoo pistonball_v6: 20 agents, physics and rendering, 457x120x3 uint8 per agent",
            ParallelMake("pettingzoo.butterfly.pistonball_v6"),
            agents=20,
            requires=_BUTTERFLY,
        ),
    ]
    return {w.key: w for w in items}


def _multi_agent(
    key: str, label: str, description: str, make_parallel: ParallelMake, agents: int, requires: tuple[str, ...]
) -> Workload:
    return Workload(
        key,
        label,
        description,
        JointMake(make_parallel),
        requires=requires,
        sizes=REAL_SIZES,
        make_parallel=make_parallel,
        agents=agents,
    )


WORKLOADS: dict[str, Workload] = _workloads()


def get_workloads(keys: list[str] | None = None) -> list[Workload]:
    """The workloads named by ``keys`` (the default ones, in their standard order, when ``None``)."""
    if keys is None:
        return [w for w in WORKLOADS.values() if w.default]
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    return [WORKLOADS[k] for k in keys]
