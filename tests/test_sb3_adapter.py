"""shmvec.sb3.SubprocVecEnv against SB3's own SubprocVecEnv / DummyVecEnv, side by side.

Each comparison builds the reference and ours from the same env factories and seeds and
checks observations, rewards, dones and infos (``terminal_observation``,
``TimeLimit.truncated``, the envs' own keys) step by step over many episode ends.
SB3's SubprocVecEnv runs with ``start_method="fork"`` so that it starts fast.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("stable_baselines3")  # the dev extra installs it: this only guards odd setups
import torch
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
)
from stable_baselines3.common.vec_env import SubprocVecEnv as SB3SubprocVecEnv

from shmvec.sb3 import SubprocVecEnv

torch.set_num_threads(1)


# -- envs --------------------------------------------------------------------------------------


class InfoEnv(gym.Env):
    """Dict (or Tuple) observations, random episode ends of both kinds, and varied infos."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, tuple_obs: bool = False, render_mode: str | None = None, all_box: bool = False) -> None:
        self.render_mode = render_mode
        self.tuple_obs = tuple_obs
        self.all_box = all_box  # VecFrameStack stacks Box spaces only
        pos = spaces.Box(-5.0, 5.0, shape=(3,), dtype=np.float32)
        count = spaces.Box(0.0, 50.0, shape=(1,), dtype=np.float32) if all_box else spaces.Discrete(50)
        self.observation_space = spaces.Tuple((pos, count)) if tuple_obs else spaces.Dict({"pos": pos, "count": count})
        self.action_space = spaces.Discrete(3)
        self.t = 0
        self.offset = 0.0
        self.label = "plain"

    def _obs(self):
        pos = (self.np_random.uniform(-1, 1, size=3) + self.offset).astype(np.float32)
        count = np.array([self.t], dtype=np.float32) if self.all_box else min(self.t, 49)
        return (pos, count) if self.tuple_obs else {"pos": pos, "count": count}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        if options and "offset" in options:
            self.offset = float(options["offset"])
        info = {"reset_draw": float(self.np_random.random())} if self.np_random.random() < 0.5 else {}
        return self._obs(), info

    def step(self, action):
        self.t += 1
        reward = float(action) + float(self.np_random.normal())
        terminated = bool(self.np_random.random() < 0.06)
        truncated = self.t >= 12
        info = {}
        u = self.np_random.random()
        if u < 0.3:
            info["count"] = self.t
            info["flag"] = bool(u < 0.1)
            info["vec"] = np.full(2, self.t, dtype=np.float32)
        if u > 0.8:
            info["nested"] = {"x": float(self.t), "tag": "n"}
        return self._obs(), reward, terminated, truncated, info

    def render(self):
        return np.full((4, 6, 3), self.t, dtype=np.uint8)

    def scaled(self, x, factor=1):
        return x * factor + self.t


class MarkerWrapper(gym.Wrapper):
    """A wrapper to look for with env_is_wrapped."""


def info_env_fns(n: int, tuple_obs: bool = False, marked: tuple[int, ...] = (), all_box: bool = False) -> list:
    def make(i):
        def fn():
            env = InfoEnv(tuple_obs=tuple_obs, render_mode="rgb_array", all_box=all_box)
            return MarkerWrapper(env) if i in marked else env

        return fn

    return [make(i) for i in range(n)]


def cartpole_fns(n: int, max_steps: int = 60) -> list:
    # A short time limit, so that truncations happen within a few hundred steps.
    return [lambda: Monitor(gym.make("CartPole-v1", max_episode_steps=max_steps)) for _ in range(n)]


@pytest.fixture
def closing():
    """Collects vector envs and closes them after the test, even when it fails."""
    venvs: list = []
    yield venvs.append
    for venv in venvs:
        venv.close()


# -- comparison helpers ------------------------------------------------------------------------


def assert_same(a, b, where: str) -> None:
    """Equal values and the same Python types (numpy arrays: same dtype and contents)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{k}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a!r} != {b!r}"
        assert np.array_equal(a, b), f"{where}: {a!r} != {b!r}"
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} ({type(a).__name__}) != {b!r} ({type(b).__name__})"


def assert_same_values(a, b, where: str) -> None:
    """Equal values, numpy scalars allowed for Python ones (a final observation read back from
    shared memory has the space's dtype, where SB3 passes on whatever the env returned)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for key in a:
            assert_same_values(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same_values(x, y, f"{where}[{k}]")
    else:
        assert np.array_equal(np.asarray(a), np.asarray(b)), f"{where}: {a!r} != {b!r}"


def assert_same_info(a: dict, b: dict, where: str) -> None:
    """Infos equal, but for Monitor's wall-clock time and the final observation's scalar types."""
    a, b = dict(a), dict(b)
    for info in (a, b):
        if "episode" in info:
            info["episode"] = {k: v for k, v in info["episode"].items() if k != "t"}
    assert ("terminal_observation" in a) == ("terminal_observation" in b), f"{where}: {a} != {b}"
    if "terminal_observation" in a:
        assert_same_values(a.pop("terminal_observation"), b.pop("terminal_observation"), f"{where} final obs")
    assert_same(a, b, where)


def run_side_by_side(ours, ref, steps: int, seed: int = 0, strict_types: bool = True) -> int:
    """Step both with the same random actions; compare everything; return the episode ends seen."""
    ours.seed(seed)
    ref.seed(seed)
    assert_same(ours.reset(), ref.reset(), "reset obs")
    for i, (a, b) in enumerate(zip(ours.reset_infos, ref.reset_infos)):
        assert_same(a, b, f"reset_infos[{i}]")
    rng = np.random.default_rng(seed)
    ends = 0
    for t in range(steps):
        actions = rng.integers(0, ours.action_space.n, size=ours.num_envs)
        obs, rew, done, infos = ours.step(actions)
        obs_r, rew_r, done_r, infos_r = ref.step(actions)
        assert_same(obs, obs_r, f"step {t} obs")
        if strict_types:
            assert_same(rew, rew_r, f"step {t} rewards")
        else:
            np.testing.assert_array_equal(rew.astype(rew_r.dtype), rew_r)
        assert_same(done, done_r, f"step {t} dones")
        assert isinstance(infos, (list, tuple)) and len(infos) == ours.num_envs
        for i, (a, b) in enumerate(zip(infos, infos_r)):
            assert_same_info(a, b, f"step {t} infos[{i}]")
        for i in np.flatnonzero(done):
            assert_same(ours.reset_infos[i], ref.reset_infos[i], f"step {t} reset_infos[{i}]")
        ends += int(done.sum())
    return ends


# -- side by side with SB3 ---------------------------------------------------------------------


def test_cartpole_matches_sb3_subproc(closing):
    fns = cartpole_fns(4)
    ours = SubprocVecEnv(fns, num_workers=2)
    closing(ours)
    ref = SB3SubprocVecEnv(fns, start_method="fork")
    closing(ref)
    ends = run_side_by_side(ours, ref, steps=400, seed=3)
    assert ends > 40


def test_cartpole_truncation_flags(closing):
    # A time limit of 8 steps with a policy that keeps the pole up: mostly truncations.
    fns = cartpole_fns(3, max_steps=8)
    ours = SubprocVecEnv(fns, num_workers=2)
    closing(ours)
    ref = DummyVecEnv(fns)
    closing(ref)
    ours.seed(1)
    ref.seed(1)
    ours.reset()
    ref.reset()
    truncated = 0
    for _ in range(40):
        actions = np.arange(3) % 2
        _, _, done, infos = ours.step(actions)
        _, _, done_r, infos_r = ref.step(actions)
        assert np.array_equal(done, done_r)
        for a, b in zip(infos, infos_r):
            assert a["TimeLimit.truncated"] is b["TimeLimit.truncated"]
            assert ("terminal_observation" in a) == ("terminal_observation" in b)
            if "terminal_observation" in a:
                assert_same(a["terminal_observation"], b["terminal_observation"], "terminal_observation")
            truncated += a["TimeLimit.truncated"]
    assert truncated > 5


def test_dict_obs_and_infos_match_sb3_subproc(closing):
    fns = info_env_fns(5)
    ours = SubprocVecEnv(fns, num_workers=2)
    closing(ours)
    ref = SB3SubprocVecEnv(fns, start_method="fork")
    closing(ref)
    assert ours.observation_space == ref.observation_space
    ends = run_side_by_side(ours, ref, steps=300, seed=7)
    assert ends > 50


def test_tuple_obs_match_dummy(closing):
    fns = info_env_fns(3, tuple_obs=True)
    ours = SubprocVecEnv(fns, num_workers=2)
    closing(ours)
    ref = DummyVecEnv(fns)
    closing(ref)
    # DummyVecEnv keeps float32 rewards (SB3's SubprocVecEnv and ours: float64).
    ends = run_side_by_side(ours, ref, steps=150, seed=11, strict_types=False)
    assert ends > 20


@pytest.mark.parametrize("wrap", ["normalize", "frame_stack", "monitor"])
def test_vec_wrappers_match(closing, wrap):
    fns = cartpole_fns(4) if wrap != "frame_stack" else info_env_fns(4, all_box=True)
    ours_base = SubprocVecEnv(fns, num_workers=2)
    closing(ours_base)
    ref_base = SB3SubprocVecEnv(fns, start_method="fork")
    closing(ref_base)
    if wrap == "normalize":
        ours, ref = VecNormalize(ours_base), VecNormalize(ref_base)
    elif wrap == "frame_stack":
        ours, ref = VecFrameStack(ours_base, n_stack=3), VecFrameStack(ref_base, n_stack=3)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the envs are Monitor-wrapped already: VecMonitor warns
            ours, ref = VecMonitor(ours_base), VecMonitor(ref_base)
    ends = run_side_by_side(ours, ref, steps=200, seed=5)
    assert ends > 20


def test_make_vec_env(closing):
    ours = make_vec_env("CartPole-v1", n_envs=3, seed=4, vec_env_cls=SubprocVecEnv, vec_env_kwargs={"num_workers": 2})
    closing(ours)
    ref = make_vec_env("CartPole-v1", n_envs=3, seed=4, vec_env_cls=SB3SubprocVecEnv, vec_env_kwargs={"start_method": "fork"})
    closing(ref)
    assert isinstance(ours, VecEnv)
    assert ours.render_mode == ref.render_mode == "rgb_array"
    assert_same(ours.reset(), ref.reset(), "reset obs")  # make_vec_env's seed reaches the first reset
    assert ours.env_is_wrapped(Monitor) == [True] * 3


def test_ppo_trains_identically(closing):
    """Same seed, same rollouts: PPO's weights after a short run are the same on both."""
    weights = []
    for cls, kwargs in ((SubprocVecEnv, {"num_workers": 2}), (SB3SubprocVecEnv, {"start_method": "fork"})):
        venv = make_vec_env("CartPole-v1", n_envs=4, seed=0, vec_env_cls=cls, vec_env_kwargs=kwargs)
        closing(venv)
        model = PPO("MlpPolicy", venv, n_steps=32, batch_size=64, n_epochs=2, seed=0, device="cpu")
        model.learn(total_timesteps=256)
        weights.append([p.detach().clone() for p in model.policy.parameters()])
    for a, b in zip(*weights):
        assert torch.equal(a, b)


def test_a2c_trains(closing):
    venv = make_vec_env("CartPole-v1", n_envs=4, seed=0, vec_env_cls=SubprocVecEnv, vec_env_kwargs={"num_workers": 2})
    closing(venv)
    model = A2C("MlpPolicy", venv, n_steps=8, seed=0, device="cpu")
    model.learn(total_timesteps=320)
    assert model.num_timesteps >= 320
    assert len(model.ep_info_buffer) > 0  # Monitor's episode infos came through


# -- the VecEnv contract -----------------------------------------------------------------------


@pytest.fixture
def info_venv(closing):
    venv = SubprocVecEnv(info_env_fns(4, marked=(1, 3)), num_workers=2)
    closing(venv)
    return venv


def test_is_an_sb3_vec_env(info_venv):
    assert isinstance(info_venv, VecEnv)
    assert info_venv.num_envs == 4
    assert isinstance(info_venv.observation_space, spaces.Dict)
    assert info_venv.action_space == spaces.Discrete(3)
    assert info_venv.metadata == {"render_modes": ["human", "rgb_array"]}


def test_seed_and_options_are_used_once(info_venv):
    seeds = info_venv.seed(100)
    assert seeds == [100, 101, 102, 103]
    first = info_venv.reset()
    expected = [InfoEnv().reset(seed=100 + i)[0]["pos"] for i in range(4)]
    np.testing.assert_array_equal(first["pos"], np.stack(expected))
    second = info_venv.reset()  # no seed this time: the envs go on with their own generators
    assert not np.array_equal(first["pos"], second["pos"])

    info_venv.set_options({"offset": 3.0})
    assert (info_venv.reset()["pos"] > 1.5).all()
    info_venv.set_options([{"offset": 10.0}, {"offset": 20.0}, {}, {"offset": 10.0}])
    pos = info_venv.reset()["pos"]
    assert (pos[0] > 8).all() and (pos[1] > 18).all() and (pos[3] > 8).all()
    assert (np.abs(pos[2] - 3.0) < 1.5).all()  # no options: the offset set before stays


def test_reset_infos(info_venv):
    info_venv.seed(0)
    info_venv.reset()
    expected = [InfoEnv().reset(seed=i)[1] for i in range(4)]
    assert info_venv.reset_infos == expected


def test_step_async_wait(info_venv):
    info_venv.reset()
    info_venv.step_async(np.zeros(4, dtype=np.int64))
    assert info_venv.waiting
    obs, rew, done, infos = info_venv.step_wait()
    assert not info_venv.waiting
    assert obs["pos"].shape == (4, 3) and rew.shape == (4,) and done.dtype == np.bool_ and len(infos) == 4


def test_get_set_attr_and_env_method(info_venv):
    info_venv.reset()
    assert info_venv.get_attr("label") == ["plain"] * 4
    info_venv.set_attr("label", "x", indices=[0, 3])
    assert info_venv.get_attr("label") == ["x", "plain", "plain", "x"]
    info_venv.set_attr("label", "y", indices=2)
    assert info_venv.get_attr("label", indices=[2, 0, 2]) == ["y", "x", "y"]
    # SB3 sets on the outermost wrapper: the base env of a wrapped one keeps its value.
    assert info_venv.env_method("get_wrapper_attr", "label", indices=[3]) == ["x"]
    assert info_venv.get_attr("unwrapped", indices=[3])[0].label == "plain"
    assert info_venv.env_method("scaled", 2, factor=5) == [10] * 4
    assert info_venv.env_method("scaled", 1, indices=[1]) == [1]
    assert info_venv.has_attr("scaled") and not info_venv.has_attr("no_such_thing")
    with pytest.raises(AttributeError):
        info_venv.get_attr("no_such_thing", indices=[3])  # raised in the worker process's block
    with pytest.raises(TypeError):
        info_venv.env_method("scaled")  # the env's own exception type comes back
    assert info_venv.get_attr("label", indices=[]) == []
    info_venv.step(np.ones(4, dtype=np.int64))  # still usable after the errors


SB3_INDICES = [None, 2, -1, -4, [0, -1], [-1, 0, -1], (3, 1), range(1, 4), range(3, -1, -1),
               np.array([-3, 2]), []]


@pytest.mark.parametrize("indices", SB3_INDICES, ids=repr)
def test_indices_as_sb3_reads_them(closing, indices):
    # Each per-env request against DummyVecEnv (SB3's own reading of indices=) on the same envs.
    fns = info_env_fns(4, marked=(1, 3))
    ours, ref = SubprocVecEnv(fns, num_workers=2), DummyVecEnv(fns)
    closing(ours)
    closing(ref)
    for venv in (ours, ref):
        venv.env_method("scaled", 0, indices=[0, 1, 2, 3])  # noop, but every env ran a request
        for i in range(4):
            venv.set_attr("label", f"env{i}", indices=i)
        venv.set_attr("label", "changed", indices=indices)
    assert ours.get_attr("label") == ref.get_attr("label")
    assert ours.get_attr("label", indices=indices) == ref.get_attr("label", indices=indices)
    assert ours.env_method("get_wrapper_attr", "label", indices=indices) == \
        ref.env_method("get_wrapper_attr", "label", indices=indices)
    assert ours.env_is_wrapped(MarkerWrapper, indices=indices) == ref.env_is_wrapped(MarkerWrapper, indices=indices)


def test_indices_slices_and_bad_indices(info_venv):
    # SB3 itself takes no slice and no lone numpy integer; ours reads them as a list index would.
    for i in range(4):
        info_venv.set_attr("label", f"env{i}", indices=i)
    assert info_venv.get_attr("label", indices=np.int64(-2)) == ["env2"]
    assert info_venv.get_attr("label", indices=slice(1, None)) == ["env1", "env2", "env3"]
    assert info_venv.get_attr("label", indices=slice(None, None, -2)) == ["env3", "env1"]
    info_venv.set_attr("label", "sliced", indices=slice(-2, None))
    assert info_venv.get_attr("label") == ["env0", "env1", "sliced", "sliced"]
    assert info_venv.env_is_wrapped(MarkerWrapper, indices=slice(0, 2)) == [False, True]
    # Out of range and non-integer, as a list index would say it (nothing is sent to the envs).
    for bad in (4, -5, [0, 4]):
        with pytest.raises(IndexError, match="out of range"):
            info_venv.get_attr("label", indices=bad)
    for bad in (1.0, ["a"]):
        with pytest.raises(TypeError):
            info_venv.env_method("scaled", 1, indices=bad)
    assert info_venv.get_attr("label") == ["env0", "env1", "sliced", "sliced"]


def test_env_is_wrapped(info_venv):
    assert info_venv.env_is_wrapped(MarkerWrapper) == [False, True, False, True]
    assert info_venv.env_is_wrapped(MarkerWrapper, indices=[3, 0]) == [True, False]
    assert info_venv.env_is_wrapped(Monitor) == [False] * 4


def test_render_and_get_images(info_venv):
    info_venv.reset()
    _, _, dones, _ = info_venv.step(np.zeros(4, dtype=np.int64))
    images = info_venv.get_images()
    # One step in: t is 1, or 0 where the episode ended and the env was reset in the same step.
    assert len(images) == 4 and all(img.shape == (4, 6, 3) and (img == (0 if done else 1)).all()
                                    for img, done in zip(images, dones))
    tiled = info_venv.render(mode="rgb_array")
    assert tiled.shape == (8, 12, 3)


def test_get_images_without_rgb_array_warns(closing):
    venv = SubprocVecEnv([lambda: gym.make("CartPole-v1")] * 2, num_workers=2)
    closing(venv)
    with pytest.warns(UserWarning, match="render mode"):
        assert venv.get_images() == [None, None]


def test_close_is_idempotent():
    venv = SubprocVecEnv([lambda: gym.make("CartPole-v1")] * 2, num_workers=2)
    venv.close()
    venv.close()
    assert venv.closed


def test_shmvec_options_pass_through(closing):
    venv = SubprocVecEnv([lambda: gym.make("CartPole-v1")] * 2, num_workers=1, validate_actions=True)
    closing(venv)
    assert venv.vector_env.num_workers == 1
    venv.reset()
    with pytest.raises(ValueError):
        venv.step(np.array([0, 5]))
    for forced in ("autoreset_mode", "copy", "context", "batch_size"):
        with pytest.raises(TypeError, match=forced):
            SubprocVecEnv([lambda: gym.make("CartPole-v1")], **{forced: None})


class CrashAtStep(gym.Env):
    """Box observations; raises at its fifth step."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == 5:
            raise RuntimeError("boom")
        return np.full(2, 0.1 * self.t, dtype=np.float32), 1.0, False, False, {}


def test_on_error_restart_reports_a_truncation_without_final_obs(closing):
    venv = SubprocVecEnv([CrashAtStep] * 4, num_workers=2, step_in_main=False, on_error="restart")
    closing(venv)
    venv.reset()
    for _ in range(4):
        _, _, done, infos = venv.step(np.zeros(4, dtype=np.int64))
        assert not done.any()
    _, _, done, infos = venv.step(np.zeros(4, dtype=np.int64))
    assert done.all()
    for info in infos:
        assert info["restarted"] is True and info["TimeLimit.truncated"] is True
        assert "terminal_observation" not in info  # lost with the crashed env; SB3's algorithms check for it
    assert len(venv.vector_env.restarts) == 2


def test_import_shmvec_does_not_import_sb3_or_torch():
    import subprocess
    import sys

    code = "import sys, shmvec, shmvec.baselines; shmvec.ShmVecEnv; print('torch' in sys.modules, 'stable_baselines3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize("space", ["dict", "tuple"])
def test_nested_actions_one_per_env_as_sb3_takes_them(closing, space):
    # SB3 indexes actions per env: for a Dict/Tuple action space they come as a list of samples.
    from envs_for_tests import EchoActionEnv

    action_space = EchoActionEnv().action_space
    if space == "tuple":
        action_space = spaces.Tuple(tuple(action_space.spaces.values()))
    fns = [lambda: EchoActionEnv(action_space)] * 3
    ours, ref = SubprocVecEnv(fns, num_workers=2), DummyVecEnv(fns)
    closing(ours)
    closing(ref)
    ours.reset()
    ref.reset()
    action_space.seed(0)
    for _ in range(3):
        actions = [action_space.sample() for _ in range(3)]
        np.testing.assert_array_equal(ours.step(actions)[0], ref.step(actions)[0])
    with pytest.raises(ValueError, match="one sample of"):
        ours.step([1, 2, 3])
