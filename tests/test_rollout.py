"""ShmVecEnv.rollout: workers write [T, N] rollouts in place, identical to a plain step loop."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from envs_for_tests import FaultyEnv, NestedEnv
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from test_equivalence import assert_same

import shmvec
from shmvec.rollout_storage import split_policy_output


def cartpole():
    return gym.make("CartPole-v1", max_episode_steps=40)  # short episodes: many truncations too


def pendulum():
    return gym.make("Pendulum-v1", max_episode_steps=25)


def cartpole_policy(obs):
    actions = (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)
    return actions, {"value": obs[:, 0].astype(np.float32), "pair": np.stack([obs[:, 1], obs[:, 2]], 1)}


def pendulum_policy(obs):
    return np.clip(obs[:, :1] * 1.5, -2.0, 2.0).astype(np.float32)


def nested_policy(obs):
    discrete = (obs["inner"][0] % 3).astype(np.int64)
    box = np.clip(obs["pos"][:, :2] / 10.0, -1.0, 1.0).astype(np.float64)
    return (discrete, box), {"logp": obs["img"][:, 0, 0].astype(np.float64)}


CASES = {"cartpole": (cartpole, cartpole_policy), "pendulum": (pendulum, pendulum_policy),
         "nested": (NestedEnv, nested_policy)}


def reference_rollouts(make_env, policy, num_envs, mode, seed, lengths, prefix_steps=0):
    """The same loop on SyncVectorEnv: one dict per rollout, with what rollout() should return."""
    ref = SyncVectorEnv([make_env] * num_envs, autoreset_mode=mode)
    obs, _ = ref.reset(seed=seed)
    pending = np.zeros(num_envs, dtype=bool)
    space = ref.single_action_space
    for _ in range(prefix_steps):
        actions, _ = split_policy_output(policy(obs), space)
        obs, _, term, trunc, _ = ref.step(actions)
        pending = term | trunc
    out = []
    for T in lengths:
        rows = {"obs": [], "actions": [], "rewards": [], "terminations": [], "truncations": [], "infos": [],
                "extras": [], "valid": []}
        for _ in range(T):
            actions, extras = split_policy_output(policy(obs), space)
            rows["obs"].append(obs)
            rows["actions"].append(actions)
            rows["extras"].append(extras)
            rows["valid"].append(~pending)
            obs, rew, term, trunc, infos = ref.step(actions)
            rows["rewards"].append(rew)
            rows["terminations"].append(term)
            rows["truncations"].append(trunc)
            rows["infos"].append(infos)
            pending = term | trunc
        rows["next_obs"] = obs
        out.append(rows)
    ref.close()
    return out


def stack(items):
    """Stack a list of (nested) per-step batches along a new leading axis."""
    first = items[0]
    if isinstance(first, dict):
        return {k: stack([x[k] for x in items]) for k in first}
    if isinstance(first, tuple):
        return tuple(stack([x[i] for x in items]) for i in range(len(first)))
    return np.stack(items)


def check_batch(batch, ref, mode, num_envs):
    T = len(ref["obs"])
    assert_same(stack(ref["obs"]), batch["obs"], "obs")
    assert_same(stack(ref["actions"]), batch["actions"], "actions")
    assert_same(np.stack(ref["rewards"]).astype(np.float64), batch["rewards"], "rewards")
    assert_same(np.stack(ref["terminations"]), batch["terminations"], "terminations")
    assert_same(np.stack(ref["truncations"]), batch["truncations"], "truncations")
    assert_same(ref["next_obs"], batch["next_obs"], "next_obs")
    for name in ref["extras"][0]:
        assert_same(np.stack([np.asarray(e[name]) for e in ref["extras"]]), batch[name], name)
    assert len(batch["infos"]) == T
    for t in range(T):
        assert_same(ref["infos"][t], batch["infos"][t], f"infos[{t}]")
    if mode is AutoresetMode.NEXT_STEP:
        assert_same(np.stack(ref["valid"]), batch["valid"], "valid")
        assert "final_obs" not in batch
    else:
        assert "valid" not in batch
        ended = np.argwhere(batch["terminations"] | batch["truncations"])
        for t, i in ended:
            assert_same(ref["infos"][t]["final_obs"][i], _row(batch["final_obs"], t, i), f"final_obs[{t}, {i}]")
    return int(np.sum(batch["terminations"] | batch["truncations"]))


def _row(tree, t, i):
    if isinstance(tree, dict):
        return {k: _row(v, t, i) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_row(v, t, i) for v in tree)
    return tree[t, i]


def _copy(tree):
    if isinstance(tree, dict):
        return {k: _copy(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_copy(v) for v in tree)
    if isinstance(tree, list):
        return list(tree)
    return np.array(tree, copy=True)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP], ids=["next", "same"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("workers,step_in_main", [(1, True), (2, True), (3, True), (2, False)])
def test_rollout_equals_step_loop(case, mode, workers, step_in_main):
    make_env, policy = CASES[case]
    n, seed, lengths = 7, 11, [60, 60, 45]  # episodes span calls; the storage is rebuilt for 45
    refs = reference_rollouts(make_env, policy, n, mode, seed, lengths)
    envs = shmvec.ShmVecEnv([make_env] * n, num_workers=workers - step_in_main, step_in_main=step_in_main,
                            autoreset_mode=mode)
    try:
        envs.reset(seed=seed)
        ends = 0
        for T, ref in zip(lengths, refs):
            ends += check_batch(envs.rollout(policy, T), ref, mode, n)
        assert ends >= 10  # the comparison crossed many episode ends
    finally:
        envs.close()


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_rollout_every_start_method(context):
    refs = reference_rollouts(cartpole, cartpole_policy, 4, AutoresetMode.NEXT_STEP, 3, [50])
    with shmvec.ShmVecEnv([cartpole] * 4, num_workers=2, step_in_main=False, context=context) as envs:
        envs.reset(seed=3)
        check_batch(envs.rollout(cartpole_policy, 50), refs[0], AutoresetMode.NEXT_STEP, 4)


def test_rollout_after_steps_and_steps_after_rollout():
    """step -> rollout -> step -> rollout continues one trajectory."""
    n, seed = 5, 2
    ref = SyncVectorEnv([cartpole] * n)
    ref_obs, _ = ref.reset(seed=seed)
    with shmvec.ShmVecEnv([cartpole] * n, num_workers=2) as envs:
        obs, _ = envs.reset(seed=seed)
        for phase in range(4):
            if phase % 2 == 0:
                for _ in range(17):
                    a = cartpole_policy(obs)[0]
                    obs, *_ = envs.step(a)
                    ref_obs, *_ = ref.step(cartpole_policy(ref_obs)[0])
                    assert_same(ref_obs, obs)
            else:
                batch = envs.rollout(cartpole_policy, 23)
                for t in range(23):
                    assert_same(ref_obs, batch["obs"][t], f"phase {phase} obs[{t}]")
                    ref_obs, *_ = ref.step(cartpole_policy(ref_obs)[0])
                assert_same(ref_obs, batch["next_obs"])
                obs = batch["next_obs"].copy()
    ref.close()


def test_batch_views_are_reused_and_old_storage_stays_valid():
    with shmvec.ShmVecEnv([cartpole] * 4, num_workers=2) as envs:
        envs.reset(seed=0)
        first = envs.rollout(cartpole_policy, 20)
        kept = _copy(first["obs"])
        second = envs.rollout(cartpole_policy, 20)
        assert np.shares_memory(first["obs"], second["obs"])  # the same storage, reused
        third = envs.rollout(cartpole_policy, 30)  # new storage; the old views stay readable
        assert not np.shares_memory(second["obs"], third["obs"])
        assert np.array_equal(second["next_obs"], third["obs"][0])
        assert not np.array_equal(kept, second["obs"])
        second["rewards"][:] = 5.0  # writable, and harmless to the next rollout
        fourth = envs.rollout(cartpole_policy, 30)
        assert np.all(fourth["rewards"][fourth["valid"]] == 1.0)


def test_policy_sees_the_storage_rows_without_a_copy():
    seen = []

    def policy(obs):
        seen.append(obs)
        return np.zeros(len(obs), dtype=np.int64)

    with shmvec.ShmVecEnv([cartpole] * 2, num_workers=1) as envs:
        envs.reset(seed=0)
        batch = envs.rollout(policy, 3)
        for t, obs in enumerate(seen):
            assert obs.flags.writeable and np.shares_memory(obs, batch["obs"][t])


def test_rollout_refuses_bad_use():
    with shmvec.ShmVecEnv([cartpole] * 4, num_workers=2) as envs:
        with pytest.raises(ResetNeeded, match="reset"):
            envs.rollout(cartpole_policy, 8)
        envs.reset(seed=0)
        for bad in (0, -3, 2.5, True, "8"):
            with pytest.raises(ValueError, match="num_steps"):
                envs.rollout(cartpole_policy, bad)
        with pytest.raises(TypeError, match="callable"):
            envs.rollout("policy", 8)
    with shmvec.ShmVecEnv([cartpole] * 4, num_workers=2, batch_size=2) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="asynchronously"):
            envs.rollout(cartpole_policy, 8)
    with shmvec.ShmVecEnv([cartpole] * 4, num_workers=2, autoreset_mode=AutoresetMode.DISABLED) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="DISABLED"):
            envs.rollout(cartpole_policy, 8)
    with shmvec.ShmVecEnv([cartpole] * 4, num_workers=2) as envs:
        envs.close()
        with pytest.raises(shmvec.ClosedError):
            envs.rollout(cartpole_policy, 8)


def test_bad_action_mid_rollout_leaves_envs_usable_and_consistent():
    """A refused action stops the rollout; the next one continues from the last step that ran."""
    n, seed = 4, 5
    calls = {"k": 0}

    def flaky(obs):
        calls["k"] += 1
        if calls["k"] == 13:
            return np.full(n, 7, dtype=np.int64)  # outside Discrete(2)
        return cartpole_policy(obs)[0]

    refs = reference_rollouts(cartpole, lambda o: cartpole_policy(o)[0], n, AutoresetMode.NEXT_STEP, seed, [30],
                              prefix_steps=12)
    with shmvec.ShmVecEnv([cartpole] * n, num_workers=2) as envs:
        envs.reset(seed=seed)
        with pytest.raises(ValueError, match="action"):
            envs.rollout(flaky, 20)
        check_batch(envs.rollout(flaky, 30), refs[0], AutoresetMode.NEXT_STEP, n)


def test_policy_errors_and_bad_extras():
    with shmvec.ShmVecEnv([cartpole] * 4, num_workers=2) as envs:
        envs.reset(seed=0)

        def boom(obs):
            raise RuntimeError("policy exploded")

        with pytest.raises(RuntimeError, match="policy exploded"):
            envs.rollout(boom, 5)
        with pytest.raises(ValueError, match="'value'.*one row per env"):
            envs.rollout(lambda o: (np.zeros(4, np.int64), {"value": np.zeros(3)}), 5)
        with pytest.raises(ValueError, match="clash"):
            envs.rollout(lambda o: (np.zeros(4, np.int64), {"rewards": np.zeros(4)}), 5)
        k = {"t": 0}

        def changing(obs):
            k["t"] += 1
            return np.zeros(4, np.int64), ({"v": np.zeros(4)} if k["t"] < 3 else {"w": np.zeros(4)})

        with pytest.raises(ValueError, match="same ones"):
            envs.rollout(changing, 5)
        with pytest.raises(ValueError, match="shape"):
            envs.rollout(lambda o: np.zeros((4, 1), np.int64), 5)
        batch = envs.rollout(cartpole_policy, 5)  # still usable
        assert batch["rewards"].shape == (5, 4)
        assert set(batch) >= {"value", "pair"}


def test_worker_error_in_rollout_raises_and_closes():
    fns = [lambda: FaultyEnv("raise", at=6)] * 4
    envs = shmvec.ShmVecEnv(fns, num_workers=2)
    envs.reset(seed=0)
    with pytest.raises(shmvec.WorkerError, match="step exploded") as info:
        envs.rollout(lambda o: np.zeros(4, np.int64), 10)
    assert info.value.env_index in range(4)
    assert envs.closed


@pytest.mark.parametrize("fault", ["kill", "raise"])
def test_restart_mid_rollout(fault):
    """on_error='restart': the failed block restarts, its envs come back truncated, the rollout goes on."""
    fns = [lambda: FaultyEnv("none")] * 2 + [lambda: FaultyEnv(fault, at=4)] * 2
    with shmvec.ShmVecEnv(fns, num_workers=2, step_in_main=False, on_error="restart") as envs:
        envs.reset(seed=0)
        batch = envs.rollout(lambda o: np.zeros(4, np.int64), 7)  # the new envs would fail at t = 7
        t = 3  # the fourth step fails in envs 2 and 3
        assert batch["truncations"][t, 2:].all() and not batch["truncations"][t, :2].any()
        assert (batch["rewards"][t, 2:] == 0).all() and (batch["rewards"][t, :2] == 1).all()
        assert batch["infos"][t]["restarted"][2:].all() and not batch["infos"][t]["_restarted"][:2].any()
        assert batch["valid"][t + 1].all()  # after a restart the next step is a normal one
        assert (batch["rewards"][t + 1:] == 1).all()
        assert len(envs.restarts) == 1 and envs.restarts[0][1] == range(2, 4)


def test_check_finite_in_rollout():
    fns = [lambda: FaultyEnv("inf_reward", at=3)] * 2
    with shmvec.ShmVecEnv(fns, num_workers=1, check_finite=True) as envs:
        envs.reset(seed=0)
        with pytest.raises(shmvec.NonFiniteError, match="reward"):
            envs.rollout(lambda o: np.zeros(2, np.int64), 6)


def test_gae_on_a_rollout_matches_the_step_loop_reference():
    """What rollout() returns is what shmvec.gae needs: NEXT_STEP mask and final-obs bootstrap."""
    n, T, seed = 6, 64, 4
    ref = reference_rollouts(cartpole, cartpole_policy, n, AutoresetMode.NEXT_STEP, seed, [T])[0]
    with shmvec.ShmVecEnv([cartpole] * n, num_workers=2) as envs:
        envs.reset(seed=seed)
        batch = envs.rollout(cartpole_policy, T)
        last = cartpole_policy(batch["next_obs"])[1]["value"]
        adv, ret = shmvec.gae(batch["rewards"].astype(np.float32), batch["value"], batch["terminations"],
                              batch["truncations"], last, autoreset="next_step", valid=batch["valid"])
    values = np.stack([e["value"] for e in ref["extras"]])
    ref_adv, ref_ret = shmvec.gae(np.stack(ref["rewards"]).astype(np.float32), values, np.stack(ref["terminations"]),
                                  np.stack(ref["truncations"]), cartpole_policy(ref["next_obs"])[1]["value"],
                                  autoreset="next_step", valid=np.stack(ref["valid"]))
    assert np.array_equal(adv, ref_adv) and np.array_equal(ret, ref_ret)
    assert batch["truncations"].any()  # a truncation was bootstrapped


def test_a_masked_reset_after_a_rollout_keeps_the_other_envs_latest_observations():
    envs = shmvec.ShmVecEnv([lambda: gym.make("CartPole-v1")] * 4, num_workers=2)
    ref = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    try:
        envs.reset(seed=3)
        ref.reset(seed=3)
        actions = np.array([[t % 2] * 4 for t in range(5)], dtype=np.int64)
        row = iter(actions)
        batch = envs.rollout(lambda obs: next(row), num_steps=5)
        for a in actions:
            ref.step(a)
        mask = np.array([True, False, False, True])
        obs, _ = envs.reset(options={"reset_mask": mask})
        expected, _ = ref.reset(options={"reset_mask": mask})
        assert np.array_equal(obs, expected)
        assert np.array_equal(obs[1:3], batch["next_obs"][1:3])
        # and the next rollout starts from them
        assert np.array_equal(envs.rollout(lambda o: np.zeros(4, np.int64), num_steps=1)["obs"][0], expected)
    finally:
        envs.close()
        ref.close()
