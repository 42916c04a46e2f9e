"""Asynchronous collection (send/recv with batch_size < num_envs)."""

from __future__ import annotations

import functools
import os
import random
import time

import gymnasium as gym
import numpy as np
import pytest
from envs_for_tests import FaultyEnv, NestedEnv
from gymnasium.vector import AutoresetMode

import shmvec


class Jittery(gym.Wrapper):
    """Sleeps a random few hundred microseconds per step (from an RNG the env never sees),
    so that blocks finish in a different order every run."""

    def __init__(self, env):
        super().__init__(env)
        self._jitter = random.Random()

    def step(self, action):
        if self._jitter.random() < 0.3:
            time.sleep(self._jitter.random() * 0.002)
        return self.env.step(action)


def jittery_cartpole():
    return Jittery(gym.make("CartPole-v1"))


def policy(obs, ids):
    """Deterministic per env: depends only on the env's own observation and its id."""
    return ((obs[:, 2] + 0.01 * (ids % 3) > 0)).astype(np.int64)


def trajectories_sync(num_envs, steps, mode):
    out = {i: [] for i in range(num_envs)}
    with shmvec.ShmVecEnv([jittery_cartpole] * num_envs, num_workers=2, autoreset_mode=mode) as envs:
        obs, _ = envs.reset(seed=3)
        ids = np.arange(num_envs)
        for _ in range(steps):
            obs, rew, term, trunc, infos = envs.step(policy(obs, ids))
            for i in ids:
                out[i].append((obs[i].tobytes(), rew[i], term[i], trunc[i]))
    return out


@pytest.mark.parametrize("step_in_main", [False, True])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_per_env_trajectories_match_synchronous_step(mode, step_in_main):
    num_envs, steps = 8, 120
    ref = trajectories_sync(num_envs, steps, mode)
    got = {i: [] for i in range(num_envs)}
    orders = set()
    with shmvec.ShmVecEnv([jittery_cartpole] * num_envs, num_workers=4 - step_in_main, batch_size=4,
                          autoreset_mode=mode, step_in_main=step_in_main) as envs:
        assert len(envs.worker_pids) == (3 if step_in_main else 4) and envs.num_blocks == 4
        envs.async_reset(seed=3)
        was_reset = set()  # each env's first batch after async_reset holds its reset observation
        while min(len(v) for v in got.values()) < steps:
            obs, rew, term, trunc, infos, ids = envs.recv()
            orders.add(tuple(ids))
            for k, i in enumerate(ids):
                if i in was_reset:
                    got[i].append((obs[k].tobytes(), rew[k], term[k], trunc[k]))
                was_reset.add(i)
            envs.send(policy(obs, ids), ids)
    for i in range(num_envs):
        assert got[i][:steps] == ref[i], f"env {i} diverged from its synchronous trajectory"
    assert len(orders) > 1  # batches really came in varying combinations


@pytest.mark.parametrize("num_envs,num_workers", [(5, 2), (4, 1), (6, 3)])
def test_send_recv_with_batch_size_num_envs_and_a_block_in_main(num_envs, num_workers):
    """EnvPool's sync mode: send/recv with every env per batch while the calling process steps a
    block (step_in_main=True); uneven blocks allowed. Trajectories equal those of step()."""
    steps = 60
    ref = trajectories_sync(num_envs, steps, AutoresetMode.NEXT_STEP)
    got = {i: [] for i in range(num_envs)}
    with shmvec.ShmVecEnv([jittery_cartpole] * num_envs, num_workers=num_workers - 1, step_in_main=True) as envs:
        assert envs.batch_size == num_envs and len(envs.worker_pids) == num_workers - 1
        envs.async_reset(seed=3)
        obs, *_, ids = envs.recv()
        assert ids.tolist() == list(range(num_envs))
        for _ in range(steps):
            envs.send(policy(obs, ids), ids)
            obs, rew, term, trunc, infos, ids = envs.recv()
            for k, i in enumerate(ids):
                got[i].append((obs[k].tobytes(), rew[k], term[k], trunc[k]))
        with pytest.raises(ValueError, match="whole blocks"):
            envs.send(np.zeros(num_envs - 1, np.int64), ids[1:])
        # a synchronous step right after a send waits for it and drops its results
        envs.send(policy(obs, ids), ids)
        envs.step(np.zeros(num_envs, np.int64))
        envs.send(policy(obs, ids), ids)
        assert envs.recv()[-1].tolist() == list(range(num_envs))
    assert got == ref


def test_recv_returns_ready_blocks_first():
    slow = functools.partial(SlowFirstBlock)
    with shmvec.ShmVecEnv([slow] * 4, num_workers=4, batch_size=2) as envs:
        envs.reset(seed=0)
        envs.send(np.zeros(4, dtype=np.int64), np.arange(4))
        *_, ids = envs.recv()
        assert ids.tolist() in ([2, 3],)  # blocks 0 and 1 are slow: the others come first
        envs.send(np.zeros(2, dtype=np.int64), ids)
        *_, ids2 = envs.recv()
        assert set(ids2.tolist()) <= {0, 1, 2, 3} and len(ids2) == 2


def test_block_in_main_runs_ahead_of_a_slow_worker():
    """step_in_main=True: envs 2, 3 in the calling process keep coming back while the worker's
    block (envs 0, 1) sleeps; then the worker's block comes back as soon as it is done."""
    with shmvec.ShmVecEnv([SlowFirstBlock] * 4, num_workers=1, batch_size=2, step_in_main=True) as envs:
        assert len(envs.worker_pids) == 1
        envs.reset(seed=0)
        envs.send(np.zeros(4, dtype=np.int64), np.arange(4))
        seen = []
        for _ in range(5):
            *_, ids = envs.recv()
            seen.append(ids.tolist())
            envs.send(np.zeros(2, dtype=np.int64), ids)
        assert seen == [[2, 3]] * 5  # 5 main-block steps while the worker's block takes 0.4 s (2 x 0.2)
        start = time.monotonic()
        while True:
            *_, ids = envs.recv()
            if ids.tolist() == [0, 1]:
                break
            envs.send(np.zeros(2, dtype=np.int64), ids)
        assert time.monotonic() - start < 1.5  # the worker's 0.4 s block, not more steps of main's


@pytest.mark.parametrize("step_in_main", [False, True])
def test_equal_blocks_take_turns(step_in_main):
    """Oldest submission first, the block the calling process steps included: no block starves.

    Not equal shares: with step_in_main and more blocks than cores the workers block in the
    kernel between steps, and the main block is stepped whenever no older one is done (seen:
    44/44/212 of 300 on a loaded machine)."""
    with shmvec.make("CartPole-v1", num_envs=6, num_workers=3 - step_in_main, batch_size=2,
                     step_in_main=step_in_main) as envs:
        envs.async_reset(seed=0)
        counts = {0: 0, 2: 0, 4: 0}
        for _ in range(300):
            *_, ids = envs.recv()
            counts[int(ids[0])] += 1
            envs.send(np.zeros(2, dtype=np.int64), ids)
        assert min(counts.values()) >= 10, counts


@pytest.mark.parametrize("spin_us", [None, 0])  # 0: every wait blocks in the kernel
@pytest.mark.parametrize("step_in_main", [False, True])
def test_a_hung_worker_times_out_while_the_other_blocks_keep_coming(step_in_main, spin_us):
    fns = [functools.partial(FaultyEnv, "hang" if i == 0 else "none", 5) for i in range(4)]
    envs = shmvec.ShmVecEnv(fns, num_workers=2 - step_in_main, batch_size=2, step_in_main=step_in_main, timeout=0.5,
                            spin_us=spin_us)
    pids = envs.worker_pids
    envs.async_reset(seed=0)
    start = time.monotonic()
    with pytest.raises(shmvec.StepTimeout, match="worker 0 .*timeout=0.5"):
        while time.monotonic() - start < 20:
            *_, ids = envs.recv()
            envs.send(np.zeros(2, dtype=np.int64), ids)
    assert time.monotonic() - start < 5 and envs.closed
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


class SlowFirstBlock(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.slow = seed is not None and seed < 2
        return np.zeros(1, np.float32), {}

    def step(self, action):
        if self.slow:
            time.sleep(0.2)
        return np.zeros(1, np.float32), 1.0, False, False, {}


def test_infos_and_final_obs_are_indexed_by_batch_position():
    with shmvec.ShmVecEnv([lambda: gym.make("CartPole-v1", max_episode_steps=5)] * 6, num_workers=3, batch_size=2,
                          autoreset_mode=AutoresetMode.SAME_STEP) as envs:
        envs.async_reset(seed=0)
        seen = 0
        for _ in range(30):
            obs, rew, term, trunc, infos, ids = envs.recv()
            if trunc.any():
                assert infos["_final_obs"].tolist() == trunc.tolist()
                assert len(infos["final_obs"]) == 2
                assert all(infos["final_obs"][k].shape == (4,) for k in np.flatnonzero(trunc))
                seen += 1
            envs.send(np.ones(2, dtype=np.int64), ids)
        assert seen > 0


def test_copy_false_gives_readonly_views_for_a_block():
    with shmvec.make("CartPole-v1", num_envs=4, num_workers=2, batch_size=2, copy=False) as envs:
        envs.async_reset(seed=0)
        obs, rew, *_ , ids = envs.recv()
        assert not obs.flags.writeable and not obs.flags.owndata and obs.shape == (2, 4)


def test_argument_checks():
    with pytest.raises(ValueError, match="multiple of the envs per block"):
        shmvec.make("CartPole-v1", num_envs=8, num_workers=2, batch_size=2)
    with pytest.raises(ValueError, match="divisible into 2 equal blocks"):
        shmvec.make("CartPole-v1", num_envs=7, num_workers=2, batch_size=3)
    with pytest.raises(ValueError, match="DISABLED"):
        shmvec.make("CartPole-v1", num_envs=4, num_workers=2, batch_size=2, autoreset_mode=AutoresetMode.DISABLED)
    with shmvec.make("CartPole-v1", num_envs=4, num_workers=2, batch_size=2) as envs:
        with pytest.raises(gym.error.ResetNeeded):
            envs.send(np.zeros(2, dtype=np.int64), np.arange(2))
        envs.async_reset(seed=0)
        obs, rew, term, trunc, infos, ids = envs.recv()
        with pytest.raises(ValueError, match="send\\(actions, env_ids\\) and recv"):
            envs.step(np.zeros(4, dtype=np.int64))
        other = np.setdiff1d(np.arange(4), ids)
        with pytest.raises(ValueError, match="already stepping"):
            envs.send(np.zeros(2, dtype=np.int64), other)
        with pytest.raises(ValueError, match="whole blocks"):
            envs.send(np.zeros(2, dtype=np.int64), ids[::-1])
        with pytest.raises(ValueError, match=r"shape \(3,\)"):
            envs.send(np.zeros(3, dtype=np.int64), ids)
        assert not ids.flags.writeable
        with pytest.raises(ValueError):
            ids[0] = 3
        envs.send(np.zeros(2, dtype=np.int64), ids.tolist())  # still usable; a list is checked in full
        envs.recv()
        envs.recv()
        with pytest.raises(gym.error.NoAsyncCallError, match="no env in flight"):
            envs.recv()
        # A synchronous reset makes every env ready for send.
        obs, _ = envs.reset(seed=1)
        envs.send(np.zeros(4, dtype=np.int64), np.arange(4))
        assert len(envs.recv()[-1]) == 2


@pytest.mark.parametrize("step_in_main", [False, True])
def test_async_restart_on_error(step_in_main):
    fns = [functools.partial(FaultyEnv, "kill" if i == 0 else "none", 2) for i in range(4)]
    with shmvec.ShmVecEnv(fns, num_workers=2 - step_in_main, batch_size=2, on_error="restart", step_in_main=step_in_main) as envs:
        envs.async_reset(seed=0)
        restarted = 0
        deadline = time.monotonic() + 30
        # Which block comes back first is up to the scheduler; a dead worker is noticed within
        # SENTINEL_CHECK_S even while the other block keeps coming back.
        while restarted < 2 and time.monotonic() < deadline:
            obs, rew, term, trunc, infos, ids = envs.recv()
            if "restarted" in infos:
                assert ids.tolist() == [0, 1] and infos["_restarted"].all() and trunc.all()
                restarted += 1
            envs.send(np.zeros(2, dtype=np.int64), ids)
        assert restarted >= 2 and len(envs.restarts) == restarted


@pytest.mark.parametrize("step_in_main", [False, True])
def test_async_error_closes_without_restart(step_in_main):
    """Env 3 raises: in a worker, or (step_in_main) in the block the calling process steps."""
    fns = [functools.partial(FaultyEnv, "raise" if i == 3 else "none", 2) for i in range(4)]
    envs = shmvec.ShmVecEnv(fns, num_workers=2 - step_in_main, batch_size=2, step_in_main=step_in_main)
    envs.reset(seed=0)
    envs.send(np.zeros(4, dtype=np.int64), np.arange(4))
    with pytest.raises(shmvec.WorkerError, match="step exploded"):
        for _ in range(400):
            *_, ids = envs.recv()
            envs.send(np.zeros(2, dtype=np.int64), ids)
    assert envs.closed


@pytest.mark.parametrize("on_error", ["raise", "restart"])
def test_env_error_in_the_main_block_through_send_recv(on_error):
    """The block the calling process steps fails; recv() reports it like a worker's."""
    fns = [functools.partial(FaultyEnv, "raise" if i == 3 else "none", 2) for i in range(4)]
    envs = shmvec.ShmVecEnv(fns, num_workers=2, on_error=on_error)  # envs 2, 3 in the main process
    envs.async_reset(seed=0)
    *_, ids = envs.recv()
    envs.send(np.zeros(4, dtype=np.int64), ids)
    *_, ids = envs.recv()
    envs.send(np.zeros(4, dtype=np.int64), ids)  # env 3's second step raises
    if on_error == "raise":
        with pytest.raises(shmvec.WorkerError, match="step exploded") as err:
            envs.recv()
        assert err.value.env_index == 3 and envs.closed
        return
    obs, rew, term, trunc, infos, ids = envs.recv()
    assert infos["_restarted"].tolist() == [False, False, True, True] and trunc[2:].all()
    assert len(envs.restarts) == 1
    envs.send(np.zeros(4, dtype=np.int64), ids)
    assert envs.recv()[-1].tolist() == [0, 1, 2, 3]
    envs.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_async_rollout_columns_equal_a_synchronous_rollout(mode):
    num_envs, T = 8, 40
    fields = {"obs": ((4,), np.float32), "actions": ((), np.int64)}
    # Reference: a synchronous loop, one row per step.
    ref_obs, ref_act = np.zeros((T, num_envs, 4), np.float32), np.zeros((T, num_envs), np.int64)
    ref_rew, ref_term, ref_trunc = np.zeros((T, num_envs)), np.zeros((T, num_envs), bool), np.zeros((T, num_envs), bool)
    with shmvec.ShmVecEnv([jittery_cartpole] * num_envs, num_workers=2, autoreset_mode=mode) as envs:
        obs, _ = envs.reset(seed=5)
        ids = np.arange(num_envs)
        for t in range(T + 1):
            act = policy(obs, ids)
            if t == T:
                ref_last_obs = obs.copy()
                break
            ref_obs[t], ref_act[t] = obs, act
            obs, ref_rew[t], ref_term[t], ref_trunc[t], _ = envs.step(act)
    rollout = shmvec.AsyncRollout(num_envs, T, fields, autoreset_mode=mode)
    with shmvec.ShmVecEnv([jittery_cartpole] * num_envs, num_workers=4, batch_size=4, autoreset_mode=mode) as envs:
        envs.async_reset(seed=5)
        while not rollout.full:
            obs, rew, term, trunc, infos, ids = envs.recv()
            rollout.record_outcome(ids, rew, term, trunc)
            act = policy(obs, ids)
            go = rollout.record_step(ids, obs=obs, actions=act)
            if go.any():
                envs.send(act[go], ids[go])
    np.testing.assert_array_equal(rollout["obs"], ref_obs)
    np.testing.assert_array_equal(rollout["actions"], ref_act)
    np.testing.assert_array_equal(rollout.rewards, ref_rew)
    np.testing.assert_array_equal(rollout.terminations, ref_term)
    np.testing.assert_array_equal(rollout.truncations, ref_trunc)
    np.testing.assert_array_equal(rollout.last["obs"], ref_last_obs)
    ended = ref_term | ref_trunc
    expected_valid = np.ones_like(ended)
    if mode is AutoresetMode.NEXT_STEP:
        expected_valid[1:] = ~ended[:-1]
    np.testing.assert_array_equal(rollout.valid, expected_valid)
    assert ended.any()
    assert (rollout.clear() == np.arange(num_envs)).all() and not rollout.full


def test_async_example_runs():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, os.path.join(root, "examples", "async_gae.py"), "--num-envs", "8",
                          "--num-workers", "2", "--batch-size", "4", "--num-steps", "8", "--rollouts", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("rollout ") == 2


def nested_policy(obs):
    """Deterministic per env (NestedEnv's Tuple action) from the env's own observation."""
    pos = obs["pos"]
    return ((pos[:, 0] > 0).astype(np.int64) + (pos[:, 1] > 0), np.clip(pos[:, :2], -1, 1).astype(np.float64))


def plain(x):
    """Nested obs / info values as comparable Python values (dtype kept)."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(plain(v) for v in x)
    if isinstance(x, np.ndarray):
        return (x.dtype.str, [plain(v) for v in x] if x.dtype == object else x.tolist())
    return x


def env_row(obs, infos, k):
    """Env ``k``'s observation and its own info entries (``_key`` masks applied) from a batch."""
    def info(d):
        return {key: info(v) if isinstance(v, dict) else plain(v[k])
                for key, v in d.items() if not key.startswith("_") and d.get("_" + key, np.ones(k + 1, bool))[k]}
    return plain({key: obs[key][k] if not isinstance(obs[key], tuple) else tuple(o[k] for o in obs[key])
                  for key in obs}), info(infos)


def stats_of(envs, i):
    return (envs.episode_returns[i], envs.episode_lengths[i], envs.episode_counts[i])


@pytest.mark.parametrize("step_in_main", [False, True])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_infos_and_episode_statistics_match_step(mode, step_in_main):
    num_envs, steps = 8, 150
    ref = {i: [] for i in range(num_envs)}
    with shmvec.ShmVecEnv([NestedEnv] * num_envs, num_workers=2, autoreset_mode=mode) as envs:
        obs, _ = envs.reset(seed=5)
        for _ in range(steps):
            obs, rew, term, trunc, infos = envs.step(nested_policy(obs))
            for i in range(num_envs):
                ref[i].append((env_row(obs, infos, i), rew[i], term[i], trunc[i], stats_of(envs, i)))
    assert ref[0][-1][-1][2] > 3  # env 0 finished several episodes
    assert sum(bool(row[0][1]) for row in ref[0]) > 20  # and had infos on many steps
    got = {i: [] for i in range(num_envs)}
    with shmvec.ShmVecEnv([NestedEnv] * num_envs, num_workers=4 - step_in_main, batch_size=4, autoreset_mode=mode,
                          step_in_main=step_in_main) as envs:
        obs, _ = envs.reset(seed=5)
        envs.send(nested_policy(obs), np.arange(num_envs))
        while min(len(v) for v in got.values()) < steps:
            obs, rew, term, trunc, infos, ids = envs.recv()
            for k, i in enumerate(ids):
                got[i].append((env_row(obs, infos, k), rew[k], term[k], trunc[k], stats_of(envs, i)))
            envs.send(nested_policy(obs), ids)
    for i in range(num_envs):
        for t, (a, b) in enumerate(zip(got[i][:steps], ref[i])):
            assert a == b, f"env {i} step {t}: async {a} != step {b}"


@pytest.mark.parametrize("resume", ["recv", "send"])
def test_check_finite_in_recv_loses_nothing(resume):
    import pickle

    fns = [functools.partial(FaultyEnv, "inf_reward" if i == 2 else "none", 3) for i in range(4)]
    with shmvec.ShmVecEnv(fns, num_workers=2, batch_size=2, check_finite=True) as envs:
        envs.async_reset(seed=0)
        steps, errors = np.zeros(4, int), 0
        while steps.min() < 20:
            try:
                obs, rew, term, trunc, infos, ids = envs.recv()
            except shmvec.NonFiniteError as exc:
                errors += 1
                assert exc.env_index == 2 and exc.env_ids.tolist() == [2, 3]
                again = pickle.loads(pickle.dumps(exc))
                assert (again.env_index, again.env_ids.tolist(), str(again)) == (2, [2, 3], str(exc))
                if resume == "send":  # go on without the refused batch
                    envs.send(np.zeros(2, np.int64), exc.env_ids)
                    steps[exc.env_ids] += 1
                    continue
                obs, rew, term, trunc, infos, ids = envs.recv()  # the refused batch, as it was
                assert ids.tolist() == [2, 3] and np.isinf(rew[0]) and rew[1] == 1.0
            steps[ids] += 1
            envs.send(np.zeros(2, np.int64), ids)
        assert errors == 1


@pytest.mark.parametrize("env_fn", [lambda: gym.make("CartPole-v1"), NestedEnv])
def test_batches_are_freed_when_dropped(env_fn):
    """Nothing in shmvec keeps a returned batch alive: no reference cycle that only the garbage
    collector could break (one did, once: memory swung by 200 MB and big batches page-faulted)."""
    import gc
    import weakref

    from gymnasium.vector.utils import batch_space

    def leaves(obs):
        if isinstance(obs, dict):
            return [leaf for v in obs.values() for leaf in leaves(v)]
        if isinstance(obs, tuple):
            return [leaf for v in obs for leaf in leaves(v)]
        return [obs]

    with shmvec.ShmVecEnv([env_fn] * 4, num_workers=2, batch_size=2) as envs, \
            shmvec.ShmVecEnv([env_fn] * 4, num_workers=2) as sync:
        envs.async_reset(seed=0)
        sync.reset(seed=0)
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):
                obs, rew, term, trunc, infos, ids = envs.recv()
                refs = [weakref.ref(a) for a in (*leaves(obs), rew, term, trunc)]
                envs.send(batch_space(envs.single_action_space, len(ids)).sample(), ids)
                del obs, rew, term, trunc, infos
                assert all(r() is None for r in refs)
                obs, rew, term, trunc, infos = sync.step(sync.action_space.sample())
                refs = [weakref.ref(a) for a in (*leaves(obs), rew, term, trunc)]
                del obs, rew, term, trunc, infos
                assert all(r() is None for r in refs)
        finally:
            gc.enable()


@pytest.mark.parametrize("step_in_main", [True, False])
def test_step_and_rollout_right_after_send_see_that_send_done(step_in_main):
    """A synchronous call after send() first finishes what was sent, with the actions sent:
    the same as receiving it first (the block in main steps late, inside the wait)."""

    def run(receive_first, then):
        with shmvec.make("CartPole-v1", num_envs=4, num_workers=2 - step_in_main, step_in_main=step_in_main) as envs:
            envs.reset(seed=7)
            envs.send(np.ones(4, np.int64), np.arange(4))
            if receive_first:
                envs.recv()
            if then == "step":
                return envs.step(np.zeros(4, np.int64))[0]
            batch = envs.rollout(lambda obs: np.zeros(len(obs), np.int64), 3)
            return np.concatenate([batch["obs"].ravel(), batch["next_obs"].ravel()])

    for then in ("step", "rollout"):
        np.testing.assert_array_equal(run(False, then), run(True, then), err_msg=then)


def test_rollout_after_send_recv_starts_from_the_last_received_obs():
    with shmvec.make("CartPole-v1", num_envs=4, num_workers=2) as envs:
        envs.reset(seed=1)
        envs.rollout(lambda obs: np.zeros(len(obs), np.int64), 2)
        envs.send(np.ones(4, np.int64), np.arange(4))
        obs = envs.recv()[0]
        batch = envs.rollout(lambda obs: np.zeros(len(obs), np.int64), 2)
        np.testing.assert_array_equal(batch["obs"][0], obs)


def ordered_batches(step_in_main: bool, ordered: bool = True, rounds: int = 60) -> list:
    """Every batch recv() hands back, with a policy that depends on what it got."""
    out = []
    with shmvec.ShmVecEnv([jittery_cartpole] * 8, num_workers=4 - step_in_main, step_in_main=step_in_main,
                          batch_size=4, ordered=ordered) as envs:
        envs.async_reset(seed=5)
        for _ in range(rounds):
            obs, rew, term, trunc, infos, ids = envs.recv()
            out.append((ids.tolist(), obs.tobytes(), rew.tolist(), term.tolist(), trunc.tolist()))
            envs.send(policy(obs, ids), ids)
    return out


@pytest.mark.parametrize("step_in_main", [False, True])
def test_ordered_collection_gives_identical_batches(step_in_main):
    first = ordered_batches(step_in_main)
    assert first == ordered_batches(step_in_main)
    # The order is the order of sending: the two halves take turns.
    assert [ids for ids, *_ in first[:4]] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7]]


def test_ordered_collection_returns_blocks_in_the_order_they_were_sent():
    with shmvec.ShmVecEnv([functools.partial(FaultyEnv, "none")] * 6, num_workers=3, batch_size=2,
                          ordered=True) as envs:
        envs.async_reset(seed=0)
        order = []
        held = None
        for k in range(9):
            *_, ids = envs.recv()
            order.append(ids.tolist())
            if k == 1:  # hold block 1 back: sent after block 2, it comes back after it
                held = ids
                continue
            envs.send(np.zeros(len(ids), dtype=np.int64), ids)
            if k == 2:
                envs.send(np.zeros(2, dtype=np.int64), held)
        assert order == [[0, 1], [2, 3], [4, 5], [0, 1], [4, 5], [2, 3], [0, 1], [4, 5], [2, 3]]


@pytest.mark.parametrize("then", ["step", "rollout", "get_state"])
def test_a_synchronous_round_drops_the_refused_batch(then):
    """The batch check_finite held back for recv() is the next recv()'s only if nothing else ran:
    a synchronous round moves the envs on, and the held batch would be stale."""
    fns = [functools.partial(FaultyEnv, "inf_reward" if i == 0 else "none", 1) for i in range(2)]
    with shmvec.ShmVecEnv(fns, num_workers=2, check_finite=True) as envs:
        envs.reset(seed=0)
        envs.send(np.zeros(2, np.int64), np.arange(2))
        with pytest.raises(shmvec.NonFiniteError):
            envs.recv()
        envs.check_finite = False
        if then == "step":
            envs.step(np.zeros(2, np.int64))
        elif then == "rollout":
            envs.rollout(lambda obs: np.zeros(2, np.int64), num_steps=2)
        else:
            envs.get_state()
        with pytest.raises(shmvec.NothingInFlightError):
            envs.recv()
