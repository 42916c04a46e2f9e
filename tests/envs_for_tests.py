"""Small envs for the tests: a nested-space env with infos, and envs that misbehave on purpose."""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing as mp
import os
import resource
import signal
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class NestedEnv(gym.Env):
    """Dict/Tuple observations of every leaf kind, a Tuple action, random episode ends, infos."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32),
                "flags": spaces.MultiBinary(4),
                "inner": spaces.Tuple((spaces.Discrete(5, start=2), spaces.MultiDiscrete([3, 4]))),
                "img": spaces.Box(0, 255, shape=(2, 3), dtype=np.uint8),
            }
        )
        self.action_space = spaces.Tuple((spaces.Discrete(3), spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float64)))
        self.t = 0
        self.scale = 1.0

    def _obs(self):
        r = self.np_random
        return {
            "pos": r.uniform(-1, 1, size=3).astype(np.float32) * self.scale,
            "flags": r.integers(0, 2, size=4).astype(np.int8),
            "inner": (int(r.integers(2, 7)), r.integers(0, [3, 4]).astype(np.int64)),
            "img": r.integers(0, 256, size=(2, 3)).astype(np.uint8),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        info = {"reset_tag": 1} if self.np_random.random() < 0.5 else {}
        if options and "scale" in options:
            self.scale = options["scale"]
        return self._obs(), info

    def step(self, action):
        discrete, box = action
        self.t += 1
        reward = float(discrete) + float(box.sum()) + float(self.np_random.normal())
        terminated = bool(self.np_random.random() < 0.05)
        truncated = bool(self.t >= 30)
        info = {}
        if self.np_random.random() < 0.3:
            info["count"] = self.t
            info["vec"] = np.full(2, self.t, dtype=np.float32)
        if self.np_random.random() < 0.1:
            info["nested"] = {"x": float(self.t)}
        return self._obs(), reward, terminated, truncated, info

    def render(self):
        return np.full((2, 2, 3), self.t, dtype=np.uint8)

    def double(self, x):
        return 2 * x


# The memory faults may only ever limit a worker process: an rlimit set in the test process
# itself would stay for the rest of the session (and a blow-up there would hit the machine).
def _in_worker_only(fault: str) -> None:
    if mp.parent_process() is None:
        raise RuntimeError(f"FaultyEnv({fault!r}) refuses to run outside a worker process")


def _cap_address_space(extra: int) -> None:
    """Cap this process's address space at its current size plus ``extra`` bytes (soft limit
    only, so it binds this process and the children it might start, nothing else)."""
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = size + extra
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


# Chunks of the memory blow-up, and how many fit under the cap: the cap leaves half a chunk of
# headroom, so the failing allocation is always the (HOG_CHUNKS + 1)-th and the worker keeps
# enough memory to format and send its error report.
HOG_CHUNK = 32 << 20
HOG_CHUNKS = 4


class FaultyEnv(gym.Env):
    """CartPole-like spaces; misbehaves in the way ``fault`` names, at step ``at``.

    Faults of ``step``: ``raise`` (an exception), ``exit`` (``os._exit(3)``), ``kill`` (SIGKILL
    to itself), ``segfault`` (a real one: a NULL read in native code), ``hang``, ``memory`` (an
    unbounded allocation loop that ends in ``MemoryError``), ``oom_kill`` (the kernel OOM
    killer's way: memory grows, then SIGKILL), and the bad outputs ``shape``, ``dtype``,
    ``nan_obs``, ``inf_reward``, ``array_reward``, ``none_reward``, ``array_flag``. ``construct`` and ``reset`` fail there.

    The memory faults never threaten the machine: the env first caps its own process's address
    space (``RLIMIT_AS``) a little above what it uses, so ``memory`` fails after
    ``HOG_CHUNKS`` chunks of ``HOG_CHUNK`` bytes, and ``oom_kill`` stays below the cap. A real
    OOM kill is not triggered on purpose: on a shared machine the kernel may pick another
    process. What the vector env sees of one (a worker gone by SIGKILL, its memory resident) is
    what ``oom_kill`` does. Both refuse to run outside a worker process.

    ``crash_dump=False`` turns off Python's fault handler before the segfault: a forked
    worker inherits pytest's, which would print the worker's stack past pytest's capture into
    the test log. ``True`` leaves it as the worker has it (a user's program that enables it
    gets the crashed env's stack on stderr).
    """

    def __init__(self, fault: str = "none", at: int = 3, *, crash_dump: bool = False) -> None:
        if fault == "construct":
            raise RuntimeError("constructor exploded")
        self.fault, self.at, self.t = fault, at, 0
        self.crash_dump = crash_dump
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        if self.fault == "reset":
            raise ValueError("reset exploded")
        return np.zeros(4, dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.zeros(4, dtype=np.float32)
        if self.t == self.at:
            if self.fault == "raise":
                raise ZeroDivisionError("step exploded")
            if self.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fault == "exit":
                os._exit(3)
            if self.fault == "segfault":
                # No core file: the kernel would write one per test run where cores are on.
                resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
                if not self.crash_dump:
                    faulthandler.disable()
                ctypes.string_at(0)  # reads address 0: SIGSEGV (faulthandler, if on, prints first)
            if self.fault == "hang":
                time.sleep(60)
            if self.fault in ("memory", "oom_kill"):
                _in_worker_only(self.fault)
                _cap_address_space(HOG_CHUNKS * HOG_CHUNK + HOG_CHUNK // 2)
                # Held by the env, as a leak is: still there while the error is reported.
                self.hog = []
                for _ in range(HOG_CHUNKS if self.fault == "oom_kill" else 1 << 20):
                    self.hog.append(b"x" * HOG_CHUNK)  # written, so resident, not just reserved
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fault == "shape":
                obs = np.zeros(5, dtype=np.float32)
            if self.fault == "dtype":
                obs = np.zeros(4, dtype=np.complex64)
            if self.fault == "nan_obs":
                obs[2] = np.nan
            if self.fault == "inf_reward":
                return obs, float("inf"), False, False, {}
            if self.fault == "array_reward":
                return obs, np.ones(3), False, False, {}
            if self.fault == "none_reward":
                return obs, None, False, False, {}
            if self.fault == "array_flag":
                return obs, 1.0, np.array([True, False]), False, {}
        return obs, 1.0, False, False, {}


class SlowEnv(gym.Env):
    """Spends about ``step_us`` microseconds of CPU per step."""

    def __init__(self, step_us: float = 100.0) -> None:
        self.step_s = step_us * 1e-6
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, dtype=np.float32), {}

    def step(self, action):
        end = time.perf_counter() + self.step_s
        while time.perf_counter() < end:
            pass
        return np.zeros(4, dtype=np.float32), 1.0, False, False, {}


def variable_space(kind: str) -> gym.Space:
    """A space whose samples have no fixed size (or, ``"Mixed"``, a Dict/Tuple mixing such
    leaves with fixed-size ones)."""
    return {
        "Text": lambda: spaces.Text(min_length=1, max_length=6),
        "Graph": lambda: spaces.Graph(node_space=spaces.Box(-1.0, 1.0, shape=(2,)), edge_space=spaces.Discrete(3)),
        "Sequence": lambda: spaces.Sequence(spaces.Discrete(4)),
        "StackedSequence": lambda: spaces.Sequence(spaces.Box(0.0, 1.0, shape=(2,)), stack=True),
        "OneOf": lambda: spaces.OneOf([spaces.Discrete(3), spaces.Box(0.0, 1.0, shape=(2,))]),
        "Mixed": lambda: spaces.Dict({
            "pos": spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32),
            "text": spaces.Text(max_length=4),
            "inner": spaces.Tuple((spaces.MultiBinary(3), spaces.Sequence(spaces.Discrete(3)),
                                   spaces.Graph(node_space=spaces.Discrete(2), edge_space=None))),
        }),
    }[kind]()


class VariableSizeEnv(gym.Env):
    """Observations (and, with ``variable_actions``, actions) of a variable-size space.

    ``kind`` names the space (see :func:`variable_space`); ``nested`` puts it at
    ``observation_space["x"]`` beside a Box at ``["pos"]``. Observations are samples of the
    space from a generator seeded by the env's own ``np_random``; episodes end at random or
    after 8 steps; about half the steps report the action received as ``info["echo"]``.
    ``fault``: ``"exit"`` ends the process at step ``at``, ``"shape"`` returns ``["pos"]`` of a
    wrong shape there, ``"unpicklable"`` returns an observation that cannot be pickled there.
    """

    def __init__(self, kind: str = "Text", nested: bool = False, variable_actions: bool = False,
                 fault: str = "none", at: int = 3) -> None:
        space = variable_space(kind)
        self.observation_space = spaces.Dict({"pos": spaces.Box(0.0, 1.0, shape=(2,)), "x": space}) if nested else space
        self.action_space = variable_space(kind) if variable_actions else spaces.Discrete(3)
        self.fault, self.at, self.t = fault, at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        return self.observation_space.sample(), {"tag": 1} if self.np_random.random() < 0.3 else {}

    def step(self, action):
        if action not in self.action_space:
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        self.t += 1
        obs = self.observation_space.sample()
        if self.t == self.at:
            if self.fault == "exit":
                os._exit(3)
            if self.fault == "shape":
                obs["pos"] = np.zeros(5, dtype=np.float32)
            if self.fault == "unpicklable":
                obs = (c for c in "abc")  # a generator: pickle refuses it
        # In a tuple: Gymnasium batches an array info by its first shape, and these vary.
        info = {"echo": (action,)} if self.np_random.random() < 0.5 else {}
        return obs, float(self.t), bool(self.np_random.random() < 0.15), self.t >= 8, info


class ClosingEnv(gym.Wrapper):
    """CartPole that leaves a file named after its index in ``marker_dir`` when it is closed."""

    def __init__(self, marker_dir: str, index: int) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.marker = os.path.join(marker_dir, f"closed-{index}")

    def close(self) -> None:
        with open(self.marker, "a") as f:
            f.write(f"{os.getpid()}\n")
        super().close()


class EchoActionEnv(gym.Env):
    """Observes the action it was given, flattened: shows what each env received."""

    def __init__(self, action_space: gym.Space | None = None) -> None:
        self.action_space = action_space if action_space is not None else gym.spaces.Dict(
            {"pick": gym.spaces.Discrete(3), "move": gym.spaces.Box(-1, 1, (2,), np.float32),
             "bits": gym.spaces.Tuple((gym.spaces.MultiBinary(2), gym.spaces.MultiDiscrete([2, 3])))})
        self.observation_space = gym.spaces.flatten_space(self.action_space)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, self.observation_space.dtype), {}

    def step(self, action):
        obs = gym.spaces.flatten(self.action_space, action).astype(self.observation_space.dtype)
        return obs, 0.0, False, False, {}


class PidEnv(gym.Env):
    """Observes the id of the process that built it and of the one that ran its latest
    ``reset``/``step``: shows where a vector env runs its envs."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0.0, np.inf, shape=(2,), dtype=np.float64)  # pids are exact in float64
        self.action_space = spaces.Discrete(2)
        self.built_in = os.getpid()

    def _obs(self) -> np.ndarray:
        return np.array([self.built_in, os.getpid()], dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 0.0, False, False, {}


# Registered for shmvec.make. Made as "envs_for_tests:<id>", gym.make imports this module first,
# so the ids resolve in a spawned worker too.
for _id, _entry in (("shmvec-tests/Faulty-v0", FaultyEnv), ("shmvec-tests/Pid-v0", PidEnv)):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry)


class NoneInfoEnv(gym.Env):
    """Counts its steps in its observation and ends an episode every ``length`` steps; its
    ``step`` returns ``None`` for the info (not Gymnasium's API, but an env may)."""

    def __init__(self, length: int = 3) -> None:
        self.observation_space = spaces.Box(0.0, np.inf, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= self.length, False, None


def continuous_ppo_env(env_id: str = "HalfCheetah-v5", gamma: float = 0.99):
    """The env factory of ``examples/training/ppo_continuous.py``: a CleanRL-style continuous PPO
    script's per-env normalization and clipping, two of them by lambdas, which the wrappers record
    in the env's ``spec``."""
    import sys

    scripts = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples", "training")
    if scripts not in sys.path:
        sys.path.append(scripts)  # kept by spawned workers too: they rebuild the factory from its module
    from ppo_continuous import make_env

    return make_env(env_id, gamma)


class OddMetadataEnv(PidEnv):
    """Metadata that the standard pickle refuses (a lambda) and that nothing can pickle (a lock);
    a ``spec`` whose kwargs hold a lock."""

    def __init__(self) -> None:
        import threading

        super().__init__()
        self.metadata = {"render_modes": [], "render_fps": 7, "scale": lambda x: 2 * x, "lock": threading.Lock()}
        self.spec = gym.envs.registration.EnvSpec("shmvec-tests/Odd-v0", kwargs={"lock": threading.Lock()})


class LockedSpace(spaces.Box):
    """A Box that cannot be pickled: it holds a lock."""

    def __init__(self) -> None:
        import threading

        super().__init__(0.0, 1.0, shape=(2,), dtype=np.float64)
        self.lock = threading.Lock()


class UnpicklableSpaceEnv(PidEnv):
    """An env whose observation space cannot be sent to the calling process."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = LockedSpace()
