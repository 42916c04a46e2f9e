"""The round's fault paths, each reproduced at the exact step where it struck (#51): a probe
(``shmvec.probes``) kills a worker, holds it back, or sends the caller a real SIGINT at a named
point of the round, and the test checks that every call returns, every row is right and
nothing is left behind.

The probe is installed in this process before the workers fork (they inherit it); it acts once
where a marker file says so, so that only the process meant to act does.
"""

from __future__ import annotations

import functools
import os
import signal
import time

import numpy as np
import pytest
from counting import BUILT, CountingEnv, Rows, counting_fns

import shmvec
from shmvec import probes
from shmvec.pool import BlockState
from shmvec.protocol import SLEEPING

pytestmark = pytest.mark.timeout(120)  # a hang fails here, not at the suite's limit


@pytest.fixture
def probe():
    """``probe(fn)`` installs ``fn`` for the test (forked workers inherit it: every vector env
    here asks for fork, as the default starts workers from the forkserver once the test process
    runs other threads); removed after."""
    previous = probes.probe
    yield probes.install
    probes.install(previous)


def once(path) -> bool:
    """True for the first process that asks, across processes (an exclusive create)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def in_worker_of(env_index: int) -> bool:
    """Whether this process is the worker that built env ``env_index`` (its block's first)."""
    return bool(BUILT) and BUILT[0] == env_index


def steps(envs, rows: Rows, n: int, actions=None) -> None:
    actions = np.zeros(envs.num_envs, np.int64) if actions is None else actions
    for _ in range(n):
        rows.step(*envs.step(actions))


# -- 1. a worker killed between its DONE and its count ---------------------------------------------
@pytest.mark.parametrize("on_error", ["restart", "raise"])
def test_a_worker_killed_between_its_done_and_its_count_fails_the_round(on_error, probe, tmp_path):
    """Worker 0 stores its DONE of a broadcast step, then dies before it counts itself: the
    count can never be complete. The round must fail it (restarted, or WorkerDied), not wait
    for good."""
    armed = tmp_path / "armed"

    def kill_after_done(point):
        if point == "worker:done" and in_worker_of(0) and armed.exists() and once(tmp_path / "killed"):
            os.kill(os.getpid(), signal.SIGKILL)

    probe(kill_after_done)
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, on_error=on_error, context="fork")
    try:
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        steps(envs, rows, 2)
        armed.touch()
        if on_error == "raise":
            with pytest.raises(shmvec.WorkerDied):
                envs.step(np.zeros(4, np.int64))
            assert envs.closed
            return
        out = envs.step(np.zeros(4, np.int64))
        assert out[4]["restarted"].tolist() == [True, True, False, False]
        rows.step(*out)
        steps(envs, rows, 8)
        assert [r[0] for r in envs.restarts] == [0]
    finally:
        envs.close()


def test_a_timeout_applies_while_every_worker_is_watched(probe, tmp_path):
    """Worker 0 stores its DONE, then hangs before it counts itself: past ``timeout`` each
    block's own DONE decides (the wait watched every worker, with no one block's submission to
    count from). That round's results are whole and are handed out; the next round finds
    worker 0 stuck and raises StepTimeout. (The timeout leaves a loaded machine three seconds
    for worker 0 to reach its DONE: with one, a CI run once stopped it before it got there.)"""
    armed = tmp_path / "armed"

    def hang_after_done(point):
        if point == "worker:done" and in_worker_of(0) and armed.exists() and once(tmp_path / "hung"):
            time.sleep(3600)

    probe(hang_after_done)
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, timeout=3.0, context="fork")
    try:
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        armed.touch()
        steps(envs, rows, 1)
        with pytest.raises(shmvec.StepTimeout, match="worker 0"):
            envs.step(np.zeros(4, np.int64))
    finally:
        envs.close()


class FailingWhenArmed(CountingEnv):
    """Env 0 raises in its step once the marker file ``armed`` exists."""

    def __init__(self, index: int, armed: str) -> None:
        super().__init__(index)
        self.armed = armed

    def step(self, action):
        if self.index == 0 and os.path.exists(self.armed):
            raise RuntimeError("env 0 fails as armed")
        return super().step(action)


def test_an_error_of_a_worker_held_before_its_count_is_raised_past_the_timeout(probe, tmp_path):
    """Env 0 raises (worker 0's status says an error report follows); worker 0 stores its DONE,
    then hangs before it counts itself: past ``timeout`` the round is whole by each block's DONE,
    and its statuses are each block's to read (the count's not-OK field lacks worker 0's), so
    the step raises env 0's error instead of returning as if nothing happened."""
    armed = tmp_path / "armed"

    def hang_after_done(point):
        if point == "worker:done" and in_worker_of(0) and armed.exists() and once(tmp_path / "hung"):
            time.sleep(3600)

    probe(hang_after_done)
    fns = [functools.partial(FailingWhenArmed, i, str(armed)) for i in range(4)]
    envs = shmvec.ShmVecEnv(fns, num_workers=2, timeout=3.0, context="fork")
    try:
        envs.reset(seed=0)
        armed.touch()
        with pytest.raises(shmvec.WorkerError, match="env 0 fails as armed"):
            envs.step(np.zeros(4, np.int64))
    finally:
        envs.close()


# -- 2. a late count of an earlier round ------------------------------------------------------------
def test_a_late_count_of_an_earlier_round_does_not_count_in_the_next(probe, tmp_path):
    """Round s: worker 1 stores its DONE and is held back for a second before it counts itself;
    worker 0 dies, so main takes block 1 by its DONE word and restarts block 0. The next
    broadcast must not take worker 1's late count of round s as its own: block 1 must be read
    once it has stepped again (its count one more), not before."""
    armed = tmp_path / "armed"

    def late_and_dead(point):
        if not armed.exists():
            return
        if point == "worker:done" and in_worker_of(2) and once(tmp_path / "held"):
            time.sleep(1.0)
        elif point == "worker:go" and in_worker_of(0) and once(tmp_path / "killed"):
            time.sleep(0.1)  # (worker 1 is past its DONE by now)
            os.kill(os.getpid(), signal.SIGKILL)

    probe(late_and_dead)
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, on_error="restart", context="fork")
    try:
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        steps(envs, rows, 2)
        armed.touch()
        out = envs.step(np.zeros(4, np.int64))
        assert out[4]["restarted"].tolist() == [True, True, False, False]
        rows.step(*out)
        steps(envs, rows, 6)  # the first of these met worker 1's late count
    finally:
        envs.close()


# -- 3. Ctrl-C while a round is posted ----------------------------------------------------------------
def interrupt_at(where: str, armed: list):
    """A probe that sends this process a real SIGINT the first time ``where`` is reached while
    ``armed`` holds True (in the calling process only)."""
    main = os.getpid()

    def at(point):
        if point == where and armed[0] and os.getpid() == main:
            armed[0] = False
            os.kill(main, signal.SIGINT)

    return at


@pytest.mark.usefixtures("sigint_handled")
def test_ctrl_c_after_a_broadcast_go_leaves_its_workers_in_flight(probe):
    """SIGINT right after a step's broadcast GO is stored: every worker runs it, so every block
    is in flight (the next reset drains them), and the env goes on after a reset."""
    armed = [False]
    probe(interrupt_at("main:posted", armed))
    envs = shmvec.ShmVecEnv(counting_fns(4, slow_s=0.2), num_workers=2, context="fork")
    try:
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        armed[0] = True
        with pytest.raises(KeyboardInterrupt):
            envs.step(np.ones(4, np.int64))
        assert envs._session.pool.states == [BlockState.IN_FLIGHT] * 2
        rows.reset(envs.reset(seed=1)[0])
        steps(envs, rows, 3)
    finally:
        envs.close()


@pytest.mark.usefixtures("sigint_handled")
def test_ctrl_c_between_a_go_and_its_payload_does_not_strand_the_worker(probe):
    """SIGINT after a ``call``'s first GO is stored and before its payloads are sent: SIGINT is
    held until both are out, so no worker waits for a payload never sent, nor takes the next
    call's payload for this one."""
    armed = [False]
    probe(interrupt_at("main:posted", armed))
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, context="fork")
    try:
        envs.reset(seed=0)
        armed[0] = True
        with pytest.raises(KeyboardInterrupt):
            envs.call("__getattribute__", "index")
        assert envs.call("__getattribute__", "count") == (0, 0, 0, 0)
        assert envs.get_attr("index") == (0, 1, 2, 3)
    finally:
        envs.close()


@pytest.mark.usefixtures("sigint_handled")
@pytest.mark.parametrize("where, in_flight", [("main:post", []), ("main:posted", [0])])
def test_ctrl_c_in_send_marks_exactly_the_blocks_posted(where, in_flight, probe):
    """SIGINT in ``send`` to blocks 0 and 1 (of 3), before any GO is stored, or after block 0's:
    exactly the blocks posted are in flight; ``recv`` hands those out, and a reset after it
    leaves nothing stranded."""
    armed = [False]
    probe(interrupt_at(where, armed))
    envs = shmvec.ShmVecEnv(counting_fns(6), num_workers=3, batch_size=4, context="fork")
    try:
        envs.reset(seed=0)
        armed[0] = True
        with pytest.raises(KeyboardInterrupt):
            envs.send(np.zeros(4, np.int64), [0, 1, 2, 3])
        states = envs._session.pool.states
        assert [b for b, s in enumerate(states) if s is BlockState.IN_FLIGHT] == in_flight
        if in_flight:
            obs, *_, ids = envs.recv()
            assert ids.tolist() == [0, 1] and obs[:, 1].tolist() == [1, 1]
        with pytest.raises(shmvec.NothingInFlightError):
            envs.recv()
        rows = Rows(6)
        rows.reset(envs.reset(seed=1)[0])
        for ids in ([0, 1, 2, 3], [2, 3, 4, 5], [0, 1, 4, 5]):
            envs.send(np.zeros(4, np.int64), ids)
            *out, got = envs.recv()
            assert got.tolist() == ids
            rows.step(*out, env_ids=got)
    finally:
        envs.close()


# -- 3b. each step of the compiled broadcast round -----------------------------------------------------
# The caller's points of a broadcast step, in order (shmvec.broadcast.POINTS): the compiled round
# calls the probe back at each, so these tests strike the code a training loop runs.
MAIN_POINTS = ["main:post", "main:posted", "ring", "main:waited", "sleep:announced", "sleep:woken", "main:seen"]


def kill_worker_0_at(where: str, armed: list, pids: list):
    """A probe that SIGKILLs worker 0 (``pids[0]``) the first time the caller reaches ``where``
    while ``armed`` holds True, and lets the caller go on only once it is dead."""

    def kill(point):
        if point == where and armed[0]:
            armed[0] = False
            os.kill(pids[0], signal.SIGKILL)
            os.waitid(os.P_PID, pids[0], os.WEXITED | os.WNOWAIT)

    return kill


def test_the_caller_points_are_the_compiled_rounds():
    from shmvec import broadcast

    assert list(broadcast.POINTS) == MAIN_POINTS
    assert set(MAIN_POINTS) <= probes.POINTS


def sleeping_workers_step(envs, actions) -> tuple:
    """A step after the workers have given up spinning (the round rings them) that takes long
    enough for the caller to sleep (action 1: 50 ms)."""
    time.sleep(0.02)
    return envs.step(actions)


@pytest.mark.usefixtures("sigint_handled")
@pytest.mark.parametrize("where", MAIN_POINTS)
def test_ctrl_c_at_each_step_of_a_broadcast_round(where, probe):
    """SIGINT at each of the caller's points of a broadcast step: the step raises
    KeyboardInterrupt there; the workers are in flight exactly when its GO was stored, main's
    SLEEPING is cleared, and after a reset the env steps on with every row right."""
    armed = [False]
    probe(interrupt_at(where, armed))
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, context="fork")
    try:
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        armed[0] = True
        with pytest.raises(KeyboardInterrupt):
            sleeping_workers_step(envs, np.ones(4, np.int64))
        assert not armed[0]  # (the point was reached)
        pool = envs._session.pool
        posted = where != "main:post"
        assert pool.states == [BlockState.IN_FLIGHT if posted else BlockState.IDLE] * 2
        assert pool.main_line[SLEEPING] == 0
        rows.reset(envs.reset(seed=1)[0])
        steps(envs, rows, 3)
    finally:
        envs.close()


@pytest.mark.parametrize("where", MAIN_POINTS)
def test_a_worker_killed_at_each_step_of_a_broadcast_round_is_restarted(where, probe):
    """Worker 0 is killed while the caller is at each of its points of a broadcast step: that
    step (or, killed once its count was complete, the next) restarts block 0, and every row stays
    right."""
    armed, pids = [False], []
    probe(kill_worker_0_at(where, armed, pids))
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, on_error="restart", context="fork")
    try:
        pids += envs.worker_pids
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        armed[0] = True
        restarted = []
        for _ in range(2):
            out = sleeping_workers_step(envs, np.ones(4, np.int64))
            restarted.append(out[4]["restarted"].tolist() if "restarted" in out[4] else [False] * 4)
            rows.step(*out)
        assert not armed[0]
        assert [True, True, False, False] in restarted
        assert [r[0] for r in envs.restarts] == [0]
        steps(envs, rows, 3)
    finally:
        envs.close()


# -- 3c. each step of the compiled wait of an asynchronous recv --------------------------------------
# The caller's points of that wait (BroadcastRound.wait_some): a recv sleeps in it as a step does.
WAIT_POINTS = ["main:waited", "sleep:announced", "sleep:woken", "main:seen"]


def slow_send(envs, ids) -> None:
    """A send of block ``ids`` after its worker gave up spinning, long enough (action 1: 50 ms)
    for the recv after it to sleep."""
    time.sleep(0.02)
    envs.send(np.ones(len(ids), np.int64), ids)


@pytest.mark.usefixtures("sigint_handled")
@pytest.mark.parametrize("where", WAIT_POINTS)
def test_ctrl_c_at_each_step_of_a_recvs_wait(where, probe):
    """SIGINT at each of the caller's points of a recv's compiled wait: recv raises
    KeyboardInterrupt, main's SLEEPING is cleared, the block stays in flight, and the next recv
    hands it out with its rows right; the env goes on."""
    armed = [False]
    probe(interrupt_at(where, armed))
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, batch_size=2, context="fork")
    try:
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        slow_send(envs, [0, 1])
        armed[0] = True
        with pytest.raises(KeyboardInterrupt):
            envs.recv()
        assert not armed[0]  # (the point was reached)
        pool = envs._session.pool
        assert pool.main_line[SLEEPING] == 0 and pool.states[0] is BlockState.IN_FLIGHT
        *out, got = envs.recv()
        assert got.tolist() == [0, 1]
        rows.step(*out, env_ids=got)
        for ids in ([2, 3], [0, 1], [2, 3]):
            envs.send(np.zeros(2, np.int64), ids)
            *out, got = envs.recv()
            rows.step(*out, env_ids=got)
    finally:
        envs.close()


@pytest.mark.parametrize("where", WAIT_POINTS)
def test_a_worker_killed_at_each_step_of_a_recvs_wait_is_restarted(where, probe):
    """Worker 0 is killed while a recv waits for its block, at each of the caller's points: that
    recv (or, killed once the block was done, the next) restarts block 0, and every row stays
    right."""
    armed, pids = [False], []
    probe(kill_worker_0_at(where, armed, pids))
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, batch_size=2, on_error="restart", context="fork")
    try:
        pids += envs.worker_pids
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        armed[0] = True
        restarted = []
        for _ in range(2):
            slow_send(envs, [0, 1])
            *out, got = envs.recv()
            assert got.tolist() == [0, 1]
            restarted.append(out[4]["restarted"].tolist() if "restarted" in out[4] else [False] * 2)
            rows.step(*out, env_ids=got)
        assert not armed[0]
        assert [True, True] in restarted
        assert [r[0] for r in envs.restarts] == [0]
        for ids in ([2, 3], [0, 1]):
            envs.send(np.zeros(2, np.int64), ids)
            *out, got = envs.recv()
            rows.step(*out, env_ids=got)
    finally:
        envs.close()


# -- 4. a replacement killed while it starts ------------------------------------------------------------
@pytest.mark.parametrize("when", ["build", "reset"])
def test_a_replacement_killed_while_it_starts_is_replaced_again(when, tmp_path):
    """Worker 0 is killed; its first two replacements die too, as they build their envs or as
    they reset them: a third is started, and the step returns with block 0 restarted."""
    deaths = tmp_path / "deaths"
    envs = shmvec.ShmVecEnv(counting_fns(4, deaths=str(deaths)), num_workers=2, on_error="restart", context="fork")
    try:
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        deaths.write_text(f"{when} 2")
        os.kill(envs.worker_pids[0], signal.SIGKILL)
        out = envs.step(np.zeros(4, np.int64))
        assert out[4]["restarted"].tolist() == [True, True, False, False]
        rows.step(*out)
        steps(envs, rows, 4)
        assert deaths.read_text() == f"{when} 0"
        assert [r[0] for r in envs.restarts] == [0]
    finally:
        envs.close()


def test_a_replacement_that_always_dies_ends_in_an_error_that_says_so(tmp_path):
    deaths = tmp_path / "deaths"
    envs = shmvec.ShmVecEnv(counting_fns(4, deaths=str(deaths)), num_workers=2, on_error="restart", context="fork")
    try:
        envs.reset(seed=0)
        deaths.write_text("build 1000")
        os.kill(envs.worker_pids[0], signal.SIGKILL)
        with pytest.raises(shmvec.WorkerDied, match=r"replaced 5 times in a row"):
            envs.step(np.zeros(4, np.int64))
        assert envs.closed
    finally:
        envs.close()
