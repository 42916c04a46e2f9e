"""Worker processes cap the thread pools of the libraries they load (shmvec.worker_threads)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import shmvec
from shmvec.worker_threads import library_threads

torch = pytest.importorskip("torch")
import numba  # noqa: E402  (loaded here, so that forked workers inherit it)


class ThreadsEnv(gym.Env):
    """Imports torch in its constructor, as an env with a torch model would; reports the pools."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        import torch  # noqa: F401

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def threads(self):
        import os

        return library_threads(), os.environ.get("OMP_NUM_THREADS")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_use_one_thread_per_library_by_default(context):
    assert numba.config.NUMBA_NUM_THREADS >= 1
    envs = shmvec.ShmVecEnv([ThreadsEnv] * 2, num_workers=2, context=context)
    try:
        for pools, omp in envs.call("threads"):
            assert pools["torch"] == 1, pools
            if context == "fork":  # numba came along with the fork; its pool is sized before it starts
                assert pools["numba"] == 1, pools
            assert omp == "1" or omp is not None
    finally:
        envs.close()


def test_worker_threads_sets_the_pools_or_leaves_them_alone():
    parent = torch.get_num_threads()
    envs = shmvec.ShmVecEnv([ThreadsEnv] * 2, num_workers=2, context="fork", worker_threads=3)
    try:
        from numba.np.ufunc import parallel

        # numba's pool, if this process launched it already (an earlier test ran a parallel
        # kernel), came along with the fork at its size: a worker can use fewer of its threads,
        # not more. Not launched, it starts at the size asked.
        numba_expected = min(3, parallel.NUM_THREADS) if parallel._is_initialized else 3
        for pools, _ in envs.call("threads"):
            assert pools["torch"] == 3 and pools["numba"] == numba_expected, pools
    finally:
        envs.close()
    envs = shmvec.ShmVecEnv([ThreadsEnv] * 2, num_workers=2, context="fork", worker_threads=None)
    try:
        for pools, _ in envs.call("threads"):
            assert pools["torch"] == parent, pools
    finally:
        envs.close()
    assert torch.get_num_threads() == parent  # the calling process is never touched
    with pytest.raises(ValueError, match="worker_threads"):
        shmvec.ShmVecEnv([ThreadsEnv] * 2, worker_threads=0)


def test_opencv_pool_is_capped_too():
    cv2 = pytest.importorskip("cv2")
    cv2.setNumThreads(2)
    envs = shmvec.ShmVecEnv([ThreadsEnv] * 2, num_workers=1, context="fork")
    try:
        [(pools, _)] = envs.call("threads")[:1]
        assert pools["cv2"] == 1, pools
    finally:
        envs.close()
    assert cv2.getNumThreads() == 2
