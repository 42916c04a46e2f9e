"""shmvec.torch.TorchVecEnv: the same results as the numpy env, as tensors (CPU here; CUDA where there is one)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from envs_for_tests import NestedEnv
from gymnasium.vector import SyncVectorEnv

import shmvec

torch = pytest.importorskip("torch", reason="torch is part of the dev extra: make test installs it")
from shmvec.torch import TorchVecEnv  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here: the GPU path is checked where torch sees one"))]


def cartpole():
    return gym.make("CartPole-v1", max_episode_steps=30)


def as_numpy(tree):
    if isinstance(tree, dict):
        return {k: as_numpy(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(as_numpy(v) for v in tree)
    return tree.cpu().numpy()


def leaves(tree):
    """The arrays of a nested dict/tuple, depth first (the test's own walk, independent of shmvec's)."""
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in leaves(v)]
    if isinstance(tree, tuple):
        return [x for v in tree for x in leaves(v)]
    return [tree]


def assert_tree_equal(a, b):
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def nested_actions(obs_np):
    return ((obs_np["inner"][0] % 3).astype(np.int64),
            np.clip(obs_np["pos"][:, :2] / 10.0, -1.0, 1.0).astype(np.float64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("copy", [True, False])
def test_step_loop_equals_sync_vector_env(device, copy):
    """Tensors on the device hold exactly SyncVectorEnv's results; actions go in as device tensors."""
    n = 6
    ref = SyncVectorEnv([cartpole] * n)
    envs = TorchVecEnv(shmvec.ShmVecEnv([cartpole] * n, num_workers=2), device=device, copy=copy)
    try:
        obs, _ = envs.reset(seed=3)
        ref_obs, _ = ref.reset(seed=3)
        assert obs.device.type == device
        np.testing.assert_array_equal(obs.cpu().numpy(), ref_obs)
        for t in range(70):
            actions = (obs[:, 2] > 0).long()  # computed on the device, from the device observations
            obs, rewards, terms, truncs, infos = envs.step(actions)
            ref_obs, ref_rewards, ref_terms, ref_truncs, ref_infos = ref.step(actions.cpu().numpy())
            for got, want in [(obs, ref_obs), (rewards, ref_rewards), (terms, ref_terms), (truncs, ref_truncs)]:
                assert got.device.type == device
                assert got.dtype == torch.from_numpy(np.asarray(want)).dtype
                np.testing.assert_array_equal(got.cpu().numpy(), want)
            assert sorted(infos) == sorted(ref_infos)
    finally:
        envs.close()
        ref.close()


@pytest.mark.parametrize("device", DEVICES)
def test_nested_spaces(device):
    """Dict/Tuple observations and Tuple actions: each leaf a tensor, equal to SyncVectorEnv's."""
    n = 4
    ref = SyncVectorEnv([NestedEnv] * n)
    envs = TorchVecEnv(shmvec.ShmVecEnv([NestedEnv] * n, num_workers=2), device=device)
    try:
        obs, _ = envs.reset(seed=1)
        ref_obs, _ = ref.reset(seed=1)
        assert_tree_equal(as_numpy(obs), ref_obs)
        for _ in range(20):
            discrete, box = nested_actions(ref_obs)
            obs, rewards, *_ = envs.step((torch.from_numpy(discrete).to(device), torch.from_numpy(box).to(device)))
            ref_obs, ref_rewards, *_ = ref.step((discrete, box))
            assert_tree_equal(as_numpy(obs), ref_obs)
            np.testing.assert_array_equal(rewards.cpu().numpy(), ref_rewards)
    finally:
        envs.close()
        ref.close()


def test_cpu_tensors_share_the_shared_memory():
    """On the CPU, copy=False hands out the shared buffers themselves; copy=True tensors of their own."""
    envs = TorchVecEnv(shmvec.make("CartPole-v1", num_envs=4, num_workers=2), device="cpu", copy=False)
    try:
        obs, _ = envs.reset(seed=0)
        buffers = envs.env.buffers
        assert obs.data_ptr() == buffers.obs.ctypes.data
        obs2, rewards, *_ = envs.step(torch.zeros(4, dtype=torch.int64))
        assert obs2.data_ptr() == obs.data_ptr() and rewards.data_ptr() == buffers.rewards.ctypes.data
        envs.copy = True
        obs3, *_ = envs.step(torch.zeros(4, dtype=torch.int64))
        assert obs3.data_ptr() != obs.data_ptr()
        np.testing.assert_array_equal(obs3.numpy(), buffers.obs)
    finally:
        envs.close()


@pytest.mark.parametrize("device", DEVICES)
def test_send_recv_batches_match_the_env_rows(device):
    """recv's tensors are the rows of the envs it names, whichever blocks finish first."""
    envs = TorchVecEnv(shmvec.ShmVecEnv([cartpole] * 8, num_workers=4, batch_size=4), device=device)
    try:
        envs.async_reset(seed=0)
        seen = set()
        for _ in range(40):
            obs, rewards, terms, truncs, infos, env_ids = envs.recv()
            assert obs.shape == (4, 4) and obs.device.type == device
            buffers = envs.env.buffers
            np.testing.assert_array_equal(obs.cpu().numpy(), buffers.obs[env_ids])
            np.testing.assert_array_equal(rewards.cpu().numpy(), buffers.rewards[env_ids])
            np.testing.assert_array_equal(terms.cpu().numpy(), buffers.terminations[env_ids])
            seen.add(tuple(env_ids))
            envs.send((obs[:, 2] > 0).long(), env_ids)
        assert len(seen) >= 1
    finally:
        envs.close()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("copy", [True, False])
def test_gathers_blocks_that_are_not_adjacent(device, copy):
    """A batch of blocks 0 and 2 (not adjacent) comes out in env-id order, row for row."""
    envs = TorchVecEnv(shmvec.ShmVecEnv([cartpole] * 8, num_workers=4), device=device, copy=copy)
    try:
        envs.reset(seed=5)
        envs.step(torch.ones(8, dtype=torch.int64))
        host = envs._host  # obs leaf, rewards, terminations, truncations: the full shared buffers
        out = envs._to_device(host, ((0, 2), (4, 6)), "test")
        rows = [0, 1, 4, 5]
        for got, buf in zip(out, [envs.env.buffers.obs, envs.env.buffers.rewards,
                                  envs.env.buffers.terminations, envs.env.buffers.truncations]):
            assert got.shape[0] == 4
            np.testing.assert_array_equal(got.cpu().numpy(), buf[rows])
    finally:
        envs.close()


@pytest.mark.parametrize("device", DEVICES)
def test_rollout_equals_the_numpy_rollout(device):
    """rollout on tensors: the same [T, N] batch as ShmVecEnv.rollout with the same policy and seeds,
    extras kept on the device the policy made them, twice in a row (storage reused)."""
    n, T = 6, 25

    def np_policy(obs):
        return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64), {"value": obs[:, 0].astype(np.float32)}

    def torch_policy(obs):
        assert isinstance(obs, torch.Tensor) and obs.device.type == device
        return (obs[:, 2] + 0.3 * obs[:, 3] > 0).long(), {"value": obs[:, 0].float()}

    ref = shmvec.ShmVecEnv([cartpole] * n, num_workers=2)
    envs = TorchVecEnv(shmvec.ShmVecEnv([cartpole] * n, num_workers=2), device=device)
    try:
        ref.reset(seed=7)
        envs.reset(seed=7)
        for _ in range(2):
            want = ref.rollout(np_policy, T)
            got = envs.rollout(torch_policy, T)
            for key in ("obs", "actions", "rewards", "terminations", "truncations", "valid", "next_obs", "value"):
                assert got[key].device.type == device, key
                np.testing.assert_array_equal(got[key].cpu().numpy(), want[key], err_msg=key)
            assert len(got["infos"]) == T
        # a step after the rollout continues from its last row
        obs, *_ = envs.step(torch.zeros(n, dtype=torch.int64))
        ref_obs, *_ = ref.step(np.zeros(n, dtype=np.int64))
        np.testing.assert_array_equal(obs.cpu().numpy(), ref_obs)
    finally:
        envs.close()
        ref.close()


def test_bad_actions_are_refused_and_the_env_goes_on():
    envs = TorchVecEnv(shmvec.make("CartPole-v1", num_envs=4, num_workers=2), device="cpu")
    try:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="action"):
            envs.step(torch.full((4,), 7, dtype=torch.int64))  # outside Discrete(2)
        with pytest.raises(ValueError):
            envs.step(torch.zeros(3, dtype=torch.int64))  # one row short
        obs, rewards, *_ = envs.step(torch.zeros(4, dtype=torch.int64))
        assert rewards.tolist() == [1.0] * 4
    finally:
        envs.close()


def test_wraps_only_shmvec_and_delegates_its_attributes():
    with pytest.raises(TypeError, match="ShmVecEnv"):
        TorchVecEnv(SyncVectorEnv([cartpole]))
    with TorchVecEnv(shmvec.make("CartPole-v1", num_envs=2, num_workers=2), device="cpu") as envs:
        envs.reset(seed=0)
        for _ in range(40):
            envs.step(torch.ones(2, dtype=torch.int64))
        assert envs.num_envs == 2
        assert envs.episode_counts.sum() >= 1  # ShmVecEnv's own attribute, through the wrapper
        assert envs.single_observation_space == envs.env.single_observation_space
    assert envs.env.closed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: pinning is checked where "
                    "torch sees one")
def test_cuda_buffers_are_pinned_and_copy_false_reuses_device_tensors():
    envs = TorchVecEnv(shmvec.make("CartPole-v1", num_envs=8, num_workers=2), device="cuda", copy=False)
    try:
        assert envs.pinned
        assert all(h.is_pinned() for h in envs._host)
        obs, _ = envs.reset(seed=0)
        a, *_ = envs.step(torch.zeros(8, dtype=torch.int64, device="cuda"))
        b, *_ = envs.step(torch.zeros(8, dtype=torch.int64, device="cuda"))
        assert a.data_ptr() == b.data_ptr()  # fixed addresses, for CUDA graphs
        np.testing.assert_array_equal(b.cpu().numpy(), envs.env.buffers.obs)
    finally:
        envs.close()
