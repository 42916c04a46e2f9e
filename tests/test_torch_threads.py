"""Torch's threads in the calling process: lowered while a rollout is collected, the user's
during every update, untouched without a rhythm or with ``torch_threads=None``."""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest

import shmvec
from shmvec import torch_threads
from shmvec.torch_threads import TorchThreads, ThreadsNotice

USER = 4


@pytest.fixture
def torch_and_clock(monkeypatch):
    """A stand-in for torch (its thread count) and for the clock the rhythm is read from."""
    fake = types.SimpleNamespace(threads=USER, calls=0)

    def set_num_threads(n):
        fake.threads = n
        fake.calls += 1

    fake.get_num_threads = lambda: fake.threads
    fake.set_num_threads = set_num_threads
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    clock = types.SimpleNamespace(now=100.0)
    monkeypatch.setattr(torch_threads.time, "perf_counter", lambda: clock.now)
    monkeypatch.setattr(torch_threads, "_told", True)
    return fake, clock


def run_loop(guard, fake, clock, gaps):
    """Step through ``gaps`` (seconds before each step; a step itself takes 0.5 ms); returns the
    torch threads seen before each step (what that gap's code ran with)."""
    seen = []
    for gap in gaps:
        clock.now += gap
        seen.append(fake.threads)
        guard.enter()
        clock.now += 0.5e-3
        guard.leave()
    return seen


def ppo_gaps(rollouts, steps, forward=1e-3, update=0.5):
    gaps = []
    for _ in range(rollouts):
        gaps += [update] + [forward] * (steps - 1)
    return gaps + [update]


def test_a_ppo_loop_collects_on_the_lowered_threads_and_updates_on_the_users(torch_and_clock):
    fake, clock = torch_and_clock
    guard = TorchThreads(1)
    seen = run_loop(guard, fake, clock, ppo_gaps(rollouts=6, steps=16))
    updates = seen[::16]  # the gap before each rollout's first step: an update
    assert updates == [USER] * 7
    forwards = [seen[r * 16 + 1 : (r + 1) * 16] for r in range(6)]
    assert forwards[0] == forwards[1] == [USER] * 15  # two rollouts of the same length first
    assert all(f == [1] * 15 for f in forwards[2:])
    # Lowered and given back once per rollout from the third on; the step after the last update
    # starts a seventh rollout, lowered.
    assert (fake.calls, fake.threads) == (2 * 4 + 1, 1)


def test_no_rhythm_no_change(torch_and_clock):
    """An off-policy loop (an update after every step), and irregular rollouts, are left alone."""
    fake, clock = torch_and_clock
    run_loop(TorchThreads(1), fake, clock, [0.02] * 200)
    irregular = []
    for steps in (16, 20, 24, 28, 32):
        irregular += [0.5] + [1e-3] * (steps - 1)
    run_loop(TorchThreads(1), fake, clock, irregular)
    assert fake.calls == 0


def test_a_hiccup_mid_rollout_never_leaves_an_update_on_the_lowered_threads(torch_and_clock):
    fake, clock = torch_and_clock
    guard = TorchThreads(1)
    gaps = ppo_gaps(rollouts=4, steps=16)
    pause = 3 * 16 + 5
    gaps[pause] = 0.2  # a long pause inside the fourth rollout (an evaluation, a checkpoint)
    gaps += ppo_gaps(rollouts=4, steps=16)[1:]
    seen = run_loop(guard, fake, clock, gaps)
    assert seen[pause] == 1  # unforeseeable: it runs on the rollout's threads
    updates = [i for i, g in enumerate(gaps) if g == 0.5]
    assert [seen[i] for i in updates] == [USER] * len(updates)
    assert seen[-2] == 1  # and the rhythm is found again


def test_off_and_close(torch_and_clock):
    fake, clock = torch_and_clock
    run_loop(TorchThreads(None), fake, clock, ppo_gaps(rollouts=5, steps=16))
    assert fake.calls == 0
    guard = TorchThreads(2)
    run_loop(guard, fake, clock, ppo_gaps(rollouts=3, steps=16)[:-10])  # stopped mid-rollout
    assert fake.threads == 2
    guard.close()
    assert fake.threads == USER


def test_said_once(torch_and_clock, monkeypatch):
    fake, clock = torch_and_clock
    monkeypatch.setattr(torch_threads, "_told", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_loop(TorchThreads(1), fake, clock, ppo_gaps(rollouts=4, steps=16))
        run_loop(TorchThreads(1), fake, clock, ppo_gaps(rollouts=4, steps=16))
    notices = [w for w in caught if issubclass(w.category, ThreadsNotice)]
    assert len(notices) == 1
    assert "1 intra-op thread(s) while a rollout of 16 steps" in str(notices[0].message)
    assert "torch_threads=None" in str(notices[0].message)
    assert notices[0].filename == __file__  # the user's line (here run_loop's), not shmvec's


def test_shmvec_lowers_real_torch_threads_during_rollouts():
    """ShmVecEnv in a PPO-shaped loop with real torch: 1 thread in rollouts, 2 in updates, 2 after close."""
    torch = pytest.importorskip("torch", reason="torch is in the dev extra: make test installs it")
    import time

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        envs = shmvec.make("CartPole-v1", num_envs=2, num_workers=1, torch_threads=1)
        try:
            envs.reset(seed=0)
            in_rollouts, in_updates = set(), set()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ThreadsNotice)
                for rollout in range(5):
                    in_updates.add(torch.get_num_threads())
                    time.sleep(0.3)  # the update
                    for step in range(12):
                        envs.step(np.zeros(2, dtype=np.int64))
                        if rollout >= 2 and step < 11:
                            in_rollouts.add(torch.get_num_threads())
                time.sleep(0.3)
                envs.step(np.zeros(2, dtype=np.int64))  # a rollout started, then closed
            assert torch.get_num_threads() == 1
        finally:
            envs.close()
        assert (in_rollouts, in_updates, torch.get_num_threads()) == ({1}, {2}, 2)
    finally:
        torch.set_num_threads(before)


def test_a_descheduled_step_inside_a_rollout_is_not_an_update(torch_and_clock):
    """The loop's thread, descheduled for a time slice (10-20 ms) while the workers and torch's
    threads share the cores, must not break the rhythm: found on HalfCheetah x8 with
    ShmVecEnv.diagnose(), where one such gap per rollout kept torch's threads up."""
    fake, clock = torch_and_clock
    guard = TorchThreads(1)
    gaps = []
    for r in range(6):
        rollout = [1e-3] * 15
        rollout[3 + r] = 0.02  # one hiccup per rollout, at a different step each time
        gaps += [0.2] + rollout
    seen = run_loop(guard, fake, clock, gaps + [0.2])
    forwards = [seen[r * 16 + 1 : (r + 1) * 16] for r in range(6)]
    assert all(f == [1] * 15 for f in forwards[2:])
    assert seen[::16] == [USER] * 7  # every update on the user's threads


def test_settled_once_the_threads_are_decided_or_no_rhythm_is_found(torch_and_clock):
    """What SlowLoopWatch waits for: a window taken before would see threads about to be lowered."""
    fake, clock = torch_and_clock
    off = TorchThreads(None)  # reads the rhythm too (the automatic window needs it), never touches torch
    run_loop(off, fake, clock, ppo_gaps(rollouts=3, steps=16)[:-1])
    assert off.settled and off.period == 16 and off.rollout_done and fake.calls == 0
    guard = TorchThreads(1)
    run_loop(guard, fake, clock, ppo_gaps(rollouts=1, steps=16))
    assert not guard.settled
    run_loop(guard, fake, clock, ppo_gaps(rollouts=2, steps=16)[1:])
    assert guard.settled and fake.threads == 1  # the rhythm was found: lowered
    irregular = TorchThreads(1)
    for steps in range(16, 16 + 4 * torch_threads.GIVE_UP_UPDATES, 4):
        assert not irregular.settled
        run_loop(irregular, fake, clock, [0.5] + [1e-3] * (steps - 1))
    run_loop(irregular, fake, clock, [0.5])
    assert irregular.settled and irregular.period == 0
    no_updates = TorchThreads(1)
    run_loop(no_updates, fake, clock, [0.02] * (torch_threads.GIVE_UP_STEPS - 1))
    assert not no_updates.settled
    run_loop(no_updates, fake, clock, [0.02])
    assert no_updates.settled
