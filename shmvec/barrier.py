"""The full memory barrier that publishes the words of the shared segment (:func:`fence`), and
the one atomic operation, an add to a word (:func:`adder`: the count of a broadcast round's
finished workers).

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

import functools
import os
import platform
import threading
from collections.abc import Callable

__all__ = ["FENCE_IR", "KIND", "adder", "assembly", "fence", "prepare"]

# Architectures whose stores are seen in program order, where a locked instruction is a full barrier.
STRONGLY_ORDERED = {"x86_64", "amd64", "i386", "i686", "x86"}

# The barrier, in LLVM's IR: sequentially consistent, so it orders every earlier load and store
# before every later one (x86-64: a locked `or`; aarch64: `dmb ish`).
FENCE_IR = """
define void @shmvec_fence() {
  fence seq_cst
  ret void
}

define i64 @shmvec_add(ptr %p, i64 %v) {
  %old = atomicrmw add ptr %p, i64 %v seq_cst
  ret i64 %old
}
"""

_lock = threading.Lock()


def _lock_fence() -> None:
    """A full barrier on x86-64: an uncontended lock's acquire and release are ``lock``-prefixed
    read-modify-writes (enough there, not on a weakly ordered CPU).
    """
    _lock.acquire()
    _lock.release()


_engine = None  # the compiled functions' JIT engine, kept alive with them
_compiled: dict[str, Callable] = {}


def _compile() -> dict[str, Callable]:
    """The IR's functions, compiled for this machine once per process (a forked worker inherits
    them), as ctypes functions: ``fence()`` (about 0.1 us a call), ``add(address, value)``.
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
    _compiled["add"] = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)(
        _engine.get_function_address("shmvec_add")
    )
    return _compiled


def prepare() -> None:
    """Compile the functions now (the calling process, before it forks its workers: they
    inherit them instead of compiling their own, about 0.1 s each).
    """
    _compile()


def adder(address: int) -> Callable[[int], int]:
    """``add(value)``: add ``value`` to the int64 word at ``address`` atomically (a sequentially
    consistent read-modify-write: ``lock xadd`` on x86-64, ``ldaxr``/``stlxr`` or ``ldaddal`` on
    aarch64); returns the word's value before.
    """
    return functools.partial(_compile()["add"], address)


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
