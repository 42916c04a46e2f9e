"""The compiled round (``shmvec.broadcast``) on its own terms: its IR is whole, its plan
says what it did, and its wait hands a dead worker to the general wait.

Its fault paths, struck at each of the caller's points, are in ``tests/test_round_faults.py``.
"""

from __future__ import annotations

import functools
import math
import os
import re
import signal
import threading

import numpy as np
import pytest
from counting import Rows, counting_fns

import shmvec
from shmvec import broadcast, probes

pytestmark = pytest.mark.timeout(120)


def test_every_constant_of_the_ir_is_filled_in():
    assert not re.search(r"@[A-Z]", broadcast.ir())


def test_the_timeout_goes_into_the_plan_in_nanoseconds():
    assert broadcast._nanoseconds(0.25) == 250_000_000
    assert broadcast._nanoseconds(-1.0) == 0  # (past at once: the general wait judges it)
    # No deadline: none, or one whose sum with the clock would overflow (found by a review: an
    # infinite timeout made every broadcast step raise OverflowError).
    for timeout in (None, math.inf, math.nan, 1e30, 1e300):
        assert broadcast._nanoseconds(timeout) == -1


def test_an_infinite_timeout_steps():
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, timeout=math.inf, context="fork")
    try:
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        for _ in range(3):
            rows.step(*envs.step(np.zeros(4, np.int64)))
    finally:
        envs.close()


@pytest.mark.usefixtures("sigint_handled")
@pytest.mark.parametrize("probed", [False, True])
def test_a_ctrl_c_while_the_caller_sleeps_in_the_compiled_wait_is_raised(probed):
    """A SIGINT while the caller sleeps in the compiled round's poll (steps of 50 ms) raises
    KeyboardInterrupt from that step, with or without a probe installed. With one, the signal's
    handler runs as the probe is called back, before any ``try`` of the callback, and ctypes
    could only report the KeyboardInterrupt as unraisable (found by a review: the step returned
    as if nothing had happened)."""
    points = []
    previous = probes.install(points.append if probed else None)
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, context="fork")
    try:
        envs.reset(seed=0)
        timer = threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                envs.step(np.ones(4, np.int64))
        finally:
            timer.join()
        assert ("sleep:announced" in points) == probed  # (the step was interrupted in its sleep)
        envs.reset(seed=1)
        envs.step(np.zeros(4, np.int64))
    finally:
        probes.install(previous)
        envs.close()


def test_a_slow_round_sleeps_in_poll_and_a_quiet_one_needs_no_collection():
    """Steps of 50 ms: the caller sleeps in the compiled wait (its poll calls counted in the
    plan) and every round comes back whole."""
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, context="fork")
    try:
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        pool = envs._session.pool
        before = pool.round.sleeps
        for _ in range(3):
            rows.step(*envs.step(np.ones(4, np.int64)))
        assert pool.round.sleeps >= before + 3
    finally:
        envs.close()


def test_a_worker_dead_before_the_round_is_judged_by_the_general_wait():
    """Worker 1 is gone before the step is posted: the compiled wait sees its sentinel, returns
    not done, and the step raises WorkerDied naming it (on_error="raise")."""
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, context="fork")
    try:
        envs.reset(seed=0)
        pid = envs.worker_pids[1]
        os.kill(pid, signal.SIGKILL)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        with pytest.raises(shmvec.WorkerDied, match="worker 1"):
            envs.step(np.zeros(4, np.int64))
        assert envs.closed
    finally:
        envs.close()


# -- a Discrete batch checked and copied by the compiled round ------------------------------------------
def test_a_discrete_batch_is_staged_checked_and_copied_by_the_compiled_round():
    """A step's Discrete batch goes through the staging row: the actions reach the envs (their
    region holds them), and one out of bounds, above or below, is refused with the check's own
    message, nothing written, nothing posted: the next step steps every env once."""
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, context="fork")
    try:
        session = envs._session
        assert session.staging is not None  # (the compiled check is in use)
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        actions = np.array([0, 0, 0, 0])
        rows.step(*envs.step(actions))
        assert session.home.act[0].tolist() == [0, 0, 0, 0]
        for bad, message in (
            ([0, 2, 0, 0], r"actions\[1\] = 2 is outside"),
            ([0, 0, -1, 0], r"actions\[2\] = -1 is outside"),
        ):
            with pytest.raises(ValueError, match=message):
                envs.step(np.array(bad))
            assert session.home.act[0].tolist() == [0, 0, 0, 0]  # nothing written
        rows.step(*envs.step(np.array([0, 0, 0, 0], np.int32)))  # every env stepped once: nothing was posted
        assert not envs.closed
    finally:
        envs.close()


def test_an_ignored_action_is_not_checked_by_the_compiled_round():
    """Under NEXT_STEP, an env whose episode ended is reset by the next step and never sees its
    action: any value passes there (as Gymnasium hands it), and only there."""
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, context="fork")
    try:
        rows = Rows(4)
        rows.reset(envs.reset(seed=0)[0])
        for _ in range(5):  # env 0's episode is 5 steps
            rows.step(*envs.step(np.zeros(4, np.int64)))
        assert envs._session.autoreset.tolist() == [True, False, False, False]
        rows.step(*envs.step(np.array([7, 0, 0, 0])))
        with pytest.raises(ValueError, match=r"actions\[3\] = 7 is outside"):  # (env 3's episode: 8 steps)
            envs.step(np.array([0, 0, 0, 7]))
    finally:
        envs.close()


@pytest.mark.parametrize(
    "actions, error, message",
    [
        (np.zeros(4, np.float32), ValueError, "expected integers"),
        (np.zeros(3, np.int64), ValueError, "have shape"),
        (np.full(4, 2**63 + 1, np.uint64), ValueError, "is outside"),  # (not staged: it would wrap)
    ],
)
def test_what_cannot_be_staged_is_checked_as_before(actions, error, message):
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, context="fork")
    try:
        envs.reset(seed=0)
        with pytest.raises(error, match=message):
            envs.step(actions)
        envs.step(np.zeros(4, np.int64))
    finally:
        envs.close()


# -- a send's Discrete batch, staged for the compiled post of its blocks --------------------------------
def test_a_sends_discrete_batch_is_checked_and_copied_by_the_compiled_post():
    """A send of adjacent blocks stages its batch: the actions reach those blocks' rows, one out of
    bounds is refused with the check's own message and nothing posted (the block stays idle),
    and the env goes on with every row right."""
    envs = shmvec.ShmVecEnv(counting_fns(6), num_workers=3, batch_size=2, context="fork")
    try:
        session = envs._session
        rows = Rows(6)
        rows.reset(envs.reset(seed=0)[0])
        envs.send(np.array([1, 1]), [2, 3])
        assert session.home.act[0][2:4].tolist() == [1, 1]
        *out, got = envs.recv()
        rows.step(*out, env_ids=got)
        with pytest.raises(ValueError, match=r"actions\[1\] = 2 is outside"):
            envs.send(np.array([0, 2]), [4, 5])
        assert session.home.act[0][4:6].tolist() == [0, 0]  # nothing written
        assert not session.in_flight()  # nothing posted
        for ids in ([4, 5], [0, 1], [2, 3]):
            envs.send(np.zeros(2, np.int32), ids)
            *out, got = envs.recv()
            assert got.tolist() == ids
            rows.step(*out, env_ids=got)
        assert not envs.closed
    finally:
        envs.close()


def test_a_sends_ignored_action_is_not_checked_and_a_scattered_batch_is_checked_in_python():
    """Under NEXT_STEP, the row of an env whose episode ended is not checked (any value passes
    there, and only there): in a staged batch that starts past env 0 (its mask read from there)
    and in one of blocks apart (checked in Python)."""
    envs = shmvec.ShmVecEnv(counting_fns(6), num_workers=3, batch_size=4, context="fork")
    try:
        session = envs._session
        rows = Rows(6)
        rows.reset(envs.reset(seed=0)[0])

        def step(ids, actions):
            envs.send(np.array(actions), ids)
            *out, got = envs.recv()
            assert got.tolist() == ids
            rows.step(*out, env_ids=got)

        for _ in range(5):  # env 4's episode is 5 steps (env 5's 6)
            step([2, 3, 4, 5], [0, 0, 0, 0])
        assert session.autoreset.tolist() == [False, False, False, False, True, False]
        with pytest.raises(ValueError, match=r"actions\[3\] = 7 is outside"):
            envs.send(np.array([0, 0, 0, 7]), [2, 3, 4, 5])
        step([2, 3, 4, 5], [0, 0, 7, 0])  # (staged: adjacent blocks)
        assert session.autoreset.tolist() == [False, False, False, False, False, True]
        with pytest.raises(ValueError, match=r"actions\[2\] = 7 is outside"):
            envs.send(np.array([0, 0, 7, 0]), [0, 1, 4, 5])
        step([0, 1, 4, 5], [0, 0, 0, 7])  # (blocks apart: checked in Python)
    finally:
        envs.close()


def test_a_refused_send_leaves_the_held_batch_held_and_says_only_why():
    """A batch that check_finite held back for recv is the next recv's when a send in between is
    refused (nothing ran), as when the Python check refused it; the error carries no trace of
    the compiled refusal."""
    from envs_for_tests import FaultyEnv

    fns = [functools.partial(FaultyEnv, "inf_reward" if i == 0 else "none", 1) for i in range(4)]
    with shmvec.ShmVecEnv(fns, num_workers=2, batch_size=2, check_finite=True, context="fork") as envs:
        envs.reset(seed=0)
        envs.send(np.zeros(2, np.int64), np.arange(2))
        with pytest.raises(shmvec.NonFiniteError):
            envs.recv()
        with pytest.raises(ValueError, match=r"actions\[1\] = 99 is outside") as refused:
            envs.send(np.array([0, 99]), np.array([2, 3]))
        assert refused.value.__context__ is None
        *_, ids = envs.recv()
        assert ids.tolist() == [0, 1]


def test_validate_actions_can_be_set_on_a_closed_env():
    envs = shmvec.ShmVecEnv(counting_fns(4), num_workers=2, context="fork")
    envs.close()
    envs.validate_actions = False
    envs.validate_actions = True  # (a Discrete batch would be staged, on an open env)
    assert envs.validate_actions
