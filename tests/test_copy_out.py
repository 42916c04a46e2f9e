"""Copy-out as each block finishes (#47): with ``copy=True`` and large observations, a step
copies each block's observations out as soon as that block is done, while the others still
step, so only the last block's share is copied after the round (``results.CopyOut``,
``WorkerPool.wait``'s ``on_done``)."""

from __future__ import annotations

import os
import signal
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from envs_for_tests import NestedEnv
from test_equivalence import run_both

import shmvec
from shmvec import protocol as P
from shmvec import results as R
from shmvec.envs import SyntheticEnv

FRAMES = (84, 84, 4)  # 28 KB a env: three envs to a block pass COPY_AS_DONE_BYTES


def frames(step_us: float = 0.0) -> SyntheticEnv:
    return SyntheticEnv(obs_shape=FRAMES, obs_dtype="uint8", step_us=step_us, reset_us=0.0, episode_steps=40)


def test_only_large_observations_are_copied_as_blocks_finish():
    with shmvec.ShmVecEnv([frames] * 6, num_workers=2) as envs:
        assert envs._session.results.copy_out() is not None  # 3 x 28 KB a block
    with shmvec.ShmVecEnv([lambda: gym.make("CartPole-v1")] * 6, num_workers=2) as envs:
        assert envs._session.results.copy_out() is None  # 48 bytes a block: copied after, one wake-up


@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP])
@pytest.mark.parametrize(
    "options",
    [{"num_workers": 2}, {"num_workers": 2, "spin_us": 0.0}, {"num_workers": 1, "step_in_main": True},
     {"num_workers": 3, "spin_us": 0.0, "context": "spawn"}],
    ids=["default", "blocking", "step_in_main", "spawn"],
)  # fmt: skip
def test_copied_as_blocks_finish_matches_sync_vector_env(options, mode):
    ends = run_both(frames, num_envs=6, steps=120, mode=mode, **options)
    assert ends > 6  # episodes of 20 to 60 steps: autoresets crossed


@pytest.mark.parametrize("make_env", [NestedEnv, lambda: gym.make("Pendulum-v1", max_episode_steps=30)],
                         ids=["Nested", "Pendulum"])  # fmt: skip
def test_every_space_copied_block_by_block_matches_sync_vector_env(make_env, monkeypatch):
    """A threshold of 0 bytes copies every space's observations block by block (a dict of
    leaves included)."""
    monkeypatch.setattr(R, "COPY_AS_DONE_BYTES", 0)
    run_both(make_env, num_envs=5, steps=90, mode=gym.vector.AutoresetMode.NEXT_STEP, num_workers=2, spin_us=0.0)


@pytest.mark.parametrize("spin_us", [0.0, None])
def test_a_block_is_copied_while_a_slower_one_still_steps(spin_us, monkeypatch):
    """Block 0 steps at once, block 1 takes 0.2 s: block 0's observations are copied while
    block 1 is still out, block 1's after it finished."""
    seen = []
    block = R.CopyOut.block

    def watched(self, b):
        seen.append((b, int(pool.lines[1 - b][P.DONE]) == pool.seq))  # was the other block done?
        block(self, b)

    monkeypatch.setattr(R.CopyOut, "block", watched)
    fns = [frames] * 3 + [partial(frames, step_us=200_000)] * 3
    with shmvec.ShmVecEnv(fns, num_workers=2, spin_us=spin_us) as envs:
        pool = envs._session.pool
        envs.reset(seed=1)
        for _ in range(3):
            seen.clear()
            obs, *_ = envs.step(np.zeros(6, dtype=np.int64))
            assert seen == [(0, False), (1, True)]
            np.testing.assert_array_equal(obs, envs.buffers.obs)


def test_the_copies_are_the_callers_own():
    with shmvec.ShmVecEnv([frames] * 6, num_workers=2) as envs:
        envs.reset(seed=3)
        first, *_ = envs.step(np.ones(6, dtype=np.int64))
        kept = first.copy()
        second, *_ = envs.step(np.full(6, 2, dtype=np.int64))
        assert first.flags.owndata and first.flags.writeable
        assert not np.shares_memory(first, envs.buffers.obs) and not np.shares_memory(first, second)
        np.testing.assert_array_equal(first, kept)  # the next step wrote elsewhere
        assert not np.array_equal(first, second)


def test_a_restarted_block_is_copied_after_its_reset():
    """A worker killed between steps: its block never finishes the step, is restarted and
    reset, and its rows are copied after that (the others' as they finished)."""
    with shmvec.ShmVecEnv([frames] * 6, num_workers=2, on_error="restart", spin_us=0.0) as envs:
        envs.reset(seed=5)
        before, *_ = envs.step(np.zeros(6, dtype=np.int64))
        os.kill(envs._session.pool.worker_pids[1], signal.SIGKILL)
        obs, _, _, truncations, _ = envs.step(np.zeros(6, dtype=np.int64))
        assert [worker for worker, _, _ in envs.restarts] == [1]
        assert truncations.tolist() == [False] * 3 + [True] * 3
        np.testing.assert_array_equal(obs, envs.buffers.obs)
        assert not np.array_equal(obs[3:], before[3:])  # a new episode's frames, not the last step's
