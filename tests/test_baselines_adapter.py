"""shmvec.baselines.SubprocVecEnv against a reference loop over the raw envs.

The reference is the classic API written out: ``done = terminated or truncated``; a done env
is reset within the step and returns its new episode's first observation, the final one in
``info["terminal_observation"]`` with ``info["TimeLimit.truncated"]``; ``reset()`` returns
observations only.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from shmvec.baselines import SubprocVecEnv


class EndsEnv(gym.Env):
    """Dict observations, both kinds of episode ends, infos with several value types."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = spaces.Dict(
            {"x": spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32), "t": spaces.Discrete(20)}
        )
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def _obs(self):
        return {"x": self.np_random.uniform(-1, 1, size=2).astype(np.float32), "t": self.t}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {"reset": True}

    def step(self, action):
        self.t += 1
        terminated = bool(self.np_random.random() < 0.08)
        truncated = self.t >= 10
        info = {"t": self.t, "odd": bool(self.t % 2)} if self.np_random.random() < 0.4 else {}
        return self._obs(), float(action) - 0.5, terminated, truncated, info

    def render(self):
        return np.full((2, 3, 3), self.t, dtype=np.uint8)


class Reference:
    """The classic SubprocVecEnv's semantics, one env after the other in this process."""

    def __init__(self, env_fns) -> None:
        self.envs = [fn() for fn in env_fns]

    def reset(self, seed):
        return [env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]

    def step(self, actions):
        out = []
        for env, a in zip(self.envs, actions):
            obs, rew, terminated, truncated, info = env.step(a)
            done = terminated or truncated
            if done:
                info = dict(info, terminal_observation=obs, **{"TimeLimit.truncated": truncated and not terminated})
                obs, _ = env.reset()
            out.append((obs, rew, done, info))
        return out


def stack(obs_list):
    if isinstance(obs_list[0], dict):
        return {k: np.stack([o[k] for o in obs_list]) for k in obs_list[0]}
    return np.stack(obs_list)


def assert_obs_equal(a, b, where):
    if isinstance(b, dict):
        assert set(a) == set(b), where
        for k in b:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{where}[{k!r}]")
    else:
        np.testing.assert_array_equal(a, b, err_msg=where)


def assert_info_equal(a: dict, b: dict, where: str) -> None:
    assert set(a) == set(b), f"{where}: {a} != {b}"
    for key in b:
        if key == "terminal_observation":
            assert_obs_equal(a[key], b[key], f"{where} terminal_observation")
        else:
            assert a[key] == b[key] and type(a[key]) is type(b[key]), f"{where}[{key!r}]: {a[key]!r} != {b[key]!r}"


@pytest.mark.parametrize(
    "make_env",
    [
        pytest.param(lambda: gym.make("CartPole-v1", max_episode_steps=25), id="cartpole"),
        pytest.param(EndsEnv, id="dict-obs"),
    ],
)
def test_matches_reference_loop(make_env):
    fns = [make_env for _ in range(5)]
    ref = Reference(fns)
    rng = np.random.default_rng(0)
    ends = truncations = 0
    with SubprocVecEnv(fns, num_workers=2) as envs:
        assert_obs_equal(envs.reset(seed=10), stack(ref.reset(seed=10)), "reset")
        for t in range(300):
            actions = rng.integers(0, 2, size=5)
            obs, rews, dones, infos = envs.step(actions)
            obs_r, rews_r, dones_r, infos_r = zip(*ref.step(actions))
            assert_obs_equal(obs, stack(obs_r), f"step {t} obs")
            np.testing.assert_array_equal(rews, np.array(rews_r))
            assert rews.dtype == np.float64 and dones.dtype == np.bool_
            np.testing.assert_array_equal(dones, np.array(dones_r))
            assert len(infos) == 5
            for i, (a, b) in enumerate(zip(infos, infos_r)):
                assert_info_equal(a, b, f"step {t} infos[{i}]")
            ends += int(dones.sum())
            truncations += sum(info.get("TimeLimit.truncated", False) for info in infos)
    assert ends > 50 and truncations > 5


def test_step_async_wait_len_and_spaces():
    envs = SubprocVecEnv([lambda: gym.make("CartPole-v1")] * 3)
    try:
        assert len(envs) == envs.num_envs == envs.nenvs == 3
        assert envs.observation_space == gym.make("CartPole-v1").observation_space  # one env's space
        assert envs.action_space == spaces.Discrete(2)
        obs = envs.reset()
        assert obs.shape == (3, 4)
        envs.step_async([0, 1, 0])
        assert envs.waiting
        obs, rews, dones, infos = envs.step_wait()
        assert not envs.waiting
        assert obs.shape == (3, 4) and rews.tolist() == [1.0, 1.0, 1.0] and not dones.any()
        assert infos == [{}, {}, {}]  # TimeLimit.truncated only appears when an episode ends
    finally:
        envs.close()
    envs.close()  # twice is fine
    assert envs.closed


def test_classic_signature_and_in_series():
    fns = [lambda: gym.make("CartPole-v1")] * 6
    with SubprocVecEnv(fns, None, None, 3) as envs:  # (env_fns, spaces, context, in_series)
        assert envs.vector_env.num_workers == 2
    with SubprocVecEnv(fns, num_workers=1, step_in_main=False) as envs:
        assert envs.vector_env.num_workers == 1
        envs.reset(seed=0)
        envs.step(np.zeros(6, dtype=np.int64))
    with pytest.raises(ValueError):
        SubprocVecEnv(fns, in_series=0)
    with pytest.raises(TypeError, match="autoreset_mode"):
        SubprocVecEnv(fns, autoreset_mode="NextStep")


def test_get_images():
    with SubprocVecEnv([lambda: EndsEnv(render_mode="rgb_array")] * 2, num_workers=2) as envs:
        envs.reset(seed=0)
        envs.step([1, 1])
        frames = envs.get_images()
        assert len(frames) == 2 and all(f.shape == (2, 3, 3) for f in frames)


def test_nested_actions_one_per_env():
    # The classic API indexes actions per env: a list of dict samples for a Dict action space.
    from envs_for_tests import EchoActionEnv

    space = EchoActionEnv().action_space
    space.seed(0)
    with SubprocVecEnv([EchoActionEnv] * 3, num_workers=2) as envs:
        envs.reset()
        actions = [space.sample() for _ in range(3)]
        obs, *_ = envs.step(actions)
        np.testing.assert_array_equal(obs, np.stack([gym.spaces.flatten(space, a) for a in actions]))


@pytest.mark.parametrize("step_in_main", [False, True])
def test_in_series_sets_the_block_size(step_in_main):
    """As in baselines: in_series envs per block, the calling process's block included."""
    with SubprocVecEnv([lambda: gym.make("CartPole-v1")] * 6, in_series=2, step_in_main=step_in_main) as envs:
        assert [len(b) for b in envs.vector_env.blocks] == [2, 2, 2]
        assert len(envs.vector_env.worker_pids) == 3 - step_in_main
