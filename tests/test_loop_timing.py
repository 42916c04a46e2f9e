"""ShmVecEnv.diagnose: where a loop's time goes, and the cause named on a clear case."""

import subprocess
import sys
import time

import numpy as np
import pytest

import shmvec
from shmvec.checks import usable_cores
from shmvec.loop_timing import Diagnosis, ThreadTime

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's counters are in /proc")


def test_a_window_accounts_for_the_loops_time():
    with shmvec.make("CartPole-v1", num_envs=4, num_workers=2) as envs:
        envs.reset(seed=0)
        hooks = envs._around_step
        with envs.diagnose() as window:
            assert window.diagnosis is None
            for _ in range(300):
                envs.step(np.zeros(4, dtype=np.int64))
                t = time.perf_counter()
                while time.perf_counter() - t < 1e-3:  # the loop's own code, a millisecond a step
                    pass
        assert envs._around_step is hooks  # nothing measured outside the window
        d = window.diagnosis
        assert d.steps == 300
        assert 0 < d.in_shmvec_s < d.wall_s and d.between_steps_s >= 0.3
        assert d.in_shmvec_s + d.between_steps_s == pytest.approx(d.wall_s)
        assert len(d.workers) == 2 and all(w.cpu_s > 0 for w in d.workers)
        assert str(d).startswith("300 steps in") and "worker 1" in str(window)


def test_other_processes_on_the_workers_cores_are_named():
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cores())]
    try:
        time.sleep(0.3)
        with shmvec.make("CartPole-v1", num_envs=4, num_workers=2) as envs:
            envs.reset(seed=0)
            with envs.diagnose() as window:
                for _ in range(400):
                    envs.step(np.zeros(4, dtype=np.int64))
    finally:
        for p in burners:
            p.kill()
            p.wait()
    d = window.diagnosis
    assert d.starved_share > 0.5 and d.other_cores >= 0.5 * usable_cores()
    assert any("other processes kept" in cause for cause in d.causes())


def diagnosis(**kw) -> Diagnosis:
    base = dict(wall_s=1.0, steps=100, in_shmvec_s=0.8, between_steps_s=0.2,
                workers=[ThreadTime("pid 1", 0.4, 0.1), ThreadTime("pid 2", 0.4, 0.1)],
                caller_threads=[], other_cores=0.0, cores=2, pools=[])  # fmt: skip
    return Diagnosis(**{**base, **kw})


def test_no_cause_without_a_clear_case():
    assert diagnosis().causes() == []
    assert str(diagnosis()).endswith("why: nothing stands out")


def test_the_callers_threads_are_named_by_their_pool():
    starved = [ThreadTime("pid 1", 0.2, 0.5), ThreadTime("pid 2", 0.2, 0.5)]
    d = diagnosis(workers=starved, caller_threads=[ThreadTime("7 (python)", 0.9, 0.0)],
                  pools=["torch's intra-op pool (2 threads)"])  # fmt: skip
    (cause,) = d.causes()
    assert "waited 1.00 s for a core and ran 0.40 s" in cause
    assert "torch's intra-op pool (2 threads)" in cause and "torch_threads='auto'" in cause
    assert "take turns" not in cause  # a cause was found: no guess


def test_workers_and_loop_taking_turns_is_the_last_guess():
    d = diagnosis(workers=[ThreadTime("pid 1", 0.2, 0.5), ThreadTime("pid 2", 0.2, 0.5)])
    (cause,) = d.causes()
    assert "take turns on 2 cores: try num_workers=1" in cause


def test_the_loops_own_code_is_named_when_it_dominates():
    (cause,) = diagnosis(in_shmvec_s=0.2, between_steps_s=0.8).causes()
    assert cause.startswith("the loop's own code") and "80%" in cause and "other 20%" in cause
