"""Unit tests for shmvec.stepper.Stepper: one block of envs, stepped in this process into the views
of a real layout (the block can sit anywhere in it), one protocol command at a time.

The reference is the same envs stepped by hand with the same seeds and actions.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from envs_for_tests import FaultyEnv, NoneInfoEnv
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from shmvec.errors import EnvObsError
from shmvec.layout import Layout
from shmvec.protocol import Command, WorkerOptions
from shmvec.stepper import Stepper

NEXT, SAME = AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP


class CountEnv(gym.Env):
    """Observes ``[its step count, ident]``; an episode ends after ``length`` steps (terminated, or
    truncated with ``truncate``). The reward is ``action + 1`` (so a reset step's 0 stands out); a
    step's info is ``{"t": count}``, a reset's ``{"resets": resets so far}``.
    """

    def __init__(self, length: int = 3, ident: int = 0, truncate: bool = False, bad: bool = False) -> None:
        self.observation_space = spaces.Box(0.0, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(4)
        self.length, self.ident, self.truncate, self.bad = length, ident, truncate, bad
        self.t = 0
        self.resets = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.ident], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = options.get("t", 0) if options else 0
        self.resets += 1
        return self._obs(), {"resets": self.resets}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        return self._obs(), float(action) + 1.0, end and not self.truncate, end and self.truncate, {"t": self.t}

    def scaled(self, x, factor=1):
        return self.ident, x * factor

    def check(self):
        if self.bad:
            raise RuntimeError(f"env {self.ident} is bad")
        return "ok"


def make_stepper(envs: list, mode: AutoresetMode = NEXT, start: int = 0, num_envs: int | None = None):
    """A stepper for ``envs`` as the block ``[start, start + len(envs))`` of a vector env of
    ``num_envs`` (default: just enough) envs; returns ``(stepper, views)``.
    """
    env0 = envs[0]
    num_envs = start + len(envs) if num_envs is None else num_envs
    layout = Layout.build(env0.observation_space, env0.action_space, num_envs, 2, with_final_obs=mode is SAME)
    views = layout.views(bytearray(layout.size))
    options = WorkerOptions(autoreset_mode=mode.value)
    return Stepper(envs, start, layout, views, options, env0.observation_space, env0.action_space), views


def step(stepper: Stepper, views: dict, actions) -> object:
    """Write the block's actions into the shared actions, then run STEP; its reply."""
    views["act/0"][stepper.start : stepper.stop] = actions
    return stepper.run(Command.STEP, None)


def outcome(stepper: Stepper, views: dict) -> tuple:
    """Copies of what the block's last command wrote: obs, rewards, terminations, truncations."""
    sl = slice(stepper.start, stepper.stop)
    return tuple(views[k][sl].copy() for k in ("obs/0", "rewards", "terminations", "truncations"))


def stats(stepper: Stepper, views: dict) -> tuple:
    """The block's episode statistics: last return, last length, episode count (as lists)."""
    sl = slice(stepper.start, stepper.stop)
    return tuple(views[k][sl].tolist() for k in ("last_return", "last_length", "episode_count"))


def test_step_matches_cartpole_stepped_by_hand():
    """Three CartPoles as the middle block (envs 1..3) of a 5-env layout: every step's obs,
    rewards and flags, NEXT_STEP autoresets and episode statistics are those of a by-hand loop;
    the rest of the layout is left alone.
    """
    seeds = [10, 11, 12]
    stepper, views = make_stepper([gym.make("CartPole-v1") for _ in seeds], start=1, num_envs=5)
    for name in ("obs/0", "rewards"):
        views[name][...] = -7.0
    ref = [gym.make("CartPole-v1") for _ in seeds]

    assert stepper.run(Command.RESET, (seeds, None, None)) is None  # CartPole's reset infos are empty
    ref_obs = [env.reset(seed=s)[0] for env, s in zip(ref, seeds)]
    np.testing.assert_array_equal(views["obs/0"][1:4], ref_obs)

    rng = np.random.default_rng(0)
    done = [False] * 3
    ret, length, count = [0.0] * 3, [0] * 3, [0] * 3
    last_ret, last_len = [0.0] * 3, [0] * 3
    for _ in range(250):
        actions = rng.integers(0, 2, size=3)
        assert step(stepper, views, actions) is None
        for j, env in enumerate(ref):
            if done[j]:  # NEXT_STEP: the step after an episode's end resets it
                o, r, te, tr = env.reset()[0], 0.0, False, False
            else:
                o, r, te, tr, _ = env.step(int(actions[j]))
                ret[j] += r
                length[j] += 1
            done[j] = te or tr
            if done[j]:
                last_ret[j], last_len[j], count[j] = ret[j], length[j], count[j] + 1
                ret[j], length[j] = 0.0, 0
            np.testing.assert_array_equal(views["obs/0"][1 + j], o)
            assert (views["rewards"][1 + j], views["terminations"][1 + j], views["truncations"][1 + j]) == (r, te, tr)
        np.testing.assert_array_equal(views["autoreset"][1:4], done)
    assert stats(stepper, views) == (last_ret, last_len, count)
    assert min(count) >= 3  # the loop did go through autoresets
    # Envs 0 and 4 belong to other blocks: untouched.
    assert (views["obs/0"][[0, 4]] == -7.0).all() and (views["rewards"][[0, 4]] == -7.0).all()
    assert views["episode_count"][[0, 4]].tolist() == [0, 0]


def test_next_step_autoreset_resets_on_the_following_step_with_reward_zero():
    stepper, views = make_stepper([CountEnv(3, ident=0), CountEnv(2, ident=1)], start=2)
    stepper.run(Command.RESET, None)

    reports = step(stepper, views, [1, 1])  # rewards 2
    assert reports == [(2, None, {"t": 1}), (3, None, {"t": 1})]  # global env indices
    reports = step(stepper, views, [1, 1])  # env 3 ends
    obs, rew, term, trunc = outcome(stepper, views)
    assert obs[:, 0].tolist() == [2, 2] and rew.tolist() == [2, 2]
    assert term.tolist() == [False, True] and trunc.tolist() == [False, False]
    assert views["autoreset"][2:4].tolist() == [False, True]
    assert stats(stepper, views) == ([0.0, 4.0], [0, 2], [0, 1])

    reports = step(stepper, views, [1, 1])  # env 3 resets, env 2 ends
    obs, rew, term, _ = outcome(stepper, views)
    assert obs[:, 0].tolist() == [3, 0] and rew.tolist() == [2, 0] and term.tolist() == [True, False]
    assert views["autoreset"][2:4].tolist() == [True, False]
    assert reports == [(2, None, {"t": 3}), (3, None, {"resets": 2})]
    assert stepper.envs[1].resets == 2

    for _ in range(9):  # up to step 12: env 2 ends at steps 3, 7, 11; env 3 at 2, 5, 8, 11
        step(stepper, views, [1, 1])
    # The reset steps count neither in an episode's length nor in its return.
    assert stats(stepper, views) == ([6.0, 4.0], [3, 2], [3, 4])


@pytest.mark.parametrize("truncate", [False, True])
def test_same_step_autoreset_writes_final_obs_and_reports_final_info(truncate):
    stepper, views = make_stepper([CountEnv(2, ident=0, truncate=truncate), CountEnv(3, ident=1)], mode=SAME)
    stepper.run(Command.RESET, None)
    views["final_obs/0"][...] = -1.0

    assert step(stepper, views, [0, 2]) == [(0, None, {"t": 1}), (1, None, {"t": 1})]
    reports = step(stepper, views, [0, 2])  # env 0 ends and is reset in the same step
    obs, rew, term, trunc = outcome(stepper, views)
    assert obs.tolist() == [[0, 0], [2, 1]]  # env 0: the new episode's first observation
    assert views["final_obs/0"][0].tolist() == [2, 0]  # and the ended one's last
    assert views["final_obs/0"][1].tolist() == [-1, -1]  # nothing written for an env that goes on
    assert rew.tolist() == [1.0, 3.0]  # the final step's reward, not 0
    assert (term[0], trunc[0]) == (not truncate, truncate) and not term[1] and not trunc[1]
    assert reports == [(0, {"t": 2}, {"resets": 2}), (1, None, {"t": 2})]  # final info, then the reset's
    assert not views["autoreset"][:2].any()  # no reset pending: it happened already

    reports = step(stepper, views, [0, 2])  # env 0 steps on (not a reset step); env 1 ends
    obs, rew, term, trunc = outcome(stepper, views)
    assert obs[:, 0].tolist() == [1, 0] and rew.tolist() == [1.0, 3.0]
    assert views["final_obs/0"][1].tolist() == [3, 1]
    assert reports == [(0, None, {"t": 1}), (1, {"t": 3}, {"resets": 2})]
    for _ in range(3):  # steps 4..6: env 0 ends at 2, 4, 6; env 1 at 3, 6
        step(stepper, views, [0, 2])
    assert stats(stepper, views) == ([2.0, 9.0], [2, 3], [3, 2])


def test_same_step_reports_final_info_even_when_the_env_gives_none():
    stepper, views = make_stepper([NoneInfoEnv(2), NoneInfoEnv(5)], mode=SAME)
    stepper.run(Command.RESET, None)
    assert step(stepper, views, [0, 0]) is None  # None infos: nothing to report
    assert step(stepper, views, [0, 0]) == [(0, {}, {})]  # but an episode's end always is
    assert views["final_obs/0"][0].tolist() == [2.0] and views["obs/0"][0].tolist() == [0.0]


def test_reset_with_seeds_matches_gymnasium_and_clears_the_flags():
    seeds = [3, 4, 5]
    stepper, views = make_stepper([gym.make("CartPole-v1") for _ in seeds], start=1)
    stepper.run(Command.RESET, ([0, 1, 2], None, None))
    for _ in range(30):  # some envs end (the flags and the pending resets are set)
        step(stepper, views, [1, 1, 1])
    assert views["autoreset"][1:].any() or views["terminations"][1:].any()

    assert stepper.run(Command.RESET, (seeds, None, None)) is None
    expected = [gym.make("CartPole-v1").reset(seed=s)[0] for s in seeds]
    np.testing.assert_array_equal(views["obs/0"][1:], expected)
    assert not views["terminations"][1:].any() and not views["truncations"][1:].any()
    assert not views["autoreset"][1:].any()
    # The same seeds, the same episode, step after step (no reset step left pending).
    ref = gym.make("CartPole-v1")
    ref.reset(seed=seeds[2])
    for _ in range(5):
        step(stepper, views, [0, 0, 0])
        o, r, *_ = ref.step(0)
        np.testing.assert_array_equal(views["obs/0"][3], o)
        assert views["rewards"][3] == r


def test_reset_passes_options_and_reports_infos():
    stepper, views = make_stepper([CountEnv(9, ident=i) for i in range(3)], start=4)
    reports = stepper.run(Command.RESET, (None, {"t": 5}, None))
    assert views["obs/0"][4:, 0].tolist() == [5, 5, 5]
    assert reports == [(4, None, {"resets": 1}), (5, None, {"resets": 1}), (6, None, {"resets": 1})]


def test_reset_with_a_mask_resets_only_the_masked_envs():
    stepper, views = make_stepper([CountEnv(3, ident=i) for i in range(3)], start=1)
    stepper.run(Command.RESET, None)
    for _ in range(3):  # every episode ends
        step(stepper, views, [0, 0, 0])
    assert views["autoreset"][1:].tolist() == [True, True, True]

    reports = stepper.run(Command.RESET, ([7, 8, 9], None, np.array([True, False, True])))
    assert reports == [(1, None, {"resets": 2}), (3, None, {"resets": 2})]
    assert [env.resets for env in stepper.envs] == [2, 1, 2]
    assert views["obs/0"][1:, 0].tolist() == [0, 3, 0]  # env 2 keeps its last observation
    assert views["terminations"][1:].tolist() == [False, True, False]
    assert views["autoreset"][1:].tolist() == [False, True, False]
    assert stepper.envs[0].np_random_seed == 7 and stepper.envs[2].np_random_seed == 9

    step(stepper, views, [0, 0, 0])  # env 2 takes its pending reset; the others step
    obs, rew, _, _ = outcome(stepper, views)
    assert obs[:, 0].tolist() == [1, 0, 1] and rew.tolist() == [1.0, 0.0, 1.0]


def test_a_masked_reset_restarts_the_episode_statistics_of_those_envs_only():
    stepper, views = make_stepper([CountEnv(3, ident=i) for i in range(2)])
    stepper.run(Command.RESET, None)
    step(stepper, views, [1, 1])  # reward 2 each
    stepper.run(Command.RESET, (None, None, [True, False]))
    step(stepper, views, [1, 1])
    step(stepper, views, [1, 1])  # env 1 ends: 3 steps
    assert stats(stepper, views) == ([0.0, 6.0], [0, 3], [0, 1])
    step(stepper, views, [1, 1])  # env 0 ends: 3 steps since its reset, not 4
    assert stats(stepper, views)[:2] == ([6.0, 6.0], [3, 3])


def test_call_returns_one_result_per_env():
    stepper, _ = make_stepper([CountEnv(ident=i) for i in range(3)], start=2)
    assert stepper.run(Command.CALL, ("scaled", (2,), {"factor": 3})) == [(0, 6), (1, 6), (2, 6)]
    assert stepper.run(Command.CALL, ("length", (), {})) == [3, 3, 3]  # an attribute is read
    assert stepper.current is None
    # Through wrappers (gym.make adds several) to the base env's attribute.
    stepper, _ = make_stepper([gym.make("CartPole-v1") for _ in range(2)])
    assert stepper.run(Command.CALL, ("gravity", (), {})) == [9.8, 9.8]


def test_set_attr_sets_one_value_per_env():
    envs = [CountEnv(ident=i) for i in range(3)]
    stepper, views = make_stepper(envs)
    assert stepper.run(Command.SET_ATTR, ("length", [1, 2, 3])) is None
    assert [env.length for env in envs] == [1, 2, 3]
    assert stepper.run(Command.CALL, ("length", (), {})) == [1, 2, 3]
    stepper.run(Command.RESET, None)
    step(stepper, views, [0, 0, 0])
    assert views["terminations"][:3].tolist() == [True, False, False]

    wrapped = [gym.make("CartPole-v1") for _ in range(2)]
    stepper, _ = make_stepper(wrapped)
    stepper.run(Command.SET_ATTR, ("gravity", [1.5, 2.5]))
    assert [env.unwrapped.gravity for env in wrapped] == [1.5, 2.5]


def play(stepper: Stepper, views: dict, actions: list) -> list:
    """Step through ``actions``; each step's outcome and the episodes that ended then."""
    out = []
    for a in actions:
        count = views["episode_count"][stepper.start : stepper.stop].copy()
        step(stepper, views, a)
        ended = np.flatnonzero(views["episode_count"][stepper.start : stepper.stop] != count)
        episodes = [(int(j), float(views["last_return"][j]), int(views["last_length"][j])) for j in ended]
        out.append((*outcome(stepper, views), episodes))
    return out


def assert_same_play(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x[:4], y[:4]):
            np.testing.assert_array_equal(u, v)
        assert x[4] == y[4]


def test_get_state_set_state_round_trip_gives_identical_next_steps():
    stepper, views = make_stepper([gym.make("CartPole-v1") for _ in range(3)])
    stepper.run(Command.RESET, ([0, 1, 2], None, None))
    rng = np.random.default_rng(1)
    play(stepper, views, rng.integers(0, 2, size=(7, 3)).tolist())

    records = stepper.run(Command.GET_STATE, [0, 1, 2])
    assert len(records) == 3
    for blob, pending, ret, length in records:
        assert isinstance(blob, bytes) and isinstance(pending, bool)
        assert isinstance(ret, float) and isinstance(length, int)
    actions = rng.integers(0, 2, size=(80, 3)).tolist()
    first = play(stepper, views, actions)
    assert any(episodes for *_, episodes in first)  # episodes end (and restart) on the way

    assert stepper.run(Command.SET_STATE, list(enumerate(records))) is None
    assert_same_play(play(stepper, views, actions), first)


def test_set_state_restores_any_envs_state_into_another_env():
    stepper, views = make_stepper([gym.make("CartPole-v1") for _ in range(2)])
    stepper.run(Command.RESET, ([0, 1], None, None))
    play(stepper, views, [[0, 1]] * 3)
    (record,) = stepper.run(Command.GET_STATE, [0])
    stepper.run(Command.SET_STATE, [(1, record)])  # env 0's state, into env 1
    for _ in range(6):
        step(stepper, views, [1, 1])
        np.testing.assert_array_equal(views["obs/0"][0], views["obs/0"][1])


def test_set_state_restores_a_pending_reset_and_the_running_episode():
    stepper, views = make_stepper([CountEnv(3, ident=0), CountEnv(3, ident=1)])
    stepper.run(Command.RESET, None)
    step(stepper, views, [1, 0])
    step(stepper, views, [1, 0])
    step(stepper, views, [1, 0])  # both end: their reset is pending
    records = stepper.run(Command.GET_STATE, [0, 1])
    assert [r[1:] for r in records] == [(True, 0.0, 0), (True, 0.0, 0)]
    step(stepper, views, [1, 0])  # the resets
    step(stepper, views, [1, 0])  # one step into the new episode
    mid = stepper.run(Command.GET_STATE, [0])[0]
    assert mid[1:] == (False, 2.0, 1)

    stepper.run(Command.SET_STATE, list(enumerate(records)))
    assert views["autoreset"][:2].tolist() == [True, True]
    step(stepper, views, [1, 0])
    obs, rew, _, _ = outcome(stepper, views)
    assert obs[:, 0].tolist() == [0, 0] and rew.tolist() == [0.0, 0.0]  # a reset step again

    stepper.run(Command.SET_STATE, [(1, mid)])  # env 1 now one step into an episode, with return 2
    count = views["episode_count"][:2].copy()
    step(stepper, views, [1, 0])
    step(stepper, views, [1, 0])  # env 1: steps 2 and 3, so its episode ends with 2 + 1 + 1
    assert views["episode_count"][1] == count[1] + 1
    assert (views["last_return"][1], views["last_length"][1]) == (4.0, 3)


@pytest.mark.parametrize(
    "fault, match",
    [("shape", r"env 3 returned observation of shape \(5,\), expected \(4,\)"), ("dtype", r"env 3 .* dtype complex64")],
)
def test_a_wrong_observation_raises_env_obs_error_naming_the_env(fault, match):
    envs = [FaultyEnv("none"), FaultyEnv(fault, at=2), FaultyEnv("none")]
    stepper, views = make_stepper(envs, start=2, num_envs=6)
    stepper.run(Command.RESET, None)
    step(stepper, views, [0, 0, 0])
    with pytest.raises(EnvObsError, match=match):
        step(stepper, views, [0, 0, 0])
    assert stepper.current == 3


def test_a_wrong_observation_of_a_nested_space_names_the_env():
    class Nested(CountEnv):
        def __init__(self, wrong=False):
            super().__init__()
            self.wrong = wrong
            self.observation_space = spaces.Dict(
                {"t": spaces.Box(0.0, np.inf, (2,), np.float32), "n": spaces.Discrete(3)}
            )

        def _obs(self):
            return {"t": super()._obs()[: 1 if self.wrong and self.t else 2], "n": 1}

    stepper, views = make_stepper([Nested(), Nested(wrong=True)])
    stepper.run(Command.RESET, None)
    # A Dict's leaves come in key order: "n", then "t".
    assert views["obs/0"][:2].tolist() == [1, 1] and views["obs/1"][:2].tolist() == [[0, 0], [0, 0]]
    with pytest.raises(EnvObsError, match=r"env 1 returned observation\['t'\] of shape \(1,\)"):
        step(stepper, views, [0, 0])
    assert stepper.current == 1


@pytest.mark.parametrize("command", ["step", "reset", "call"])
def test_current_names_the_env_that_raised(command):
    envs = [
        FaultyEnv("reset" if command == "reset" and i == 1 else "raise" if i == 1 else "none", at=1) for i in range(3)
    ]
    stepper, views = make_stepper(envs, start=5)
    assert stepper.current is None
    if command == "reset":
        with pytest.raises(ValueError, match="reset exploded"):
            stepper.run(Command.RESET, None)
    elif command == "step":
        stepper.run(Command.RESET, None)
        assert stepper.current is None
        with pytest.raises(ZeroDivisionError):
            step(stepper, views, [0, 0, 0])
    else:
        envs[1].check = lambda: 1 / 0
        for env in (envs[0], envs[2]):
            env.check = lambda: "ok"
        with pytest.raises(ZeroDivisionError):
            stepper.run(Command.CALL, ("check", (), {}))
    assert stepper.current == 6


def test_current_names_the_env_whose_reward_is_not_a_scalar():
    envs = [FaultyEnv("array_reward", at=1), FaultyEnv("none"), FaultyEnv("none")]
    stepper, views = make_stepper(envs, start=2)
    stepper.run(Command.RESET, None)
    with pytest.raises(EnvObsError, match=r"env 2 returned reward"):
        step(stepper, views, [0, 0, 0])
    assert stepper.current == 2


@pytest.mark.parametrize("cmd", [0, 11, 99, -1])
def test_an_unknown_command_raises_value_error(cmd):
    stepper, views = make_stepper([CountEnv(), CountEnv()])
    stepper.run(Command.RESET, None)
    before = outcome(stepper, views)
    with pytest.raises(ValueError, match=f"unknown command {cmd}"):
        stepper.run(cmd, None)
    for a, b in zip(before, outcome(stepper, views)):
        np.testing.assert_array_equal(a, b)
    assert [env.t for env in stepper.envs] == [0, 0]
