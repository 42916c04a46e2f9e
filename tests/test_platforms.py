"""What shmvec needs of the platform, tested on Linux: macOS's constraints (no affinity call, no
/proc, spawn, short shared-memory names), envs registered in the user's script reaching spawned
workers, and the missing-main-guard error (``test_faults.py``). ``make test-macos-profile`` runs
this file and the core suite with the macOS profile (``macos_profile.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shmvec
from shmvec import checks, cpu_counters, diagnose, segment


def test_cores_come_from_cpu_count_where_there_is_no_affinity_call(monkeypatch):
    for name in ("sched_getaffinity", "process_cpu_count"):
        monkeypatch.delattr(os, name, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert checks.usable_cores() == 6
    assert shmvec.options.Options.resolve(16, {}).num_workers == 6


def test_segment_names_fit_macos_limit():
    for pid in (1, 99_999, 4_194_304):  # macOS's largest pid has 5 digits, Linux's 7
        assert len("/" + segment.segment_name(pid)) <= segment.MAX_NAME


def test_diagnose_says_what_it_cannot_measure_without_proc(monkeypatch):
    """Without the kernel's per-thread counters the window still runs and reports the caller's
    times and the workers' command time, and names what it could not measure."""
    monkeypatch.setattr(cpu_counters, "MEASURABLE", False)
    monkeypatch.setattr(diagnose, "MEASURABLE", False)
    with shmvec.make("CartPole-v1", num_envs=4, num_workers=2) as envs:
        envs.reset(seed=0)
        with envs.diagnose() as window:
            for _ in range(200):
                envs.step(np.zeros(4, dtype=np.int64))
    d = window.diagnosis
    assert d.steps == 200 and not d.measured and d.other_cores is None
    assert all(w.cpu_s == 0 and w.busy_s > 0 for w in d.workers)
    assert "not measured here" in str(d) and "no per-thread CPU counters" in str(d)
    assert shmvec.slow_loop.warning_text(d) is None  # nothing measured, nothing to warn about


REGISTERED_SCRIPT = """
import gymnasium as gym
import numpy as np
import shmvec
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class Shifted(CartPoleEnv):
    '''An env only this script knows (its class is defined here).'''

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward + 0.5, terminated, truncated, info


if {outside}:
    gym.register("Shifted-v0", entry_point=Shifted, max_episode_steps=50)

if __name__ == "__main__":
    if not {outside}:
        gym.register("Shifted-v0", entry_point=Shifted, max_episode_steps=50)
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("Shifted-v0")] * 4)
    for envs in (
        shmvec.make("Shifted-v0", num_envs=4, num_workers=2, context="{context}"),
        shmvec.ShmVecEnv([lambda: gym.make("Shifted-v0")] * 4, num_workers=2, context="{context}"),
    ):
        a, _ = envs.reset(seed=5)
        b, _ = ref.reset(seed=5)
        assert (a == b).all()
        for t in range(120):
            act = np.array([t % 2, 1, 0, (t // 3) % 2])
            got, want = envs.step(act), ref.step(act)
            for x, y in zip(got[:4], want[:4]):
                assert (x == y).all(), t
        envs.close()
    print("same as SyncVectorEnv")
"""


@pytest.mark.parametrize("outside", [False, True], ids=["inside-the-main-guard", "outside-it"])
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_an_env_registered_in_the_users_script_reaches_spawned_workers(tmp_path, outside, context):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(REGISTERED_SCRIPT.format(outside=outside, context=context)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0 and "same as SyncVectorEnv" in out.stdout, out.stderr[-3000:]


def test_the_default_start_method_is_spawn_where_spawn_is_pythons_default():
    # Under the macOS profile spawn is the default (as on macOS): every worker is spawned.
    # Elsewhere shmvec's per-start policy applies (tests/test_start_methods.py).
    import multiprocessing

    from shmvec import start_methods

    spawn_default = multiprocessing.get_start_method(allow_none=True) == "spawn"
    with shmvec.make("CartPole-v1", num_envs=2, num_workers=1) as envs:
        if spawn_default:
            assert (envs.context, envs.start_methods) == ("spawn", ["spawn"])
        else:
            assert envs.context == start_methods.AUTO and envs.start_methods[0] in ("fork", "forkserver")


PACKAGE_SCRIPT = """
import numpy as np
import shmvec

if __name__ == "__main__":
    import registering_pkg  # registers its envs as it is imported, as ale_py does

    envs = shmvec.make("RegPkg/Env3-v0", num_envs=4, num_workers=2, context="{context}")
    envs.reset(seed=0)
    envs.step(np.zeros(4, np.int64))
    envs.close()
    print("stepped")
"""


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_package_registered_under_the_main_guard_warns_nothing_in_a_spawned_worker(tmp_path, context):
    """A worker that is not forked gets the main process's registrations (RegPkg/Env0-39), then
    its factory imports the package, which registers them again: no "Overriding environment"
    warning is printed for any of them (without the fix: 40 per worker)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PACKAGE_SCRIPT.format(context=context)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         env=env)  # fmt: skip
    assert out.returncode == 0 and "stepped" in out.stdout, out.stderr[-3000:]
    assert out.stderr.count("Overriding environment") == 0, out.stderr[-3000:]
