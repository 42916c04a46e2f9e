"""The kernel's CPU counters, read from ``/proc``: each thread's time on a core and in the run
queue, the cores' busy time, and the thread pools loaded in this process.

What a window of the loop (:mod:`shmvec.diagnose`) reads at its edges. Where there is no
``/proc`` (macOS, Windows) :data:`MEASURABLE` is False, the readers return nothing, and the
window says what it could not measure.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["MEASURABLE", "cores_busy", "loaded_pools", "thread_times"]

# Whether this system has the per-thread counters (Linux's /proc/<pid>/task/<tid>/schedstat).
MEASURABLE = os.path.exists(f"/proc/{os.getpid()}/task")


def _schedstat(path: str) -> tuple[float, float]:
    """``(seconds on a core, seconds waiting in the run queue)`` of a task, ``(0, 0)`` if gone."""
    try:
        with open(path) as f:
            run_ns, wait_ns, _ = f.read().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def thread_times(pid: int) -> dict[int, tuple[str, float, float]]:
    """Each thread of ``pid``: ``{tid: (name, cpu_s, starved_s)}`` (empty where there is no /proc)."""
    out: dict[int, tuple[str, float, float]] = {}
    if not MEASURABLE:
        return out
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        out[int(tid)] = (name, *_schedstat(f"/proc/{pid}/task/{tid}/schedstat"))
    return out


def cores_busy() -> float | None:
    """Seconds the cores this process may run on have spent busy since boot (``/proc/stat``'s
    ``cpuN`` lines: in a container the file may count the host's cores), or ``None``.
    """
    if not MEASURABLE:
        return None
    try:
        cores = os.sched_getaffinity(0)
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except (AttributeError, OSError):
        return None
    busy, seen = 0, False
    for line in lines:
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores):
            continue
        ticks = [int(x) for x in rest.split()]
        busy += sum(ticks[:8]) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)  # less idle, iowait
        seen = True
    return busy / os.sysconf("SC_CLK_TCK") if seen else None


def loaded_pools() -> list[str]:
    """The thread pools the calling process has loaded, as the user knows them (torch first)."""
    names = []
    torch: Any = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        names.append(f"torch's intra-op pool ({torch.get_num_threads()} threads)")
    if "threadpoolctl" in sys.modules or "numpy" in sys.modules:
        try:
            from threadpoolctl import threadpool_info

            for pool in threadpool_info():
                names.append(f"{pool.get('internal_api')} in {os.path.basename(pool.get('filepath', '?'))} "
                             f"({pool.get('num_threads')} threads)")  # fmt: skip
        except Exception:  # not installed, or a library it cannot read
            pass
    return names
