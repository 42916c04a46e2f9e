"""An env whose every row says whose it is and how far it got, and the check of every row after
every round: what the round's fault tests and its stress test (``tests/test_round_jitter.py``,
``make stress``) read.

``CountingEnv(index)`` observes ``[index, count]``: ``count`` steps since its last reset, also
its reward; it terminates every ``episode`` steps. :class:`Rows` follows each env's count from
round to round (``NEXT_STEP`` autoreset): a row must hold its own index, and the count after
the one it held, or 0 after an episode's end, or 0 with ``restarted`` set (that row is its new
envs' reset; the next step steps on from it). A stale row (a round
whose results were read before they were written) or another env's row fails it.
"""

from __future__ import annotations

import os
import random
import signal
import time

import gymnasium as gym
import numpy as np

BUILT: list[int] = []  # the env indexes built in this process (a worker's block)


def episode_of(index: int) -> int:
    return 5 + index % 4


class CountingEnv(gym.Env):
    """Observes ``[index, count]``; rewards ``count``; terminates every ``episode_of(index)``
    steps, with an info then. Action 1 sleeps ``slow_s`` in the step.

    ``hang_rate``: the chance that a step sleeps ``hang_s`` (past a vector env's timeout).

    ``deaths``: a file holding how many times this env kills its own process, with SIGKILL, as
    it is built or reset (``"build 2"``, ``"reset 1"``); each death takes one off. The file is
    written by a test once the first envs run, so that only replacements die.
    """

    def __init__(
        self,
        index: int,
        slow_s: float = 0.05,
        deaths: str | None = None,
        hang_s: float = 0.0,
        hang_rate: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.index, self.slow_s, self.deaths = index, slow_s, deaths
        self.hang_s, self.hang_rate = hang_s, hang_rate
        self._rng = random.Random(seed * 1000 + index)
        self.observation_space = gym.spaces.Box(-1.0, 1e9, (2,), np.float64)
        self.action_space = gym.spaces.Discrete(2)
        self.count = 0
        BUILT.append(index)
        self._maybe_die("build")

    def _maybe_die(self, when: str) -> None:
        if self.deaths is None or not os.path.exists(self.deaths):
            return
        with open(self.deaths, "r+") as f:
            what, left = f.read().split()
            if what != when or int(left) <= 0:
                return
            f.seek(0)
            f.truncate()
            f.write(f"{what} {int(left) - 1}")
            f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def _obs(self) -> np.ndarray:
        return np.array([self.index, self.count], np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._maybe_die("reset")
        self.count = 0
        return self._obs(), {}

    def step(self, action):
        if action == 1:
            time.sleep(self.slow_s)
        if self.hang_rate and self._rng.random() < self.hang_rate:
            time.sleep(self.hang_s)
        self.count += 1
        ended = self.count % episode_of(self.index) == 0
        return self._obs(), float(self.count), ended, False, {"ended_at": self.count} if ended else {}


def counting_fns(n: int, **kwargs) -> list:
    import functools

    return [functools.partial(CountingEnv, i, **kwargs) for i in range(n)]


class Rows:
    """Each env's count as last seen, and the check of the next rows (``NEXT_STEP``)."""

    def __init__(self, num_envs: int) -> None:
        self.count = np.zeros(num_envs, np.int64)
        self.ended = np.zeros(num_envs, bool)
        self.checked = 0

    def reset(self, obs: np.ndarray, env_ids=None) -> None:
        ids = np.arange(len(self.count)) if env_ids is None else np.asarray(env_ids)
        assert (obs[:, 0] == ids).all(), f"rows of other envs after a reset: {obs[:, 0]} for {ids}"
        assert (obs[:, 1] == 0).all(), f"a reset left counts {obs[:, 1]}"
        self.count[ids] = 0
        self.ended[ids] = False

    def step(self, obs, rewards, terminations, truncations, infos, env_ids=None) -> None:
        ids = np.arange(len(self.count)) if env_ids is None else np.asarray(env_ids)
        restarted = np.zeros(len(ids), bool)
        if "restarted" in infos:
            restarted = np.asarray(infos["_restarted"]) & np.asarray(infos["restarted"])
        assert (obs[:, 0] == ids).all(), f"rows of other envs: {obs[:, 0]} for envs {ids}"
        was_ended = self.ended[ids]
        expect = np.where(restarted | was_ended, 0, self.count[ids] + 1)
        got = obs[:, 1].astype(np.int64)
        bad = got != expect
        assert not bad.any(), (
            f"stale or wrong rows: envs {ids[bad]} counted {got[bad]}, expected {expect[bad]} "
            f"(restarted {restarted[bad]}, after an episode's end {was_ended[bad]})"
        )
        stepped = ~(restarted | was_ended)
        assert (rewards[stepped] == expect[stepped]).all(), f"rewards {rewards} for counts {expect}"
        ends = stepped & (expect % np.array([episode_of(i) for i in ids]) == 0) & (expect > 0)
        assert (terminations == ends).all(), f"terminations {terminations}, expected {ends}"
        assert (truncations == restarted).all(), f"truncations {truncations}, restarted {restarted}"
        self.count[ids] = got
        self.ended[ids] = (terminations | truncations) & ~restarted  # a restarted row is already its reset
        self.checked += len(ids)
