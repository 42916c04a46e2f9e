"""The full memory barrier (shmvec.barrier): the instruction it compiles to on each target, and
the compiled barrier running the handoff (docs/architecture.md, "Memory ordering")."""

import os
import platform
import re
import subprocess
import sys
import textwrap

import pytest

from shmvec import barrier


def instructions(triple: str) -> list[str]:
    """The mnemonics of the barrier's body compiled for ``triple``."""
    asm = barrier.assembly(triple)
    body = asm.split("shmvec_fence:")[1].split(".Lfunc_end0")[0]
    return [line.split()[0] for line in body.splitlines() if line.strip() and not line.strip().startswith((".", "#"))]


def test_the_barrier_is_dmb_ish_on_aarch64():
    assert instructions("aarch64-unknown-linux-gnu") == ["dmb", "ret"]
    assert re.search(r"\bdmb\s+ish\b", barrier.assembly("aarch64-apple-macosx14.0.0"))  # Apple Silicon alike


def test_the_barrier_is_a_locked_instruction_on_x86_64():
    asm = barrier.assembly("x86_64-unknown-linux-gnu")
    assert re.search(r"\block\b", asm) or "mfence" in asm  # a full barrier on x86-64 either way


def test_this_machine_runs_the_barrier_its_order_needs():
    strong = platform.machine().lower() in barrier.STRONGLY_ORDERED
    if "SHMVEC_FENCE" not in os.environ:
        assert barrier.KIND == ("lock" if strong else "compiled")
    barrier.fence()  # callable, returns


def test_a_bad_override_is_refused():
    code = "import shmvec.barrier"
    env = {**os.environ, "SHMVEC_FENCE": "none"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "SHMVEC_FENCE must be 'lock' or 'compiled'" in result.stderr


def test_the_lock_barrier_is_refused_on_a_weakly_ordered_cpu():
    """``SHMVEC_FENCE=lock`` where the CPU reorders stores (aarch64, played here): refused, not
    silently a barrier that orders nothing there."""
    code = "import platform; platform.machine = lambda: 'aarch64'; import shmvec.barrier"
    env = {**os.environ, "SHMVEC_FENCE": "lock"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "SHMVEC_FENCE=lock is not a full barrier on this CPU (aarch64" in result.stderr


def test_the_compiled_barrier_runs_the_handoff():
    """The barrier a weakly ordered machine runs, here: a vector env whose processes all use it
    steps and collects bit-identically to Gymnasium's SyncVectorEnv, sync and async.
    """
    code = textwrap.dedent(
        """
        import gymnasium as gym, numpy as np, shmvec
        from shmvec import barrier
        assert barrier.KIND == "compiled"
        for context in ("fork", "spawn"):
            ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
            envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2, context=context)
            a, _ = envs.reset(seed=3)
            b, _ = ref.reset(seed=3)
            assert (a == b).all()
            rng = np.random.default_rng(0)
            for _ in range(300):
                act = rng.integers(0, 2, 4)
                got, want = envs.step(act), ref.step(act)
                for x, y in zip(got[:4], want[:4]):
                    assert (x == y).all()
            envs.close(), ref.close()
        envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2, batch_size=2)
        envs.async_reset(seed=0)
        for _ in range(200):
            obs, *_, ids = envs.recv()
            envs.send(np.zeros(2, dtype=np.int64), ids)
        envs.close()
        print("ok")
        """
    )
    env = {**os.environ, "SHMVEC_FENCE": "compiled"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_count_is_a_compare_and_swap_then_a_barrier():
    x86 = barrier.assembly("x86_64-unknown-linux-gnu").split("shmvec_count:")[1].split(".Lfunc_end")[0]
    arm = barrier.assembly("aarch64-unknown-linux-gnu").split("shmvec_count:")[1].split(".Lfunc_end")[0]
    # the tagged count's compare-and-swap, then the barrier (on both ways out: counted, or stale)
    assert re.findall(r"\block\b\s+(cmpxchg\w*|or\w*)", x86) == ["cmpxchgq", "orl", "orl"]
    assert (arm.count("ldaxr") == arm.count("stlxr") == 1) or "casal" in arm
    assert len(re.findall(r"dmb\s+ish", arm)) == 2


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # (forked: they inherit the barrier)
def test_counts_from_many_processes_are_never_lost():
    """Four forked processes count themselves 10,000 times each on one shared line, every other
    time as failed: a plain read-modify-write would lose some; the compare-and-swap loses none,
    and the counts returned are 1 .. 40,000, each once (each the word's count after that add)."""
    import ctypes
    import mmap
    import multiprocessing as mp

    from shmvec import protocol as P

    memory = mmap.mmap(-1, 64)
    address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    words = memoryview(memory).cast("q")
    words[P.DONE] = P.count_base(12345)
    barrier.prepare()  # compiled here: the forked processes inherit it
    ctx = mp.get_context("fork")
    seen = ctx.SimpleQueue()

    def count_many():
        count = barrier.counter(address)
        seen.put([count(12345 << 1 | i % 2) for i in range(10_000)])

    procs = [ctx.Process(target=count_many) for _ in range(4)]
    for p in procs:
        p.start()
    counts = sorted(n for _ in procs for n in seen.get())
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    assert counts == list(range(1, 40_001))
    word = words[P.DONE]
    assert P.counted(word) == 40_000 and P.not_ok(word) == 20_000 and word >> 32 == 12345


def test_a_count_of_an_earlier_round_is_not_counted():
    """A worker late with its count of round 6 finds main's word set for round 7: it adds
    nothing and is told so (0), whatever it failed; round 7's own counts go on from 0."""
    import ctypes
    import mmap

    from shmvec import protocol as P

    memory = mmap.mmap(-1, 64)
    words = memoryview(memory).cast("q")
    count = barrier.counter(ctypes.addressof(ctypes.c_char.from_buffer(memory)))
    words[P.DONE] = P.count_base(7)
    assert count(6 << 1) == 0 and count(6 << 1 | 1) == 0 and words[P.DONE] == P.count_base(7)
    assert count(7 << 1 | 1) == 1 and count(7 << 1) == 2
    assert P.counted(words[P.DONE]) == 2 and P.not_ok(words[P.DONE]) == 1
