"""Small envs for the tests: a nested-space env with infos, and envs that misbehave on purpose."""

from __future__ import annotations

import os
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


class FaultyEnv(gym.Env):
    """CartPole-like spaces; misbehaves in the way ``fault`` names, at step ``at``."""

    def __init__(self, fault: str = "none", at: int = 3) -> None:
        if fault == "construct":
            raise RuntimeError("constructor exploded")
        self.fault, self.at, self.t = fault, at, 0
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
            if self.fault == "hang":
                time.sleep(60)
            if self.fault == "shape":
                obs = np.zeros(5, dtype=np.float32)
            if self.fault == "dtype":
                obs = np.zeros(4, dtype=np.complex64)
            if self.fault == "nan_obs":
                obs[2] = np.nan
            if self.fault == "inf_reward":
                return obs, float("inf"), False, False, {}
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
