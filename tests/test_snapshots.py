"""Env snapshots (get_state/set_state) and checkpoints (state_dict/load_state_dict).

The reference is the run the snapshot was taken from: restore, replay the same actions, and
every observation, reward, flag and info must be bit-identical.
"""

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading

import gymnasium as gym
import numpy as np
import pytest
from envs_for_tests import NestedEnv
from gymnasium.wrappers import NormalizeObservation, NormalizeReward

import shmvec
from shmvec import EnvState, ShmVecEnv, SnapshotError
from shmvec.bench.workloads import GymMake


def same(a, b) -> bool:
    """Bit-identical nested results (dicts, tuples, arrays)."""
    if a is None or b is None:
        return a is b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == object:  # SAME_STEP's final observations and infos: one object per env
        if a.ndim == 0:
            return b.ndim == 0 and same(a.item(), b.item())
        return b.dtype == object and a.shape == b.shape and all(same(x, y) for x, y in zip(a.flat, b.flat))
    return a.dtype == b.dtype and np.array_equal(a, b)


def cartpole():
    # Wrappers with state of their own: TimeLimit's count, running means of observations and returns.
    return NormalizeReward(NormalizeObservation(gym.make("CartPole-v1", max_episode_steps=40)))


def actions_for(envs, steps: int, seed: int = 0) -> list:
    space = envs.action_space
    space.seed(seed)
    return [space.sample() for _ in range(steps)]


def play(envs, actions) -> list:
    return [envs.step(a) for a in actions]


def assert_replays(envs, warmup: int = 25, steps: int = 60) -> list:
    """Snapshot after ``warmup`` steps, play ``steps``, restore, play them again: identical."""
    envs.reset(seed=3)
    play(envs, actions_for(envs, warmup, seed=1))
    saved = envs.get_state()
    actions = actions_for(envs, steps, seed=2)
    first = play(envs, actions)
    obs = envs.set_state(saved)
    if isinstance(obs, np.ndarray):  # what set_state returns: the observations of the snapshot
        np.testing.assert_array_equal(obs, np.concatenate([s.obs[0] for s in saved]))
    again = play(envs, actions)
    for t, (x, y) in enumerate(zip(first, again)):
        assert same(x, y), f"step {t} after the restore differs"
    return first


# (fork by name: Python 3.12+ may warn of the test process's threads, as it would any user's)
FORK = pytest.param("fork", marks=pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"))


@pytest.mark.parametrize("context", [FORK, "spawn"])
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_cartpole_replays_bit_identically(context, mode):
    with ShmVecEnv([cartpole] * 4, num_workers=2, context=context, autoreset_mode=mode) as envs:
        first = assert_replays(envs)
        assert any(step[2].any() or step[3].any() for step in first), "no episode ended: autoreset untested"


def test_episode_statistics_continue_from_the_snapshot():
    with ShmVecEnv([cartpole] * 2, num_workers=2) as envs:
        envs.reset(seed=0)
        play(envs, [np.zeros(2, dtype=np.int64)] * 5)
        saved = envs.get_state()
        play(envs, [np.zeros(2, dtype=np.int64)] * 12)  # pushing left, each first episode ends
        lengths, returns = envs.episode_lengths, envs.episode_returns
        assert (envs.episode_counts == 1).all()
        play(envs, [np.zeros(2, dtype=np.int64)] * 3)
        envs.set_state(saved)
        play(envs, [np.zeros(2, dtype=np.int64)] * 12)
        # The running episode was restored with the env: the episode that ends has the same length.
        np.testing.assert_array_equal(envs.episode_lengths, lengths)
        np.testing.assert_array_equal(envs.episode_returns, returns)


def test_dict_space_env_replays_with_infos():
    with ShmVecEnv([NestedEnv] * 4, num_workers=2) as envs:
        first = assert_replays(envs, steps=80)
        assert any(step[4] for step in first), "no infos: their replay is untested"


def test_step_in_main_block_replays():
    with ShmVecEnv([cartpole] * 3, num_workers=1, step_in_main=True) as envs:
        assert_replays(envs)


def test_restore_into_another_slot():
    """The state of env 0 (worker 0) restored into slot 3 (worker 1) continues as env 0 did."""
    with ShmVecEnv([cartpole] * 4, num_workers=2) as envs:
        envs.reset(seed=5)
        play(envs, actions_for(envs, 10))
        (state,) = envs.get_state([0])
        actions = actions_for(envs, 40, seed=9)
        first = play(envs, actions)
        obs = envs.set_state([state], env_ids=[3])
        assert obs.shape == (1, 4) and np.array_equal(obs[0], state.obs[0][0])
        moved = [a.copy() for a in actions]
        for a in moved:
            a[3] = a[0]
        again = play(envs, moved)
        for x, y in zip(first, again):
            for k in range(4):
                assert np.array_equal(x[k][0], y[k][3])


def test_restore_after_a_worker_restart():
    with ShmVecEnv([cartpole] * 4, num_workers=2, on_error="restart") as envs:
        envs.reset(seed=1)
        play(envs, actions_for(envs, 8))
        saved = envs.get_state()
        actions = actions_for(envs, 40, seed=4)
        first = play(envs, actions)
        os.kill(envs.worker_pids[1], signal.SIGKILL)
        envs.step(actions[0])
        assert len(envs.restarts) == 1
        envs.set_state(saved)
        again = play(envs, actions)
        assert all(same(x, y) for x, y in zip(first, again))


def test_rollout_replays():
    with shmvec.make("CartPole-v1", num_envs=4, num_workers=2) as envs:
        envs.reset(seed=0)

        def policy(obs):
            return (obs[:, 2] > 0).astype(np.int64)

        envs.rollout(policy, 16)
        saved = envs.get_state()  # the latest observations live in the rollout storage
        first = {k: v.copy() for k, v in envs.rollout(policy, 32).items() if isinstance(v, np.ndarray)}
        envs.set_state(saved)
        again = envs.rollout(policy, 32)
        for key, value in first.items():
            np.testing.assert_array_equal(value, again[key], err_msg=key)


def test_atari_pong_replays():
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")

    def pong():
        import ale_py
        from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

        gym.register_envs(ale_py)
        # ALE's saved state does not hold the previous action that sticky actions repeat
        # (docs/snapshots.md): snapshots of ALE envs replay exactly without them.
        env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0)
        return FrameStackObservation(AtariPreprocessing(env, noop_max=30), 4)

    with ShmVecEnv([pong] * 2, num_workers=2) as envs:
        assert_replays(envs, warmup=30, steps=40)


def test_mujoco_ant_replays():
    pytest.importorskip("mujoco")
    with ShmVecEnv([GymMake("Ant-v5")] * 2, num_workers=2) as envs:
        assert_replays(envs, warmup=20, steps=60)


# -- what cannot be snapshotted, and bad input ------------------------------------------------
class LockedEnv(gym.Wrapper):
    """Holds a lock: no state can be pickled out of it."""

    def __init__(self, env):
        super().__init__(env)
        self.lock = threading.Lock()


class OwnStateEnv(gym.Env):
    """Says what its state is (a counter), and holds a lock that keeps it from being pickled."""

    observation_space = gym.spaces.Box(0, 1000, shape=(1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.lock = threading.Lock()
        self.count = 0

    def reset(self, *, seed=None, options=None):
        self.count = 0
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        self.count += 1 + int(action)
        return np.array([self.count], dtype=np.float32), 1.0, False, False, {}

    def get_state(self):
        return self.count

    def set_state(self, state):
        self.count = state


def test_an_env_that_cannot_be_snapshotted_is_named():
    with ShmVecEnv([lambda: LockedEnv(gym.make("CartPole-v1"))] * 2, num_workers=2) as envs:
        envs.reset(seed=0)
        with pytest.raises(SnapshotError, match=r"env 0 \(CartPole-v1: LockedEnv > .*'lock' of LockedEnv"):
            envs.get_state()
        envs.step(np.zeros(2, dtype=np.int64))  # still usable


def test_an_env_with_its_own_state_protocol_is_used_as_is():
    with ShmVecEnv([OwnStateEnv] * 2, num_workers=2) as envs:
        envs.reset(seed=0)
        envs.step(np.ones(2, dtype=np.int64))
        saved = envs.get_state()
        first = play(envs, [np.array([0, 1])] * 3)
        envs.set_state(saved)
        assert all(same(x, y) for x, y in zip(first, play(envs, [np.array([0, 1])] * 3)))


def test_bad_states_are_refused():
    with ShmVecEnv([cartpole] * 2, num_workers=2) as envs, ShmVecEnv([NestedEnv] * 2, num_workers=2) as other:
        envs.reset(seed=0)
        other.reset(seed=0)
        with pytest.raises(TypeError, match="one EnvState"):
            envs.set_state(envs.get_state([0])[0], env_ids=[0])
        with pytest.raises(ValueError, match="got 1 states for 2 envs"):
            envs.set_state(envs.get_state([0]))
        with pytest.raises(TypeError, match=r"states\[0\] is a str"):
            envs.set_state(["x"], env_ids=[1])
        with pytest.raises(SnapshotError, match="another observation space"):
            envs.set_state(other.get_state([0]), env_ids=[0])
        with pytest.raises(ValueError, match="out of range"):
            envs.get_state([2])
        with pytest.raises(ValueError, match="distinct"):
            envs.get_state([0, 0])
        envs.step(np.zeros(2, dtype=np.int64))


def test_a_state_from_other_wrappers_is_refused():
    with (
        ShmVecEnv([lambda: gym.make("CartPole-v1")] * 1, num_workers=1) as plain,
        ShmVecEnv([cartpole] * 1, num_workers=1) as wrapped,
    ):
        plain.reset(seed=0)
        wrapped.reset(seed=0)
        with pytest.raises(SnapshotError, match="other layers"):
            wrapped.set_state(plain.get_state())


def test_envs_in_flight_are_refused():
    with ShmVecEnv([cartpole] * 4, num_workers=2, batch_size=2) as envs:
        envs.async_reset(seed=0)
        *_, ids = envs.recv()
        with pytest.raises(ValueError, match="in flight"):
            envs.get_state()
        with pytest.raises(ValueError, match="in flight"):
            envs.state_dict()
        assert len(envs.get_state(ids)) == 2  # the batch received is not in flight


def test_states_pickle():
    with ShmVecEnv([cartpole] * 2, num_workers=1) as envs:
        envs.reset(seed=0)
        saved = pickle.loads(pickle.dumps(envs.get_state()))
        assert all(isinstance(s, EnvState) and s.nbytes > 0 for s in saved)
        envs.set_state(saved)


# -- checkpoints ----------------------------------------------------------------------------
RESUME = textwrap.dedent(
    """
    import sys, numpy as np, shmvec


    def main(path, out, mode):
        envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2, max_episode_steps=30)
        if mode == "resume":
            shmvec.load_state(envs, path)
        else:
            envs.reset(seed=7)
            envs.action_space.seed(11)
        rows = []
        for t in range(60):
            if mode == "full" and t == 20:
                shmvec.save_state(envs, path)
            if mode == "resume" and t >= 40:
                break
            obs, rew, term, trunc, _ = envs.step(envs.action_space.sample())
            rows.append(np.concatenate([obs.ravel(), rew, term, trunc]))
        stats = np.concatenate([envs.episode_returns, envs.episode_lengths, envs.episode_counts])
        np.savez(out, steps=np.array(rows), stats=stats)
        envs.close()


    if __name__ == "__main__":  # (spawn and forkserver, Python 3.14's default, import this file again)
        main(*sys.argv[1:])
    """
)


def test_a_run_resumed_in_a_new_process_equals_the_uninterrupted_run(tmp_path):
    script = tmp_path / "resume.py"
    script.write_text(RESUME)
    ckpt = tmp_path / "envs.ckpt"

    def run(mode):
        out = tmp_path / f"{mode}.npz"
        subprocess.run([sys.executable, str(script), str(ckpt), str(out), mode], check=True, timeout=120)
        return np.load(out)

    full, resumed = run("full"), run("resume")
    np.testing.assert_array_equal(full["steps"][20:], resumed["steps"])  # the action sampler's draws too
    np.testing.assert_array_equal(full["stats"], resumed["stats"])
    assert full["steps"][20:, -8:].any(), "no episode ended after the checkpoint"


def test_load_state_dict_refuses_another_vector_env():
    with shmvec.make("CartPole-v1", num_envs=2, num_workers=1) as a, shmvec.make("CartPole-v1", num_envs=3) as b:
        a.reset(seed=0)
        with pytest.raises(ValueError, match="num_envs=2"):
            b.load_state_dict(a.state_dict())
        with pytest.raises(ValueError, match="not a ShmVecEnv state_dict"):
            b.load_state_dict({"envs": []})
