"""The VectorEnv surface of ShmVecEnv: spaces, copy semantics, call/attr/render, statistics, input checks."""

from __future__ import annotations

import os
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from envs_for_tests import ClosingEnv, NestedEnv, VariableSizeEnv
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode, VectorEnv

import shmvec


@pytest.fixture
def cartpole_envs():
    envs = shmvec.make("CartPole-v1", num_envs=6, num_workers=2)
    yield envs
    envs.close()


def test_is_a_gymnasium_vector_env(cartpole_envs):
    envs = cartpole_envs
    assert isinstance(envs, VectorEnv)
    assert envs.num_envs == 6
    assert envs.single_observation_space == gym.make("CartPole-v1").observation_space
    assert envs.observation_space.shape == (6, 4)
    assert envs.action_space.shape == (6,)
    assert envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP


def test_batched_spaces_are_built_on_first_read_and_assignable(cartpole_envs):
    from gymnasium.vector.utils import batch_space

    envs = cartpole_envs
    # Gymnasium's batched Box holds four arrays the size of a batch: built only when read.
    assert "_batched_observation_space" not in vars(envs)
    assert envs.observation_space == batch_space(envs.single_observation_space, 6)
    assert envs.observation_space is envs.observation_space
    assert envs.action_space == batch_space(envs.single_action_space, 6)
    mine = gym.spaces.Box(-1, 1, (6, 4))
    envs.observation_space = mine  # as a wrapper-free user may set it
    assert envs.observation_space is mine


def test_copy_true_returns_owned_arrays(cartpole_envs):
    obs, _ = cartpole_envs.reset(seed=0)
    obs2, rew, term, trunc, _ = cartpole_envs.step(np.zeros(6, dtype=np.int64))
    assert not np.shares_memory(obs, obs2)
    obs2[:] = 0  # ours to change
    rew[:] = 5
    obs3, rew3, *_ = cartpole_envs.step(np.zeros(6, dtype=np.int64))
    assert np.all(rew3 == 1.0) and np.any(obs3 != 0)


def test_copy_false_returns_readonly_views():
    with shmvec.ShmVecEnv([NestedEnv] * 4, num_workers=2, copy=False) as envs:
        ref = shmvec.ShmVecEnv([NestedEnv] * 4, num_workers=2)
        obs, _ = envs.reset(seed=1)
        ref_obs, _ = ref.reset(seed=1)
        np.testing.assert_array_equal(obs["pos"], ref_obs["pos"])
        with pytest.raises(ValueError, match="read-only"):
            obs["pos"][0, 0] = 1.0
        envs.action_space.seed(0)
        a = envs.action_space.sample()
        o1, r1, *_ = envs.step(a)
        o2, r2, *_ = ref.step(a)
        np.testing.assert_array_equal(o1["img"], o2["img"])
        np.testing.assert_array_equal(r1, r2)
        assert not r1.flags.writeable
        ref.close()


def test_call_get_set_attr_and_render():
    with shmvec.ShmVecEnv([lambda: NestedEnv(render_mode="rgb_array")] * 5, num_workers=3) as envs:
        envs.reset(seed=0)
        assert envs.call("double", 21) == (42,) * 5
        assert envs.get_attr("scale") == (1.0,) * 5
        envs.set_attr("scale", [1.0, 2.0, 3.0, 4.0, 5.0])
        assert envs.get_attr("scale") == (1.0, 2.0, 3.0, 4.0, 5.0)
        envs.set_attr("scale", 7.0)
        assert envs.get_attr("scale") == (7.0,) * 5
        frames = envs.render()
        assert len(frames) == 5 and frames[0].shape == (2, 2, 3)
        assert envs.render_mode == "rgb_array"
        with pytest.raises(ValueError, match="one per env"):
            envs.set_attr("scale", [1.0, 2.0])
        with pytest.raises(shmvec.WorkerError, match="AttributeError") as info:
            envs.call("no_such_method")
        assert info.value.env_index == 0 and "Traceback" in info.value.remote_traceback
        # A failed call leaves stepping state intact: the env stays usable.
        envs.step(envs.action_space.sample())


def test_episode_statistics_counted_in_workers():
    n = 4
    with shmvec.make("CartPole-v1", num_envs=n, num_workers=2) as envs:
        envs.reset(seed=0)
        ret, length = np.zeros(n), np.zeros(n, dtype=int)
        last_ret, last_len, counts = np.zeros(n), np.zeros(n, dtype=int), np.zeros(n, dtype=int)
        prev_done = np.zeros(n, dtype=bool)
        rng = np.random.default_rng(0)
        for _ in range(400):
            _, r, te, tr, _ = envs.step(rng.integers(0, 2, n))
            live = ~prev_done  # NEXT_STEP: the step after an episode end is a reset, not a transition
            ret += np.where(live, r, 0.0)
            length += live
            done = te | tr
            last_ret[done], last_len[done] = ret[done], length[done]
            counts += done
            ret[done], length[done] = 0.0, 0
            prev_done = done
        assert counts.sum() > 20
        np.testing.assert_array_equal(envs.episode_counts, counts)
        np.testing.assert_array_equal(envs.episode_returns, last_ret)
        np.testing.assert_array_equal(envs.episode_lengths, last_len)
        np.testing.assert_array_equal(envs.episode_returns, envs.episode_lengths)  # CartPole: +1 per step


def test_make_passes_env_kwargs_and_wrappers():
    with shmvec.make("CartPole-v1", num_envs=2, num_workers=1, env_kwargs={"max_episode_steps": 5},
                     wrappers=[gym.wrappers.RecordEpisodeStatistics]) as envs:
        envs.reset(seed=0)
        for _ in range(5):
            _, _, _, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
        assert trunc.all() or "episode" in infos


@pytest.mark.parametrize(
    "actions, match",
    [
        (np.zeros(5, dtype=np.int64), r"shape \(5,\), expected \(6,\)"),
        (np.zeros(6, dtype=np.float32), "dtype float32, expected integers"),
        (np.array([0, 1, 2, 0, 1, 0]), r"actions\[2\] = .*outside the action space"),
        (np.array([0, 1, -1, 0, 1, 0]), r"env 2"),
    ],
)
def test_bad_actions_are_refused_and_env_stays_usable(cartpole_envs, actions, match):
    cartpole_envs.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        cartpole_envs.step(actions)
    obs, *_ = cartpole_envs.step(np.ones(6, dtype=np.int64))
    assert obs.shape == (6, 4)


def test_box_and_nested_action_checks():
    with shmvec.make("Pendulum-v1", num_envs=2, num_workers=1) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="outside the action space"):
            envs.step(np.array([[0.0], [3.0]], dtype=np.float32))
        with pytest.raises(ValueError, match="outside"):
            envs.step(np.array([[np.nan], [0.0]], dtype=np.float32))
        envs.step(np.array([[0.5], [-2.0]], dtype=np.float32))
    with shmvec.ShmVecEnv([NestedEnv] * 2, num_workers=2) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"actions\[1\] have shape"):
            envs.step((np.zeros(2, dtype=np.int64), np.zeros((2, 3))))
        with pytest.raises(ValueError, match="do not match action_space"):
            envs.step((np.zeros(2, dtype=np.int64),))


@pytest.mark.parametrize("space", [
    gym.spaces.Discrete(3), gym.spaces.Discrete(4, start=-2), gym.spaces.MultiBinary(3),
    gym.spaces.MultiDiscrete([3, 3]), gym.spaces.MultiDiscrete([2, 5], start=[1, -1]),
    gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32)),
    gym.spaces.Box(-np.inf, np.inf, (2,)), gym.spaces.Box(0, 10, (3,), np.int64),
])
def test_action_range_check_matches_an_elementwise_reference(space):
    """The min/max shortcut refuses exactly the batches in which some element is out of range
    (or NaN), and names the first env with one, as a plain elementwise test does."""
    from shmvec.actions import ActionBatch

    if isinstance(space, gym.spaces.Box):
        low, high, dtypes = space.low, space.high, [np.float32, np.float64]
        values = [low.min() - 1, high.max() + 1, np.nan, -np.inf, np.inf, 0, 1]
    else:
        start = getattr(space, "start", 0)
        low = np.asarray(start)
        high = low + (space.n if isinstance(space, gym.spaces.Discrete) else getattr(space, "nvec", 2))
        dtypes, values = [np.int64, np.int32, np.uint64, np.uint8], [-3, -2, -1, 0, 1, 2, 3, 4, 5, 2**40]
    batch, rng = ActionBatch(space), np.random.default_rng(0)
    n = 5
    for dtype in dtypes:
        for _ in range(200):
            a = np.stack([space.sample() for _ in range(n)]).astype(dtype, copy=True).reshape(n, *space.shape)
            if rng.random() < 0.7:  # poke values that may be out of range into some elements
                for _ in range(rng.integers(1, 3)):
                    v = values[rng.integers(len(values))]
                    with np.errstate(all="ignore"):
                        a.flat[rng.integers(a.size)] = np.array(v).astype(dtype) if np.isfinite(v) or a.dtype.kind == "f" else 0
            with np.errstate(invalid="ignore"):
                bad_rows = ~((a >= low) & (a < high) if not isinstance(space, gym.spaces.Box)
                             else (a >= low) & (a <= high)).reshape(n, -1).all(axis=1)
            if bad_rows.any():
                with pytest.raises(ValueError, match=rf"\(env {int(np.argmax(bad_rows))}\)"):
                    batch.leaf_arrays(a, n)
            else:
                assert batch.leaf_arrays(a, n)[0] is a


def test_validation_can_be_turned_off():
    with shmvec.make("Pendulum-v1", num_envs=2, num_workers=1, validate_actions=False) as envs:
        envs.reset(seed=0)
        envs.step(np.array([[5.0], [-5.0]], dtype=np.float32))  # Pendulum clips by itself


def test_step_before_reset_and_after_close():
    envs = shmvec.make("CartPole-v1", num_envs=2, num_workers=1)
    with pytest.raises(ResetNeeded):
        envs.step(np.zeros(2, dtype=np.int64))
    envs.reset()
    envs.close()
    envs.close()  # idempotent
    with pytest.raises(shmvec.ClosedError):
        envs.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(shmvec.ClosedError):
        envs.reset()


@pytest.mark.parametrize("kind", ["Text", "Graph", "Sequence"])
@pytest.mark.parametrize("nested", [False, True])
def test_variable_size_spaces_work(kind, nested):
    """Once refused; now batched as Gymnasium does (a tuple of one sample per env), the rest of
    the space still in shared memory. tests/test_variable_spaces.py compares them bit for bit."""
    with shmvec.ShmVecEnv([partial(VariableSizeEnv, kind, nested)] * 2, num_workers=2) as envs:
        obs, _ = envs.reset(seed=0)
        obs, *_ = envs.step(np.zeros(2, dtype=np.int64))
        assert obs in envs.observation_space
        variable = obs["x"] if nested else obs
        assert isinstance(variable, tuple) and len(variable) == 2


def test_mismatched_spaces_are_refused():
    fns = [lambda: gym.make("CartPole-v1"), lambda: gym.make("Acrobot-v1")]
    with pytest.raises(ValueError, match="env 1 has observation_space"):
        shmvec.ShmVecEnv(fns, num_workers=2)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="empty"):
        shmvec.ShmVecEnv([])
    with pytest.raises(TypeError, match=r"env_fns\[1\]"):
        shmvec.ShmVecEnv([lambda: gym.make("CartPole-v1"), gym.make("CartPole-v1")])
    with pytest.raises(ValueError, match="num_workers"):
        shmvec.make("CartPole-v1", num_envs=2, num_workers=0)


def test_more_workers_than_envs_or_cores():
    with shmvec.make("CartPole-v1", num_envs=3, num_workers=8) as envs:
        assert envs.num_workers == 3
        envs.reset(seed=0)
        for _ in range(50):
            envs.step(np.ones(3, dtype=np.int64))
    # 5 worker processes on 2 cores: oversubscribed, must neither livelock nor crawl
    with shmvec.make("CartPole-v1", num_envs=10, num_workers=6, step_in_main=False) as envs:
        envs.reset(seed=0)
        for _ in range(200):
            envs.step(np.ones(10, dtype=np.int64))


def test_garbage_collection_closes():
    import gc

    envs = shmvec.make("CartPole-v1", num_envs=2, num_workers=2)
    pids = envs.worker_pids
    assert len(pids) == 2
    del envs
    gc.collect()  # the finalizer shuts the workers down and reaps them
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("how", ["close", "with", "gc"])
@pytest.mark.parametrize("step_in_main", [True, False])
def test_every_env_is_closed_once_in_its_own_process(tmp_path, how, step_in_main):
    import gc

    fns = [partial(ClosingEnv, str(tmp_path), i) for i in range(5)]
    envs = shmvec.ShmVecEnv(fns, num_workers=2 - step_in_main, step_in_main=step_in_main)
    blocks = envs.blocks
    assert len(blocks) == 2 and blocks[0] == range(0, 3)
    hosts = list(envs.worker_pids)
    hosts += [os.getpid()] * (len(blocks) - len(hosts))  # the main process's block comes last
    envs.reset(seed=0)
    if how == "close":
        envs.close()
        envs.close()
    elif how == "with":
        with envs:
            envs.step(np.zeros(5, dtype=np.int64))
    else:
        del envs
        gc.collect()
    for host, block in zip(hosts, blocks):
        for i in block:
            marker = tmp_path / f"closed-{i}"
            assert marker.exists(), f"env {i} was not closed"
            assert marker.read_text().split() == [str(host)], f"env {i}: closed by {marker.read_text()!r}"


def test_import_is_cheap():
    import subprocess
    import sys

    code = ("import sys, shmvec; print(*(m in sys.modules for m in "
            "('numba', 'shmvec.pool', 'ray', 'torch', 'stable_baselines3')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"] * 5


def test_action_rows_ignored_by_a_reset_are_not_range_checked():
    # Under NEXT_STEP the envs being reset never see their action (Gymnasium hands them any
    # value), so only the other rows are held to the space; dtype and shape still hold for all.
    from shmvec.actions import ActionBatch

    space = gym.spaces.Dict({"move": gym.spaces.Box(np.array([-1, 0], np.float32), np.array([1, 2], np.float32)),
                             "pick": gym.spaces.Discrete(3)})
    batch = ActionBatch(space)
    actions = {"move": np.array([[0.0, 1.0], [9.0, 1.0], [0.0, 1.0]], np.float32), "pick": np.array([0, 1, 7])}
    with pytest.raises(ValueError, match=r"actions\['move'\]\[1\]"):
        batch.leaf_arrays(actions, 3)
    batch.leaf_arrays(actions, 3, ignored=np.array([False, True, True]))
    with pytest.raises(ValueError, match=r"actions\['pick'\]\[2\] = 7"):
        batch.leaf_arrays(actions, 3, ignored=np.array([False, True, False]))
    with pytest.raises(ValueError, match="expected integers"):
        batch.leaf_arrays({**actions, "pick": actions["pick"] * 1.0}, 3, ignored=np.ones(3, bool))
    with pytest.raises(TypeError, match=r"shape \(\), expected \(3,\)"):
        batch.leaf_arrays({**actions, "pick": 1}, 3, ignored=np.ones(3, bool))


def test_send_skips_the_range_check_of_envs_being_reset():
    with shmvec.ShmVecEnv([lambda: gym.make("CartPole-v1", max_episode_steps=2)] * 4, num_workers=2,
                          batch_size=2) as envs:
        envs.async_reset(seed=0)
        resets = live = 0
        while resets < 2 or live < 2:
            _, _, terminated, truncated, _, ids = envs.recv()
            if (terminated | truncated).all():  # both envs reset in their next step: actions ignored
                envs.send(np.array([5, -3]), ids)
                resets += 1
                continue
            with pytest.raises(ValueError, match="outside the action space"):
                envs.send(np.array([5, 0]), ids)  # a live env would see this one
            envs.send(np.zeros(2, dtype=np.int64), ids)
            live += 1


class _Inherited:
    """A parent-side object in a reference cycle whose finalizer records the process it runs in:
    a forked worker that collects it would run parent-only cleanup (Ray's gRPC client hangs there)."""

    def __init__(self, path):
        self.path, self.me = path, self

    def __del__(self):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


class _CollectingEnv(gym.Wrapper):
    def collect(self):
        import gc

        return gc.collect()


def test_forked_workers_never_finalize_what_they_inherited(tmp_path):
    import gc

    path = tmp_path / "finalized"
    gc.disable()  # keep the cycle alive in the parent until the workers have forked
    try:
        _Inherited(str(path))  # unreachable at once, but only a collection can free a cycle
        envs = shmvec.ShmVecEnv([lambda: _CollectingEnv(gym.make("CartPole-v1"))] * 2, num_workers=2,
                                step_in_main=False, context="fork")
    finally:
        gc.enable()
    try:
        envs.call("collect")  # a full collection in each worker
        pids = set(envs.worker_pids)
    finally:
        envs.close()
    gc.collect()
    finalized = {int(line) for line in path.read_text().split()} if path.exists() else set()
    assert finalized == {os.getpid()}  # the parent's copy, once; no worker's
    assert not finalized & pids


def test_unpicklable_call_arguments_fail_at_once_and_leave_the_env_usable():
    envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2)
    try:
        envs.reset(seed=0)
        with pytest.raises(shmvec.PayloadError, match="cannot be pickled"):
            envs.call("get_wrapper_attr", lambda: 1)  # a lambda: pickle refuses it
        assert not envs.closed
        assert envs.get_attr("spec")[0].id == "CartPole-v1"
        envs.step(np.zeros(4, dtype=np.int64))
    finally:
        envs.close()


class _Unrebuildable:
    """A factory that pickles but cannot be rebuilt in a worker (as a module missing there)."""

    def __call__(self):
        return gym.make("CartPole-v1")

    def __getstate__(self):
        return {"parent": os.getpid()}

    def __setstate__(self, state):
        if os.getpid() != state["parent"]:
            raise ImportError("no module named 'gone' in the worker")


def test_a_factory_that_cannot_be_rebuilt_in_the_worker_names_its_error():
    with pytest.raises(shmvec.WorkerError, match="no module named 'gone'") as info:
        shmvec.ShmVecEnv([_Unrebuildable()] * 2, num_workers=2)
    assert info.value.phase == "construct" and info.value.exc_type == "ImportError"


def test_adapters_pass_an_already_batched_tuple_through():
    from shmvec._adapters import batched_actions

    space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Discrete(3)))
    batch = (np.array([0, 1]), np.array([2, 0]))  # as many subspaces as envs: a batch, not two samples
    got = batched_actions(space, batch, 2)
    assert [a.tolist() for a in got] == [[0, 1], [2, 0]]
    per_env = batched_actions(space, [(0, 2), (1, 0)], 2)  # one sample per env, as SB3 indexes them
    assert [a.tolist() for a in per_env] == [[0, 1], [2, 0]]


class _BigInfoEnv(gym.Env):
    """Infos that are small on most steps and larger than a replies row on every third."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        size = 50_000 if self.t % 3 == 0 else 3  # 400 KB of float64: past the 64 KiB row
        return np.zeros(2, np.float32), 1.0, False, False, {"blob": np.full(size, self.t, np.float64)}

    def payload(self, nbytes):
        return b"x" * nbytes


def test_replies_travel_in_shared_memory_or_on_the_pipe_by_size():
    """Replies up to a row of ``replies`` come through shared memory, larger ones on the pipe,
    in any order, with nothing stale left behind."""
    from gymnasium.vector import SyncVectorEnv

    from shmvec.protocol import REPLY_BYTES, REPLY_LEN

    ref = SyncVectorEnv([_BigInfoEnv] * 4)
    with shmvec.ShmVecEnv([_BigInfoEnv] * 4, num_workers=2) as envs:
        ref.reset(seed=0)
        envs.reset(seed=0)
        used = set()
        for t in range(1, 8):
            _, _, _, _, want = ref.step(np.zeros(4, dtype=np.int64))
            _, _, _, _, got = envs.step(np.zeros(4, dtype=np.int64))
            assert np.array_equal(got["blob"], want["blob"]) and got["blob"].dtype == want["blob"].dtype, t
            used.add(envs._session.pool.lines[0][REPLY_LEN] < 0)
        assert used == {True, False}  # both paths ran
        for nbytes in (10, REPLY_BYTES - 100, REPLY_BYTES + 100, 3 * REPLY_BYTES, 10):
            assert envs.call("payload", nbytes) == (b"x" * nbytes,) * 4
    ref.close()


def test_version_license_and_type_marker_are_packaged(capsys):
    """`shmvec --version` says the one version there is; the wheel ships LICENSE and py.typed."""
    import tomllib
    from pathlib import Path

    from shmvec.__main__ import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"shmvec {shmvec.__version__}"
    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"]  # read from shmvec.__version__
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "shmvec.__version__"}
    assert "LICENSE" in project["project"]["license-files"] and (root / "LICENSE").is_file()
    assert (root / "shmvec" / "py.typed").is_file() and "py.typed" in project["tool"]["setuptools"]["package-data"]["shmvec"]
    assert any(req.startswith("setuptools>=77") for req in project["build-system"]["requires"])


def test_pickling_or_copying_says_why_it_cannot():
    import copy
    import pickle

    with shmvec.make("CartPole-v1", num_envs=2, num_workers=1) as envs:
        for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="owns worker processes and shared memory.*env factories"):
                attempt(envs)
        envs.reset(seed=0)  # still usable


def test_make_takes_make_vecs_call_shape():
    """Keywords of gymnasium.make_vec's shape: env arguments go to gymnasium.make, ShmVecEnv's
    options to the vector env (top level or vector_kwargs), and a keyword that is neither says so."""
    import gymnasium as gym

    want = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync", render_mode="rgb_array", max_episode_steps=7)
    with shmvec.make("CartPole-v1", 2, render_mode="rgb_array", max_episode_steps=7, num_workers=1) as envs:
        assert envs.render_mode == want.render_mode == "rgb_array" and envs.num_workers == 1
        got_obs, _ = envs.reset(seed=0)
        want_obs, _ = want.reset(seed=0)
        assert np.array_equal(got_obs, want_obs)
        for _ in range(7):
            got = envs.step(np.zeros(2, dtype=np.int64))
            ref = want.step(np.zeros(2, dtype=np.int64))
        assert got[3].all() and ref[3].all()  # the time limit reached the env
    want.close()
    with shmvec.make("CartPole-v1", 2, None, {"num_workers": 2}, env_kwargs={"render_mode": "rgb_array"}) as envs:
        assert envs.num_workers == 2 and envs.render_mode == "rgb_array"
    with pytest.raises(TypeError, match=r"'gravity_x' is neither an option of ShmVecEnv \(.*num_workers.*\) nor an argument"):
        shmvec.make("CartPole-v1", 2, gravity_x=3.0)
    with pytest.raises(ValueError, match="vectorization_mode='sync'"):
        shmvec.make("CartPole-v1", 2, vectorization_mode="sync")


@pytest.mark.parametrize("step_in_main", [False, True])
def test_an_env_whose_last_step_gives_no_info_still_gives_its_final_obs(step_in_main):
    from envs_for_tests import NoneInfoEnv

    with shmvec.ShmVecEnv([partial(NoneInfoEnv, 2), partial(NoneInfoEnv, 3)], num_workers=1,
                          step_in_main=step_in_main, autoreset_mode=AutoresetMode.SAME_STEP) as envs:
        envs.reset(seed=0)
        _, _, terms, _, infos = envs.step(np.zeros(2, dtype=np.int64))
        assert not terms.any() and infos == {}
        obs, _, terms, _, infos = envs.step(np.zeros(2, dtype=np.int64))  # env 0 ends its episode
        assert terms.tolist() == [True, False] and obs[0, 0] == 0.0
        assert infos["_final_obs"].tolist() == [True, False] and infos["final_obs"][0].tolist() == [2.0]
        assert infos["final_info"] == {} and infos["_final_info"].tolist() == [True, False]


def test_asynchronous_collection_blocks_where_the_blocks_outnumber_the_cores(monkeypatch):
    import shmvec.pool

    monkeypatch.setattr(shmvec.pool, "usable_cores", lambda: 1)
    with shmvec.make("CartPole-v1", num_envs=4, num_workers=2, batch_size=2) as envs:
        assert envs._session.pool._wait_policy.max_spin == 0.0  # spinners would starve blocks of turns
    with shmvec.make("CartPole-v1", num_envs=4, num_workers=2) as envs:
        assert envs._session.pool._wait_policy.max_spin > 0.0  # synchronous rounds spin and yield
