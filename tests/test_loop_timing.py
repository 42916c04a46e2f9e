"""ShmVecEnv.diagnose: where a loop's time goes, and the cause named on a clear case; the one
automatic window and its warning (shmvec.slow_loop)."""

import subprocess
import sys
import time
import warnings
from functools import partial

import numpy as np
import pytest

import shmvec
from shmvec import collect_threads, slow_loop
from shmvec.checks import usable_cores
from shmvec.loop_timing import Diagnosis, ThreadTime
from shmvec.slow_loop import SlowLoopWarning, SlowLoopWatch
from envs_for_tests import FaultyEnv, NoneInfoEnv, SlowEnv

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


def test_recv_calls_and_rollout_rows_are_the_steps_of_a_window():
    with shmvec.ShmVecEnv([lambda: SlowEnv(200.0) for _ in range(4)], num_workers=2, batch_size=2) as envs:
        envs.async_reset(seed=0)
        with envs.diagnose() as window:
            for _ in range(100):
                *_, ids = envs.recv()
                envs.send(np.zeros(len(ids), dtype=np.int64), ids)
        d = window.diagnosis
        assert d.steps == 100 and 0 < d.in_shmvec_s < d.wall_s
    with shmvec.ShmVecEnv([lambda: SlowEnv(200.0) for _ in range(4)], num_workers=2) as envs:
        envs.reset(seed=0)
        with envs.diagnose() as window:
            envs.rollout(lambda obs: np.zeros(4, dtype=np.int64), num_steps=50)
        assert window.diagnosis.steps == 50


def test_each_worker_reports_its_time_running_commands_apart_from_waiting_for_them():
    with shmvec.ShmVecEnv([lambda: SlowEnv(1000.0) for _ in range(2)], num_workers=2) as envs:
        envs.reset(seed=0)
        with envs.diagnose() as window:
            for _ in range(100):
                envs.step(np.zeros(2, dtype=np.int64))
                t = time.perf_counter()
                while time.perf_counter() - t < 2e-3:  # the loop's own code, while the workers wait
                    pass
    d = window.diagnosis
    for w in d.workers:
        # 100 steps of 1 ms each, in the window of about 300 ms
        assert 0.09 <= w.busy_s <= 0.9 * d.wall_s
    assert "running commands" in str(d)


def test_the_warning_is_for_the_clearest_case_only():
    starved = [ThreadTime("pid 1", 0.2, 0.5), ThreadTime("pid 2", 0.2, 0.5)]
    assert diagnosis().warning() is None  # healthy
    assert diagnosis(workers=starved).warning() is None  # workers and loop only take turns
    text = diagnosis(workers=starved, caller_threads=[ThreadTime("7 (python)", 0.9, 0.0)]).warning()
    assert "waited 1.00 s for a core and ran 0.40 s" in text and "other threads" in text
    assert "other processes kept 1.5" in diagnosis(workers=starved, other_cores=1.5).warning()
    # starved, but less than they ran: diagnose() names it, the warning does not
    mild = [ThreadTime("pid 1", 0.4, 0.3), ThreadTime("pid 2", 0.4, 0.3)]
    d = diagnosis(workers=mild, other_cores=1.5)
    assert d.causes() and d.warning() is None


@pytest.fixture
def short_window(monkeypatch):
    monkeypatch.setattr(slow_loop, "WARMUP_STEPS", 20)
    monkeypatch.setattr(slow_loop, "WINDOW_S", 1.0)
    monkeypatch.setattr(collect_threads, "GIVE_UP_STEPS", 50)  # a loop of steps alone: no rhythm to wait for


@pytest.fixture
def judged(monkeypatch):
    """Every judged window's diagnosis, each found a clear case (``"a clear case"``)."""
    seen = []

    def warning(self):
        seen.append(self)
        return "a clear case"

    monkeypatch.setattr(Diagnosis, "warning", warning)
    return seen


def test_a_loop_that_starves_its_workers_is_warned_about_once(short_window):
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cores() + 1)]
    try:
        time.sleep(0.3)
        for warn in (True, False):
            with shmvec.ShmVecEnv(
                [lambda: SlowEnv(500.0) for _ in range(4)], num_workers=2, warn_slow_loop=warn
            ) as envs:
                envs.reset(seed=0)
                watch = envs._around_step
                assert isinstance(watch, SlowLoopWatch) is warn
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    t = time.perf_counter()
                    while time.perf_counter() - t < 3.0:
                        envs.step(np.zeros(4, dtype=np.int64))
                said = [w for w in caught if issubclass(w.category, SlowLoopWarning)]
                if warn:
                    (one,) = said
                    assert "waited" in str(one.message) and "other processes kept" in str(one.message)
                    assert "warn_slow_loop=False" in str(one.message)
                    assert one.filename == __file__  # the user's line, under shmvec's own hooks
                    assert envs._around_step is watch.hooks  # measured once: out of the step path
                else:
                    assert said == []
    finally:
        for p in burners:
            p.kill()
            p.wait()


def test_the_window_waits_for_the_threads_rhythm_to_settle(short_window):
    class Hooks:
        settled, rollout_done = False, False

        def enter(self): ...
        def leave(self): ...
        def close(self): ...

    with shmvec.make("CartPole-v1", num_envs=2, num_workers=1) as envs:
        hooks = Hooks()
        envs._around_step = watch = SlowLoopWatch(hooks, envs)
        envs.reset(seed=0)
        for _ in range(100):
            envs.step(np.zeros(2, dtype=np.int64))
        assert watch.window is None and watch.warmup == 20
        hooks.settled = True
        for _ in range(25):
            envs.step(np.zeros(2, dtype=np.int64))
        assert watch.window is not None and watch.window.steps == 6  # from the 20th settled step on


def test_the_automatic_window_leaves_the_updates_out(short_window, judged, monkeypatch):
    monkeypatch.setattr(slow_loop, "WINDOW_S", 0.01)
    with shmvec.make("CartPole-v1", num_envs=2, num_workers=1) as envs:
        envs.reset(seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SlowLoopWarning)
            for _ in range(12):  # rollouts of 16 steps, a 0.1 s update after each
                for _ in range(16):
                    envs.step(np.zeros(2, dtype=np.int64))
                time.sleep(0.1)
    (d,) = judged
    # 64 steps or more, over 4 rollouts or more: 0.4 s of updates at least, none of it counted
    assert d.steps >= 64 and d.wall_s < 0.2 and d.between_steps_s < 0.1


def test_a_warning_made_an_error_costs_no_step(short_window, judged, monkeypatch):
    monkeypatch.setattr(slow_loop, "WINDOW_S", 0.05)
    with shmvec.ShmVecEnv([lambda: NoneInfoEnv(length=10**6)] * 2, num_workers=1) as envs:
        envs.reset(seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", SlowLoopWarning)
            count = 0
            with pytest.raises(SlowLoopWarning, match="a clear case"):
                while True:
                    obs, *_ = envs.step(np.zeros(2, dtype=np.int64))
                    count += 1
                    assert obs[0, 0] == count
            assert envs._around_step is not None and len(judged) == 1
            obs, *_ = envs.step(np.zeros(2, dtype=np.int64))  # the step that raised never ran
            assert obs[0, 0] == count + 1


def test_a_window_judged_inside_diagnose_leaves_the_step_path_after_it(short_window, judged, monkeypatch):
    monkeypatch.setattr(slow_loop, "WINDOW_S", 0.01)
    with shmvec.make("CartPole-v1", num_envs=2, num_workers=1) as envs:
        envs.reset(seed=0)
        watch = envs._around_step
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SlowLoopWarning)
            with envs.diagnose() as window:
                for _ in range(1000):
                    envs.step(np.zeros(2, dtype=np.int64))
            assert len(judged) == 1 and envs._around_step is watch  # diagnose() gave its hooks back
            envs.step(np.zeros(2, dtype=np.int64))
        assert envs._around_step is watch.hooks
        assert window.diagnosis.steps == 1000


def test_a_worker_restarted_inside_a_window_is_left_out_of_it():
    """Its new process is not the one whose counters began the window."""
    fns = [partial(FaultyEnv, "exit" if i == 0 else "none", at=5) for i in range(4)]
    with shmvec.ShmVecEnv(fns, num_workers=2, on_error="restart") as envs:
        envs.reset(seed=0)
        before = envs._session.pool.worker_pids
        with envs.diagnose() as window:
            for _ in range(8):
                envs.step(np.zeros(4, dtype=np.int64))
        assert envs.restarts and envs._session.pool.worker_pids[0] != before[0]
    (worker,) = window.diagnosis.workers
    assert worker.name == f"pid {before[1]}" and worker.busy_s > 0
