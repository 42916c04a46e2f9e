"""The synthetic benchmark envs: spaces, determinism, seeded heavy tail, and a real CPU cost per step."""

from __future__ import annotations

import pickle
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from shmvec.envs import AtariLikeEnv, FixedCostEnv, HeavyTailEnv, SyntheticEnv, burn_cpu


def rollout(env: gym.Env, seed: int, steps: int) -> list:
    obs, _ = env.reset(seed=seed)
    out = [obs]
    for t in range(steps):
        obs, reward, terminated, truncated, _ = env.step(t % env.action_space.n)
        out.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            obs, _ = env.reset()
            out.append(obs)
    return out


@pytest.mark.parametrize(
    "env, shape, dtype",
    [
        (AtariLikeEnv(), (84, 84, 4), np.uint8),
        (FixedCostEnv(step_us=0), (8,), np.float32),
        (HeavyTailEnv(step_us=0, slow_us=0), (8,), np.float32),
        (SyntheticEnv(obs_shape=(3, 5), obs_dtype="float64"), (3, 5), np.float64),
    ],
)
def test_spaces_and_checker(env, shape, dtype):
    assert env.observation_space.shape == shape and env.observation_space.dtype == dtype
    assert isinstance(env.action_space, gym.spaces.Discrete)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=3)
    for t in range(20):
        assert env.observation_space.contains(obs)
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert isinstance(reward, float) and isinstance(terminated, bool) and not truncated and info == {}


def test_observations_are_fresh_arrays():
    env = AtariLikeEnv()
    obs0, _ = env.reset(seed=0)
    obs1, *_ = env.step(1)
    obs2, *_ = env.step(1)
    assert not np.shares_memory(obs1, obs2) and not np.shares_memory(obs0, obs1)
    assert not np.array_equal(obs1, obs2) or not np.array_equal(obs0, obs1)


def test_deterministic_given_the_seed():
    a = rollout(SyntheticEnv(episode_steps=5, obs_shape=(2, 3), obs_dtype="uint8"), seed=7, steps=40)
    b = rollout(SyntheticEnv(episode_steps=5, obs_shape=(2, 3), obs_dtype="uint8"), seed=7, steps=40)
    c = rollout(SyntheticEnv(episode_steps=5, obs_shape=(2, 3), obs_dtype="uint8"), seed=8, steps=40)
    assert pickle.dumps(a) == pickle.dumps(b)
    assert pickle.dumps(a) != pickle.dumps(c)


def test_episodes_end_within_the_drawn_range():
    env = SyntheticEnv(episode_steps=4)
    env.reset(seed=0)
    lengths, t = [], 0
    for _ in range(200):
        _, _, terminated, _, _ = env.step(0)
        t += 1
        if terminated:
            lengths.append(t)
            t = 0
            env.reset()
    assert lengths and all(2 <= n <= 6 for n in lengths)
    assert len(set(lengths)) > 1  # lengths vary, so vectorized copies do not end in lockstep


def test_heavy_tail_draws_follow_the_seed():
    def slow_steps(seed: int) -> int:
        env = HeavyTailEnv(step_us=0, slow_us=1, slow_prob=0.05)
        rollout(env, seed, 2000)
        return env.slow_steps

    assert slow_steps(1) == slow_steps(1)
    assert 40 < slow_steps(1) < 180  # ~5 % of 2000
    assert slow_steps(1) != slow_steps(2) or slow_steps(1) != slow_steps(3)


def cpu_per_step(env: gym.Env, steps: int) -> float:
    env.reset(seed=0)
    start = time.thread_time()
    for _ in range(steps):
        _, _, terminated, _, _ = env.step(0)
        if terminated:
            env.reset()
    return (time.thread_time() - start) / steps


def test_step_cost_is_real_cpu_work_and_scales():
    # CPU time of this thread, not wall time: immune to the machine being busy.
    free = cpu_per_step(SyntheticEnv(step_us=0), 200)
    c100 = cpu_per_step(FixedCostEnv(step_us=100), 100)
    c300 = cpu_per_step(FixedCostEnv(step_us=300), 100)
    assert c100 > free + 80e-6
    assert c300 > c100 + 150e-6


def test_heavy_tail_costs_more_on_average_than_its_fast_steps():
    fast = cpu_per_step(HeavyTailEnv(step_us=10, slow_prob=0.0, slow_us=2000), 200)
    mixed = cpu_per_step(HeavyTailEnv(step_us=10, slow_prob=0.1, slow_us=2000), 200)
    assert mixed > fast + 50e-6  # ~10 % of 2 ms = 200 us on average


def test_burn_cpu_spends_at_least_the_time_asked():
    start = time.thread_time()
    burn_cpu(2000)
    assert time.thread_time() - start >= 2000e-6
    burn_cpu(0)
    burn_cpu(-1)


@pytest.mark.parametrize("env_id", ["shmvec/AtariLike-v0", "shmvec/FixedCost-v0", "shmvec/HeavyTail-v0",
                                    "shmvec/Synthetic-v0", "shmvec.envs:shmvec/AtariLike-v0"])
def test_registered_ids(env_id):
    env = gym.make(env_id)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    env.step(0)
    env.close()


def test_registered_ids_take_parameters():
    env = gym.make("shmvec/Synthetic-v0", obs_shape=(2,), step_us=5)
    assert env.observation_space.shape == (2,) and env.unwrapped.step_us == 5


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="slow_us"):
        SyntheticEnv(slow_prob=0.1)
    with pytest.raises(ValueError, match="slow_prob"):
        SyntheticEnv(slow_prob=1.5, slow_us=1)
    with pytest.raises(ValueError, match="obs_dtype"):
        SyntheticEnv(obs_dtype="int32")
    with pytest.raises(ValueError, match=">= 0"):
        SyntheticEnv(step_us=-1)
    with pytest.raises(ValueError, match="episode_steps"):
        SyntheticEnv(episode_steps=0)
