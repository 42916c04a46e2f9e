"""RayVecEnv on a local Ray cluster: the same results as a local ShmVecEnv, faults, clean shutdown."""

from __future__ import annotations

import os
import signal
import time
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from envs_for_tests import FaultyEnv, NestedEnv, VariableSizeEnv
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from test_equivalence import assert_same
from test_rollout import cartpole, cartpole_policy, nested_policy

import shmvec

ray = pytest.importorskip("ray", reason="the ray extra is part of dev: make test installs it")
from shmvec.ray import RayVecEnv  # noqa: E402


pytestmark = pytest.mark.usefixtures("ray_cluster")


def gone(pids, within=10.0):
    deadline = time.monotonic() + within
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.05)
    return not alive


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent's wait() is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def same_batch(a, b):
    assert set(a) == set(b)
    for key in a:
        if key == "infos":
            assert len(a[key]) == len(b[key])
            for t, (x, y) in enumerate(zip(a[key], b[key])):
                assert_same(x, y, f"infos[{t}]")
        else:
            assert_same(a[key], b[key], key)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP], ids=["next", "same"])
@pytest.mark.parametrize("case", ["cartpole", "nested"])
def test_rollout_across_actors_equals_local_rollout(case, mode):
    make_env, policy = {"cartpole": (cartpole, cartpole_policy), "nested": (NestedEnv, nested_policy)}[case]
    n, seed = 7, 3  # 3 actors of 3, 2 and 2 envs: global ids and seeds across uneven blocks
    local = shmvec.ShmVecEnv([make_env] * n, num_workers=2, autoreset_mode=mode)
    remote = RayVecEnv([make_env] * n, num_actors=3, autoreset_mode=mode)
    try:
        assert remote.num_actors == 3 and [len(b) for b in remote.blocks] == [3, 2, 2]
        assert_same(local.reset(seed=seed), remote.reset(seed=seed), "reset")
        ends = 0
        for T in (50, 50, 20):  # episodes span calls
            mine = local.rollout(policy, T)
            theirs = remote.rollout(policy, T)
            same_batch(mine, theirs)
            ends += int((mine["terminations"] | mine["truncations"]).sum())
        assert ends >= 5
        assert_same(local.episode_returns, remote.episode_returns)
        assert_same(local.episode_counts, remote.episode_counts)
    finally:
        local.close()
        remote.close()


def test_step_api_equals_sync_vector_env():
    n, seed = 5, 9
    ref = SyncVectorEnv([NestedEnv] * n)
    envs = RayVecEnv([NestedEnv] * n, num_actors=2)
    try:
        assert envs.single_observation_space == ref.single_observation_space
        assert envs.action_space == ref.action_space
        assert_same(ref.reset(seed=seed), envs.reset(seed=seed), "reset")
        ref.action_space.seed(seed)
        for t in range(80):
            actions = ref.action_space.sample()
            for name, x, y in zip(("obs", "rewards", "terms", "truncs", "infos"), ref.step(actions), envs.step(actions)):
                assert_same(x, y, f"step {t} {name}")
        assert envs.call("double", 21) == (42,) * n
        envs.set_attr("scale", [1.0, 2.0, 3.0, 4.0, 5.0])
        assert envs.get_attr("scale") == (1.0, 2.0, 3.0, 4.0, 5.0)
        assert len(envs.render()) == n
    finally:
        ref.close()
        envs.close()


def test_variable_size_spaces_equal_sync_vector_env():
    """Text/Sequence/Graph leaves (batched as tuples) are joined across actors as tuples."""
    fns = [partial(VariableSizeEnv, "Mixed", variable_actions=True)] * 3
    ref = SyncVectorEnv(fns)
    envs = RayVecEnv(fns, num_actors=2)
    try:
        assert_same(ref.reset(seed=1), envs.reset(seed=1), "reset")
        ref.action_space.seed(1)
        for t in range(20):
            actions = ref.action_space.sample()
            assert_same(ref.step(actions), envs.step(actions), f"step {t}")
    finally:
        ref.close()
        envs.close()


class ThresholdPolicy:
    """A policy with a weight: broadcast once per update, used on the actors."""

    def __init__(self, threshold):
        self.threshold = threshold

    def __call__(self, obs):
        return (obs[:, 2] > self.threshold).astype(np.int64), {"w": np.full(len(obs), self.threshold)}


def test_set_policy_broadcasts_new_weights():
    with RayVecEnv([cartpole] * 4, num_actors=2) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="needs a policy"):
            envs.rollout(num_steps=4)
        envs.set_policy(ThresholdPolicy(0.5))
        assert (envs.rollout(num_steps=4)["w"] == 0.5).all()
        assert (envs.rollout(ThresholdPolicy(-1.0), 4)["w"] == -1.0).all()
        assert (envs.rollout(num_steps=4)["w"] == -1.0).all()  # the last one stays


def test_bad_input_is_refused_clearly():
    with pytest.raises(ValueError, match="DISABLED"):
        RayVecEnv([cartpole] * 2, autoreset_mode=AutoresetMode.DISABLED)
    with pytest.raises(TypeError, match="sets .batch_size. itself"):
        RayVecEnv([cartpole] * 2, batch_size=1)
    with pytest.raises(ValueError, match="num_cpus=64.*largest node"):
        RayVecEnv([cartpole] * 2, num_workers_per_actor=64)
    with pytest.raises(TypeError, match=r"env_fns\[1\]"):
        RayVecEnv([cartpole, 3])
    with RayVecEnv([cartpole] * 6, num_actors=2) as envs:
        with pytest.raises(ResetNeeded):
            envs.step(np.zeros(6, np.int64))
        envs.reset(seed=0)
        bad = np.zeros(6, np.int64)
        bad[4] = 9
        with pytest.raises(ValueError, match=r"actions\[4\] = 9 is outside"):  # the global index
            envs.step(bad)
        with pytest.raises(ValueError, match="shape"):
            envs.step(np.zeros(5, np.int64))
        with pytest.raises(ValueError, match="reset_mask"):
            envs.reset(options={"reset_mask": np.ones(6, bool)})
        with pytest.raises(ValueError, match="num_steps"):
            envs.rollout(cartpole_policy, 0)
        assert envs.step(np.zeros(6, np.int64))[1].shape == (6,)  # still usable


def test_construction_error_names_the_env():
    fns = [cartpole] * 3 + [lambda: FaultyEnv("construct")]
    with pytest.raises(shmvec.WorkerError, match="constructor exploded") as info:
        RayVecEnv(fns, num_actors=2)
    assert info.value.env_index == 3 and "Ray actor 1" in str(info.value)  # global index, and where


def test_env_error_in_an_actor_raises_and_closes():
    envs = RayVecEnv([lambda: FaultyEnv("raise", at=5)] * 4, num_actors=2)
    envs.reset(seed=0)
    with pytest.raises(shmvec.WorkerError, match="step exploded"):
        envs.rollout(lambda o: np.zeros(len(o), np.int64), 10)
    with pytest.raises(shmvec.ClosedError):
        envs.rollout(num_steps=3)
    envs.close()


def test_dead_actor_is_reported_with_actor_and_node_and_nothing_is_left():
    envs = RayVecEnv([cartpole] * 8, num_actors=2, num_workers_per_actor=2)
    info = envs._info
    workers = [pid for i in info for pid in i["worker_pids"]]
    assert len(workers) == 4  # every env in a worker process: two per actor
    envs.reset(seed=0)
    envs.rollout(cartpole_policy, 5)
    os.kill(info[1]["pid"], signal.SIGKILL)
    with pytest.raises(shmvec.ActorDied, match=r"Ray actor 1 \(envs 4..7\) on node \S+") as err:
        for _ in range(50):  # the death reaches Ray within moments
            envs.rollout(cartpole_policy, 5)
    assert err.value.actor_index == 1 and err.value.node_ip == info[1]["node_ip"]
    assert gone(workers + [i["pid"] for i in info]), "a worker or actor process outlived the vector env"
    envs.close()  # idempotent after the fault


def test_close_ends_actors_and_their_workers():
    envs = RayVecEnv([cartpole] * 6, num_actors=2, num_workers_per_actor=2, on_error="restart")
    pids = [i["pid"] for i in envs._info] + [p for i in envs._info for p in i["worker_pids"]]
    envs.reset(seed=1)
    envs.rollout(cartpole_policy, 8)
    envs.close()
    envs.close()
    assert gone(pids), "a worker or actor process outlived close()"
    with pytest.raises(shmvec.ClosedError):
        envs.reset()
