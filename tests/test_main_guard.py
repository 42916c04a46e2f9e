"""A script without a main guard, run as users run it (``python script.py``): under a start
method that imports the main module again (spawn; forkserver, Python 3.14's default on Linux) it
stops with shmvec's own error naming the guard, and under fork it runs. Under shmvec's default
(``shmvec.start_methods``) it runs while it has one thread, and names the guard once a thread of
its own keeps the workers from being forked.
"""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import pytest

from shmvec import start_methods

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import threading
import numpy as np
import shmvec

{thread}

envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2{context})
envs.reset(seed=0)
envs.step(np.zeros(4, np.int64))
envs.close()
print("ran to the end")
"""

THREAD = "threading.Thread(target=threading.Event().wait, daemon=True).start()"


@pytest.mark.parametrize(
    "context, threaded",
    [("spawn", False), ("forkserver", False), ("fork", False), (None, False), (None, True)],
    ids=["spawn", "forkserver", "fork", "default", "default-threaded"],
)
def test_a_script_without_a_main_guard_runs_or_names_the_guard(tmp_path, context, threaded):
    if context is not None and context not in mp.get_all_start_methods():
        pytest.skip(f"{context} is not available here")
    if context is None and start_methods.requested(None) != start_methods.AUTO:
        pytest.skip("the default is a single start method here (tested above)")
    script = tmp_path / "no_guard.py"
    given = "" if context is None else f", context={context!r}"
    script.write_text(SCRIPT.format(context=given, thread=THREAD if threaded else ""))
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    method = context or ("forkserver" if threaded else "fork")
    if method == "fork":
        assert out.returncode == 0, out.stderr[-3000:]
        assert "ran to the end" in out.stdout
        return
    assert out.returncode != 0
    assert "ran to the end" not in out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("shmvec.errors.WorkerDied: worker "), out.stderr[-3000:]
    assert f"Under the {method!r} start method" in last
    assert 'create vector envs under `if __name__ == "__main__":`' in last
