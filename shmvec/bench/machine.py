"""What machine a result was measured on: CPU, cores, memory, Python and library versions."""

from __future__ import annotations

import os
import platform
import sys
import time
from importlib import metadata
from typing import Any

from shmvec.checks import usable_cores

__all__ = ["machine_info", "machine_line", "parallel_scaling"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _virtualized() -> bool | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return " hypervisor" in line
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _spin_work(iterations: int) -> float:
    start = time.perf_counter()
    x = 0
    for i in range(iterations):
        x += i * i
    return time.perf_counter() - start


def _timed_worker(barrier: Any, iterations: int, out: Any, slot: int) -> None:
    barrier.wait()
    out[slot] = _spin_work(iterations)


def parallel_scaling(processes: int | None = None, seconds: float = 0.2) -> dict[str, Any]:
    """How much faster ``processes`` CPU-bound processes get through work than one process.

    The ceiling of any engine's speedup over a serial loop on this machine: on a VM whose
    vCPUs are hyperthreads of one core, or whose host is busy, two processes may get far
    less than twice the work done, whatever the vector env. Takes about ``3 * seconds``.

    Returns
    -------
    dict
        ``{"processes": k, "speedup": s}``: ``k`` processes did ``k`` times the work of one
        in ``1/s`` of ``k`` times its time (``s == k`` is perfect scaling).
    """
    import multiprocessing as mp

    k = processes or usable_cores()
    if k < 2:
        return {"processes": k, "speedup": 1.0}
    # Calibrate the work to ~`seconds` in one process, then time it alone and k-fold at once.
    probe = 200_000
    iterations = max(probe, int(probe * seconds / max(_spin_work(probe), 1e-6)))
    single = _spin_work(iterations)
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    barrier = ctx.Barrier(k + 1)
    out = ctx.Array("d", k, lock=False)
    procs = [ctx.Process(target=_timed_worker, args=(barrier, iterations, out, i), daemon=True) for i in range(k)]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=60)
        start = time.perf_counter()
        for p in procs:
            p.join(timeout=60)
        wall = time.perf_counter() - start
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return {"processes": k, "speedup": round(k * single / wall, 2) if wall > 0 else None}


def machine_info() -> dict[str, Any]:
    """A JSON-ready description of this machine and software."""
    from shmvec.bench.memory import read_kb

    mem_kb = read_kb("/proc/meminfo", b"MemTotal:")
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "virtualized": _virtualized(),
        "memory_gb": None if mem_kb is None else round(mem_kb / 2**20, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_impl": platform.python_implementation(),
        "start_method": _start_method(),
        "versions": {
            name: _version(name)
            for name in ("shmvec", "numpy", "gymnasium", "stable-baselines3", "envpool", "matplotlib", "psutil")
        },
        "argv": sys.argv[1:],
    }


def _start_method() -> str:
    """How shmvec's vector envs start their workers here by default (``shmvec.start_methods``)."""
    from shmvec import start_methods

    setting = start_methods.requested(None)
    return "fork, or forkserver from a threaded caller" if setting == start_methods.AUTO else setting


def machine_line(info: dict[str, Any]) -> str:
    """One line for a report: ``Intel Xeon, 2 cores (VM), 24 GB, Python 3.11.7, numpy 2.4 ...``."""
    v = info.get("versions", {})
    cores = f"{info.get('usable_cores')} usable cores"
    if info.get("cores") != info.get("usable_cores"):
        cores += f" of {info.get('cores')}"
    vm = " (virtual machine)" if info.get("virtualized") else ""
    libs = ", ".join(f"{name} {ver}" for name, ver in v.items() if ver)
    mem = f", {info['memory_gb']} GB RAM" if info.get("memory_gb") else ""
    return (
        f"{info.get('cpu')}, {cores}{vm}{mem}; {info.get('os')}; "
        f"Python {info.get('python')} (start method: {info.get('start_method')}); {libs}"
    )
