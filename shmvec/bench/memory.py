"""Resident memory of this process and all its descendants.

RSS adds up every process's resident pages, so pages shared between them (the interpreter
image a forked child shares with its parent, a shared-memory segment) count once per process.
PSS (proportional set size, Linux ``/proc/PID/smaps_rollup``) splits each shared page between
the processes that map it, so its sum is what the tree really holds. Both are recorded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["TreeMemory", "available_mb", "descendants", "read_kb", "tree_memory"]


@dataclass(frozen=True)
class TreeMemory:
    """Memory of a process tree, in MiB (``None`` where it could not be read)."""

    processes: int
    rss_mb: float | None
    pss_mb: float | None


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(name))
    return children


def descendants(pid: int | None = None) -> list[int]:
    """Every live descendant of ``pid`` (default: this process), from ``/proc``."""
    pid = os.getpid() if pid is None else pid
    children = _children_map()
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def read_kb(path: str, key: bytes) -> int | None:
    """The kB figure on the line of ``path`` that starts with ``key`` (``/proc`` files); None if absent."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def tree_memory(pid: int | None = None) -> TreeMemory:
    """RSS and PSS summed over ``pid`` (default: this process) and its descendants."""
    pid = os.getpid() if pid is None else pid
    if os.path.isdir(f"/proc/{pid}"):
        pids = [pid, *descendants(pid)]
        rss = [read_kb(f"/proc/{p}/status", b"VmRSS:") for p in pids]
        pss = [read_kb(f"/proc/{p}/smaps_rollup", b"Pss:") for p in pids]
        rss_known = [v for v in rss if v is not None]
        pss_ok = all(v is not None for v in pss)
        return TreeMemory(
            processes=len(pids),
            rss_mb=sum(rss_known) / 1024 if rss_known else None,
            pss_mb=sum(pss) / 1024 if pss_ok else None,  # type: ignore[arg-type]
        )
    try:  # not Linux: psutil, where installed
        import psutil
    except ImportError:
        return TreeMemory(processes=0, rss_mb=None, pss_mb=None)
    proc = psutil.Process(pid)
    procs = [proc, *proc.children(recursive=True)]
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return TreeMemory(processes=len(procs), rss_mb=total / 2**20, pss_mb=None)


def available_mb() -> float | None:
    """``MemAvailable`` from ``/proc/meminfo``, in MiB (``None`` where unknown)."""
    kb = read_kb("/proc/meminfo", b"MemAvailable:")
    return None if kb is None else kb / 1024
