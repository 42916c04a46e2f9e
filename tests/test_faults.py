"""Faults in envs and workers come back as clear errors, without hangs or leaks."""

from __future__ import annotations

import functools
import re
import signal
import time

import numpy as np
import pytest
from envs_for_tests import FaultyEnv, SlowEnv

import shmvec


def faulty(n, fault, bad_env, at=3):
    return [functools.partial(FaultyEnv, fault if i == bad_env else "none", at) for i in range(n)]


@pytest.mark.parametrize("bad_env, step_in_main", [(1, True), (3, True), (3, False)])
def test_exception_in_step(bad_env, step_in_main):
    envs = shmvec.ShmVecEnv(faulty(4, "raise", bad_env), num_workers=2 - step_in_main, step_in_main=step_in_main)
    envs.reset(seed=0)
    with pytest.raises(shmvec.WorkerError) as info:
        for _ in range(5):
            envs.step(np.zeros(4, dtype=np.int64))
    err = info.value
    assert err.env_index == bad_env and err.phase == "step"
    # Worker k steps block k; the calling process's block (envs 2, 3 with step_in_main) has no worker.
    assert err.worker_index == (None if step_in_main and bad_env >= 2 else bad_env // 2)
    assert err.exc_type == "ZeroDivisionError" and "step exploded" in str(err)
    assert "envs_for_tests.py" in err.remote_traceback
    assert envs.closed  # on_error="raise": closed cleanly


def test_exception_in_constructor():
    with pytest.raises(shmvec.WorkerError, match="constructor exploded") as info:
        shmvec.ShmVecEnv(faulty(4, "construct", 2), num_workers=2, step_in_main=False)
    assert info.value.env_index == 2 and info.value.phase == "construct"
    with pytest.raises(shmvec.WorkerError, match="constructor exploded"):
        shmvec.ShmVecEnv(faulty(4, "construct", 3), num_workers=1, step_in_main=True)  # the calling process's block


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
    with pytest.raises(shmvec.WorkerError, match=r"env 2 returned observation of shape \(5,\), expected \(4,\)") as info:
        for _ in range(5):
            envs.step(np.zeros(4, dtype=np.int64))
    assert info.value.exc_type == "EnvObsError"
    # Where it is raised (the calling process's block), it is a shmvec error and a ValueError.
    from shmvec.errors import EnvObsError

    assert issubclass(EnvObsError, shmvec.ShmVecError) and issubclass(EnvObsError, ValueError)


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
print("PIDS", *envs.worker_pids, flush=True)
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


@pytest.mark.parametrize("fault, match", [("array_reward", r"env 1 returned reward array\(\[1\., 1\., 1\.\]\): expected a float"),
                                          ("none_reward", r"env 1 returned reward None: expected a float"),
                                          ("array_flag", r"env 1 \((worker \d|the calling process)\) raised ValueError during step: The truth value of an array")])
@pytest.mark.parametrize("step_in_main", [False, True])
def test_a_reward_or_flag_that_is_not_a_scalar_names_its_env(fault, match, step_in_main):
    """Rewards and flags are written once per lane; a value that is not a scalar names its env."""
    envs = shmvec.ShmVecEnv(faulty(2, fault, 1, at=2), num_workers=1, step_in_main=step_in_main)
    envs.reset(seed=0)
    envs.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(shmvec.WorkerError, match=match) as err:
        envs.step(np.zeros(2, dtype=np.int64))
    assert err.value.env_index == 1 and envs.closed


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


# -- the fault suite: every kind of env death, every start method, default settings ------------
# Three envs in two workers: env 1 fails, in worker 0 next to a healthy env 0; worker 1 (env 2)
# is never at fault. Nothing but `context`, `on_error` and, for the hang, `timeout` is set:
# every env runs in a worker, as by default.
CONTEXTS = ["fork", "forkserver", "spawn"]
HANG_TIMEOUT = 0.3
# fault -> (what the caller gets, its message); WorkerDied names the exit code or the signal.
DEATHS = {
    "raise": (shmvec.WorkerError, r"env 1 \(worker 0\) raised ZeroDivisionError during step: step exploded"),
    "exit": (shmvec.WorkerDied, r"worker 0 \(envs 0\.\.1\) exited with code 3$"),
    "kill": (shmvec.WorkerDied, r"worker 0 \(envs 0\.\.1\) was killed by SIGKILL$"),
    "segfault": (shmvec.WorkerDied, r"worker 0 \(envs 0\.\.1\) was killed by SIGSEGV$"),
    "hang": (shmvec.StepTimeout, rf"worker 0 \(envs 0\.\.1\) did not finish within timeout={HANG_TIMEOUT} s"),
    "memory": (shmvec.WorkerError, r"env 1 \(worker 0\) raised MemoryError during step"),
    "oom_kill": (shmvec.WorkerDied, r"worker 0 \(envs 0\.\.1\) was killed by SIGKILL$"),
}
NO_ACTION = np.zeros(3, dtype=np.int64)


def _suite_env(fault: str, context: str, on_error: str) -> shmvec.ShmVecEnv:
    extra = {"timeout": HANG_TIMEOUT} if fault == "hang" else {}
    return shmvec.ShmVecEnv(faulty(3, fault, 1, at=2), num_workers=2, context=context, on_error=on_error, **extra)


def _check_error(err: Exception, fault: str) -> None:
    """The error names what failed and where, and carries the worker's own account."""
    kind, match = DEATHS[fault]
    assert type(err) is kind and re.search(match, str(err)), str(err)
    if kind is shmvec.WorkerError:
        assert (err.env_index, err.worker_index, err.phase) == (1, 0, "step")
        assert err.exc_type == ("MemoryError" if fault == "memory" else "ZeroDivisionError")
        assert "envs_for_tests.py" in err.remote_traceback
    if kind is shmvec.WorkerDied:
        assert (err.worker_index, err.envs) == (0, range(0, 2))
        assert err.exitcode == {"exit": 3, "segfault": -signal.SIGSEGV}.get(fault, -signal.SIGKILL)


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("fault", list(DEATHS))
def test_every_death_raises_a_clear_error_and_closes(fault, context):
    """on_error="raise" (the default): the step raises the shmvec error that says what happened,
    at once (the hang: at its timeout), and the vector env closes, its workers gone.

    The memory blow-ups are made safe for a shared machine: the env caps its own worker's
    address space (RLIMIT_AS) just above what it uses before allocating, so ``memory`` ends in a
    MemoryError after 128 MiB, and ``oom_kill`` plays the kernel OOM killer (resident memory,
    then SIGKILL) instead of provoking the real one, which may pick any process.
    """
    envs = _suite_env(fault, context, "raise")
    pids = envs.worker_pids
    envs.reset(seed=0)
    envs.step(NO_ACTION)
    t0 = time.monotonic()
    with pytest.raises(shmvec.ShmVecError) as info:
        envs.step(NO_ACTION)
    assert time.monotonic() - t0 < 2.0 + (HANG_TIMEOUT if fault == "hang" else 0.0)
    _check_error(info.value, fault)
    assert envs.closed
    assert _gone(pids, 3.0)
    with pytest.raises(shmvec.ClosedError):
        envs.step(NO_ACTION)


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("fault", list(DEATHS))
def test_every_death_restarts_its_worker(fault, context):
    """on_error="restart": the failed worker is replaced (a new process) and its envs start new
    episodes in the same step, flagged in infos["restarted"]; the other worker and the step
    after are untouched."""
    envs = _suite_env(fault, context, "restart")
    envs.reset(seed=0)
    envs.step(NO_ACTION)
    old = envs.worker_pids
    obs, rew, term, trunc, infos = envs.step(NO_ACTION)
    assert infos["_restarted"].tolist() == [True, True, False] and infos["restarted"][:2].all()
    assert trunc.tolist() == [True, True, False] and not term.any()
    assert rew.tolist() == [0.0, 0.0, 1.0]
    new = envs.worker_pids
    assert new[0] != old[0] and new[1] == old[1]
    assert _gone(old[:1], 3.0)  # the failed worker, dead or alive (an exception), is stopped
    [(w, lanes, err)] = envs.restarts
    assert (w, lanes) == (0, range(0, 2))
    _check_error(err, fault)
    obs, rew, term, trunc, infos = envs.step(NO_ACTION)  # an ordinary step
    assert "restarted" not in infos and not trunc.any() and rew.tolist() == [1.0, 1.0, 1.0]
    envs.close()


CRASH_SCRIPT = r"""
import functools, sys
import numpy as np
sys.path.insert(0, {tests!r})
import shmvec
from envs_for_tests import FaultyEnv

def fns(fault, bad_env):
    return [functools.partial(FaultyEnv, fault if i == bad_env else "none", 2, crash_dump=True) for i in range(2)]

for fault in ("segfault", "exit"):
    for on_error in ("raise", "restart"):
        envs = shmvec.ShmVecEnv(fns(fault, 0), num_workers=2, context={context!r}, on_error=on_error)
        print("PIDS", *envs.worker_pids, flush=True)
        envs.reset(seed=0)
        try:
            for _ in range(3):
                envs.step(np.zeros(2, dtype=np.int64))
            print(fault, on_error, "restarted:", *[str(err) for _, _, err in envs.restarts], flush=True)
            print("PIDS", *envs.worker_pids, flush=True)
        except shmvec.WorkerDied as err:
            print(fault, on_error, "raised:", err, flush=True)
        envs.close()
print("ALIVE", flush=True)
# What step_in_main=True gives up: env 1 runs in this process, and its os._exit ends it.
envs = shmvec.ShmVecEnv(fns("exit", 1), num_workers=1, context={context!r}, step_in_main=True)
print("PIDS", *envs.worker_pids, flush=True)
envs.reset(seed=0)
for _ in range(3):
    envs.step(np.zeros(2, dtype=np.int64))
print("UNREACHABLE", flush=True)
"""


@pytest.mark.parametrize("context", CONTEXTS)
def test_caller_survives_segfault_and_exit_in_a_worker(context):
    """Run in a process of its own, which the test watches: by default a segfaulting or
    os._exit-ing env leaves its caller running (an error or a restart), with Python's fault
    handler on (-X faulthandler, as many training scripts have it), whose dump of the crashed
    worker's stack reaches stderr. The last env, opted into the caller with step_in_main=True,
    does end it: that is what the speed mode gives up. Nothing is left behind either way."""
    import os
    import subprocess
    import sys

    code = CRASH_SCRIPT.format(tests=os.path.dirname(__file__), context=context)
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()  # a test that fails leaves nothing running either
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    lines = out.stdout.splitlines()
    assert [line for line in lines if not line.startswith("PIDS")] == [
        "segfault raise raised: worker 0 (envs 0..0) was killed by SIGSEGV",
        "segfault restart restarted: worker 0 (envs 0..0) was killed by SIGSEGV",
        "exit raise raised: worker 0 (envs 0..0) exited with code 3",
        "exit restart restarted: worker 0 (envs 0..0) exited with code 3",
        "ALIVE",
    ], out.stdout + out.stderr
    assert out.returncode == 3, out.stderr
    assert "Fatal Python error: Segmentation fault" in out.stderr and "envs_for_tests.py" in out.stderr
    pids = [int(pid) for line in lines if line.startswith("PIDS") for pid in line.split()[1:]]
    assert len(pids) == 4 * 2 + 2 * 2 + 1 and _gone(pids, 3.0)  # the restarts' new workers too
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shmvec_{proc.pid}_")]


def _sb3_env(fns, **kwargs):
    sb3 = pytest.importorskip("shmvec.sb3", reason="the sb3 extra is part of dev")
    return sb3.SubprocVecEnv(fns, **kwargs)


def _baselines_env(fns, **kwargs):
    return shmvec.SubprocVecEnv(fns, **kwargs)


@pytest.mark.parametrize("fault, on_error", [("segfault", "raise"), ("exit", "restart")])
@pytest.mark.parametrize("entry", ["make", "sb3", "baselines"])
def test_deaths_through_every_entry_point(entry, fault, on_error):
    """shmvec.make and both SubprocVecEnv adapters, at their defaults, give the same error or
    restart as ShmVecEnv (the adapters flag a restarted env in its info dict)."""
    if entry == "make":
        # Every env of make() is the same: all fail at once, and the error names worker 0.
        envs = venv = shmvec.make("envs_for_tests:shmvec-tests/Faulty-v0", num_envs=3, num_workers=2,
                                  env_kwargs={"fault": fault, "at": 2}, on_error=on_error)
        failed = [True] * 3
    else:
        envs = (_sb3_env if entry == "sb3" else _baselines_env)(faulty(3, fault, 1, at=2), num_workers=2,
                                                               on_error=on_error)
        venv, failed = envs.vector_env, [True, True, False]
    pids = venv.worker_pids
    envs.reset()
    envs.step(NO_ACTION)
    if on_error == "raise":
        with pytest.raises(shmvec.WorkerDied, match=r"worker 0 \(envs 0\.\.1\) was killed by SIGSEGV"):
            envs.step(NO_ACTION)
        assert venv.closed and _gone(pids, 3.0)
    else:
        result = envs.step(NO_ACTION)
        if entry == "make":
            assert result[4]["_restarted"].tolist() == failed
        else:
            dones, infos = result[2], result[3]
            assert dones.tolist() == failed
            assert [bool(info.get("restarted")) for info in infos] == failed
        assert [w for w, _, _ in venv.restarts] == ([0, 1] if entry == "make" else [0])
        envs.step(NO_ACTION)
    envs.close()


@pytest.mark.parametrize("entry", ["ShmVecEnv", "make", "sb3", "baselines"])
def test_no_env_runs_in_the_calling_process_by_default(entry):
    """At the default settings every env is built, reset and stepped in a worker process."""
    import os

    from envs_for_tests import PidEnv

    if entry == "ShmVecEnv":
        envs = venv = shmvec.ShmVecEnv([PidEnv] * 3)
    elif entry == "make":
        envs = venv = shmvec.make("envs_for_tests:shmvec-tests/Pid-v0", num_envs=3)
    else:
        envs = (_sb3_env if entry == "sb3" else _baselines_env)([PidEnv] * 3)
        venv = envs.vector_env
    reset = envs.reset()
    obs = reset[0] if entry in ("ShmVecEnv", "make") else reset
    stepped = envs.step(np.zeros(3, dtype=np.int64))[0]
    workers = set(venv.worker_pids)
    assert os.getpid() not in workers
    for pid in (*obs[:, 0], *obs[:, 1], *stepped[:, 1]):
        assert int(pid) in workers
    envs.close()


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


def test_worker_killed_while_idle_is_restarted_by_the_next_step():
    import os

    envs = shmvec.ShmVecEnv(faulty(4, "none", 0), num_workers=2, on_error="restart")
    envs.reset(seed=0)
    os.kill(envs.worker_pids[0], signal.SIGKILL)
    time.sleep(0.1)
    infos = envs.step(np.zeros(4, dtype=np.int64))[4]
    assert infos["_restarted"].tolist() == [True, True, False, False]
    assert re.search(r"worker 0 \(envs 0\.\.1\) was killed by SIGKILL", str(envs.restarts[0][2]))
    envs.close()


def test_reset_after_a_restart_reports_no_restart():
    envs = shmvec.ShmVecEnv(faulty(4, "raise", 1), num_workers=2, on_error="restart")
    try:
        envs.reset(seed=0)
        restarted = False
        for _ in range(5):
            *_, infos = envs.step(np.zeros(4, dtype=np.int64))
            restarted = restarted or "restarted" in infos
        assert restarted
        _, infos = envs.reset(seed=1)
        assert "restarted" not in infos
    finally:
        envs.close()


def test_spawn_without_a_main_guard_says_what_to_do(tmp_path):
    """A script that builds a vector env at module level under spawn: each worker imports it
    again and dies at once; the error says why and what to do."""
    import subprocess
    import sys

    script = tmp_path / "no_guard.py"
    script.write_text("import shmvec\nenvs = shmvec.make('CartPole-v1', num_envs=2, num_workers=1, context='spawn')\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "WorkerDied" in out.stderr and 'if __name__ == "__main__":' in out.stderr, out.stderr[-2000:]


# -- Ctrl-C ----------------------------------------------------------------------------------------
@pytest.fixture
def sigint():
    """``sigint(seconds)`` sends this process a real SIGINT that many seconds later, handled as a
    terminal user's is (a shell without job control starts its jobs with SIGINT ignored)."""
    import os
    import threading

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timers = []

    def after(seconds):
        timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        timers.append(timer)

    yield after
    for timer in timers:
        timer.cancel()
        timer.join()
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("call", ["step", "rollout", "call"])
def test_ctrl_c_in_a_round_leaves_the_env_usable(call, sigint):
    """A real SIGINT while the workers step: KeyboardInterrupt reaches the caller, the env stays
    open, asks for a reset, and works after it; nothing leaks (the autouse check)."""
    from gymnasium.error import ResetNeeded

    envs = shmvec.ShmVecEnv([functools.partial(SlowEnv, step_us=300_000)] * 2, num_workers=2)
    try:
        envs.reset(seed=0)
        actions = np.zeros(2, dtype=np.int64)
        sigint(0.1)
        with pytest.raises(KeyboardInterrupt):
            if call == "step":
                envs.step(actions)
            elif call == "rollout":
                envs.rollout(lambda obs: actions, num_steps=3)
            else:
                envs.call("step", 0)  # (what runs in the workers does not matter)
        assert not envs.closed
        with pytest.raises(ResetNeeded):
            envs.step(actions)
        obs, _ = envs.reset(seed=2)  # drains the interrupted round first
        assert obs.shape == (2, 4)
        _, rewards, *_ = envs.step(actions)
        assert rewards.tolist() == [1.0, 1.0]
    finally:
        envs.close()


def test_ctrl_c_in_recv_keeps_the_batch_coming(sigint):
    envs = shmvec.ShmVecEnv([functools.partial(SlowEnv, step_us=300_000)] * 2, num_workers=2, batch_size=1)
    try:
        envs.async_reset(seed=0)
        _, _, _, _, _, ids = envs.recv()
        envs.send(np.zeros(1, dtype=np.int64), ids)
        _, _, _, _, _, other = envs.recv()
        envs.send(np.zeros(1, dtype=np.int64), other)
        sigint(0.1)
        with pytest.raises(KeyboardInterrupt):
            envs.recv()
        got = sorted(int(envs.recv()[5][0]) for _ in range(2))  # both steps still arrive
        assert got == [0, 1] and not envs.closed
    finally:
        envs.close()
