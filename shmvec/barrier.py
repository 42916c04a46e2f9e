"""The full memory barrier that publishes the words of the shared segment (:func:`fence`), and
the one atomic operation, a worker counting itself done in a broadcast round (:func:`counter`).

The handoff between the calling process and its workers is lock-free: plain stores of results
(or actions), then a flag word (``DONE``, ``GO``), read by a process spinning on that flag. On
x86-64 stores become visible in program order (TSO) and any ``lock``-prefixed instruction is a
full barrier, so an uncontended lock's acquire and release (``lock cmpxchg``) is one. On weakly
ordered CPUs (ARMv8: Apple Silicon, Graviton, Grace; POWER; RISC-V) an acquire followed by a
release orders neither earlier stores before later ones nor a later load after an earlier
store: there the barrier is LLVM's ``fence seq_cst`` (``dmb ish`` on aarch64), compiled once
per process by llvmlite (numba's backend, always installed with shmvec) and called through
ctypes. ``docs/architecture.md`` ("Memory ordering") argues, word by word, which barrier
publishes what; every call of :func:`fence` names its line there.

``SHMVEC_FENCE=lock`` or ``SHMVEC_FENCE=compiled`` (read once, at import) picks one where the
machine's own choice should be overridden (tests run the compiled one on x86-64 too).
"""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Callable
from typing import Any

from shmvec.protocol import DONE, STATUS

__all__ = ["FENCE_IR", "KIND", "assembly", "counter", "fence", "prepare"]

# Architectures whose stores are seen in program order, where a locked instruction is a full barrier.
STRONGLY_ORDERED = {"x86_64", "amd64", "i386", "i686", "x86"}

# The barrier, in LLVM's IR: sequentially consistent, so it orders every earlier load and store
# before every later one (x86-64: a locked `or`; aarch64: `dmb ish`). And a worker's count in a
# broadcast round, on main's control line (@shmvec_line, set once per process, so that a call
# converts one argument, a third of the cost of passing the address too): one is added to its
# STATUS word if the command failed, then to its DONE word (sequentially consistent
# read-modify-writes: `lock xadd` on x86-64, `ldaxr`/`stlxr` or `ldaddal` on aarch64), then
# the full barrier that orders the count before the caller's read of main's SLEEPING
# (ordering [COUNT] and [SLEEP]); it returns the count, this worker included.
FENCE_IR = """
define void @shmvec_fence() {
  fence seq_cst
  ret void
}

@shmvec_line = global ptr null

define i64 @shmvec_count(i64 %failed) {
entry:
  %line = load ptr, ptr @shmvec_line
  %bad = icmp ne i64 %failed, 0
  br i1 %bad, label %fail, label %count
fail:
  %status = getelementptr i64, ptr %line, i64 STATUS
  %s = atomicrmw add ptr %status, i64 1 seq_cst
  br label %count
count:
  %done = getelementptr i64, ptr %line, i64 DONE
  %old = atomicrmw add ptr %done, i64 1 seq_cst
  fence seq_cst
  %n = add i64 %old, 1
  ret i64 %n
}
""".replace("STATUS", str(STATUS)).replace("DONE", str(DONE))

_lock = threading.Lock()


def _lock_fence() -> None:
    """A full barrier on x86-64: an uncontended lock's acquire and release are ``lock``-prefixed
    read-modify-writes (enough there, not on a weakly ordered CPU).
    """
    _lock.acquire()
    _lock.release()


_engine = None  # the compiled functions' JIT engine, kept alive with them
_compiled: dict[str, Any] = {}  # the ctypes functions, and the count's line pointer


def _compile() -> dict[str, Any]:
    """The IR's functions, compiled for this machine once per process (a forked worker inherits
    them), as ctypes functions: ``fence()`` (about 0.1 us a call), ``count(failed)``.
    """
    if _compiled:
        return _compiled
    import ctypes

    import llvmlite.binding as llvm

    global _engine
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(FENCE_IR)
    module.verify()
    _engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine())
    _engine.finalize_object()
    _compiled["fence"] = ctypes.CFUNCTYPE(None)(_engine.get_function_address("shmvec_fence"))
    _compiled["count"] = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(_engine.get_function_address("shmvec_count"))
    _compiled["line"] = ctypes.c_void_p.from_address(_engine.get_global_value_address("shmvec_line"))
    return _compiled


def prepare() -> None:
    """Compile the functions now (the calling process, before it forks its workers: they
    inherit them instead of compiling their own, about 0.1 s each).
    """
    _compile()


def counter(main_line: int) -> Callable[[int], int]:
    """``count(failed)``: count this worker done in a broadcast round on main's control line,
    at address ``main_line`` (its int64 words): one atomic add to its ``STATUS`` word if
    ``failed`` is not 0, one to its ``DONE`` word, then a full barrier; returns ``DONE`` after
    the add.

    One line per process (a worker's main line): a second call moves the count there.
    """
    compiled = _compile()
    compiled["line"].value = main_line
    return compiled["count"]


def assembly(triple: str) -> str:
    """The barrier's assembly for the target ``triple`` (``"aarch64-unknown-linux-gnu"``, say):
    what :func:`fence` runs on such a machine (llvmlite compiles for every target here).
    """
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    machine = llvm.Target.from_triple(triple).create_target_machine()
    return machine.emit_assembly(llvm.parse_assembly(FENCE_IR))


def _choose() -> tuple[str, Callable[[], None]]:
    wanted = os.environ.get("SHMVEC_FENCE", "")
    if wanted not in ("", "lock", "compiled"):
        raise ValueError(f"SHMVEC_FENCE must be 'lock' or 'compiled', got {wanted!r}")
    if wanted == "lock" or (not wanted and platform.machine().lower() in STRONGLY_ORDERED):
        return "lock", _lock_fence
    return "compiled", _compile()["fence"]


# Which barrier this process runs ("lock" or "compiled"), and the barrier itself.
KIND, fence = _choose()
