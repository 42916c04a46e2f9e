"""The compiled broadcast round (``shmvec.broadcast``) on its own terms: its IR is whole, its plan
says what it did, and its wait hands a dead worker to the general wait.

Its fault paths, struck at each of the caller's points, are in ``tests/test_round_faults.py``.
"""

from __future__ import annotations

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
