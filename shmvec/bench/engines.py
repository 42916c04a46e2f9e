"""The engines a sweep compares: shmvec, Gymnasium's vector envs, the classic baseline, peers.

Each engine is built the way its own documentation advises: shmvec with one worker per usable
core, Gymnasium's ``AsyncVectorEnv``, the classic ``SubprocVecEnv`` and SB3's with one process
per env, EnvPool with one thread per usable core. Every one is wrapped in the same tiny
:class:`Driver` surface (``reset(seed)``, ``step(actions)``, ``close()``) so the harness times
them all with the same loop. Optional peers (SB3, EnvPool) are skipped when not installed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from shmvec.bench.workloads import Workload

__all__ = ["CEILING", "ENGINES", "Engine", "RunSpec", "Driver", "VectorEnvDriver", "get_engines", "make_actions"]


@dataclass(frozen=True)
class RunSpec:
    """What one measurement runs: a workload, a number of envs, and this machine's settings."""

    workload: Workload
    num_envs: int
    num_workers: int  # shmvec's num_workers (the other engines choose their own)
    seed: int = 0
    # shmvec's synchronous engines step a block in the calling process (step_in_main=True):
    # instruction counts of the calling process then see every env step.
    in_process: bool = False
    spin_us: float | None = None  # shmvec's spin budget (None: its default; 0: waits block at once)

    def env_fns(self) -> list[Callable[[], Any]]:
        return [self.workload.make_env] * self.num_envs

    def parallel_fns(self) -> list[Callable[[], Any]]:
        """The PettingZoo parallel env factories of a multi-agent workload, one per copy."""
        assert self.workload.make_parallel is not None, f"{self.workload.key} is not multi-agent"
        return [self.workload.make_parallel] * self.num_envs

    @property
    def rows(self) -> int:
        """Env steps one vector step makes: ``num_envs``, times the agents of a multi-agent workload."""
        return self.num_envs * self.workload.agents


def make_actions(single_action_space: Any, num_envs: int, seed: int, count: int = 16) -> list[Any]:
    """``count`` batches of random valid actions, made before the clock starts."""
    from gymnasium.vector.utils import batch_space

    space = batch_space(single_action_space, num_envs)
    space.seed(seed)
    return [space.sample() for _ in range(count)]


class Driver(Protocol):
    """The surface the harness times; ``step`` results are ignored.

    ``steps_per_call`` (optional, default 1): vector steps one ``step`` call makes (a rollout
    engine's ``step`` collects a whole rollout).
    """

    workers: int

    def reset(self, seed: int) -> None: ...
    def step(self, actions: Any) -> None: ...
    def close(self) -> None: ...


class VectorEnvDriver:
    """Any Gymnasium ``VectorEnv`` (shmvec's included)."""

    def __init__(self, env: Any, workers: int) -> None:
        self.env, self.workers = env, workers
        self.step = env.step  # bound once: the timing loop should not pay for a wrapper call

    def reset(self, seed: int) -> None:
        self.env.reset(seed=seed)

    def close(self) -> None:
        self.env.close()


class _RowDriver(VectorEnvDriver):
    """A vector env with one row per agent: the harness's actions come as ``[copies, agents, ...]``
    (what the serial references take) and are flattened to rows, a view, before each step."""

    def __init__(self, env: Any, workers: int, rows: int) -> None:
        super().__init__(env, workers)
        self.step = lambda actions, step=env.step: step(actions.reshape(rows, *actions.shape[2:]))


class _ResetSeedDriver:
    """Engines whose ``reset`` takes the seed positionally and ``step`` the actions (classic, serial)."""

    def __init__(self, env: Any, workers: int) -> None:
        self.env, self.workers = env, workers
        self.step = env.step

    def reset(self, seed: int) -> None:
        self.env.reset(seed)

    def close(self) -> None:
        self.env.close()


class _SB3Driver:
    def __init__(self, env: Any, workers: int) -> None:
        self.env, self.workers = env, workers
        self.step = env.step

    def reset(self, seed: int) -> None:
        self.env.seed(seed)  # SB3 applies the seeds at the next reset
        self.env.reset()

    def close(self) -> None:
        self.env.close()


class _EnvPoolDriver:
    def __init__(self, env: Any, workers: int) -> None:
        self.env, self.workers = env, workers
        self.step = env.step

    def reset(self, seed: int) -> None:
        self.env.reset()  # EnvPool takes its seed at construction

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


class _TorchRLDriver:
    """TorchRL's ``ParallelEnv``: actions go in as a tensor of the TensorDict; its own autoreset
    (``step_and_maybe_reset``, what TorchRL's collectors call) carries on past episode ends."""

    def __init__(self, env: Any, workers: int) -> None:
        import torch

        self.env, self.workers, self._as_tensor = env, workers, torch.as_tensor
        self.td: Any = None

    def reset(self, seed: int) -> None:
        self.env.set_seed(seed)
        self.td = self.env.reset()

    def step(self, actions: Any) -> None:
        td = self.td
        td["action"] = self._as_tensor(actions)
        _, self.td = self.env.step_and_maybe_reset(td)

    def close(self) -> None:
        self.env.close()


class TorchRLMake:
    """A picklable factory of one TorchRL ``GymWrapper`` around ``make_env()`` (discrete actions
    as indices, as the other engines take them)."""

    def __init__(self, make_env: Callable[[], Any]) -> None:
        self.make_env = make_env

    def __call__(self) -> Any:
        from torchrl.envs import GymWrapper

        return GymWrapper(self.make_env(), categorical_action_encoding=True)


class _AsyncDriver:
    """shmvec's asynchronous collection timed as the sync engines are: one ``step`` call runs
    recv/send cycles until every env has advanced once on average (``num_envs`` env steps)."""

    def __init__(self, env: Any, workers: int) -> None:
        self.env, self.workers = env, workers
        self.cycles = env.num_envs // env.batch_size
        self._primed = False

    def reset(self, seed: int) -> None:
        self.env.reset(seed=seed)
        self._primed = False

    def step(self, actions: Any) -> None:
        env = self.env
        if not self._primed:  # after reset every env waits for its first actions
            import numpy as np

            env.send(actions, np.arange(env.num_envs))
            self._primed = True
        for _ in range(self.cycles):
            ids = env.recv()[-1]
            env.send(actions[ids], ids)

    def close(self) -> None:
        self.env.close()


# Rows of the rollouts the rollout engines collect per ``step`` call (CleanRL's default for Atari).
ROLLOUT_STEPS = 128


class _CyclingPolicy:
    """The stand-in policy of the rollout engines: pre-generated batches, one per call, in turn."""

    def __init__(self, actions: list[Any]) -> None:
        self.actions, self.i = actions, 0

    def __call__(self, obs: Any) -> Any:
        self.i += 1
        return self.actions[self.i % len(self.actions)]


class _StepLoopDriver:
    """What a PPO loop does with ``step``: ``T`` steps, each copied into ``[T, N]`` rollout buffers."""

    def __init__(self, env: Any, workers: int, actions: list[Any]) -> None:
        import numpy as np

        from shmvec.tree import flatten, space_leaves

        self.env, self.workers, self.steps_per_call = env, workers, ROLLOUT_STEPS
        self.policy = _CyclingPolicy(actions)
        T, n = ROLLOUT_STEPS, env.num_envs
        self._flatten = lambda x, space=env.single_observation_space: flatten(space, x)
        self.obs_buf = [
            np.zeros((T, n, *leaf.shape), leaf.dtype) for leaf in space_leaves(env.single_observation_space)
        ]
        sample = actions[0]
        self.act_buf = np.zeros((T, *np.shape(sample)), np.asarray(sample).dtype)
        self.rew_buf = np.zeros((T, n), np.float32)
        self.term_buf = np.zeros((T, n), bool)
        self.trunc_buf = np.zeros((T, n), bool)
        self.obs = None

    def reset(self, seed: int) -> None:
        self.obs, _ = self.env.reset(seed=seed)

    def step(self, actions: Any) -> None:
        env, policy, flatten = self.env, self.policy, self._flatten
        obs = self.obs
        for t in range(self.steps_per_call):
            a = policy(obs)
            for buf, leaf in zip(self.obs_buf, flatten(obs)):
                buf[t] = leaf
            self.act_buf[t] = a
            obs, rew, term, trunc, _ = env.step(a)
            self.rew_buf[t] = rew
            self.term_buf[t] = term
            self.trunc_buf[t] = trunc
        self.obs = obs

    def close(self) -> None:
        self.env.close()


class _RolloutDriver:
    """``ShmVecEnv.rollout``: the workers write the ``[T, N]`` buffers in place."""

    def __init__(self, env: Any, workers: int, actions: list[Any]) -> None:
        self.env, self.workers, self.steps_per_call = env, workers, ROLLOUT_STEPS
        self.policy = _CyclingPolicy(actions)

    def reset(self, seed: int) -> None:
        self.env.reset(seed=seed)

    def step(self, actions: Any) -> None:
        self.env.rollout(self.policy, self.steps_per_call)

    def close(self) -> None:
        self.env.close()


# -- builders ---------------------------------------------------------------------------------
def _layout(spec: RunSpec, step_in_main: bool) -> tuple[int, dict[str, Any]]:
    """The blocks a shmvec engine steps in parallel (``spec.num_workers``, at most one per env),
    and the ShmVecEnv options that give that many: worker processes, plus the calling process's
    block where it steps one."""
    blocks = min(spec.num_workers, spec.num_envs)
    in_main = step_in_main or spec.in_process
    return blocks, {"num_workers": blocks - in_main, "step_in_main": in_main}


def _build_shmvec(step_in_main: bool) -> Callable[[RunSpec], Driver]:
    def build(spec: RunSpec) -> Driver:
        blocks, layout = _layout(spec, step_in_main)
        if spec.workload.multi_agent:
            from shmvec.pettingzoo import MultiAgentVecEnv

            rows = MultiAgentVecEnv(spec.parallel_fns(), spin_us=spec.spin_us, **layout)
            return _RowDriver(rows, blocks, spec.rows)
        from shmvec.vector_env import ShmVecEnv

        return VectorEnvDriver(ShmVecEnv(spec.env_fns(), spin_us=spec.spin_us, **layout), blocks)

    return build


def _build_shmvec_async(step_in_main: bool, ordered: bool = False) -> Callable[[RunSpec], Driver]:
    def build(spec: RunSpec) -> Driver:
        from shmvec.vector_env import ShmVecEnv

        blocks, layout = _layout(spec, step_in_main)
        env = ShmVecEnv(
            spec.env_fns(), batch_size=spec.num_envs // blocks, ordered=ordered, spin_us=spec.spin_us, **layout
        )
        return _AsyncDriver(env, blocks)

    return build


def _rollout_actions(spec: RunSpec, env: Any) -> list[Any]:
    return make_actions(env.single_action_space, spec.num_envs, spec.seed)


def _build_shmvec_loop(spec: RunSpec) -> Driver:
    from shmvec.vector_env import ShmVecEnv

    blocks, layout = _layout(spec, False)
    env = ShmVecEnv(spec.env_fns(), spin_us=spec.spin_us, **layout)
    return _StepLoopDriver(env, blocks, _rollout_actions(spec, env))


def _build_shmvec_rollout(spec: RunSpec) -> Driver:
    from shmvec.vector_env import ShmVecEnv

    blocks, layout = _layout(spec, False)
    env = ShmVecEnv(spec.env_fns(), spin_us=spec.spin_us, **layout)
    return _RolloutDriver(env, blocks, _rollout_actions(spec, env))


def _build_gym_sync(spec: RunSpec) -> Driver:
    from gymnasium.vector import SyncVectorEnv

    return VectorEnvDriver(SyncVectorEnv(spec.env_fns()), 1)


def _build_gym_async(shared_memory: bool) -> Callable[[RunSpec], Driver]:
    def build(spec: RunSpec) -> Driver:
        from gymnasium.vector import AsyncVectorEnv

        return VectorEnvDriver(AsyncVectorEnv(spec.env_fns(), shared_memory=shared_memory), spec.num_envs)

    return build


def _build_classic(spec: RunSpec) -> Driver:
    from shmvec.bench.classic import ClassicSubprocVecEnv

    return _ResetSeedDriver(ClassicSubprocVecEnv(spec.env_fns()), spec.num_envs)


def _build_sb3(spec: RunSpec) -> Driver:
    import multiprocessing as mp

    from stable_baselines3.common.vec_env import SubprocVecEnv

    # SB3's default start method, forkserver, has every worker import torch anew: up to a
    # minute to start 32 envs on 2 cores. Stepping does not depend on the start method, so
    # fork (where it exists) keeps the sweep short without changing what is measured.
    method = "fork" if "fork" in mp.get_all_start_methods() else None
    return _SB3Driver(SubprocVecEnv(spec.env_fns(), start_method=method), spec.num_envs)


def _build_torchrl(spec: RunSpec) -> Driver:
    import multiprocessing as mp

    from torchrl.envs import ParallelEnv

    # One process per env, as TorchRL's docs build a ParallelEnv; fork where it exists, as for SB3.
    method = "fork" if "fork" in mp.get_all_start_methods() else None
    env = ParallelEnv(spec.num_envs, TorchRLMake(spec.workload.make_env), mp_start_method=method)
    return _TorchRLDriver(env, spec.num_envs)


def _build_envpool(spec: RunSpec) -> Driver:
    import envpool

    assert spec.workload.envpool_id is not None  # EnvPool runs only the workloads it has (_envpool_supports)
    threads = min(spec.num_workers, spec.num_envs)
    env = envpool.make(
        spec.workload.envpool_id, env_type="gymnasium", num_envs=spec.num_envs, num_threads=threads, seed=spec.seed
    )
    return _EnvPoolDriver(env, threads)


def _build_serial(spec: RunSpec) -> Driver:
    from shmvec.bench.serial import SerialLoop

    return _ResetSeedDriver(SerialLoop(spec.env_fns()), 1)


def _build_split_serial(spec: RunSpec) -> Driver:
    from shmvec.bench.serial import SplitSerial

    return SplitSerial(spec.env_fns(), spec.num_workers)  # a Driver itself: steps_per_call varies


def _build_supersuit(multiprocessing: bool) -> Callable[[RunSpec], Driver]:
    def build(spec: RunSpec) -> Driver:
        import supersuit as ss

        assert spec.workload.make_parallel is not None  # a multi-agent engine runs multi-agent workloads only
        cpus = min(spec.num_workers, spec.num_envs) if multiprocessing else 0
        env = ss.concat_vec_envs_v1(
            ss.pettingzoo_env_to_vec_env_v1(spec.workload.make_parallel()),
            spec.num_envs,
            num_cpus=cpus,
            base_class="gymnasium",
        )
        return _RowDriver(env, max(cpus, 1), spec.rows)

    return build


def _envpool_supports(workload: Workload) -> str | None:
    return None if workload.envpool_id else "EnvPool has no such env"


ROLLOUT_WORKLOADS = ("cartpole", "atari-like")

# The key of the engine that bounds what parallel stepping can get on this machine: a reference,
# not a competitor (targets against "every other engine" leave it out).
CEILING = "split-serial"


def _heavy_tail_only(workload: Workload) -> str | None:
    return None if workload.key == "heavy-tail" else "ordered collection is measured where order costs most: heavy-tail"


def _rollout_supports(workload: Workload) -> str | None:
    return None if workload.key in ROLLOUT_WORKLOADS else "rollout engines run on CartPole and Atari-like only"


# -- the registry -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Engine:
    """One vector-env implementation the sweep can time.

    Attributes
    ----------
    key : str
        Name on the command line and in the JSON (``"gym-async-shm"``).
    label : str
        Name in tables and plots.
    description : str
        How it is built.
    build : callable
        ``build(spec) -> Driver``.
    processes : callable
        ``processes(spec) -> int``: processes it starts besides the caller (for the caps).
    requires : str, optional
        Module it needs; when that does not import, the engine is reported as skipped.
    install_hint : str
        What to install to get it.
    reference : bool
        The serial loop: the per-core reference every engine is divided by.
    supports : callable, optional
        ``supports(workload) -> reason or None``: why it cannot run a workload.
    agents : {"single", "multi", "both"}
        The workloads it steps: single-agent Gymnasium envs, multi-agent PettingZoo envs (a
        row per agent), or both.
    """

    key: str
    label: str
    description: str
    build: Callable[[RunSpec], Driver]
    processes: Callable[[RunSpec], int]
    requires: str | None = None
    install_hint: str = ""
    reference: bool = False
    supports: Callable[[Workload], str | None] | None = None
    agents: str = "single"

    def unavailable(self) -> str | None:
        """Why this engine cannot run here (a missing optional package), or ``None``."""
        if self.requires is None:
            return None
        try:
            importlib.import_module(self.requires)
        except ImportError as exc:
            hint = f" ({self.install_hint})" if self.install_hint else ""
            return f"not installed: {type(exc).__name__}: {exc}{hint}"
        except Exception as exc:  # a broken install is skipped too, with what broke
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            if len(text) > 120:
                text = text[:117] + "..."
            return f"fails to import: {type(exc).__name__}: {text}"
        return None

    def unsupported(self, workload: Workload) -> str | None:
        """Why this engine cannot run ``workload``, or ``None``."""
        if self.agents != "both" and workload.multi_agent != (self.agents == "multi"):
            return "a single-agent engine" if self.agents == "single" else "a multi-agent engine"
        return None if self.supports is None else self.supports(workload)


def _per_env(spec: RunSpec) -> int:
    return spec.num_envs


def _none(spec: RunSpec) -> int:
    return 0


ENGINES: dict[str, Engine] = {
    e.key: e
    for e in [
        Engine(
            "shmvec",
            "shmvec",
            "ShmVecEnv(num_workers = usable cores): the defaults, every env in a worker",
            _build_shmvec(False),
            lambda s: min(s.num_workers, s.num_envs),
            agents="both",
        ),
        Engine(
            "shmvec-main",
            "shmvec, block in main",
            "ShmVecEnv(step_in_main=True): the calling process steps "
            "one block (opt-in speed mode, no isolation for that block)",
            _build_shmvec(True),
            lambda s: min(s.num_workers, s.num_envs) - 1,
            agents="both",
        ),
        Engine(
            "shmvec-async",
            "shmvec async",
            "ShmVecEnv(batch_size = num_envs / num_workers): send/recv, every block in a worker",
            _build_shmvec_async(False),
            lambda s: min(s.num_workers, s.num_envs),
        ),
        Engine(
            "shmvec-async-ordered",
            "shmvec async ordered",
            "ShmVecEnv(batch_size = num_envs / num_workers, ordered=True): send/recv, batches in the "
            "order they were sent (reproducible)",
            _build_shmvec_async(False, ordered=True),
            lambda s: min(s.num_workers, s.num_envs),
            supports=_heavy_tail_only,
        ),
        Engine(
            "shmvec-async-main",
            "shmvec async, block in main",
            "ShmVecEnv(batch_size = num_envs / "
            "num_workers, step_in_main=True): send/recv, the calling process steps one block while it waits",
            _build_shmvec_async(True),
            lambda s: min(s.num_workers, s.num_envs) - 1,
        ),
        Engine(
            "shmvec-loop",
            "shmvec step loop",
            f"ShmVecEnv.step in a PPO loop copying each step into [T={ROLLOUT_STEPS}, N] buffers",
            _build_shmvec_loop,
            lambda s: min(s.num_workers, s.num_envs),
            supports=_rollout_supports,
        ),
        Engine(
            "shmvec-rollout",
            "shmvec rollout",
            f"ShmVecEnv.rollout(policy, {ROLLOUT_STEPS}): workers write the [T, N] buffers in place",
            _build_shmvec_rollout,
            lambda s: min(s.num_workers, s.num_envs),
            supports=_rollout_supports,
        ),
        # Before the process-per-env peers: what they leave running for a while after close
        # would slow a 2-process ceiling measured right after them.
        Engine(
            CEILING,
            "split serial",
            "the serial loop split over num_workers processes that never "
            "talk while they step: the most any engine could get from these cores",
            _build_split_serial,
            lambda s: min(s.num_workers, s.num_envs),
            agents="both",
        ),
        Engine(
            "supersuit-serial",
            "SuperSuit serial",
            "supersuit concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), num_cpus=0)",
            _build_supersuit(False),
            _none,
            requires="supersuit",
            install_hint="pip install supersuit",
            agents="multi",
        ),
        Engine(
            "supersuit-mp",
            "SuperSuit mp",
            "supersuit concat_vec_envs_v1(..., num_cpus = usable cores): its multiprocessing backend",
            _build_supersuit(True),
            lambda s: min(s.num_workers, s.num_envs),
            requires="supersuit",
            install_hint="pip install supersuit",
            agents="multi",
        ),
        Engine("gym-sync", "gym Sync", "gymnasium.vector.SyncVectorEnv", _build_gym_sync, _none),
        Engine(
            "gym-async-shm",
            "gym Async (shm)",
            "AsyncVectorEnv(shared_memory=True), one process per env",
            _build_gym_async(True),
            _per_env,
        ),
        Engine(
            "gym-async-pipe",
            "gym Async (pipe)",
            "AsyncVectorEnv(shared_memory=False), one process per env",
            _build_gym_async(False),
            _per_env,
        ),
        Engine(
            "classic",
            "classic Subproc",
            "pipe-per-env SubprocVecEnv (shmvec.bench.classic), one process per env",
            _build_classic,
            _per_env,
        ),
        Engine(
            "sb3",
            "SB3 Subproc",
            "stable_baselines3 SubprocVecEnv, one process per env, fork start method",
            _build_sb3,
            _per_env,
            requires="stable_baselines3",
            install_hint="pip install stable-baselines3",
        ),
        Engine(
            "torchrl",
            "TorchRL Parallel",
            "torchrl.envs.ParallelEnv(num_envs, GymWrapper(env)), one process per env, fork start method",
            _build_torchrl,
            _per_env,
            requires="torchrl",
            install_hint="pip install torchrl (with the torch it was built for)",
        ),
        Engine(
            "envpool",
            "EnvPool",
            "envpool.make(env_type='gymnasium'), num_threads = usable cores",
            _build_envpool,
            _none,
            requires="envpool",
            install_hint="pip install envpool",
            supports=_envpool_supports,
        ),
        Engine(
            "serial",
            "serial loop",
            "for env in envs: env.step(a) in the calling process (reference)",
            _build_serial,
            _none,
            reference=True,
            agents="both",
        ),
    ]
}


def get_engines(keys: list[str] | None = None) -> list[Engine]:
    """The engines named by ``keys`` (all, in their standard order, when ``None``)."""
    if keys is None:
        return list(ENGINES.values())
    unknown = [k for k in keys if k not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engine(s) {unknown}; choose from {list(ENGINES)}")
    return [ENGINES[k] for k in keys]
