"""Unit tests for shmvec.sync: fences, wake pipes, spin budgets and the spin-then-block wait."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from shmvec.protocol import SLEEPING
from shmvec.barrier import fence
from shmvec.sync import SpinPolicy, block_until, drain, ring, spin_policies, spin_until

# Words of the control line other than SLEEPING get these values; block_until must not touch them.
OTHER_WORDS = {i: 100 + i for i in range(8) if i != SLEEPING}


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


@pytest.fixture
def pipe():
    r, w = _pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


@pytest.fixture
def sentinel():
    """A second pipe standing for a dead worker's sentinel: readable once it is 'dead'."""
    r, w = _pipe()
    yield r, w
    os.close(r)
    os.close(w)


@pytest.fixture(params=["ndarray", "memoryview"])
def line(request):
    """A control line: 8 int64 words (a numpy row, or a memoryview of one as control_lines gives)."""
    words = np.zeros(8, dtype=np.int64)
    for i, v in OTHER_WORDS.items():
        words[i] = v
    return words if request.param == "ndarray" else memoryview(words)


def _assert_line_after(line) -> None:
    assert line[SLEEPING] == 0
    for i, v in OTHER_WORDS.items():
        assert line[i] == v, f"word {i} of the control line was changed"


def _is_empty(fd: int) -> bool:
    try:
        os.read(fd, 1)
    except BlockingIOError:
        return True
    return False


def _start(target) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def _join(t: threading.Thread) -> None:
    t.join(5.0)
    assert not t.is_alive()


def _wait_for(cond, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


# --- fence --------------------------------------------------------------------------------------


def test_fence_can_be_called_repeatedly_and_concurrently():
    counts = [0] * 4

    def worker(k):
        for _ in range(2000):
            fence()
            counts[k] += 1

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        _join(t)
    assert counts == [2000] * 4
    fence()  # the lock was released every time


def test_fence_dekker_handshake_one_side_always_sees_the_other():
    """Store own word, fence, load the other's: never may both sides miss each other."""
    rounds = 200
    flags = np.zeros(2, dtype=np.int64)
    seen = np.zeros((rounds, 2), dtype=np.int64)
    barrier = threading.Barrier(2, timeout=5.0)

    def side(me):
        other = 1 - me
        for k in range(rounds):
            barrier.wait()
            flags[me] = k + 1
            fence()
            seen[k, me] = flags[other] == k + 1
            barrier.wait()

    threads = [threading.Thread(target=side, args=(m,), daemon=True) for m in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        _join(t)
    assert (seen.sum(axis=1) >= 1).all()


# --- ring / drain -------------------------------------------------------------------------------


def test_ring_writes_one_wake_byte(pipe):
    r, w = pipe
    ring(w)
    assert os.read(r, 16) == b"\x01"
    assert _is_empty(r)


def test_drain_empties_the_pipe(pipe):
    r, w = pipe
    for _ in range(10):
        ring(w)
    drain(r)
    assert _is_empty(r)


def test_drain_of_an_empty_pipe_returns(pipe):
    r, _ = pipe
    drain(r)
    assert _is_empty(r)


@pytest.mark.parametrize("nbytes", [4095, 4096, 4097, 3 * 4096])
def test_drain_empties_around_read_size(pipe, nbytes):
    r, w = pipe
    assert os.write(w, b"\x01" * nbytes) == nbytes
    drain(r)
    assert _is_empty(r)


def test_ring_on_a_full_pipe_does_not_raise(pipe):
    r, w = pipe
    total = 0
    while True:
        try:
            total += os.write(w, b"\x01" * 65536)
        except BlockingIOError:
            break
    assert total > 0
    ring(w)  # the pipe already holds a pending wake-up: nothing to do, nothing raised
    ring(w)
    drain(r)
    assert _is_empty(r)
    ring(w)  # the pipe works again
    assert os.read(r, 16) == b"\x01"


def test_ring_on_a_pipe_with_no_reader_does_not_raise(pipe):
    r, w = pipe
    os.close(r)
    ring(w)  # BrokenPipeError is swallowed: the waiter is gone
    with pytest.raises(BrokenPipeError):
        os.write(w, b"\x01")  # it was a broken pipe indeed


# --- SpinPolicy ---------------------------------------------------------------------------------


def test_spin_policy_starts_with_full_budget():
    p = SpinPolicy(max_spin=1e-3, min_spin=1e-5, oversubscribed=False)
    assert p.max_spin == 1e-3
    assert p.min_spin == 1e-5
    assert p.budget == 1e-3


def test_spin_policy_quick_wait_keeps_full_budget_slow_wait_shrinks_it():
    p = SpinPolicy(max_spin=1e-3, min_spin=1e-5, oversubscribed=False)
    p.update(1e-4)
    assert p.budget == 1e-3
    p.update(1e-3)  # exactly max_spin still counts as satisfied while spinning
    assert p.budget == 1e-3
    p.update(2e-3)
    assert p.budget == 1e-5
    p.update(5e-3)
    assert p.budget == 1e-5
    p.update(0.0)  # a quick wait restores the full budget
    assert p.budget == 1e-3


def test_spin_policy_min_spin_capped_by_max_spin():
    p = SpinPolicy(max_spin=1e-4, min_spin=1e-3, oversubscribed=False)
    assert p.min_spin == 1e-4
    p.update(1.0)
    assert p.budget == 1e-4


def test_spin_policy_zero_max_spin():
    p = SpinPolicy(max_spin=0.0, min_spin=50e-6, oversubscribed=True)
    assert p.budget == 0.0
    assert p.min_spin == 0.0
    p.update(1.0)
    assert p.budget == 0.0


@pytest.mark.parametrize("oversubscribed, every", [(True, 4), (False, 16)])
def test_spin_policy_yield_every(oversubscribed, every):
    assert SpinPolicy(1e-3, 1e-5, oversubscribed).yield_every == every


# --- spin_until ---------------------------------------------------------------------------------


class Counter:
    """A done() that counts its calls and turns true on its ``true_at``-th call (never if None)."""

    def __init__(self, true_at: int | None = None) -> None:
        self.calls = 0
        self.true_at = true_at

    def __call__(self) -> bool:
        self.calls += 1
        return self.true_at is not None and self.calls >= self.true_at


@pytest.mark.parametrize("budget", [0.0, 1e-3])
def test_spin_until_true_at_once(budget):
    done = Counter(true_at=1)
    policy = SpinPolicy(budget, 0.0, oversubscribed=False)
    assert spin_until(done, policy) is True
    assert done.calls == 1


def test_spin_until_becomes_true_after_some_polls():
    done = Counter(true_at=50)
    assert spin_until(done, SpinPolicy(5.0, 0.0, oversubscribed=True)) is True
    assert done.calls == 50


def test_spin_until_becomes_true_from_another_thread():
    event = threading.Event()
    t = _start(lambda: (time.sleep(0.02), event.set()))
    try:
        assert spin_until(event.is_set, SpinPolicy(5.0, 0.0, oversubscribed=True)) is True
    finally:
        _join(t)


@pytest.mark.parametrize("budget", [0.0, -1.0])
def test_spin_until_no_budget_returns_false_without_waiting(budget):
    done = Counter()
    policy = SpinPolicy(1e-3, 0.0, oversubscribed=False)
    policy.budget = budget
    assert spin_until(done, policy) is False
    assert done.calls == 1


@pytest.mark.parametrize("oversubscribed", [True, False])
def test_spin_until_gives_up_after_budget(oversubscribed):
    done = Counter()
    start = time.perf_counter()
    assert spin_until(done, SpinPolicy(2e-3, 0.0, oversubscribed)) is False
    assert time.perf_counter() - start >= 2e-3
    assert done.calls > 1


def test_spin_until_without_yields():
    done = Counter()
    policy = SpinPolicy(1e-3, 0.0, oversubscribed=False)
    policy.yield_every = 0
    assert spin_until(done, policy) is False
    assert done.calls > 1


# --- block_until --------------------------------------------------------------------------------


def test_block_until_done_at_once(line, pipe):
    r, _ = pipe
    assert block_until(lambda: True, line, r, [], timeout=1.0) == []
    _assert_line_after(line)


def test_block_until_woken_by_ring_from_thread(line, pipe):
    """The completer's side of the handshake: set done, fence, ring if the waiter sleeps."""
    r, w = pipe
    flag = threading.Event()
    saw_sleeping = []

    def complete():
        saw_sleeping.append(_wait_for(lambda: line[SLEEPING] == 1))
        flag.set()
        fence()
        if line[SLEEPING]:
            ring(w)

    t = _start(complete)
    try:
        # poll_interval far above the test's time: only the wake byte can end the wait in time
        assert block_until(flag.is_set, line, r, [], timeout=30.0, poll_interval=30.0) == []
    finally:
        _join(t)
    assert saw_sleeping == [True]  # the waiter announced that it blocks
    _assert_line_after(line)
    assert _is_empty(r)  # the wake byte was consumed


def test_block_until_returns_dead_fds(line, pipe, sentinel):
    r, _ = pipe
    dead_r, dead_w = sentinel
    other_r, other_w = _pipe()
    try:
        t = _start(lambda: (_wait_for(lambda: line[SLEEPING] == 1), os.write(dead_w, b"x")))
        try:
            got = block_until(lambda: False, line, r, [other_r, dead_r], timeout=30.0, poll_interval=30.0)
        finally:
            _join(t)
    finally:
        os.close(other_r)
        os.close(other_w)
    assert got == [dead_r]
    _assert_line_after(line)


def test_block_until_dead_fd_already_readable(line, pipe, sentinel):
    r, _ = pipe
    dead_r, dead_w = sentinel
    os.write(dead_w, b"x")
    assert block_until(lambda: False, line, r, [dead_r], timeout=5.0) == [dead_r]
    _assert_line_after(line)


def test_block_until_done_wins_over_dead_fd(line, pipe, sentinel):
    """A command that finished as its worker died still counts as finished."""
    r, _ = pipe
    dead_r, dead_w = sentinel
    os.write(dead_w, b"x")
    done = Counter(true_at=2)  # false before the select, true after it
    assert block_until(done, line, r, [dead_r], timeout=5.0) == []
    _assert_line_after(line)


def test_block_until_timeout(line, pipe):
    r, _ = pipe
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        block_until(lambda: False, line, r, [], timeout=0.05, poll_interval=0.5)
    assert time.monotonic() - start >= 0.05
    _assert_line_after(line)


def test_block_until_zero_timeout_raises_at_once(line, pipe):
    r, _ = pipe
    done = Counter()
    with pytest.raises(TimeoutError):
        block_until(done, line, r, [], timeout=0.0)
    assert done.calls == 1
    _assert_line_after(line)


def test_block_until_spurious_wake_does_not_end_the_wait(line, pipe):
    r, w = pipe
    ring(w)  # a stale wake byte from an earlier round
    with pytest.raises(TimeoutError):
        block_until(lambda: False, line, r, [], timeout=0.1, poll_interval=0.5)
    assert _is_empty(r)
    _assert_line_after(line)


def test_block_until_recovers_lost_wake_up(line, pipe):
    """done() turns true but no wake byte is ever written: the poll interval finds it."""
    r, _ = pipe
    flag = threading.Event()
    t = _start(lambda: (_wait_for(lambda: line[SLEEPING] == 1), flag.set()))
    try:
        assert block_until(flag.is_set, line, r, [], timeout=10.0, poll_interval=0.02) == []
    finally:
        _join(t)
    _assert_line_after(line)


def test_block_until_clears_sleeping_when_done_raises(line, pipe):
    r, w = pipe
    ring(w)

    def done():
        if line[SLEEPING] == 0:  # after the select
            raise RuntimeError("boom")
        return False

    with pytest.raises(RuntimeError, match="boom"):
        block_until(done, line, r, [], timeout=5.0)
    _assert_line_after(line)


def test_block_until_without_timeout_returns_when_done(line, pipe):
    r, w = pipe
    flag = threading.Event()

    def complete():
        _wait_for(lambda: line[SLEEPING] == 1)
        flag.set()
        fence()
        ring(w)

    t = _start(complete)
    try:
        assert block_until(flag.is_set, line, r, [], timeout=None, poll_interval=0.05) == []
    finally:
        _join(t)
    _assert_line_after(line)


# --- the pool's spin rule -----------------------------------------------------------------------


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("cores", [1, 2, 3, 4, 16, 64])
def test_spin_policies_by_processes_and_cores(cores, asynchronous):
    for num_workers in range(0, 2 * cores + 2):
        for main_block in (0, 1):
            blocks = num_workers + main_block
            if blocks == 0:
                continue
            worker, main = spin_policies(num_workers, blocks, cores, asynchronous=asynchronous)
            where = (cores, num_workers, main_block, asynchronous)
            if num_workers + 1 > cores:  # workers and caller outnumber the cores: spinners yield often
                assert worker.yield_every == main.yield_every == 4, where
            else:
                assert worker.yield_every == main.yield_every == 16, where
            if blocks > cores and asynchronous:  # blocks would starve for turns: nobody spins
                assert worker.max_spin == main.max_spin == 0.0, where
                continue
            assert worker.max_spin == pytest.approx(2e-3), where
            # The caller spins briefly only beside exactly as many worker blocks as cores.
            brief = num_workers + 1 > cores and blocks == cores
            assert main.max_spin == pytest.approx(150e-6 if brief else 2e-3), where


def test_spin_policies_spin_us_sets_both():
    worker, main = spin_policies(8, 8, 2, spin_us=300.0)
    assert worker.max_spin == main.max_spin == pytest.approx(300e-6)
    worker, main = spin_policies(1, 1, 16, spin_us=0.0)
    assert worker.max_spin == main.max_spin == 0.0


@pytest.mark.parametrize("cores", [1, 2, 3])
def test_default_workers_never_exceed_the_cores(monkeypatch, cores):
    import shmvec
    import shmvec.options

    monkeypatch.setattr(shmvec.options, "usable_cores", lambda: cores)
    with shmvec.make("CartPole-v1", num_envs=5) as envs:
        assert envs.num_workers == min(cores, 5) and len(envs.worker_pids) == envs.num_workers
    with shmvec.make("CartPole-v1", num_envs=5, step_in_main=True) as envs:
        assert envs.num_workers == cores - 1 and envs.num_blocks == cores
