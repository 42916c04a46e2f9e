"""Round-trip latency between two processes for the wake-up primitives a vector env can use.

Each benchmark is one round trip: this process signals a partner process, the partner waits
for it and signals back, this process waits for that. pytest-benchmark's table gives the time
per round trip (us); ``extra_info["us_per_round_trip"]`` records the median in
``--benchmark-json`` output. The partner is forked (``fork`` start method) so it inherits the
descriptors and the shared page directly; Linux only for ``eventfd``.

Run: ``make bench-micro`` or ``pytest benchmarks/test_bench_sync.py --benchmark-only``.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Iterator

import numpy as np
import pytest

pytestmark = [
    pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs the fork start method"),
    pytest.mark.benchmark(group="sync round trip"),
]

# A fixed count keeps each benchmark short and bounded (a spinner that loses its core can
# stall a round trip for a scheduler tick): 3,000 round trips, timed in groups of 10.
ROUNDS, ITERATIONS = 300, 10

CTX = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None


def _serve(setup: Callable[[], tuple[Callable[[], None], Callable[[], bool]]]) -> None:
    """Partner loop: wait for a ping, answer with a pong, until ``wait`` says stop."""
    wait, pong = setup()
    while wait():
        pong()


class Pair:
    """A forked partner answering pings; ``ping()`` does one round trip from this side."""

    def __init__(self, ping: Callable[[], None], serve: Callable[[], None], stop: Callable[[], None]) -> None:
        self.ping, self.stop = ping, stop
        self.proc = CTX.Process(target=serve, daemon=True)
        self.proc.start()

    def close(self) -> None:
        self.stop()
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def _pipe_byte() -> Pair:
    a_r, a_w = os.pipe()  # main -> partner
    b_r, b_w = os.pipe()  # partner -> main

    def serve() -> None:
        while os.read(a_r, 1) == b"p":
            os.write(b_w, b"q")

    def ping() -> None:
        os.write(a_w, b"p")
        os.read(b_r, 1)

    pair = Pair(ping, serve, lambda: os.write(a_w, b"x"))
    pair.fds = (a_r, a_w, b_r, b_w)  # type: ignore[attr-defined]
    return pair


def _mp_pipe() -> Pair:
    here, there = CTX.Pipe()
    msg = ("step", 1)

    def serve() -> None:
        while there.recv() is not None:
            there.send(msg)

    def ping() -> None:
        here.send(msg)
        here.recv()

    return Pair(ping, serve, lambda: here.send(None))


def _mp_event() -> Pair:
    go, back, stop = CTX.Event(), CTX.Event(), CTX.Value("b", 0, lock=False)

    def serve() -> None:
        while True:
            go.wait()
            go.clear()  # before answering: the next ping cannot be lost
            if stop.value:
                return
            back.set()

    def ping() -> None:
        go.set()
        back.wait()
        back.clear()

    def halt() -> None:
        stop.value = 1
        go.set()

    return Pair(ping, serve, halt)


def _mp_semaphore() -> Pair:
    go, back, stop = CTX.Semaphore(0), CTX.Semaphore(0), CTX.Value("b", 0, lock=False)

    def serve() -> None:
        while True:
            go.acquire()
            if stop.value:
                return
            back.release()

    def ping() -> None:
        go.release()
        back.acquire()

    def halt() -> None:
        stop.value = 1
        go.release()

    return Pair(ping, serve, halt)


def _eventfd() -> Pair:
    go, back = os.eventfd(0), os.eventfd(0)

    def serve() -> None:
        while os.eventfd_read(go) == 1:
            os.eventfd_write(back, 1)

    def ping() -> None:
        os.eventfd_write(go, 1)
        os.eventfd_read(back)

    return Pair(ping, serve, lambda: os.eventfd_write(go, 2))


def _spin_word() -> Pair:
    # One shared page, two int64 words: word 0 is written by this side only, word 1 by the
    # partner only; each side spins until the other's word changes. x86 and ARM keep aligned
    # 8-byte stores whole, so a reader sees the old value or the new one.
    page = mmap.mmap(-1, mmap.PAGESIZE)
    words = np.frombuffer(page, dtype=np.int64, count=2)
    counter = [0]

    def serve() -> None:
        last = 0
        while True:
            seq = words[0]
            if seq == last:
                continue
            if seq < 0:
                return
            last = seq
            words[1] = seq

    def ping() -> None:
        counter[0] += 1
        seq = counter[0]
        words[0] = seq
        while words[1] != seq:
            pass

    def halt() -> None:
        words[0] = -1

    pair = Pair(ping, serve, halt)
    pair.page = page  # type: ignore[attr-defined]
    return pair


KINDS = {
    "pipe byte (os.write/os.read)": _pipe_byte,
    "multiprocessing Pipe send/recv": _mp_pipe,
    "multiprocessing Event pair": _mp_event,
    "multiprocessing Semaphore pair": _mp_semaphore,
    "eventfd pair": _eventfd,
    "spin on a shared int64 word": _spin_word,
}


@pytest.fixture(params=list(KINDS))
def pair(request) -> Iterator[Pair]:
    if request.param == "eventfd pair" and not hasattr(os, "eventfd"):
        pytest.skip("os.eventfd needs Linux and Python 3.10+")
    if request.param == "spin on a shared int64 word" and (os.cpu_count() or 1) < 2:
        pytest.skip("a spinning partner needs a core of its own")
    p = KINDS[request.param]()
    yield p
    p.close()


def test_round_trip(benchmark, pair, request):
    for _ in range(10):  # the partner is up and answering before timing starts
        pair.ping()
    benchmark.pedantic(pair.ping, rounds=ROUNDS, iterations=ITERATIONS, warmup_rounds=5)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        us = stats.stats.median * 1e6
        benchmark.extra_info["us_per_round_trip"] = round(us, 2)
        print(f"\n{request.node.callspec.id}: {us:.1f} us per round trip", file=sys.stderr)
