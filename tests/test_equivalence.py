"""ShmVecEnv must be bit-identical to gymnasium's SyncVectorEnv built from the same factories and seeds."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from envs_for_tests import NestedEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import shmvec


def assert_same(a, b, where="obs"):
    """Exact equality of nested observations / infos (dicts, tuples, arrays, object arrays)."""
    if isinstance(a, dict):
        # Mapping equality, as Python's: a final_obs keeps the env's own key order in
        # SyncVectorEnv and the space's order here.
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray) and a.dtype == object:
        assert isinstance(b, np.ndarray) and b.dtype == object and a.shape == b.shape, where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif a is None:
        assert b is None, where
    else:
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        assert a_arr.dtype == b_arr.dtype, f"{where}: dtype {a_arr.dtype} != {b_arr.dtype}"
        assert a_arr.shape == b_arr.shape, f"{where}: shape {a_arr.shape} != {b_arr.shape}"
        assert a_arr.tobytes() == b_arr.tobytes(), f"{where}: {a_arr} != {b_arr}"


def run_both(make_env, num_envs, steps, mode, seed=7, **kwargs):
    ref = SyncVectorEnv([make_env] * num_envs, autoreset_mode=mode)
    envs = shmvec.ShmVecEnv([make_env] * num_envs, autoreset_mode=mode, **kwargs)
    try:
        out_ref, out = ref.reset(seed=seed), envs.reset(seed=seed)
        assert_same(out_ref[0], out[0], "reset obs")
        assert_same(out_ref[1], out[1], "reset infos")
        ref.action_space.seed(seed)
        ends = 0
        for t in range(steps):
            actions = ref.action_space.sample()
            r = ref.step(actions)
            s = envs.step(actions)
            for name, x, y in zip(("obs", "rewards", "terminations", "truncations", "infos"), r, s):
                assert_same(x, y, f"step {t} {name}")
            ends += int(np.sum(r[2] | r[3]))
        return ends
    finally:
        ref.close()
        envs.close()


def cartpole():
    return gym.make("CartPole-v1")


def pendulum():
    return gym.make("Pendulum-v1", max_episode_steps=60)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("make_env", [cartpole, pendulum, NestedEnv], ids=["CartPole", "Pendulum", "Nested"])
def test_matches_sync_vector_env(make_env, num_workers, mode):
    ends = run_both(make_env, num_envs=7, steps=700, mode=mode, num_workers=num_workers)
    assert ends > 50  # many episode boundaries were crossed


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_thousands_of_steps(mode):
    ends = run_both(cartpole, num_envs=7, steps=3000, mode=mode, num_workers=2)
    assert ends > 800


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
@pytest.mark.parametrize("make_env", [cartpole, pendulum, NestedEnv], ids=["CartPole", "Pendulum", "Nested"])
def test_start_methods(context, make_env, mode):
    ends = run_both(make_env, num_envs=5, steps=300, mode=mode, num_workers=3, context=context)
    assert ends > 10


@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("step_in_main", [True, False])
def test_all_envs_in_workers_matches_too(step_in_main, num_workers):
    # num_workers=1 with step_in_main=False: one worker process hosts every env.
    run_both(NestedEnv, num_envs=4, steps=300, mode=AutoresetMode.NEXT_STEP, num_workers=num_workers,
             step_in_main=step_in_main)


def test_closures_with_spawn():
    gravity = 9.81

    def make():
        return gym.make("CartPole-v1").unwrapped if gravity < 0 else gym.make("CartPole-v1")

    run_both(make, num_envs=3, steps=100, mode=AutoresetMode.NEXT_STEP, num_workers=2, context="spawn")


def test_disabled_mode_with_masked_resets():
    ref = SyncVectorEnv([cartpole] * 4, autoreset_mode=AutoresetMode.DISABLED)
    envs = shmvec.ShmVecEnv([cartpole] * 4, autoreset_mode=AutoresetMode.DISABLED, num_workers=2)
    try:
        assert_same(ref.reset(seed=3)[0], envs.reset(seed=3)[0])
        ref.action_space.seed(0)
        for t in range(300):
            a = ref.action_space.sample()
            r, s = ref.step(a), envs.step(a)
            for x, y in zip(r, s):
                assert_same(x, y, f"step {t}")
            ended = r[2] | r[3]
            if ended.any():
                with pytest.raises(ValueError, match="DISABLED"):
                    envs.step(a)
                opts = {"reset_mask": ended}
                assert_same(ref.reset(options=dict(opts)), envs.reset(options=dict(opts)))
    finally:
        ref.close()
        envs.close()


def test_reset_seed_list_and_options():
    ref = SyncVectorEnv([NestedEnv] * 3)
    with shmvec.ShmVecEnv([NestedEnv] * 3, num_workers=2) as envs:
        seeds = [5, None, 11]
        r, s = ref.reset(seed=seeds, options={"scale": 3.0}), envs.reset(seed=seeds, options={"scale": 3.0})
        assert_same(r[0]["pos"][[0, 2]], s[0]["pos"][[0, 2]])
        assert np.all(np.abs(s[0]["pos"]) <= 3.0)
        with pytest.raises(ValueError, match="seeds"):
            envs.reset(seed=[1, 2])
    ref.close()
