"""Unit tests for shmvec.pool.WorkerPool: command rounds over blocks of envs (submit, wait,
collect), failures per block, restarts and shutdown.

Pools are built by :func:`make_pool` alone and always shut down (the ``pools`` fixture), which
checks that no worker process and no shared-memory name outlives them.
"""

from __future__ import annotations

import functools
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
from conftest import shm_entries
from envs_for_tests import FaultyEnv, SlowEnv
from gymnasium.vector import AutoresetMode

from shmvec.blocks import reset_payloads
from shmvec.errors import ClosedError, StepTimeout, WorkerDied, WorkerError
from shmvec.options import Options
from shmvec.pool import BlockState, PoolState, WorkerPool
from shmvec.protocol import Command

_open_pools: list[WorkerPool] = []


def make_pool(
    env_fns,
    num_workers=2,
    step_in_main=False,
    asynchronous=False,
    *,
    context="fork",
    timeout=None,
    autoreset_mode=AutoresetMode.NEXT_STEP,
    **kw,
) -> WorkerPool:
    """The one place that builds a :class:`WorkerPool`. ``asynchronous``: the options of a vector
    env that collects one block at a time. The ``pools`` fixture shuts every pool down.
    """
    blocks = num_workers + (1 if step_in_main else 0)
    given = dict(
        num_workers=num_workers,
        step_in_main=step_in_main,
        context=context,
        timeout=timeout,
        autoreset_mode=autoreset_mode,
        batch_size=len(env_fns) // blocks if asynchronous else None,
        **kw,
    )
    pool = WorkerPool(env_fns, Options.resolve(len(env_fns), given))
    _open_pools.append(pool)
    return pool


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_shut_down(pool: WorkerPool, pids: list[int]) -> None:
    """``pool`` is closed, its worker processes ``pids`` are gone, no segment name is left."""
    assert pool.state is PoolState.CLOSED
    assert pool.worker_pids == [] and pool.views == {}
    assert [pid for pid in pids if alive(pid)] == []
    assert all(p is None or p.exitcode is not None for p in pool.workers.procs)
    assert shm_entries() == set()


@pytest.fixture(autouse=True)
def pools():
    """Shut down every pool a test made, and check that it left nothing behind."""
    yield
    while _open_pools:
        pool = _open_pools.pop()
        pids = [p.pid for p in pool.workers.procs if p is not None]
        pool.shutdown()
        assert_shut_down(pool, pids)


class IndexEnv(FaultyEnv):
    """A :class:`FaultyEnv` (CartPole-like spaces, ``fault`` at step ``at``) that knows its index:
    ``whoami()`` is ``(index, pid of the process running it)``, ``check()`` raises for a ``bad``
    env; the step info of an odd index is ``{"index": index}``.
    """

    def __init__(self, index: int, fault: str = "none", at: int = 3, bad: bool = False) -> None:
        super().__init__(fault, at)
        self.index, self.bad = index, bad

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        obs[0], obs[1] = self.index, self.t
        return obs, reward, terminated, truncated, {"index": self.index} if self.index % 2 else info

    def whoami(self):
        return self.index, os.getpid()

    def check(self):
        if self.bad:
            raise RuntimeError(f"env {self.index} is bad")
        return "ok"


def indexed(n: int, per_env: dict | None = None) -> list:
    """Factories of ``n`` IndexEnvs; ``per_env`` maps an env index to its keyword arguments."""
    per_env = per_env or {}
    return [functools.partial(IndexEnv, i, **per_env.get(i, {})) for i in range(n)]


CARTPOLE = functools.partial(gym.make, "CartPole-v1")


def call_payload(name: str) -> tuple:
    """The payload of a CALL command: ``name``, no arguments."""
    return name, (), {}


def call_all(pool: WorkerPool, name: str, block_ids=None):
    return pool.run(Command.CALL, [call_payload(name)] * len(pool.blocks), block_ids=block_ids)


def step_all(pool: WorkerPool, actions, block_ids=None):
    pool.views["act/0"][:] = actions
    return pool.run(Command.STEP, block_ids=block_ids)


class ByHand:
    """The same envs stepped one by one with NEXT_STEP autoreset: the reference."""

    def __init__(self, n: int, seeds: list[int]) -> None:
        self.envs = [gym.make("CartPole-v1") for _ in range(n)]
        self.obs = np.array([env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)])
        self.done = [False] * n

    def step(self, actions, env_ids=None) -> tuple:
        env_ids = range(len(self.envs)) if env_ids is None else env_ids
        out = []
        for i in env_ids:
            if self.done[i]:
                o, r, te, tr = self.envs[i].reset()[0], 0.0, False, False
            else:
                o, r, te, tr, _ = self.envs[i].step(int(actions[i]))
            self.done[i] = te or tr
            self.obs[i] = o
            out.append((r, te, tr))
        return out


def assert_matches(pool: WorkerPool, ref: ByHand, got: list, env_ids) -> None:
    env_ids = list(env_ids)
    np.testing.assert_array_equal(pool.views["obs/0"][env_ids], ref.obs[env_ids])
    outcome = [(pool.views["rewards"][i], pool.views["terminations"][i], pool.views["truncations"][i]) for i in env_ids]
    assert outcome == got


@pytest.mark.parametrize("num_workers, step_in_main", [(2, False), (1, True), (0, True)])
def test_reset_and_step_match_a_by_hand_loop(num_workers, step_in_main):
    n, seeds = 5, [20, 21, 22, 23, 24]
    pool = make_pool([CARTPOLE] * n, num_workers, step_in_main)
    assert len(pool.blocks) == 2 - (num_workers == 0) and len(pool.worker_pids) == num_workers
    if step_in_main:  # the last block is stepped here, by envs of this process
        assert pool.main_index == num_workers and pool.main is not None
        assert len(pool.main.stepper.envs) == len(pool.blocks[-1])
    replies, failures = pool.run(Command.RESET, reset_payloads(seeds, None, None, pool.blocks))
    assert failures == {} and replies == [None] * len(pool.blocks)  # one slot per block: nothing to say
    ref = ByHand(n, seeds)
    np.testing.assert_array_equal(pool.views["obs/0"], ref.obs)

    rng = np.random.default_rng(0)
    for _ in range(120):
        actions = rng.integers(0, 2, size=n)
        replies, failures = step_all(pool, actions)
        assert failures == {} and replies == [None] * len(pool.blocks)
        assert_matches(pool, ref, ref.step(actions), range(n))
    assert pool.views["episode_count"].min() >= 2  # through autoresets
    assert pool.states == [BlockState.IDLE] * len(pool.blocks)


def test_run_returns_one_reply_slot_per_block():
    pool = make_pool(indexed(7), num_workers=3, step_in_main=True)  # blocks 0..1, 2..3, 4..5, 6 (here)
    assert pool.blocks == [range(2), range(2, 4), range(4, 6), range(6, 7)]
    replies, failures = call_all(pool, "whoami")
    assert failures == {}
    pids = [*pool.worker_pids, os.getpid()]  # worker k steps block k; the last block is this process's
    assert len(set(pids)) == 4
    assert replies == [[(i, pids[b]) for i in block] for b, block in enumerate(pool.blocks)]

    replies, failures = call_all(pool, "whoami", block_ids=[1, 3])
    assert failures == {} and replies == [None, [(2, pids[1]), (3, pids[1])], None, [(6, pids[3])]]

    pool.run(Command.RESET)
    replies, failures = step_all(pool, np.zeros(7, dtype=np.int64))
    # STEP replies are the envs' infos, by global env index (odd envs report one).
    assert failures == {}
    assert replies == [[(1, None, {"index": 1})], [(3, None, {"index": 3})], [(5, None, {"index": 5})], None]
    assert pool.views["obs/0"][:, :2].tolist() == [[i, 1] for i in range(7)]


def test_set_attr_round_sets_one_value_per_env():
    pool = make_pool(indexed(4), num_workers=2)
    replies, failures = pool.run(Command.SET_ATTR, [("bad", [False, True]), ("bad", [True, False])])
    assert failures == {} and replies == [None, None]
    _, failures = call_all(pool, "check")
    assert sorted(e.env_index for e in failures.values()) == [1, 2]


def test_an_env_that_raises_fails_its_block_and_the_others_reply():
    pool = make_pool(indexed(6, {3: {"bad": True}}), num_workers=3)
    pids = pool.worker_pids
    replies, failures = call_all(pool, "check")
    assert list(failures) == [1]
    err = failures[1]
    assert isinstance(err, WorkerError)
    assert (err.worker_index, err.env_index, err.phase, err.exc_type) == (1, 3, "call", "RuntimeError")
    assert "env 3 is bad" in str(err) and "test_pool.py" in err.remote_traceback
    assert replies == [["ok", "ok"], None, ["ok", "ok"]]
    with pytest.raises(WorkerError, match="env 3 is bad"):
        pool.raise_first(failures)
    # An env's exception leaves its worker alive and the pool usable.
    assert pool.state is PoolState.OPEN and pool.worker_pids == pids
    replies, failures = call_all(pool, "whoami")
    assert failures == {} and [r[0][0] for r in replies] == [0, 2, 4]


def test_raise_first_raises_the_lowest_blocks_failure():
    pool = make_pool(indexed(6, {5: {"bad": True}, 2: {"bad": True}}), num_workers=3)
    replies, failures = call_all(pool, "check")
    assert sorted(failures) == [1, 2] and replies[0] == ["ok", "ok"]
    with pytest.raises(WorkerError) as info:
        pool.raise_first(failures)
    assert info.value.env_index == 2 and info.value is failures[1]
    pool.raise_first({})  # nothing to raise
    assert pool.state is PoolState.OPEN


def test_an_env_that_raises_in_the_main_block_reports_no_worker():
    pool = make_pool(indexed(4, {3: {"fault": "raise", "at": 1}}), num_workers=1, step_in_main=True)
    pool.run(Command.RESET)
    replies, failures = step_all(pool, np.zeros(4, dtype=np.int64))
    assert list(failures) == [1] and replies[0] == [(1, None, {"index": 1})]
    err = failures[1]
    assert isinstance(err, WorkerError) and err.worker_index is None and err.env_index == 3
    assert err.phase == "step" and "step exploded" in str(err) and "the calling process" in str(err)
    assert pool.views["obs/0"][:2, 1].tolist() == [1, 1]  # the worker's block did step


def test_a_killed_worker_gives_worker_died_and_leaves_the_pool_broken():
    pool = make_pool([CARTPOLE] * 4, num_workers=2)
    pool.run(Command.RESET, reset_payloads([0, 1, 2, 3], None, None, pool.blocks))
    before = pool.views["obs/0"].copy()
    os.kill(pool.worker_pids[1], signal.SIGKILL)
    pool.workers.procs[1].join(5.0)  # dead before the round starts (a kill is not instant)
    t0 = time.monotonic()
    replies, failures = step_all(pool, np.ones(4, dtype=np.int64))
    assert time.monotonic() - t0 < 2.0
    assert list(failures) == [1] and replies == [None, None]
    err = failures[1]
    assert isinstance(err, WorkerDied)
    assert err.worker_index == 1 and err.exitcode == -signal.SIGKILL and err.envs == range(2, 4)
    assert "killed by SIGKILL" in str(err)
    assert not np.array_equal(pool.views["obs/0"][:2], before[:2])  # block 0 stepped all the same
    assert pool.state is PoolState.OPEN  # until the caller decides
    with pytest.raises(WorkerDied):
        pool.raise_first(failures)
    assert pool.state is PoolState.BROKEN
    with pytest.raises(ClosedError, match="after a worker fault"):
        pool.run(Command.RESET)
    pool.shutdown()
    assert pool.state is PoolState.CLOSED


def test_a_hanging_env_times_out():
    pool = make_pool(indexed(4, {0: {"fault": "hang", "at": 1}}), num_workers=2, timeout=0.5)
    pool.run(Command.RESET)
    hung = pool.worker_pids[0]
    t0 = time.monotonic()
    replies, failures = step_all(pool, np.zeros(4, dtype=np.int64))
    elapsed = time.monotonic() - t0
    assert 0.45 <= elapsed < 3.0
    assert list(failures) == [0] and isinstance(failures[0], StepTimeout)
    assert "worker 0 (envs 0..1)" in str(failures[0]) and "timeout=0.5" in str(failures[0])
    assert replies[1] == [(3, None, {"index": 3})]  # block 1 finished its step
    assert not alive(hung)  # the stuck worker was stopped
    with pytest.raises(StepTimeout):
        pool.raise_first(failures)
    assert pool.state is PoolState.BROKEN


def test_submit_and_receive_return_whole_blocks_and_mark_them_idle():
    n, seeds = 6, list(range(6))
    pool = make_pool([CARTPOLE] * n, num_workers=3, asynchronous=True)
    pool.run(Command.RESET, reset_payloads(seeds, None, None, pool.blocks))
    ref = ByHand(n, seeds)
    actions = np.array([0, 1, 1, 0, 1, 0])
    pool.views["act/0"][:] = actions

    pool.submit(Command.STEP, [0, 1, 2])
    assert pool.states == [BlockState.IN_FLIGHT] * 3
    ready, replies, failures = pool.receive(2)
    assert len(ready) == 2 and ready == sorted(ready) and replies == {} and failures == {}
    rest = ({0, 1, 2} - set(ready)).pop()
    assert [pool.states[b] for b in ready] == [BlockState.IDLE] * 2 and pool.states[rest] is BlockState.IN_FLIGHT
    env_ids = [i for b in ready for i in pool.blocks[b]]  # every env of the blocks taken has stepped
    assert_matches(pool, ref, ref.step(actions, env_ids), env_ids)

    ready, replies, failures = pool.receive(2)  # only one left in flight
    assert ready == [rest] and failures == {}
    assert pool.states == [BlockState.IDLE] * 3
    assert_matches(pool, ref, ref.step(actions, pool.blocks[rest]), pool.blocks[rest])

    pool.submit(Command.STEP, [1])
    ready, _, _ = pool.receive(3)
    assert ready == [1] and pool.states == [BlockState.IDLE] * 3
    assert_matches(pool, ref, ref.step(actions, pool.blocks[1]), pool.blocks[1])


def test_receive_collects_a_failed_block_as_finished():
    pool = make_pool(indexed(4, {2: {"bad": True}}), num_workers=2, asynchronous=True)
    pool.submit(Command.CALL, [0, 1], [call_payload("check")] * 2)
    ready, replies, failures = pool.receive(2)
    assert ready == [0, 1] and replies == {0: ["ok", "ok"]}
    assert list(failures) == [1] and failures[1].env_index == 2
    assert pool.states == [BlockState.IDLE] * 2 and pool.state is PoolState.OPEN


def slow_last_block(n_fast: int, n_slow: int) -> list:
    """Fast envs, then ``n_slow`` envs whose step costs 0.1 s of CPU (same spaces as FaultyEnv)."""
    return [functools.partial(FaultyEnv, "none")] * n_fast + [functools.partial(SlowEnv, 100_000.0)] * n_slow


def test_receive_ordered_returns_the_blocks_submitted_first():
    pool = make_pool(slow_last_block(4, 2), num_workers=3, asynchronous=True)  # block 2 is slow (0.2 s a step)
    pool.run(Command.RESET)
    pool.submit(Command.STEP, [2])
    pool.submit(Command.STEP, [0, 1])
    order = [pool.receive(1, ordered=True)[0] for _ in range(3)]
    assert order == [[2], [0], [1]]  # the order of submission (lowest block first among a submission)

    pool.submit(Command.STEP, [2])
    pool.submit(Command.STEP, [0, 1])
    first, _, _ = pool.receive(1)  # unordered: whichever is done first, not the slow block
    assert first in ([0], [1])
    assert sorted(b for _ in range(2) for b in pool.receive(1)[0]) == sorted({0, 1, 2} - set(first))
    assert pool.states == [BlockState.IDLE] * 3


def test_step_in_main_steps_the_last_block_in_this_process():
    pool = make_pool(indexed(4), num_workers=1, step_in_main=True)
    main_envs = pool.main.stepper.envs
    assert [env.index for env in main_envs] == [2, 3]  # the very objects stepped, here
    pool.run(Command.RESET)
    for t in range(1, 4):
        step_all(pool, np.zeros(4, dtype=np.int64))
        assert [env.t for env in main_envs] == [t, t]
        assert pool.views["obs/0"][:, 1].tolist() == [t] * 4
    replies, _ = call_all(pool, "whoami")
    assert replies == [[(0, pool.worker_pids[0]), (1, pool.worker_pids[0])], [(2, os.getpid()), (3, os.getpid())]]


def test_restart_block_replaces_a_dead_worker():
    pool = make_pool(indexed(4, {1: {"fault": "kill", "at": 2}}), num_workers=2)
    pool.run(Command.RESET)
    step_all(pool, np.zeros(4, dtype=np.int64))
    old = pool.worker_pids[0]
    _, failures = step_all(pool, np.zeros(4, dtype=np.int64))
    assert list(failures) == [0] and isinstance(failures[0], WorkerDied)

    pool.restart_block(0)
    new = pool.worker_pids[0]
    assert new != old and not alive(old) and alive(new)
    assert pool.state is PoolState.OPEN and pool.states == [BlockState.IDLE] * 2
    replies, failures = pool.run(Command.RESET, reset_payloads([5, 6, 7, 8], None, None, pool.blocks))
    assert failures == {}
    replies, failures = step_all(pool, np.zeros(4, dtype=np.int64))
    assert failures == {}
    # Both blocks were reset: this is every env's first step (the new worker's envs' first ever).
    assert pool.views["obs/0"][:, 1].tolist() == [1, 1, 1, 1]
    replies, failures = call_all(pool, "whoami")
    assert failures == {} and replies[0] == [(0, new), (1, new)]


def test_restart_block_replaces_a_timed_out_worker():
    pool = make_pool(indexed(4, {3: {"fault": "hang", "at": 1}}), num_workers=2, timeout=0.5)
    pool.run(Command.RESET)
    _, failures = step_all(pool, np.zeros(4, dtype=np.int64))
    assert list(failures) == [1] and isinstance(failures[1], StepTimeout)
    pool.restart_block(1)
    replies, failures = pool.run(Command.RESET)
    assert failures == {} and replies == [None, None]
    _, failures = call_all(pool, "check")
    assert failures == {}


def test_restart_block_replaces_the_main_blocks_envs():
    pool = make_pool(indexed(4, {2: {"fault": "raise", "at": 2}}), num_workers=1, step_in_main=True)
    pool.run(Command.RESET)
    step_all(pool, np.zeros(4, dtype=np.int64))
    _, failures = step_all(pool, np.zeros(4, dtype=np.int64))
    assert list(failures) == [1] and failures[1].env_index == 2
    old_envs = list(pool.main.stepper.envs)
    worker = pool.worker_pids
    pool.restart_block(1)
    assert pool.worker_pids == worker  # the worker's block is left alone
    assert all(new is not old for new, old in zip(pool.main.stepper.envs, old_envs))
    assert [env.t for env in pool.main.stepper.envs] == [0, 0]  # built, not stepped
    _, failures = pool.run(Command.RESET)
    assert failures == {}
    _, failures = step_all(pool, np.zeros(4, dtype=np.int64))
    assert failures == {} and pool.views["obs/0"][:, 1].tolist() == [1, 1, 1, 1]
    assert [env.t for env in pool.main.stepper.envs] == [1, 1]


def test_shutdown_is_idempotent_and_leaves_nothing():
    pool = make_pool([CARTPOLE] * 4, num_workers=2)
    pool.run(Command.RESET)
    pids = pool.worker_pids
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    assert shm_entries() == set()  # the segment's name is unlinked as soon as it is made
    pool.shutdown()
    assert_shut_down(pool, pids)
    pool.shutdown()  # again: nothing to do
    assert pool.state is PoolState.CLOSED
    with pytest.raises(ClosedError):
        pool.submit(Command.STEP, [0, 1])


def test_shutdown_closes_the_envs_of_every_block(tmp_path):
    from envs_for_tests import ClosingEnv

    fns = [functools.partial(ClosingEnv, str(tmp_path), i) for i in range(3)]
    pool = make_pool(fns, num_workers=1, step_in_main=True)
    pids = pool.worker_pids
    pool.shutdown()
    assert_shut_down(pool, pids)
    assert sorted(os.listdir(tmp_path)) == ["closed-0", "closed-1", "closed-2"]


def test_receive_runs_the_main_block_like_a_workers():
    pool = make_pool(indexed(4), num_workers=1, step_in_main=True, asynchronous=True)
    pool.run(Command.RESET)
    pool.views["act/0"][:] = 0
    pool.submit(Command.STEP, [1])  # the main block: parked until a wait runs it
    assert pool.states == [BlockState.IDLE, BlockState.IN_FLIGHT]
    assert [env.t for env in pool.main.stepper.envs] == [0, 0]
    pool.submit(Command.STEP, [0])
    ready, replies, failures = pool.receive(1, ordered=True)
    assert ready == [1] and replies == {1: [(3, None, {"index": 3})]} and failures == {}
    assert [env.t for env in pool.main.stepper.envs] == [1, 1]
    assert pool.states == [BlockState.IN_FLIGHT, BlockState.IDLE]
    ready, replies, _ = pool.receive(1)
    assert ready == [0] and replies == {0: [(1, None, {"index": 1})]}
    assert pool.views["obs/0"][:, 1].tolist() == [1, 1, 1, 1]
