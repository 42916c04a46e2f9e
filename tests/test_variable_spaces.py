"""Variable-size spaces (Text, Sequence, Graph, OneOf, and Dict/Tuple mixing them with fixed
leaves): bit-for-bit what gymnasium's SyncVectorEnv returns, in every mode and collection."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from envs_for_tests import NestedEnv, VariableSizeEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from test_equivalence import assert_same

import shmvec
from shmvec.protocol import CMD, GO, PAYLOAD, STATUS, Command, Status

KINDS = ["Text", "Graph", "Sequence", "StackedSequence", "OneOf", "Mixed"]
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
CONTEXTS = ["fork", "spawn"]


def env_fns(kind, num_envs, **kwargs):
    return [partial(VariableSizeEnv, kind, variable_actions=True, **kwargs)] * num_envs


def env_actions(space: gym.Space, ids, counts) -> tuple:
    """One action per env of ``ids``, depending only on the env and how many steps it took."""
    out = []
    for i in ids:
        space.seed(int(i) * 10_000 + int(counts[i]))
        out.append(space.sample())
    return tuple(out)


def batched(space: gym.Space, items: tuple):
    """Gymnasium's batch of one sample per env."""
    return concatenate(space, items, create_empty_array(space, len(items)))


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("kind", KINDS)
def test_step_matches_sync_vector_env(kind, mode, context):
    num_envs, steps = 5, 30
    fns = env_fns(kind, num_envs)
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    envs = shmvec.ShmVecEnv(fns, num_workers=3, autoreset_mode=mode, context=context)
    try:
        assert envs.observation_space == ref.observation_space and envs.action_space == ref.action_space
        out_ref, out = ref.reset(seed=11), envs.reset(seed=11)
        assert_same(out_ref, out, "reset")
        assert out[0] in envs.observation_space
        space, counts, ends = ref.single_action_space, np.zeros(num_envs, int), 0
        for t in range(steps):
            ended = ref._autoreset_envs.copy()
            if mode is AutoresetMode.DISABLED and ended.any():
                out_ref = ref.reset(options={"reset_mask": ended})
                out = envs.reset(options={"reset_mask": ended})
                assert_same(out_ref, out, f"masked reset before step {t}")
            actions = batched(space, env_actions(space, range(num_envs), counts))
            counts += 1
            r, s = ref.step(actions), envs.step(actions)
            for name, x, y in zip(("obs", "rewards", "terminations", "truncations", "infos"), r, s):
                assert_same(x, y, f"step {t} {name}")
            ends += int(np.sum(r[2] | r[3]))
        assert ends > 5
    finally:
        ref.close()
        envs.close()


def trajectories(kind, num_envs, steps, mode):
    """Each env's (obs, reward, terminated, truncated, infos) per step, from SyncVectorEnv."""
    fns = env_fns(kind, num_envs)
    out = {i: [] for i in range(num_envs)}
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        ref.reset(seed=5)
        ids, counts = np.arange(num_envs), np.zeros(num_envs, int)
        for _ in range(steps):
            actions = env_actions(ref.single_action_space, ids, counts)
            counts += 1
            obs, rew, term, trunc, infos = ref.step(batched(ref.single_action_space, actions))
            for i in ids:
                out[i].append((env_row(ref.single_observation_space, obs, num_envs, i), rew[i], term[i], trunc[i],
                               infos, i))
    finally:
        ref.close()
    return out


def env_row(space: gym.Space, obs, n: int, k: int):
    """Env ``k``'s observation out of a batch of ``n`` (Gymnasium's ``iterate``)."""
    return list(iterate(batch_space(space, n), obs))[k]


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("mode", MODES[:2], ids=lambda m: m.name)
@pytest.mark.parametrize("kind", KINDS)
def test_async_collection_matches_sync_per_env(kind, mode, context):
    """send/recv in batches of two blocks out of three: each env's trajectory is the one it has
    in SyncVectorEnv (its actions depend only on the env and its step count)."""
    num_envs, steps = 6, 12
    ref = trajectories(kind, num_envs, steps, mode)
    got = {i: [] for i in range(num_envs)}
    with shmvec.ShmVecEnv(env_fns(kind, num_envs), num_workers=3, batch_size=4, autoreset_mode=mode,
                          context=context) as envs:
        space = envs.single_action_space
        counts = np.zeros(num_envs, int)
        envs.async_reset(seed=5)
        first = set()
        while min(len(v) for v in got.values()) < steps:
            obs, rew, term, trunc, infos, ids = envs.recv()
            for k, i in enumerate(ids):
                if i in first:
                    got[i].append((env_row(envs.single_observation_space, obs, len(ids), k), rew[k], term[k],
                                   trunc[k], infos, k))
                first.add(i)
            envs.send(batched(space, env_actions(space, ids, counts)), ids)
            counts[ids] += 1
    for i in range(num_envs):
        for t, ((r_obs, r_rew, r_term, r_trunc, r_infos, r_k), (obs, rew, term, trunc, infos, k)) \
                in enumerate(zip(ref[i][:steps], got[i])):
            where = f"env {i} step {t}"
            assert_same(r_obs, obs, f"{where} obs")
            assert (r_rew, r_term, r_trunc) == (rew, term, trunc), where
            for key in ("final_obs", "echo"):
                if f"_{key}" in r_infos and r_infos[f"_{key}"][r_k]:
                    assert infos[f"_{key}"][k], f"{where} {key}"
                    assert_same(r_infos[key][r_k], infos[key][k], f"{where} {key}")


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("kind", ["Text", "Graph", "Sequence"])
def test_nested_observations_with_fixed_actions(kind, nested):
    fns = [partial(VariableSizeEnv, kind, nested)] * 4
    ref = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    with shmvec.ShmVecEnv(fns, num_workers=2, autoreset_mode=AutoresetMode.SAME_STEP) as envs:
        assert_same(ref.reset(seed=2), envs.reset(seed=2))
        ref.action_space.seed(0)
        for t in range(20):
            actions = ref.action_space.sample()
            assert_same(ref.step(actions), envs.step(actions), f"step {t}")
    ref.close()


def test_copy_false_gives_tuples_and_read_only_fixed_leaves():
    fns = [partial(VariableSizeEnv, "Mixed")] * 4
    ref = SyncVectorEnv(fns, copy=False)
    with shmvec.ShmVecEnv(fns, num_workers=2, copy=False) as envs:
        assert_same(ref.reset(seed=0)[0], envs.reset(seed=0)[0])
        obs, *_ = envs.step(np.zeros(4, dtype=np.int64))
        assert isinstance(obs["text"], tuple) and len(obs["text"]) == 4
        assert not obs["pos"].flags.writeable
        assert_same(ref.step(np.zeros(4, dtype=np.int64))[0], obs)
    ref.close()


def test_copy_true_deep_copies_what_it_hands_out():
    """As SyncVectorEnv(copy=True): an observation handed out twice (envs a masked reset left
    alone) is a new copy each time, so changing one leaves the other alone."""
    with shmvec.ShmVecEnv([partial(VariableSizeEnv, "Graph")] * 2, num_workers=1,
                          autoreset_mode=AutoresetMode.DISABLED) as envs:
        first, _ = envs.reset(seed=0)
        again, _ = envs.reset(options={"reset_mask": np.array([True, False])})
        assert again[1] is not first[1]
        assert_same(again[1], first[1])
        again[1].nodes[...] = 0.5
        third, _ = envs.reset(options={"reset_mask": np.array([True, False])})
        assert_same(third[1], first[1])


def test_fixed_spaces_send_nothing_per_step_and_variable_ones_one_reply_per_worker():
    """Envs without variable-size leaves keep the plain path: no pickled message either way."""
    with shmvec.make("CartPole-v1", num_envs=4, num_workers=2, step_in_main=False) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        pool = envs._session.pool
        assert pool.replies.pickled_act == [] and not pool.replies.pickled_obs
        assert [pool.lines[w][STATUS] for w in range(2)] == [Status.OK, Status.OK]
        main_line = pool.lines[-1]  # the step was a broadcast: one command on main's line, no payload
        assert main_line[GO] == pool.seq and main_line[CMD] == Command.STEP and main_line[STATUS] == 0
    with shmvec.ShmVecEnv(env_fns("Text", 4), num_workers=2, step_in_main=False) as envs:
        envs.reset(seed=0)
        envs.step(("a", "b", "c", "d"))
        pool = envs._session.pool
        assert [pool.lines[w][STATUS] for w in range(2)] == [Status.REPLY, Status.REPLY]
        assert [pool.lines[w][PAYLOAD] for w in range(2)] == [1, 1]


def test_rollout_is_refused_naming_the_field_and_fixed_spaces_keep_it():
    with shmvec.ShmVecEnv([partial(VariableSizeEnv, "Text", True)] * 2, num_workers=2) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"observation_space\['x'\] \(Text\)"):
            envs.rollout(lambda obs: np.zeros(2, dtype=np.int64), num_steps=4)
        envs.step(np.zeros(2, dtype=np.int64))  # still usable
    with shmvec.ShmVecEnv([NestedEnv] * 2, num_workers=2) as envs:
        envs.reset(seed=0)
        batch = envs.rollout(lambda obs: (np.zeros(2, np.int64), np.zeros((2, 2))), num_steps=4)
        assert batch["rewards"].shape == (4, 2)


@pytest.mark.parametrize("step_in_main", [False, True])
def test_restart_gives_new_envs_and_the_others_carry_on(step_in_main):
    """on_error="restart": the lane of env 0 (which exits at its third step) comes back with
    new envs' reset observations; the variable leaves of every lane stay in the space."""
    fns = [partial(VariableSizeEnv, "Mixed", fault="exit" if i == 0 else "none") for i in range(4)]
    with shmvec.ShmVecEnv(fns, num_workers=2 - step_in_main, on_error="restart", step_in_main=step_in_main,
                          autoreset_mode=AutoresetMode.SAME_STEP) as envs:
        envs.reset(seed=0)
        for _ in range(20):  # env 0 exits at the third step of an episode
            obs, rew, term, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
            if envs.restarts:
                break
        assert infos["_restarted"].tolist() == [True, True, False, False]
        assert trunc[:2].all() and (rew[:2] == 0).all()
        assert obs in envs.observation_space and len(envs.restarts) == 1
        for _ in range(2):
            obs, *_ = envs.step(np.zeros(4, dtype=np.int64))
            assert obs in envs.observation_space


def test_restart_in_asynchronous_collection():
    fns = [partial(VariableSizeEnv, "Mixed", variable_actions=True, fault="exit" if i == 0 else "none")
           for i in range(4)]
    with shmvec.ShmVecEnv(fns, num_workers=2, batch_size=2, on_error="restart", step_in_main=False) as envs:
        space = envs.single_action_space
        counts = np.zeros(4, int)
        envs.async_reset(seed=0)
        for _ in range(60):
            obs, rew, term, trunc, infos, ids = envs.recv()
            if envs.restarts:
                break
            envs.send(batched(space, env_actions(space, ids, counts)), ids)
            counts[ids] += 1
        assert ids.tolist() == [0, 1] and infos["_restarted"].all() and trunc.all()
        assert obs in batch_space(envs.single_observation_space, 2)
        envs.send(batched(space, env_actions(space, ids, counts)), ids)
        obs, *_, ids = envs.recv()
        assert obs in batch_space(envs.single_observation_space, 2)


def test_wrong_shaped_fixed_leaf_names_env_and_field():
    fns = [partial(VariableSizeEnv, "Text", True, fault="shape" if i == 1 else "none", at=1) for i in range(2)]
    with shmvec.ShmVecEnv(fns, num_workers=2, step_in_main=False) as envs:
        envs.reset(seed=0)
        with pytest.raises(shmvec.WorkerError, match=r"env 1 returned observation\['pos'\] of shape \(5,\)"):
            envs.step(np.zeros(2, dtype=np.int64))


def test_unpicklable_observation_is_an_error_not_a_dead_worker():
    fns = [partial(VariableSizeEnv, "Text", fault="unpicklable", at=1)] * 2
    with shmvec.ShmVecEnv(fns, num_workers=1, step_in_main=False) as envs:
        envs.reset(seed=0)
        with pytest.raises(shmvec.WorkerError, match="cannot pickle 'generator' object") as err:
            envs.step(np.zeros(2, dtype=np.int64))
        assert err.value.report["phase"] == "step"


def test_variable_actions_are_checked_naming_field_and_env():
    with shmvec.ShmVecEnv(env_fns("Mixed", 2), num_workers=2) as envs:
        envs.reset(seed=0)
        good = batched(envs.single_action_space, env_actions(envs.single_action_space, range(2), [0, 0]))
        bad = dict(good, text=(good["text"][0], "far too long"))
        with pytest.raises(ValueError, match=r"actions\['text'\]\[1\] = 'far too long' is outside"):
            envs.step(bad)
        with pytest.raises(ValueError, match=r"actions\['text'\] hold 1 samples, expected 2"):
            envs.step(dict(good, text=("a",)))
        with pytest.raises(TypeError, match=r"actions\['text'\] must hold one sample per env"):
            envs.step(dict(good, text="ab"))
        envs.step(good)  # the env stays usable
        envs.validate_actions = False
        assert not envs.validate_actions
        with pytest.raises(shmvec.WorkerError, match="is not in"):  # the env itself refuses it now
            envs.step(bad)


@pytest.mark.parametrize("adapter", ["sb3", "baselines"])
def test_adapters(adapter):
    fns = [partial(VariableSizeEnv, "Mixed")] * 3
    if adapter == "sb3":
        pytest.importorskip("stable_baselines3")
        from shmvec.sb3 import SubprocVecEnv

        venv = SubprocVecEnv(fns, num_workers=2)
    else:
        from shmvec.baselines import SubprocVecEnv

        venv = SubprocVecEnv(fns, num_workers=2)
    ref = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        if adapter == "sb3":
            venv.seed(4)
            obs = venv.reset()
        else:
            obs = venv.reset(seed=4)
        assert_same(ref.reset(seed=4)[0], obs)
        for t in range(20):
            obs, rews, dones, infos = venv.step([0, 1, 2])
            r_obs, r_rews, r_term, r_trunc, r_infos = ref.step(np.array([0, 1, 2]))
            assert_same(r_obs, obs, f"step {t}")
            for i in np.flatnonzero(dones):
                assert_same(r_infos["final_obs"][i], infos[i]["terminal_observation"])
    finally:
        venv.close()
        ref.close()


def test_torch_wrapper_refuses_naming_the_field():
    pytest.importorskip("torch")
    from shmvec.torch import TorchVecEnv

    envs = shmvec.ShmVecEnv([partial(VariableSizeEnv, "Graph", True)] * 2, num_workers=1)
    with envs, pytest.raises(ValueError, match=r"observation_space\['x'\] \(Graph\)"):
        TorchVecEnv(envs, device="cpu")
