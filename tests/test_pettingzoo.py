"""MultiAgentVecEnv: PettingZoo parallel envs with a row per agent, against copies stepped by hand."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

pytest.importorskip("pettingzoo")
mpe2 = pytest.importorskip("mpe2")

import shmvec  # noqa: E402
from ma_envs_for_tests import LeavingAgents, MixedSpaces  # noqa: E402
from mpe2 import simple_spread_v3  # noqa: E402
from pettingzoo.test import parallel_api_test  # noqa: E402

from shmvec._adapters import env_info  # noqa: E402
from shmvec.pettingzoo import MultiAgentVecEnv  # noqa: E402

_NOT_INFOS = frozenset({"active", "_active", "final_obs", "_final_obs", "final_info", "_final_info"})


def spread():
    return simple_spread_v3.parallel_env(N=3, max_cycles=7)


class Reference:
    """The copies stepped one after the other by hand, following MultiAgentVecEnv's documented
    row semantics (written from the docs, not from shmvec's code)."""

    def __init__(self, fns, mode):
        self.envs = [fn() for fn in fns]
        self.agents = list(self.envs[0].possible_agents)
        self.a = len(self.agents)
        self.mode = mode
        self.held = [np.zeros((2, self.a), dtype=bool) for _ in self.envs]  # terminated, truncated
        self.pending = [False] * len(self.envs)

    def _rows(self, i, obs, rewards):
        env, held = self.envs[i], self.held[i]
        space = env.observation_space(self.agents[0])
        rows = []
        for j, agent in enumerate(self.agents):
            o = obs[agent] if agent in obs else np.zeros(space.shape, dtype=space.dtype)
            r = rewards.get(agent, 0.0) if rewards is not None else 0.0
            rows.append([o, float(r), bool(held[0, j]), bool(held[1, j]), agent in env.agents])
        return rows

    def _infos(self, infos):
        return [dict(infos.get(agent) or {}) for agent in self.agents]

    def reset(self, seed):
        out, infos = [], []
        for i, env in enumerate(self.envs):
            obs, inf = env.reset(seed=seed + i)
            self.held[i][:] = False
            self.pending[i] = False
            out += self._rows(i, obs, None)
            infos += self._infos(inf)
        return out, infos

    def step(self, actions):
        out, infos, finals = [], [], []
        for i, env in enumerate(self.envs):
            if self.pending[i]:  # NEXT_STEP: this step is the reset
                obs, inf = env.reset()
                self.held[i][:] = False
                self.pending[i] = False
                out += self._rows(i, obs, None)
                infos += self._infos(inf)
                finals += [None] * self.a
                continue
            live = list(env.agents)
            acts = {agent: actions[i * self.a + j] for j, agent in enumerate(self.agents) if agent in live}
            obs, rew, term, trunc, inf = env.step(acts)
            for j, agent in enumerate(self.agents):
                if agent in live:
                    self.held[i][0, j], self.held[i][1, j] = bool(term[agent]), bool(trunc[agent])
            rows = self._rows(i, obs, rew)
            ended = not env.agents or self.held[i].any(axis=0).all()
            if ended and self.mode is AutoresetMode.SAME_STEP:
                finals += [(row[0], info) for row, info in zip(rows, self._infos(inf))]
                obs2, inf2 = env.reset()
                self.held[i][:] = False
                new = self._rows(i, obs2, None)
                for row, fresh in zip(rows, new):
                    row[0], row[4] = fresh[0], fresh[4]  # the new episode's obs; the step's reward, flags
                out += rows
                infos += self._infos(inf2)
                continue
            if ended and self.mode is AutoresetMode.NEXT_STEP:
                self.pending[i] = True
            out += rows
            infos += self._infos(inf)
            finals += [None] * self.a
        return out, infos, finals

    def close(self):
        for env in self.envs:
            env.close()


def check_rows(got, want_rows, want_infos, what):
    obs, rew, term, trunc, infos = got
    assert np.array_equal(obs, np.stack([r[0] for r in want_rows])), f"{what}: obs"
    assert obs.dtype == want_rows[0][0].dtype
    if rew is not None:
        assert np.array_equal(rew, [r[1] for r in want_rows]), f"{what}: rewards"
        assert np.array_equal(term, [r[2] for r in want_rows]), f"{what}: terminations"
        assert np.array_equal(trunc, [r[3] for r in want_rows]), f"{what}: truncations"
    assert np.array_equal(infos["active"], [r[4] for r in want_rows]), f"{what}: active"
    for k, info in enumerate(want_infos):
        assert env_info(infos, k, _NOT_INFOS) == info, f"{what}: infos of row {k}"


def run_against_reference(fns, mode, steps=40, seed=11, **options):
    ref = Reference(fns, mode)
    envs = MultiAgentVecEnv(fns, autoreset_mode=mode, **options)
    rng = np.random.default_rng(seed)
    ended_copies = 0
    try:
        assert envs.num_envs == len(fns) * ref.a and envs.single_action_space == ref.envs[0].action_space("agent_0")
        obs, infos = envs.reset(seed=seed)
        rows, row_infos = ref.reset(seed)
        check_rows((obs, None, None, None, infos), rows, row_infos, "reset")
        for t in range(steps):
            actions = rng.integers(0, envs.single_action_space.n, size=envs.num_envs)
            got = envs.step(actions)
            rows, row_infos, finals = ref.step(actions)
            check_rows(got, rows, row_infos, f"step {t}")
            infos = got[4]
            for k, final in enumerate(finals):
                has = "_final_obs" in infos and infos["_final_obs"][k]
                assert has == (final is not None), f"step {t}: final_obs mask of row {k}"
                if final is not None:
                    assert np.array_equal(infos["final_obs"][k], final[0])
                    assert env_info(infos["final_info"], k) == final[1]
            ended_copies += sum(f is not None for f in finals[:: ref.a])
            assert np.array_equal(envs.active, infos["active"])
    finally:
        envs.close()
        ref.close()
    return ended_copies


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("make", [LeavingAgents, spread], ids=["leaving-agents", "simple-spread"])
def test_rows_equal_copies_stepped_by_hand(make, mode):
    ended = run_against_reference([make] * 4, mode, num_workers=2)
    if mode is AutoresetMode.SAME_STEP:
        assert ended >= 4  # episodes ended (and were reset) in the run


def test_spawned_workers_and_the_calling_process_block_agree_too():
    run_against_reference([LeavingAgents] * 3, AutoresetMode.NEXT_STEP, steps=25, num_workers=1, context="spawn")
    run_against_reference([LeavingAgents] * 3, AutoresetMode.SAME_STEP, steps=25, num_workers=1, step_in_main=True)


def test_test_env_follows_the_pettingzoo_api():
    parallel_api_test(LeavingAgents(), num_cycles=30)


def test_leaving_agents_keep_defined_rows():
    """On the step it leaves, an agent's row holds its last observation, reward and end flag;
    from then on a zero observation, reward 0 and the same flag; inactive throughout."""
    with MultiAgentVecEnv([functools.partial(LeavingAgents, max_cycles=30)], num_workers=1) as envs:
        _, infos = envs.reset(seed=3)
        was_active = infos["active"]
        seen_gone = False
        for _ in range(30):
            obs, rew, term, trunc, infos = envs.step(np.ones(3, dtype=np.int64))
            left_now = was_active & ~infos["active"]
            assert term[left_now].all()
            gone = ~was_active
            if gone.any() and infos["active"].any():  # some agents left before, others still there
                seen_gone = True
                assert (obs[gone] == 0).all() and (rew[gone] == 0).all() and term[gone].all()
            if not infos["active"].any():
                break
            was_active = infos["active"]
        assert seen_gone


def test_disabled_mode_resets_copies_by_mask():
    fns = [functools.partial(LeavingAgents, max_cycles=4)] * 2
    with MultiAgentVecEnv(fns, num_workers=2, autoreset_mode="disabled") as envs:
        envs.reset(seed=0)
        for _ in range(20):
            obs, rew, term, trunc, infos = envs.step(np.zeros(6, dtype=np.int64))
            if not infos["active"][:3].any():
                break
        with pytest.raises(ValueError, match="DISABLED"):
            envs.step(np.zeros(6, dtype=np.int64))
        with pytest.raises(ValueError, match="rows of copy 0 are mixed"):
            envs.reset(options={"reset_mask": np.array([True, False, False, False, False, False])})
        mask = np.array([True] * 3 + [not infos["active"][3:].any()] * 3)
        obs, infos = envs.reset(options={"reset_mask": mask})
        assert infos["active"][:3].all()
        envs.step(np.zeros(6, dtype=np.int64))


def test_agents_with_different_spaces_are_named():
    with pytest.raises(ValueError, match=r"agent 'agent_1' has observation_space Box.*agent 'agent_0' has"):
        MultiAgentVecEnv([MixedSpaces] * 2, num_workers=1)


@pytest.mark.parametrize("fault, error", [("raise", shmvec.WorkerError), ("exit", shmvec.WorkerDied),
                                          ("hang", shmvec.StepTimeout)])
def test_faults_raise_as_for_single_agent_envs(fault, error):
    fns = [LeavingAgents, functools.partial(LeavingAgents, fault=fault, at=2)]
    envs = MultiAgentVecEnv(fns, num_workers=2, timeout=1.0)
    envs.reset(seed=0)
    with pytest.raises(error) as info:
        for _ in range(4):
            envs.step(np.zeros(6, dtype=np.int64))
    if fault == "raise":
        assert info.value.env_index == 1 and "multi-agent step exploded" in str(info.value)
    assert envs.closed


def test_restart_marks_the_copys_rows():
    fns = [LeavingAgents, functools.partial(LeavingAgents, fault="exit", at=2)]
    with MultiAgentVecEnv(fns, num_workers=2, on_error="restart") as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(6, dtype=np.int64))
        obs, rew, term, trunc, infos = envs.step(np.zeros(6, dtype=np.int64))
        assert infos["_restarted"].tolist() == [False] * 3 + [True] * 3
        assert trunc[3:].all() and not term[3:].any() and (rew[3:] == 0).all()
        assert infos["active"][3:].all()  # the new episode's agents
        envs.step(np.zeros(6, dtype=np.int64))  # and it goes on


def test_copy_false_rows_are_read_only_views_and_calls_reach_the_pettingzoo_env():
    with MultiAgentVecEnv([LeavingAgents] * 2, num_workers=1, copy=False) as envs:
        obs, _ = envs.reset(seed=0)
        assert not obs.flags.writeable
        obs, rew, *_ = envs.step(np.zeros(6, dtype=np.int64))
        assert not obs.flags.writeable and not rew.flags.writeable
        assert envs.get_attr("max_cycles") == (9, 9)
        assert envs.call("observation_space", "agent_0")[0].shape == (3,)
        assert [f.shape for f in envs.render()] == [(2, 2, 3)] * 2


def test_bad_actions_and_options_are_refused_clearly():
    with MultiAgentVecEnv([LeavingAgents] * 2, num_workers=1) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"one row per agent row \(6 = 2 copies x 3 agents\)"):
            envs.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(TypeError, match="batch_size"):
        MultiAgentVecEnv([LeavingAgents] * 2, batch_size=1)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_rollout_equals_the_step_loop(mode):
    """rollout() per agent row: the same obs, actions, rewards, flags, active rows and extras as
    a step loop with the same policy (which sees every row, and may use any of them)."""
    fns = [LeavingAgents, functools.partial(LeavingAgents, max_cycles=5), LeavingAgents]

    def policy(obs):
        actions = (np.abs(obs[:, 0]).astype(np.int64) + np.arange(len(obs))) % 3
        return actions, {"value": obs.sum(axis=1).astype(np.float32)}

    steps = 23
    with MultiAgentVecEnv(fns, num_workers=2, autoreset_mode=mode) as envs:
        obs, infos = envs.reset(seed=5)
        want = {key: [] for key in ("obs", "actions", "rewards", "terminations", "truncations", "active", "value")}
        step_infos = []
        for _ in range(steps):
            actions, extras = policy(obs)
            want["obs"].append(obs)
            want["active"].append(infos["active"])
            want["actions"].append(actions)
            want["value"].append(extras["value"])
            obs, rew, term, trunc, infos = envs.step(actions)
            step_infos.append(infos)
            want["rewards"].append(rew)
            want["terminations"].append(term)
            want["truncations"].append(trunc)
        want_next = obs
    with MultiAgentVecEnv(fns, num_workers=2, autoreset_mode=mode) as envs:
        envs.reset(seed=5)
        batch = envs.rollout(policy, steps)
        for key, rows in want.items():
            assert np.array_equal(batch[key], np.stack(rows)), key
        assert np.array_equal(batch["next_obs"], want_next)
        assert batch["terminations"].any() or batch["truncations"].any()
        assert ("valid" in batch) == (mode is AutoresetMode.NEXT_STEP)
        if mode is AutoresetMode.NEXT_STEP:
            assert batch["valid"].shape == (steps, 9) and not batch["valid"].all()
        else:
            assert batch["final_obs"].shape == (steps, 9, 3)
        for t, infos in enumerate(step_infos):
            for k in range(9):
                assert env_info(batch["infos"][t], k, _NOT_INFOS) == env_info(infos, k, _NOT_INFOS), (t, k)
                if "_final_obs" in infos and infos["_final_obs"][k]:
                    assert np.array_equal(batch["final_obs"][t, k], infos["final_obs"][k])


# -- through SB3 ------------------------------------------------------------------------------
def test_sb3_vec_env_rows_requests_and_terminal_observations():
    pytest.importorskip("stable_baselines3")
    from shmvec.sb3 import PettingZooVecEnv

    venv = PettingZooVecEnv([functools.partial(LeavingAgents, max_cycles=4)] * 2, num_workers=1)
    try:
        venv.seed(3)
        obs = venv.reset()
        assert obs.shape == (6, 3) and venv.num_envs == 6
        assert venv.get_attr("max_cycles", indices=[0, 4]) == [4, 4]
        venv.set_attr("max_cycles", 7, indices=[4])  # row 4: agent 1 of copy 1
        assert venv.get_attr("max_cycles") == [4, 4, 4, 7, 7, 7]
        assert venv.env_method("observation_space", "agent_0", indices=[5])[0].shape == (3,)
        assert venv.env_is_wrapped(gym_wrapper()) == [False] * 6
        ended = 0
        for _ in range(12):
            obs, rewards, dones, infos = venv.step(np.zeros(6, dtype=np.int64))
            assert len(infos) == 6 and all("TimeLimit.truncated" in info for info in infos)
            for k in np.flatnonzero(dones):
                if "terminal_observation" in infos[k]:
                    ended += 1
                    assert infos[k]["terminal_observation"].shape == (3,)
        assert ended > 0
    finally:
        venv.close()


def gym_wrapper():
    import gymnasium as gym

    return gym.wrappers.RecordEpisodeStatistics


def test_sb3_ppo_trains_on_agent_rows():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO

    from shmvec.sb3 import PettingZooVecEnv

    venv = PettingZooVecEnv([spread] * 2, num_workers=1)
    try:
        model = PPO("MlpPolicy", venv, n_steps=32, batch_size=48, n_epochs=1, seed=0, device="cpu")
        model.learn(total_timesteps=400)
        assert model.num_timesteps >= 400
    finally:
        venv.close()


def test_matches_supersuit_where_the_semantics_agree():
    """SuperSuit's serial concat_vec_envs_v1 resets a copy within the step that ends it, as
    SAME_STEP does, and seeds copy i with seed + i: on an env whose agents end together, the rows
    are the same, and its terminal_observation is our final_obs."""
    ss = pytest.importorskip("supersuit")

    def make():
        return simple_spread_v3.parallel_env(N=3, max_cycles=4)

    theirs = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(make()), 3, num_cpus=0, base_class="gymnasium")
    ours = MultiAgentVecEnv([make] * 3, num_workers=2, autoreset_mode="same_step")
    rng = np.random.default_rng(1)
    try:
        got, want = ours.reset(seed=7), theirs.reset(seed=7)
        assert np.array_equal(got[0], want[0])
        ended = 0
        for _ in range(14):
            actions = rng.integers(0, 5, size=9)
            obs, rew, term, trunc, infos = ours.step(actions)
            w_obs, w_rew, w_term, w_trunc, w_infos = theirs.step(actions)
            # SuperSuit keeps rewards as float32; ours are float64, as PettingZoo returned them.
            assert np.array_equal(obs, w_obs) and np.array_equal(rew.astype(np.float32), w_rew)
            assert np.array_equal(term, w_term) and np.array_equal(trunc, w_trunc)
            for k, info in enumerate(w_infos):
                if "terminal_observation" in info:
                    ended += 1
                    assert infos["_final_obs"][k] and np.array_equal(infos["final_obs"][k], info["terminal_observation"])
        assert ended == 9 * 3  # every copy ended three times
    finally:
        ours.close()
        theirs.close()
