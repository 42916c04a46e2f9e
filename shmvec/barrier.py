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
import struct
import threading
from collections.abc import Callable
from typing import Any

from shmvec.protocol import DONE

__all__ = ["FENCE_IR", "KIND", "assembly", "counter", "fence", "jit", "prepare"]

# Architectures whose stores are seen in program order, where a locked instruction is a full barrier.
STRONGLY_ORDERED = {"x86_64", "amd64", "i386", "i686", "x86"}

# The barrier, in LLVM's IR: sequentially consistent, so it orders every earlier load and store
# before every later one (x86-64: a locked `or`; aarch64: `dmb ish`). And a worker's count in a
# broadcast round, on main's control line (@shmvec_line, set once per process, so that a call
# converts one argument): its argument is the round's sequence number times two, plus one if
# its status is not OK. It adds one worker done (and one in bits 16-31 if not OK) to main's DONE
# word by compare-and-swap, only while that word holds this round's tag (protocol.count_base):
# a late worker of an earlier round leaves a later round's count alone. Then the full barrier
# that orders the count before the caller's read of main's SLEEPING (ordering [COUNT] and
# [SLEEP]). It returns the workers done, this one included, or 0 for a stale round.
FENCE_IR = """
define void @shmvec_fence() {
  fence seq_cst
  ret void
}

@shmvec_line = global ptr null

define i64 @shmvec_count(i64 %arg) {
entry:
  %line = load ptr, ptr @shmvec_line
  %word = getelementptr i64, ptr %line, i64 DONE
  %bad = and i64 %arg, 1
  %seq = lshr i64 %arg, 1
  %low = and i64 %seq, 2147483647
  %tag = shl i64 %low, 32
  %badbits = shl i64 %bad, 16
  %inc = add i64 %badbits, 1
  %first = load atomic i64, ptr %word monotonic, align 8
  br label %look
look:
  %old = phi i64 [ %first, %entry ], [ %seen, %again ]
  %high = and i64 %old, -4294967296
  %ours = icmp eq i64 %high, %tag
  br i1 %ours, label %add, label %stale
add:
  %new = add i64 %old, %inc
  %pair = cmpxchg ptr %word, i64 %old, i64 %new seq_cst seq_cst
  %seen = extractvalue { i64, i1 } %pair, 0
  %swapped = extractvalue { i64, i1 } %pair, 1
  br i1 %swapped, label %counted, label %again
again:
  br label %look
counted:
  fence seq_cst
  %n = and i64 %new, 65535
  ret i64 %n
stale:
  fence seq_cst
  ret i64 0
}
""".replace("DONE", str(DONE))

_lock = threading.Lock()


def _lock_fence() -> None:
    """A full barrier on x86-64: an uncontended lock's acquire and release are ``lock``-prefixed
    read-modify-writes (enough there, not on a weakly ordered CPU).
    """
    _lock.acquire()
    _lock.release()


_engines: list = []  # every JIT engine of this process, kept alive with its functions
_compiled: dict[str, Any] = {}  # the ctypes functions, and the count's line pointer
_compiling = threading.Lock()


def jit(ir: str) -> Any:
    """An LLVM engine holding ``ir`` compiled for this machine (kept for the process's life):
    its functions' addresses, for ctypes, come from ``get_function_address``.
    """
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(ir)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    _engines.append(engine)
    return engine


def _compile() -> dict[str, Any]:
    """The IR's functions, compiled for this machine once per process (a forked worker inherits
    them), as ctypes functions: ``fence()`` (about 0.1 us a call), ``count(seq << 1 | not_ok)``.
    """
    import ctypes

    with _compiling:  # (two threads building the first pools at once compile once)
        if not _compiled:
            engine = jit(FENCE_IR)
            kind = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)
            _compiled.update(
                fence=ctypes.CFUNCTYPE(None)(engine.get_function_address("shmvec_fence")),
                count=kind(engine.get_function_address("shmvec_count")),
                line=ctypes.c_void_p.from_address(engine.get_global_value_address("shmvec_line")),
            )
    return _compiled


def prepare() -> None:
    """Compile the functions now (the calling process, before it forks its workers: they
    inherit them instead of compiling their own, about 0.1 s each).
    """
    _compile()


def counter(main_line: int) -> Callable[[int], int]:
    """``count(seq << 1 | not_ok)``: count this worker done in broadcast round ``seq`` on main's
    control line, at address ``main_line`` (its int64 words), as ``FENCE_IR`` says: the round's
    workers done after this add (``protocol.counted``), or 0 when main's ``DONE`` word no longer
    holds round ``seq``'s tag (nothing added).

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
    if struct.calcsize("P") < 8:
        # The control words are int64, each read and written as one access: single-copy atomic
        # on 64-bit CPUs only (a torn SLEEPING or count could lose a wake-up).
        raise ImportError("shmvec needs a 64-bit CPU and Python: its shared control words are 64-bit")
    wanted = os.environ.get("SHMVEC_FENCE", "")
    if wanted not in ("", "lock", "compiled"):
        raise ValueError(f"SHMVEC_FENCE must be 'lock' or 'compiled', got {wanted!r}")
    strong = platform.machine().lower() in STRONGLY_ORDERED
    if wanted == "lock" and not strong:
        raise ValueError(
            f"SHMVEC_FENCE=lock is not a full barrier on this CPU ({platform.machine()}, weakly ordered): "
            "unset it, or use SHMVEC_FENCE=compiled"
        )
    if wanted == "lock" or (not wanted and strong):
        return "lock", _lock_fence
    return "compiled", _compile()["fence"]


# Which barrier this process runs ("lock" or "compiled"), and the barrier itself.
KIND, fence = _choose()
