"""Broadcast rounds (#47): a round for every worker is posted once, on main's line, its wake-ups
relayed down a tree of workers, and main sleeps waiting for one named block at a time
(docs/architecture.md, "A broadcast round")."""

from __future__ import annotations

import os
import threading
import time
from functools import partial

import numpy as np
import pytest
from envs_for_tests import FaultyEnv
from test_equivalence import run_both

from shmvec import protocol as P
from shmvec.sync import block_until


def test_the_wake_up_tree_reaches_every_worker_once():
    for workers in (1, 2, 5, 17, 64):
        reached = [c for k in (None, *range(workers)) for c in P.relay_children(k, workers)]
        assert sorted(reached) == list(range(workers))  # each woken by exactly one parent
    assert list(P.relay_children(None, 64)) == [0, 1] and list(P.relay_children(None, 1)) == [0]
    assert list(P.relay_children(0, 64)) == [2, 3, 4, 5] and list(P.relay_children(2, 12)) == [10, 11]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_every_wake_up_relayed_down_the_tree_matches_sync_vector_env(context):
    """spin_us=0: every wait blocks, so every round's wake-ups go down the tree (two levels
    below main for 12 workers) and the last DONE of each round rings main."""
    import gymnasium as gym

    run_both(lambda: gym.make("CartPole-v1"), num_envs=12, steps=150, mode=gym.vector.AutoresetMode.NEXT_STEP,
             num_workers=12, spin_us=0.0, context=context)  # fmt: skip


def test_a_relaying_worker_restarted_still_relays():
    """Worker 1 wakes workers 6..9; its env exits at every 4th step, so it is replaced again and
    again, and each replacement (on the same wake pipe) relays: those workers step every step."""
    import shmvec

    fns = [partial(FaultyEnv, "exit" if i == 1 else "none", at=4) for i in range(12)]
    with shmvec.ShmVecEnv(fns, num_workers=12, on_error="restart", spin_us=0.0) as envs:
        envs.reset(seed=0)
        for _ in range(30):
            envs.step(np.zeros(12, dtype=np.int64))
        restarted = [worker for worker, _, _ in envs.restarts]
        steps = envs.get_attr("t")
    assert len(restarted) >= 3 and set(restarted) == {1}
    assert [steps[i] for i in range(12) if i != 1] == [30] * 11


def test_main_names_the_block_it_waits_for_and_moves_on(tmp_path):
    """block_until with a moving announcement: it names the first block not done, returns when
    that one is done before it sleeps (the caller names the next one), and sleeps on the one
    still out, which alone rings."""
    line = memoryview(bytearray(64)).cast("q")
    done = [False, False, False]
    first = [0]

    def all_done():
        while first[0] < 3 and done[first[0]]:
            first[0] += 1
        return first[0] == 3

    r, w = os.pipe()
    os.set_blocking(r, False)
    seen = []

    def finish_later():
        while line[P.SLEEPING] != 2:  # main waits for block 1 (block 0 was done before it slept)
            time.sleep(0.001)
        seen.append(line[P.SLEEPING])
        done[2] = True  # not the named block: no ring
        time.sleep(0.05)
        done[1] = True
        os.write(w, b"\x01")  # the named one rings

    done[0] = True
    t = threading.Thread(target=finish_later)
    t.start()
    try:
        calls = 0
        while first[0] < 3:  # as the pool's wait loops
            assert block_until(all_done, line, r, [], timeout=5.0, announce=lambda: first[0] + 1) == []
            calls += 1
        assert calls == 2  # block 0 named and found done; block 1 named, slept on
    finally:
        t.join()
        os.close(r), os.close(w)
    assert seen == [2] and line[P.SLEEPING] == 0 and all(done)
