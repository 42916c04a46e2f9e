"""Faults in envs and workers come back as clear errors, without hangs or leaks."""

from __future__ import annotations

import functools
import signal
import time

import numpy as np
import pytest
from envs_for_tests import FaultyEnv

import shmvec


def faulty(n, fault, bad_env, at=3):
    return [functools.partial(FaultyEnv, fault if i == bad_env else "none", at) for i in range(n)]


@pytest.mark.parametrize("bad_env, step_in_main", [(1, True), (3, True), (3, False)])
def test_exception_in_step(bad_env, step_in_main):
    envs = shmvec.ShmVecEnv(faulty(4, "raise", bad_env), num_workers=2, step_in_main=step_in_main)
    envs.reset(seed=0)
    with pytest.raises(shmvec.WorkerError) as info:
        for _ in range(5):
            envs.step(np.zeros(4, dtype=np.int64))
    err = info.value
    assert err.env_index == bad_env and err.phase == "step"
    assert err.worker_index == bad_env // 2
    assert err.exc_type == "ZeroDivisionError" and "step exploded" in str(err)
    assert "envs_for_tests.py" in err.remote_traceback
    assert envs.closed  # on_error="raise": closed cleanly


def test_exception_in_constructor():
    with pytest.raises(shmvec.WorkerError, match="constructor exploded") as info:
        shmvec.ShmVecEnv(faulty(4, "construct", 2), num_workers=2, step_in_main=False)
    assert info.value.env_index == 2 and info.value.phase == "construct"
    with pytest.raises(shmvec.WorkerError, match="constructor exploded"):
        shmvec.ShmVecEnv(faulty(4, "construct", 3), num_workers=2)  # the main process's block


def test_exception_in_reset():
    envs = shmvec.ShmVecEnv(faulty(3, "reset", 0), num_workers=3)
    with pytest.raises(shmvec.WorkerError, match="reset exploded") as info:
        envs.reset()
    assert info.value.env_index == 0 and info.value.phase == "reset"


@pytest.mark.parametrize("fault, expect", [("kill", "killed by SIGKILL"), ("exit", "exited with code 3")])
def test_worker_death_is_reported(fault, expect):
    envs = shmvec.ShmVecEnv(faulty(4, fault, 0), num_workers=2)
    envs.reset(seed=0)
    t0 = time.monotonic()
    with pytest.raises(shmvec.WorkerDied, match=expect) as info:
        for _ in range(5):
            envs.step(np.zeros(4, dtype=np.int64))
    assert time.monotonic() - t0 < 2.0
    assert info.value.worker_index == 0
    assert envs.closed


def test_hung_step_times_out():
    envs = shmvec.ShmVecEnv(faulty(2, "hang", 0), num_workers=2, timeout=0.5)
    envs.reset(seed=0)
    t0 = time.monotonic()
    with pytest.raises(shmvec.StepTimeout, match="timeout"):
        for _ in range(5):
            envs.step(np.zeros(2, dtype=np.int64))
    assert time.monotonic() - t0 < 3.0
    assert envs.closed


def test_wrong_observation_shape_names_env_and_field():
    envs = shmvec.ShmVecEnv(faulty(4, "shape", 2), num_workers=2)
    envs.reset(seed=0)
    with pytest.raises(shmvec.WorkerError, match=r"env 2 returned observation of shape \(5,\), expected \(4,\)"):
        for _ in range(5):
            envs.step(np.zeros(4, dtype=np.int64))


def test_many_envs_alive_at_once_do_not_collide():
    pool = [shmvec.make("CartPole-v1", num_envs=2, num_workers=2) for _ in range(4)]
    try:
        for i, envs in enumerate(pool):
            envs.reset(seed=i)
        for envs in pool:
            envs.step(np.zeros(2, dtype=np.int64))
    finally:
        for envs in pool:
            envs.close()


def test_no_segment_name_exists_while_running():
    import os

    with shmvec.make("CartPole-v1", num_envs=2, num_workers=2) as envs:
        envs.reset(seed=0)
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shmvec_{os.getpid()}_")]


SCRIPT = r"""
import signal, sys, time, numpy as np
# Started from a background job of a shell without job control, a process inherits SIGINT
# ignored and Python installs no KeyboardInterrupt handler: give it the one a terminal user has.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {tests!r})
import shmvec
from envs_for_tests import SlowEnv
envs = shmvec.ShmVecEnv([lambda: SlowEnv(2000.0)] * 4, num_workers=3)
envs.reset(seed=0)
print("PIDS", *[p.pid for p in envs._pool.procs], flush=True)
while True:
    envs.step(np.zeros(4, dtype=np.int64))
"""


def _start_script():
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(tests=os.path.dirname(__file__))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), proc.stderr.read()
    return proc, [int(p) for p in line.split()[1:]]


def _gone(pids, within):
    import os

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split()[2] != "Z":
                        alive.append(pid)
            except (ProcessLookupError, FileNotFoundError):
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_reaches_the_user_promptly_and_leaves_nothing():
    import os
    import signal

    proc, pids = _start_script()
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()  # a test that fails leaves nothing running either
    assert time.monotonic() - t0 < 3.0
    assert "KeyboardInterrupt" in err
    assert err.count("Traceback") == 1, err  # the main process's only: workers stay quiet
    assert _gone(pids, 3.0)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shmvec_{proc.pid}_")]


def test_main_process_killed_workers_exit_and_nothing_is_left():
    import os
    import signal

    proc, pids = _start_script()
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=5)
    assert _gone(pids, 3.0), "workers outlived their SIGKILLed parent"
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shmvec_{proc.pid}_")]


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_clean_exit_prints_no_resource_tracker_warning(context):
    import subprocess
    import sys

    code = (
        "import numpy as np, shmvec\n"
        f"envs = shmvec.make('CartPole-v1', num_envs=4, num_workers=2, context={context!r})\n"
        "envs.reset(seed=0); envs.step(np.zeros(4, dtype=np.int64))\n"
        "env2 = shmvec.make('CartPole-v1', num_envs=2, num_workers=2, context={context!r})\n"
        "envs.close()\n"  # env2 is left to interpreter exit
    ).replace("{context!r}", repr(context))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "resource_tracker" not in out.stderr and "leaked" not in out.stderr, out.stderr
    assert out.stderr.strip() == "", out.stderr


def test_segment_is_owner_only(monkeypatch):
    import os
    import stat
    from multiprocessing import shared_memory

    modes = []
    real_unlink = shared_memory.SharedMemory.unlink

    def unlink(self):
        modes.append(stat.S_IMODE(os.stat(f"/dev/shm/{self.name}").st_mode))
        real_unlink(self)

    monkeypatch.setattr(shared_memory.SharedMemory, "unlink", unlink)
    with shmvec.make("CartPole-v1", num_envs=2, num_workers=2) as envs:
        envs.reset(seed=0)
    assert modes == [0o600]


@pytest.mark.parametrize("fault, bad_env, timeout", [("raise", 0, None), ("kill", 1, None), ("hang", 0, 0.5),
                                                     ("raise", 3, None)])
def test_on_error_restart_replaces_the_lane_and_carries_on(fault, bad_env, timeout):
    envs = shmvec.ShmVecEnv(faulty(4, fault, bad_env, at=3), num_workers=2, on_error="restart", timeout=timeout)
    envs.reset(seed=0)
    lane = range(0, 2) if bad_env < 2 else range(2, 4)
    for t in range(1, 6):
        obs, rew, term, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
        if t == 3:
            assert infos["_restarted"].tolist() == [i in lane for i in range(4)]
            assert trunc.tolist() == [i in lane for i in range(4)] and not term.any()
            assert rew.tolist() == [0.0 if i in lane else 1.0 for i in range(4)]
        else:
            assert "restarted" not in infos and not trunc.any()
    assert len(envs.restarts) == 1
    w, env_range, exc = envs.restarts[0]
    assert env_range == lane
    assert isinstance(exc, {"raise": shmvec.WorkerError, "kill": shmvec.WorkerDied,
                            "hang": shmvec.StepTimeout}[fault])
    assert not envs.closed
    envs.close()


def test_restart_of_the_main_process_block_and_bad_option():
    calls = {"n": 0}

    def make():
        calls["n"] += 1
        return FaultyEnv("raise", at=1)

    envs = shmvec.ShmVecEnv([make] * 2, num_workers=1, on_error="restart")
    envs.reset(seed=0)
    obs, rew, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
    assert trunc.all() and infos["_restarted"].all()
    with pytest.raises(ValueError, match="on_error"):
        shmvec.ShmVecEnv([make], on_error="ignore")
    envs.close()


@pytest.mark.parametrize("bad_env", [1, 4])  # mid-block: in the worker's block (0-2), in main's (3-5)
def test_wrong_observation_shape_mid_block_names_that_env(bad_env):
    """Small observations are written once per block; one that does not fit still names its env."""
    envs = shmvec.ShmVecEnv(faulty(6, "shape", bad_env), num_workers=2)
    envs.reset(seed=0)
    with pytest.raises(shmvec.WorkerError, match=rf"env {bad_env} returned observation of shape \(5,\)") as err:
        for _ in range(5):
            envs.step(np.zeros(6, dtype=np.int64))
    assert err.value.env_index == bad_env and envs.closed


def test_wrong_observation_dtype_is_refused():
    envs = shmvec.ShmVecEnv(faulty(2, "dtype", 1), num_workers=2)
    envs.reset(seed=0)
    with pytest.raises(shmvec.WorkerError, match=r"env 1 returned observation of dtype complex64, expected float32"):
        for _ in range(5):
            envs.step(np.zeros(2, dtype=np.int64))


@pytest.mark.parametrize("fault, match", [("nan_obs", r"env 2 returned a non-finite observation"),
                                          ("inf_reward", r"env 2 returned a non-finite reward")])
def test_non_finite_values_are_caught_on_request(fault, match):
    with shmvec.ShmVecEnv(faulty(4, fault, 2, at=2), num_workers=2, check_finite=True) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(shmvec.NonFiniteError, match=match):
            envs.step(np.zeros(4, dtype=np.int64))
        envs.step(np.zeros(4, dtype=np.int64))  # still usable
    with shmvec.ShmVecEnv(faulty(4, fault, 2, at=2), num_workers=2) as envs:  # off by default
        envs.reset(seed=0)
        for _ in range(3):
            envs.step(np.zeros(4, dtype=np.int64))


@pytest.mark.parametrize("command", ["call", "reset_options", "set_attr", "rollout"])
def test_worker_killed_while_idle_is_reported_by_a_command_with_a_payload(command):
    """The OOM killer (or a user's kill) may strike a worker between commands. The next command
    that sends it a pickled payload raises WorkerDied (it was a bare BrokenPipeError), and the
    other worker, which got its payload, is not left waiting for it (closing took 5 s)."""
    import os

    envs = shmvec.ShmVecEnv(faulty(4, "none", 0), num_workers=2)
    envs.reset(seed=0)
    os.kill(envs.worker_pids[0], signal.SIGKILL)
    time.sleep(0.1)  # let it die
    t0 = time.monotonic()
    with pytest.raises(shmvec.WorkerDied, match=r"worker 0 \(envs 0\.\.1\) was killed by SIGKILL"):
        if command == "call":
            envs.call("double", 1)
        elif command == "reset_options":
            envs.reset(options={"scale": 2.0})
        elif command == "set_attr":
            envs.set_attr("at", 5)
        else:
            envs.rollout(lambda obs: np.zeros(4, dtype=np.int64), 2)
    assert envs.closed
    assert time.monotonic() - t0 < 2.0
