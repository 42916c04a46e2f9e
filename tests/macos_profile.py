"""The macOS profile: this machine made to look like macOS where shmvec can tell the difference.

``SHMVEC_TEST_PROFILE=macos`` (``make test-macos-profile``) applies it before anything imports
shmvec (``conftest.py``): spawn is the default start method, ``os.sched_getaffinity`` (and
``os.process_cpu_count``) are gone, and ``/proc`` cannot be read or listed. What it leaves
alone: POSIX shared memory and descriptor passing (macOS has both; the segments' names are
checked against macOS's 31-byte limit in ``test_platforms.py``), and the memory order (Apple
Silicon's is ARM's: ``docs/architecture.md``, "Memory ordering").
"""

from __future__ import annotations

import builtins
import multiprocessing
import os


def _hidden(path) -> bool:
    try:
        return os.fspath(path).startswith("/proc")
    except TypeError:  # a file descriptor
        return False


def apply() -> None:
    multiprocessing.set_start_method("spawn", force=True)
    for name in ("sched_getaffinity", "process_cpu_count"):
        if hasattr(os, name):
            delattr(os, name)
    real_open, real_listdir, real_exists = builtins.open, os.listdir, os.path.exists

    def open_(file, *args, **kwargs):
        if _hidden(file):
            raise FileNotFoundError(2, "No such file or directory (macOS profile)", file)
        return real_open(file, *args, **kwargs)

    def listdir(path="."):
        if _hidden(path):
            raise FileNotFoundError(2, "No such file or directory (macOS profile)", path)
        return real_listdir(path)

    builtins.open = open_
    os.listdir = listdir
    os.path.exists = lambda path: False if _hidden(path) else real_exists(path)


ACTIVE = os.environ.get("SHMVEC_TEST_PROFILE") == "macos"
if ACTIVE:
    apply()
