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
from shmvec import slow_loop
from shmvec.checks import usable_cores
from shmvec.diagnose import Diagnosis, LoopWindow, ThreadTime
from shmvec.slow_loop import SlowLoopWarning, SlowLoopWatch, warning_text
from shmvec.torch_threads import TorchThreads
from envs_for_tests import FaultyEnv, NoneInfoEnv, SlowEnv

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's counters are in /proc")


def test_a_window_accounts_for_the_loops_time():
    with shmvec.make("CartPole-v1", num_envs=4, num_workers=2) as envs:
        envs.reset(seed=0)
        hooks = envs._session.hooks
        with envs.diagnose() as window:
            assert window in hooks
            assert window.diagnosis is None
            for _ in range(300):
                envs.step(np.zeros(4, dtype=np.int64))
                t = time.perf_counter()
                while time.perf_counter() - t < 1e-3:  # the loop's own code, a millisecond a step
                    pass
        assert window not in hooks  # nothing measured outside the window
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
    assert warning_text(diagnosis()) is None  # healthy
    assert warning_text(diagnosis(workers=starved)) is None  # workers and loop only take turns
    text = warning_text(diagnosis(workers=starved, caller_threads=[ThreadTime("7 (python)", 0.9, 0.0)]))
    assert "waited 1.00 s for a core and ran 0.40 s" in text and "other threads" in text
    assert "other processes kept 1.5" in warning_text(diagnosis(workers=starved, other_cores=1.5))
    # starved, but less than they ran: diagnose() names it, the warning does not
    mild = [ThreadTime("pid 1", 0.4, 0.3), ThreadTime("pid 2", 0.4, 0.3)]
    d = diagnosis(workers=mild, other_cores=1.5)
    assert d.causes() and warning_text(d) is None


@pytest.fixture
def short_window(monkeypatch):
    monkeypatch.setattr(slow_loop, "WARMUP_STEPS", 20)
    monkeypatch.setattr(slow_loop, "WINDOW_S", 1.0)


@pytest.fixture
def judged(monkeypatch):
    """Every judged window's diagnosis, each found a clear case (``"a clear case"``)."""
    seen = []

    def warning(diagnosis):
        seen.append(diagnosis)
        return "a clear case"

    monkeypatch.setattr(slow_loop, "warning_text", warning)
    return seen


def rollouts(envs, count, steps=16, update_s=0.05, seconds=None):
    """A PPO-like loop: ``count`` rollouts of ``steps`` steps (or as many as fit in ``seconds``),
    an update of ``update_s`` after each.
    """
    t0 = time.perf_counter()
    for _ in range(count):
        for _ in range(steps):
            envs.step(np.zeros(envs.num_envs, dtype=np.int64))
        time.sleep(update_s)
        if seconds is not None and time.perf_counter() - t0 > seconds:
            return


def watch_of(envs):
    (watch,) = [h for h in envs._session.hooks._hooks if isinstance(h, SlowLoopWatch)] or [None]
    return watch


def test_a_loop_that_starves_its_workers_is_warned_about_once(short_window):
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cores() + 1)]
    try:
        time.sleep(0.3)
        for warn in (True, False):
            with shmvec.ShmVecEnv(
                [lambda: SlowEnv(500.0) for _ in range(4)], num_workers=2, warn_slow_loop=warn
            ) as envs:
                envs.reset(seed=0)
                watch = watch_of(envs)
                assert (watch is not None) is warn
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    rollouts(envs, 1000, update_s=0.02, seconds=4.0)
                said = [w for w in caught if issubclass(w.category, SlowLoopWarning)]
                if warn:
                    (one,) = said
                    assert "waited" in str(one.message) and "other processes kept" in str(one.message)
                    assert "warn_slow_loop=False" in str(one.message)
                    assert one.filename == __file__  # the user's line, under shmvec's own hooks
                    assert watch not in envs._session.hooks  # measured once: out of the step path
                    assert not any(isinstance(h, LoopWindow) for h in envs._session.hooks._hooks)
                else:
                    assert said == []
    finally:
        for p in burners:
            p.kill()
            p.wait()


class Rhythm:
    """A stand-in for TorchThreads' reading of the loop's rhythm."""

    settled, period, rollout_done = False, 0, False

    def enter(self): ...
    def leave(self): ...
    def close(self): ...


def test_the_window_waits_for_the_threads_rhythm_to_settle(short_window):
    with shmvec.make("CartPole-v1", num_envs=2, num_workers=1, warn_slow_loop=False) as envs:
        hooks, rhythm = envs._session.hooks, Rhythm()
        watch = SlowLoopWatch(rhythm, hooks, envs._session.pool.worker_clocks)
        hooks.add(watch)
        envs.reset(seed=0)
        for _ in range(100):
            envs.step(np.zeros(2, dtype=np.int64))
        assert watch.window is None and watch.warmup == 20
        rhythm.settled, rhythm.period = True, 16
        for _ in range(25):
            envs.step(np.zeros(2, dtype=np.int64))
        assert watch.window is not None and watch.window.steps == 5  # timed from the step after the 20th


def test_a_loop_without_a_rhythm_is_not_judged(short_window, judged):
    """A loop that never settles on a rhythm (or breaks it inside the window: a harness pausing
    for seconds between its stretches of steps) is left alone: its gaps are not the workers' steps.
    """
    with shmvec.make("CartPole-v1", num_envs=2, num_workers=1, warn_slow_loop=False) as envs:
        hooks, rhythm = envs._session.hooks, Rhythm()
        watch = SlowLoopWatch(rhythm, hooks, envs._session.pool.worker_clocks)
        hooks.add(watch)
        envs.reset(seed=0)
        rhythm.settled = True  # settled, with no rhythm found
        envs.step(np.zeros(2, dtype=np.int64))
        assert watch not in hooks and watch.window is None
        watch = SlowLoopWatch(rhythm, hooks, envs._session.pool.worker_clocks)
        hooks.add(watch)
        rhythm.period = 16
        for _ in range(30):
            envs.step(np.zeros(2, dtype=np.int64))
        window = watch.window
        assert window is not None and window in hooks
        rhythm.period = 0  # the rhythm broke inside the window
        envs.step(np.zeros(2, dtype=np.int64))
        assert watch not in hooks and window not in hooks
    assert judged == []


def test_the_automatic_window_leaves_the_updates_out(short_window, judged, monkeypatch):
    monkeypatch.setattr(slow_loop, "WINDOW_S", 0.01)
    with shmvec.make("CartPole-v1", num_envs=2, num_workers=1) as envs:
        envs.reset(seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SlowLoopWarning)
            rollouts(envs, 12, update_s=0.25)
    (d,) = judged
    # 64 steps or more, over 4 rollouts or more: 3 updates inside the window at least, 0.75 s,
    # none of it counted (the bound leaves the steps themselves 0.6 s on a loaded machine)
    assert d.steps >= 64 and d.wall_s < 0.6 and d.between_steps_s < 0.25


def test_a_warning_made_an_error_costs_no_step(short_window, judged, monkeypatch):
    monkeypatch.setattr(slow_loop, "WINDOW_S", 0.05)
    with shmvec.ShmVecEnv([lambda: NoneInfoEnv(length=10**6)] * 2, num_workers=1) as envs:
        envs.reset(seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", SlowLoopWarning)
            count = 0
            with pytest.raises(SlowLoopWarning, match="a clear case"):
                while True:
                    for _ in range(16):
                        obs, *_ = envs.step(np.zeros(2, dtype=np.int64))
                        count += 1
                        assert obs[0, 0] == count
                    time.sleep(0.02)
            assert len(judged) == 1
            obs, *_ = envs.step(np.zeros(2, dtype=np.int64))  # the step that raised never ran
            assert obs[0, 0] == count + 1


def test_a_window_judged_inside_diagnose_leaves_the_step_path_after_it(short_window, judged, monkeypatch):
    monkeypatch.setattr(slow_loop, "WINDOW_S", 0.01)
    with shmvec.make("CartPole-v1", num_envs=2, num_workers=1) as envs:
        envs.reset(seed=0)
        hooks = envs._session.hooks
        watch = watch_of(envs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SlowLoopWarning)
            with envs.diagnose() as window:
                rollouts(envs, 40, update_s=0.02)
            assert len(judged) == 1 and watch not in hooks and window not in hooks
        assert [type(h) for h in hooks._hooks] == [TorchThreads]
        assert window.diagnosis.steps == 640


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
