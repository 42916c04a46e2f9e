"""shmvec's start-method policy (``shmvec.start_methods``, docs/architecture.md "Platforms"):
under the default, a worker is forked while the calling process runs one thread and started by
the forkserver once it runs more, first starts and restarts alike, so no fork ever copies a
threaded caller. Each script runs as users run it, in a fresh interpreter whose threads the
test controls, with fork's ``DeprecationWarning`` (Python 3.12+) made an error.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import shmvec
from shmvec import start_methods

ROOT = Path(__file__).resolve().parents[1]

# Each script runs in a fresh interpreter (the macOS profile's spawn default is not there).
pytestmark = pytest.mark.skipif(
    start_methods.platform_default() == "spawn", reason="the policy applies where Python may fork by default"
)


def run(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    out = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


RESTARTS = """
import os, signal, threading
import numpy as np
import shmvec
from shmvec import start_methods

if __name__ == "__main__":
    envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2, on_error="restart")
    print(start_methods.threads(), envs.context, *envs.start_methods)
    envs.reset(seed=0)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    os.kill(envs.worker_pids[1], signal.SIGKILL)
    envs.step(np.zeros(4, np.int64))  # worker 1 is restarted, from a threaded caller
    print(start_methods.threads(), len(envs.restarts), *envs.start_methods)
    stop.set()
    thread.join()
    os.kill(envs.worker_pids[0], signal.SIGKILL)
    envs.step(np.zeros(4, np.int64))  # worker 0, with one thread again
    print(start_methods.threads(), len(envs.restarts), *envs.start_methods)
    envs.close()
"""


def test_a_restart_forks_only_while_the_caller_runs_one_thread(tmp_path):
    lines = run(tmp_path, RESTARTS)
    assert lines == ["1 auto fork fork", "2 1 fork forkserver", "1 2 fork forkserver"]


THREADED = """
import threading
import gymnasium as gym
import numpy as np
import shmvec

if __name__ == "__main__":
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)  # as torch's, OpenMP's or a logger's would be
    thread.start()
    envs = shmvec.make("CartPole-v1", num_envs=5, num_workers=3)
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 5)
    print(envs.context, *envs.start_methods)
    for got, want in zip(envs.reset(seed=3), ref.reset(seed=3)):
        assert (got == want).all() if isinstance(got, np.ndarray) else True
    for t in range(300):
        actions = np.array([(t + k) % 2 for k in range(5)])
        for got, want in zip(envs.step(actions)[:4], ref.step(actions)[:4]):
            assert (got == want).all(), t
    print("same as SyncVectorEnv")
    envs.close()
    stop.set()
    thread.join()
"""


def test_a_threaded_caller_starts_every_worker_from_the_forkserver(tmp_path):
    assert run(tmp_path, THREADED) == ["auto forkserver forkserver forkserver", "same as SyncVectorEnv"]


def test_the_forkserver_preloads_the_workers_modules_and_keeps_pythons_own(tmp_path):
    lines = run(
        tmp_path,
        """
        from multiprocessing import forkserver
        from shmvec import start_methods

        if __name__ == "__main__":
            before = list(forkserver._forkserver._preload_modules)
            start_methods.context("forkserver")
            after = forkserver._forkserver._preload_modules
            assert after[: len(before)] == before and set(start_methods.PRELOAD) <= set(after), after
            print(*before)
        """,
    )
    assert lines == ["__main__"]


def test_a_start_method_set_by_the_user_is_followed_unless_it_is_the_default(tmp_path):
    other = next(m for m in ("spawn", "forkserver") if m != start_methods.platform_default())
    lines = run(
        tmp_path,
        f"""
        import multiprocessing as mp
        import shmvec
        from shmvec import start_methods

        if __name__ == "__main__":
            print(start_methods.platform_default() == mp.get_start_method())  # (this sets it)
            print(start_methods.requested(None))
            mp.set_start_method({other!r}, force=True)
            with shmvec.make("CartPole-v1", num_envs=2, num_workers=2) as envs:
                print(envs.context, *envs.start_methods)
        """,
    )
    assert lines == ["True", "auto", f"{other} {other} {other}"]


def test_a_start_method_named_is_used_for_every_start():
    with shmvec.make("CartPole-v1", num_envs=2, num_workers=2, context="spawn") as envs:
        assert (envs.context, envs.start_methods) == ("spawn", ["spawn", "spawn"])


def test_an_unknown_start_method_is_refused_naming_the_option():
    with pytest.raises(
        ValueError, match=r"context='threads': expected None, 'auto' or a start method of this platform"
    ):
        shmvec.make("CartPole-v1", num_envs=2, num_workers=2, context="threads")
    assert start_methods.requested("auto") == start_methods.requested(None)


def test_a_thread_pool_that_stops_at_a_fork_does_not_count_and_one_that_stays_does(tmp_path):
    # numpy's OpenBLAS pool stops in its fork handler; numba's parallel kernels keep OS threads
    # that `threading` does not list.
    lines = run(
        tmp_path,
        """
        import threading
        import numba
        import numpy as np
        import shmvec

        @numba.njit(parallel=True)
        def total(x):
            s = 0.0
            for i in numba.prange(x.shape[0]):
                s += x[i]
            return s

        if __name__ == "__main__":
            np.ones((300, 300)) @ np.ones((300, 300))  # OpenBLAS's threads, where it has more than one core
            with shmvec.make("CartPole-v1", num_envs=2, num_workers=2) as envs:
                print(*envs.start_methods)
            total(np.ones(1000))
            with shmvec.make("CartPole-v1", num_envs=2, num_workers=2) as envs:
                print(threading.active_count(), *envs.start_methods)
        """,
    )
    assert lines == ["fork fork", "1 forkserver forkserver"]
