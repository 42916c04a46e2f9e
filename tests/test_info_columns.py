"""Scalar infos in shared memory (shmvec.info_columns): Gymnasium's infos exactly, without pickling."""

from __future__ import annotations

import os
import signal

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from test_equivalence import InfoTypesEnv, assert_same, run_both

import shmvec
from shmvec.info_columns import InfoSchema


class ReportingEnv(gym.Env):
    """Reports numbers every step as MuJoCo's and ALE's envs do: float64, int and bool values."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def _info(self):
        return {"x_position": np.float64(self.t * 0.5), "lives": 3 - self.t % 3, "frame": np.int64(self.t),
                "alive": self.t % 2 == 0}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = int(self.np_random.integers(5))
        return np.zeros(2, np.float32), self._info()

    def step(self, action):
        self.t += 1
        return np.full(2, self.t / 100, np.float32), float(action), self.t % 7 == 0, False, self._info()


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("step_in_main", [False, True])
def test_infos_equal_sync_vector_env_with_columns(mode, step_in_main):
    workers = {"num_workers": 2 - step_in_main, "step_in_main": step_in_main}
    if mode is not AutoresetMode.DISABLED:
        run_both(ReportingEnv, 5, 40, mode, **workers)
        run_both(InfoTypesEnv, 5, 40, mode, **workers)  # mixed types across envs, keys that come late
    envs = shmvec.ShmVecEnv([ReportingEnv] * 4, autoreset_mode=mode, **workers)
    try:
        envs.reset(seed=1)
        envs.step(np.zeros(4, np.int64))
        reader = envs._session.infos.columns
        assert reader is not None and set(reader.keys) == {"x_position", "lives", "frame", "alive"}
    finally:
        envs.close()


def test_disabled_mode_with_masked_resets_keeps_the_infos():
    ref = SyncVectorEnv([ReportingEnv] * 3, autoreset_mode=AutoresetMode.DISABLED)
    envs = shmvec.ShmVecEnv([ReportingEnv] * 3, num_workers=2, autoreset_mode=AutoresetMode.DISABLED)
    try:
        assert_same(ref.reset(seed=3), envs.reset(seed=3), "reset")
        for t in range(30):
            a = np.full(3, t % 2)
            r, s = ref.step(a), envs.step(a)
            for name, x, y in zip(("obs", "rew", "term", "trunc", "infos"), r, s):
                assert_same(x, y, f"step {t} {name}")
            ended = r[2] | r[3]
            if ended.any():
                assert_same(ref.reset(options={"reset_mask": ended}), envs.reset(options={"reset_mask": ended}))
    finally:
        ref.close()
        envs.close()


def test_a_step_of_column_keys_pickles_nothing():
    envs = shmvec.ShmVecEnv([ReportingEnv] * 3, num_workers=0, step_in_main=True)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(3, np.int64))  # the first step's infos pick the columns
        stepper = envs._session.pool.main.stepper
        replies = []
        step = stepper.step
        stepper.step = lambda out=None: replies.append(step(out)) or replies[-1]
        for _ in range(10):
            _, _, term, trunc, infos = envs.step(np.ones(3, np.int64))
            assert infos["_x_position"].all() and infos["x_position"].dtype == np.float64
        assert replies == [None] * 10  # nothing left to send: every value went to a column
    finally:
        envs.close()


def test_rollout_infos_equal_the_step_loops():
    def collect(use_rollout):
        envs = shmvec.ShmVecEnv([InfoTypesEnv] * 4, num_workers=2)
        try:
            envs.reset(seed=5)
            actions = [np.array([t % 3, 1, 2, 0]) for t in range(12)]
            if use_rollout:
                it = iter(actions)
                return envs.rollout(lambda obs: next(it), num_steps=12)["infos"]
            return [envs.step(a)[4] for a in actions]
        finally:
            envs.close()

    got, expected = collect(True), collect(False)
    assert len(expected) == 12 and any("f64" in i for i in expected)
    for t in range(12):
        assert_same(expected[t], got[t] if got[t] is not None else {}, f"row {t}")


def test_a_restarted_worker_writes_the_columns_again():
    envs = shmvec.ShmVecEnv([ReportingEnv] * 4, num_workers=2, on_error="restart")
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(4, np.int64))
        assert envs._session.infos.columns is not None
        os.kill(envs.worker_pids[0], signal.SIGKILL)
        _, _, _, _, infos = envs.step(np.zeros(4, np.int64))
        assert infos["restarted"].tolist() == [True, True, False, False]
        assert infos["_x_position"].tolist() == [False, False, True, True]  # the lost step reported nothing
        envs.reset(seed=0)
        _, _, _, _, infos = envs.step(np.zeros(4, np.int64))
        assert infos["_x_position"].all() and infos["_frame"].all()
        assert (infos["x_position"] == infos["frame"] * 0.5).all()
    finally:
        envs.close()


def test_schema_takes_flat_numeric_keys_only():
    infos = {"a": np.zeros(3), "_a": np.ones(3, bool), "b": np.zeros(3, object), "_b": np.ones(3, bool),
             "c": np.zeros((3, 2)), "_c": np.ones(3, bool), "d": {"x": np.zeros(3)}, "_d": np.ones(3, bool),
             "restarted": np.ones(3, bool), "_restarted": np.ones(3, bool), "e": np.zeros(3, np.int32),
             "_e": np.ones(3, bool)}
    schema = InfoSchema.discover(infos)
    assert schema.keys == ("a", "e") and schema.dtypes == (np.dtype(np.float64), np.dtype(np.int32))
    assert InfoSchema.discover({}) is None


def test_the_route_sends_what_the_columns_do_not_hold():
    """InfoRoute, a block's side of the one decision: column keys to the columns, the rest (and
    every info of a SAME_STEP episode end, and of a reset) by reply, plain where it is pickled."""
    from multiprocessing import shared_memory

    from shmvec.info_columns import ColumnWriter, InfoLayout, InfoRoute

    schema = InfoSchema(("x",), (np.dtype(np.float64),))
    layout = InfoLayout.build(schema, 4)
    shm = shared_memory.SharedMemory(create=True, size=layout.size)
    try:
        route = InfoRoute(start=2, pickled=True)
        assert route.step_report(0, {"x": np.float64(1.5)}, None) == (2, None, {"x": 1.5})  # no columns yet
        assert type(route.step_report(0, {"x": np.float64(1.5)}, None)[2]["x"]) is float
        route.columns = ColumnWriter(layout, shm.buf, slice(2, 4))
        route.before_step()
        assert route.step_report(1, {"x": 0.25}, None) is None  # all in the column
        assert layout.views(shm.buf)["info/0"][3] == 0.25
        assert route.step_report(0, {"x": 1.0, "s": "text"}, None) == (2, None, {"s": "text"})
        final = route.step_report(1, {"x": 2.0}, {"x": np.float64(3.0)})  # SAME_STEP end: both whole
        assert final == (3, {"x": 3.0}, {"x": 2.0}) and type(final[1]["x"]) is float
        assert route.reset_report(0, {"x": np.float64(4.0)}) == (2, None, {"x": 4.0})
        kept = InfoRoute(start=0, pickled=False).step_report(0, {"x": np.float64(1.0)}, None)
        assert type(kept[2]["x"]) is np.float64  # the calling process's block hands it over as it is
    finally:
        del route
        shm.close()
        shm.unlink()
