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
    run_both(NestedEnv, num_envs=4, steps=300, mode=AutoresetMode.NEXT_STEP, num_workers=num_workers - step_in_main,
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


# -- Gymnasium conformance: what its own tests/vector check, against SyncVectorEnv --------------


class CountEnv(gym.Env):
    """Counts its steps; the observation is the count, returned as envs usually return it: a
    Python int for Discrete, a 0-d array for a scalar Box. Episodes end at ``max_count``."""

    def __init__(self, obs: str = "discrete") -> None:
        self.kind = obs
        count = gym.spaces.Discrete(8)
        scalar = gym.spaces.Box(0.0, 8.0, shape=(), dtype=np.float32)
        self.observation_space = {
            "discrete": count,
            "box": scalar,
            "dict": gym.spaces.Dict({"count": count, "level": scalar, "vec": gym.spaces.Box(0, 8, (2,), np.int32)}),
        }[obs]
        self.action_space = gym.spaces.Discrete(4)
        self.max_count = 3
        self.count = 0

    def _obs(self):
        if self.kind == "discrete":
            return self.count
        level = np.array(self.count, dtype=np.float32)
        if self.kind == "box":
            return level
        return {"count": self.count, "level": level, "vec": np.full(2, self.count, np.int32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return self._obs(), {}

    def step(self, action):
        self.count += 1
        return self._obs(), float(action), self.count >= self.max_count, False, {"action": int(action)}


@pytest.mark.parametrize("obs", ["discrete", "box", "dict"])
def test_final_obs_keeps_the_types_sync_gives(obs):
    # SyncVectorEnv keeps each final observation as the env returned it (a Python int for a
    # Discrete space); data_equivalence compares types too.
    from gymnasium.utils.env_checker import data_equivalence

    def make():
        return CountEnv(obs)

    ref = SyncVectorEnv([make] * 3, autoreset_mode=AutoresetMode.SAME_STEP)
    with shmvec.ShmVecEnv([make] * 3, num_workers=2, autoreset_mode=AutoresetMode.SAME_STEP) as envs:
        ref.set_attr("max_count", [2, 3, 3])
        envs.set_attr("max_count", [2, 3, 3])
        assert data_equivalence(ref.reset(seed=0), envs.reset(seed=0))
        for t in range(7):
            r, s = ref.step([1, 2, 3]), envs.step([1, 2, 3])
            assert data_equivalence(r, s), f"step {t}: {r} != {s}"
            if "final_obs" in s[4]:
                final = s[4]["final_obs"][s[4]["_final_obs"]][0]
                leaf = final if obs != "dict" else final["count"]
                assert type(leaf) is (int if obs != "box" else np.ndarray)
    ref.close()


def test_np_random_seed_and_np_random_per_env():
    ref = SyncVectorEnv([cartpole] * 3)
    with shmvec.ShmVecEnv([cartpole] * 3, num_workers=2) as envs:
        ref.reset(seed=42)
        envs.reset(seed=42)
        assert envs.np_random_seed == ref.np_random_seed == (42, 43, 44)
        envs.reset()  # seed=None: the envs go on with their generators, and their seeds stay
        ref.reset()
        assert envs.np_random_seed == ref.np_random_seed == (42, 43, 44)
        generators = envs.np_random
        assert isinstance(generators, tuple) and len(generators) == 3
        for ours, theirs in zip(generators, ref.np_random):
            assert ours.bit_generator.state == theirs.bit_generator.state
    ref.close()


@pytest.mark.parametrize(
    "mask",
    [[True, False, True], np.array([True]), np.array([[True, True, True]]), np.array([1, 1, 0]),
     np.array([1.0, 0.0, 0.0]), np.array([False, False, False])],
    ids=["list", "short", "2d", "int", "float", "none-set"],
)
def test_reset_mask_errors_are_gymnasiums(mask):
    ref = SyncVectorEnv([cartpole] * 3, autoreset_mode=AutoresetMode.DISABLED)
    with shmvec.ShmVecEnv([cartpole] * 3, num_workers=2, autoreset_mode=AutoresetMode.DISABLED) as envs:
        envs.reset(seed=0)
        ref.reset(seed=0)
        with pytest.raises(Exception) as expected:
            ref.reset(options={"reset_mask": mask})
        with pytest.raises(type(expected.value)) as got:
            envs.reset(options={"reset_mask": mask})
        assert type(got.value) is type(expected.value) and str(got.value) == str(expected.value)
        envs.reset(options={"reset_mask": np.array([True, False, True])})  # still usable
    ref.close()


def test_actions_as_gymnasium_takes_them():
    ref = SyncVectorEnv([CountEnv] * 3)
    with shmvec.ShmVecEnv([CountEnv] * 3, num_workers=2) as envs:
        ref.reset(seed=0)
        envs.reset(seed=0)
        # Not a batch at all: TypeError, as Gymnasium's iterate() raises; a batch of the wrong
        # size: ValueError. Neither reaches an env here (SyncVectorEnv steps the first envs
        # before it notices a wrong size, so it is asked on a copy).
        probe = SyncVectorEnv([CountEnv] * 3)
        probe.reset(seed=0)
        for bad, error in ((0, TypeError), (np.int64(1), TypeError), ([1, 1], ValueError), ([1] * 4, ValueError)):
            with pytest.raises(error):
                probe.step(bad)
            with pytest.raises(error):
                envs.step(bad)
        probe.close()
        for t in range(3):
            r, s = ref.step([1, 2, 3]), envs.step([1, 2, 3])
            for x, y in zip(r, s):
                assert_same(x, y, f"step {t}")
        # Every episode ended: under NEXT_STEP this step resets them and ignores the actions,
        # so any value goes, as with Gymnasium (whose tests send 4 to a Discrete(4) here).
        r, s = ref.step([4, -1, 99]), envs.step([4, -1, 99])
        for x, y in zip(r, s):
            assert_same(x, y, "reset step")
        # An action an env would see must be in the action space (a deliberate difference,
        # docs/migration.md); SyncVectorEnv hands it over. validate_actions=False does too.
        with pytest.raises(ValueError, match=r"actions\[0\] = 4 is outside the action space"):
            envs.step([4, 1, 1])
        envs.validate_actions = False
        r, s = ref.step([4, 1, 1]), envs.step([4, 1, 1])
        for x, y in zip(r, s):
            assert_same(x, y, "unchecked step")
    ref.close()


class InfoTypesEnv(gym.Env):
    """Infos of every scalar kind an env hands out (numpy float64/float32/int64/bool, Python
    ones, nested), with types that differ between envs for some keys, and episodes that end."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.t = 0

    def _info(self):
        t = self.t
        first = self.np_random_seed % 2 == 0  # seeds differ per env: mixed types across envs
        return {
            "f64": np.float64(t / 3), "f32": np.float32(t / 3), "i64": np.int64(t - 2), "flag": np.bool_(t % 2),
            "py": t / 7, "mixed": np.float64(t / 3) if first else t, "late": np.float64(t) if t > 2 else None,
            "nested": {"x": np.float64(-t), "ok": np.bool_(t > 1)},
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), self._info()

    def step(self, action):
        self.t += 1
        return np.full(2, self.t / 10, np.float32), 1.0, self.t >= 4 + int(action), False, self._info()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("step_in_main", [False, True])
def test_infos_keep_their_dtypes_after_travelling(mode, step_in_main):
    """Workers send numpy float64/int64 info values as Python scalars (they pickle several
    times faster); the merged infos keep SyncVectorEnv's dtypes and values exactly."""
    run_both(InfoTypesEnv, 5, 30, mode, num_workers=2 - step_in_main, step_in_main=step_in_main)
    envs = shmvec.ShmVecEnv([InfoTypesEnv] * 3, num_workers=3)
    try:
        _, infos = envs.reset(seed=0)
        assert infos["f64"].dtype == np.float64 and infos["f32"].dtype == np.float32
        assert infos["i64"].dtype == np.int64 and infos["flag"].dtype == object  # Gymnasium's rule for np.bool_
        assert infos["nested"]["x"].dtype == np.float64 and type(infos["nested"]["ok"][0]) is np.bool_
    finally:
        envs.close()


def test_plain_scalars_leaves_the_envs_dict_alone():
    from shmvec.info_columns import plain_scalars

    info = {"a": np.float64(1.5), "b": {"c": np.float64(-2.0)}, "d": np.float32(2.0), "e": "text", "f": np.bool_(1)}
    out = plain_scalars(info)
    assert type(out["a"]) is float and type(out["b"]["c"]) is float and type(out["d"]) is np.float32
    assert type(out["f"]) is np.bool_ and out["e"] == "text"
    assert type(info["a"]) is np.float64 and type(info["b"]["c"]) is np.float64
    assert plain_scalars({}) == {} and plain_scalars(None) is None


def test_add_info_with_columns_builds_what_gymnasium_builds():
    """Merging many envs' infos through the ``columns`` cache gives Gymnasium's own result:
    the first value of a key picks its dtype (later values are cast into it), nested dicts and
    ``final_obs`` keep their own rules, envs without a key leave zeros and False."""
    from gymnasium.vector.vector_env import VectorEnv

    from shmvec.infos import add_info

    envs = [
        {"a": 1, "b": np.float32(0.5), "s": "x", "n": {"r": 1.5}},
        {"a": 2.7, "b": 3.25, "v": np.arange(3.0), "n": {"r": 2, "l": 4}},
        {},
        {"a": True, "s": None, "v": np.ones(3), "final_obs": np.zeros(2)},
        {"b": np.float64(1e40), "a": -4, "n": {"l": np.int64(7)}},
    ]
    ref = VectorEnv()
    ref.num_envs = len(envs)
    want: dict = {}
    got: dict = {}
    columns: dict = {}
    with np.errstate(over="ignore"):  # 1e40 into float32: inf on both sides, on purpose
        for i, info in enumerate(envs):
            want = ref._add_info(want, info, i)
            add_info(got, info, i, len(envs), columns)
    assert_same(want, got, "infos")
    assert set(columns) == {"a", "b", "s", "v"}  # flat keys only
