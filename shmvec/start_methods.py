"""How each worker process is started: shmvec's start-method policy.

``context=None`` (the default, also spelled ``"auto"``) decides per start, first starts and
restarts alike: a worker is **forked**, and runs only if no thread but the caller's own outlived
the fork; otherwise it is killed before it runs anything, and the **forkserver** starts it.

A fork copies only the thread that forks; a lock another thread held at that instant stays held
in the child for good, which is why Python 3.12 warns about forking a threaded process and 3.14
no longer forks by default. Some thread pools stop themselves before a fork (OpenBLAS's, the
one numpy starts at import, in its ``pthread_atfork`` handler) and restart when next used;
OpenMP's, numba's, torch's and the user's own do not. Python's warning counts the threads left
just after the fork, in the parent; so does shmvec (:func:`threads`, in
``processes.WorkerProcesses.start``), before the child is let go. A fork without company starts
a worker in milliseconds, keeps the caller's imports and registrations, and needs no main guard.
The forkserver is Python's own (started by fork and exec, safe from a threaded caller); shmvec
adds its worker's modules to the server's preload list, so that a start from it imports little.

Where Python's default start method is spawn (macOS, Windows) shmvec spawns. A start method
named (``context="spawn"``...) or set process-wide with ``multiprocessing.set_start_method`` to
something other than the platform's default is used for every start. ``docs/architecture.md``
("Platforms") gives the measured costs of each.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext

__all__ = ["AUTO", "PRELOAD", "context", "platform_default", "requested", "threads"]

AUTO = "auto"

# What a worker imports before it steps (its envs' own modules aside), imported once by the
# forkserver so that each worker forked from it starts with them.
PRELOAD = (
    "numpy",
    "gymnasium",
    "cloudpickle",
    "shmvec.worker",
    "shmvec.stepper",
    "shmvec.segment",
    "shmvec.barrier",
    "shmvec.layout",
    "shmvec.info_columns",
)

_preloaded = False


def platform_default() -> str:
    """Python's default start method on this platform and version."""
    if sys.platform in ("darwin", "win32"):
        return "spawn"
    return "forkserver" if sys.version_info >= (3, 14) else "fork"


def requested(context: str | None) -> str:
    """The setting a pool follows for ``context`` (the option): a start method's name, or
    :data:`AUTO` for the per-start policy.

    Raises
    ------
    ValueError
        If ``context`` names no start method this platform has.
    """
    methods = mp.get_all_start_methods()
    if context is None or context == AUTO:
        default = platform_default()
        chosen = mp.get_start_method(allow_none=True)
        if chosen is not None and chosen != default:
            return chosen  # the user's process-wide choice
        return AUTO if default != "spawn" and "fork" in methods else default
    if context not in methods:
        raise ValueError(f"context={context!r}: expected None, {AUTO!r} or a start method of this platform {methods}")
    return context


def threads() -> int | None:
    """The calling process's threads, native ones included (``None`` where ``/proc`` cannot say)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def context(method: str) -> ForkContext | ForkServerContext | SpawnContext:
    """The ``multiprocessing`` context of ``method``; for forkserver, with :data:`PRELOAD` added
    to the server's preload list (once, before it first starts; Python's own entries, the main
    module among them, stay).
    """
    global _preloaded
    if method == "forkserver" and not _preloaded:
        from multiprocessing import forkserver

        current = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
        forkserver.set_forkserver_preload(current + [name for name in PRELOAD if name not in current])
        _preloaded = True
    # The stubs type get_context(str) as BaseContext, which lacks Process: it is one of these.
    return cast("ForkContext | ForkServerContext | SpawnContext", mp.get_context(method))
